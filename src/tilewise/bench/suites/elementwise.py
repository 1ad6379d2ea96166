"""map / zip beside PyTorch eager and torch.compile, at 2^28 elements (1 GiB per fp32 tensor, far
past the 60 MiB L2): contiguous (every version, v4_blocked the default), a transposed input (v1,
v3_tiled), a bias row (v1, v3_tiled, v5_rows) and a scalar operand (v1, v5_rows); then warp
divergence measured (a branch against its branch-free form, on warps that split and warps that do
not)."""

from __future__ import annotations

import torch

from ...cost import Cost
from ...ops.pointwise import elementwise as ew
from ..harness import check, time_ms


def _compiled(fn):
    """torch.compile of the same expression, compiled (and checked) before it is timed."""
    return torch.compile(fn, dynamic=False)


def _zip_add(r, what: str, shape: str, dtype, a, b, out, names, compiled: bool = False) -> None:
    """zip add of a and b into ``out``: PyTorch eager (the baseline), torch.compile when asked, and
    the versions ``names``; ``what`` names the case in the check messages."""
    r.status(f"zip add {shape} {dtype}")
    ref = torch.add(a, b)
    cost = ew.cost("add", a.numel(), (a.numel(), b.numel()), dtype)
    base_ms = time_ms(lambda: torch.add(a, b))
    r.add("zip_add", "torch_eager", shape, dtype, base_ms, cost)
    if compiled:
        cf = _compiled(lambda p, q: p + q)
        check(f"{what}.torch.compile", cf(a, b), ref)
        r.add("zip_add", "torch.compile", shape, dtype, time_ms(lambda: cf(a, b)), cost)
    for name in names:
        fn = ew.ZIP_VARIANTS[name]
        out.fill_(float("nan"))
        fn("add", a, b, out)
        check(f"{what}.{name}", out, ref)
        ms = time_ms(lambda: fn("add", a, b, out))
        r.add("zip_add", name, shape, dtype, ms, cost, baseline="torch_eager", baseline_ms=base_ms)


def run(r) -> None:
    n = 2**28
    dtypes = [torch.float32] if r.quick else [torch.float32, torch.bfloat16]
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in dtypes:
        shape = f"n={n}"
        x = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        y = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        out = torch.empty_like(x)
        itemsize = x.element_size()

        r.status(f"copy {shape} {dtype}")
        copy_ms = time_ms(lambda: out.copy_(x))
        r.add("copy", "torch.copy_", shape, dtype, copy_ms, Cost(0, 2 * n * itemsize))

        unary = ["relu", "gelu"] if r.quick else ["relu", "gelu", "exp", "sin"]
        for op in unary:
            r.status(f"map {op} {shape} {dtype}")
            tfn = ew.MAP_OPS[op][1]
            ref = tfn(x)
            cost = ew.cost(op, n, n, dtype)
            base_ms = time_ms(lambda: tfn(x))
            r.add(f"map_{op}", "torch_eager", shape, dtype, base_ms, cost)
            if op == "relu" or not r.quick:
                cf = _compiled(lambda t, f=tfn: f(t))
                check(f"map_{op}.torch.compile", cf(x), ref)
                r.add(f"map_{op}", "torch.compile", shape, dtype, time_ms(lambda: cf(x)), cost)
            for name, fn in ew.MAP_VARIANTS.items():
                out.fill_(float("nan"))
                fn(op, x, out)
                check(f"map_{op}.{name}", out, ref)
                ms = time_ms(lambda: fn(op, x, out))
                r.add(f"map_{op}", name, shape, dtype, ms, cost, baseline="torch_eager", baseline_ms=base_ms)
            del ref

        # v3/v5 need 2-D strided layouts: the cases below.
        _zip_add(r, "zip_add", shape, dtype, x, y, out, ("v1_strided", "v2_contiguous", "v4_blocked"), compiled=True)

        # Strided: a transposed operand (16384 x 16384), a bias row over 65536 x 4096, and a
        # scalar (0-dim) operand over all 2^28 (x * 2.0 inside autograd is this case).
        side = 2**14
        cases = (("transposed", x.view(side, side).t(), y.view(side, side), out.view(side, side),
                  ("v1_strided", "v3_tiled")),
                 ("bias_row", x.view(-1, 4096), y[:4096], out.view(-1, 4096), ("v1_strided", "v3_tiled", "v5_rows")),
                 ("scalar", x, y[0], out, ("v1_strided", "v5_rows")))
        for label, a, b, o, names in cases:
            _zip_add(r, f"zip_add {label}", f"{label} {tuple(a.shape)}", dtype, a, b, o, names)
        del x, y, out, cases, a, b, o
        torch.cuda.empty_cache()

    # Warp divergence: a branch whose sides are 256 FMAs each, compute bound (2^26 elements, the
    # memory floor is ~0.13 ms beside ~0.5 ms of one chain). Expected: branch on "uniform" ~ the
    # cost of one chain; branch on "split" ~ select (both chains) ~ 2x.
    n, work = 2**26, 256
    for pattern in ("uniform", "split"):
        x = ew.divergence_inputs(n, pattern, generator=g)
        out = torch.empty_like(x)
        ref = ew.divergence_reference(x, work)
        shape = f"{pattern} n={n} work={work}"
        cost = ew.divergence_cost(n, work)
        times = {}
        for v in reversed(ew.DIVERGENCE_VARIANTS):  # v2_select first: it is the baseline
            r.status(f"divergence {v} {shape}")
            out.fill_(float("nan"))
            ew.divergence(x, v, work, out)
            check(f"divergence.{v}", out, ref)
            times[v] = time_ms(lambda: ew.divergence(x, v, work, out))
            base = "" if v == "v2_select" else "v2_select"
            r.add("divergence", v, shape, torch.float32, times[v], cost, baseline=base,
                  baseline_ms=times.get("v2_select") if base else None)
        del x, out, ref
