"""tilewise.fuse beside PyTorch eager (one kernel per op) and torch.compile of the same expression:
sin(x)^2 + cos(x)^2 and relu(x + b) over 2^28 fp32 elements (1 GiB, far past L2)."""

from __future__ import annotations

import torch

from ...ops.pointwise import fusion as fu
from ...ops.pointwise.elementwise import cos, relu, sin
from ..harness import check, time_ms


def run(r) -> None:
    n = 2**28
    g = torch.Generator(device="cuda").manual_seed(0)
    dtype = torch.float32
    x = torch.randn(n, device="cuda", dtype=dtype, generator=g)

    cases = [
        ("fused_sin2_cos2", f"n={n}", fu.fuse(lambda x: sin(x) ** 2 + cos(x) ** 2),
         lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, (x,)),
        ("fused_bias_relu", f"({n // 4096}, 4096) + (4096,)", fu.fuse(lambda x, b: relu(x + b)),
         lambda x, b: torch.relu(x + b), (x.view(-1, 4096), torch.randn(4096, device="cuda", generator=g))),
    ]
    for opname, shape, fused, eager, inputs in cases:
        r.status(f"{opname} {shape}")
        ref = eager(*inputs)
        cost = fused.cost(ref.numel(), tuple(t.numel() for t in inputs), dtype)
        base_ms = time_ms(lambda: eager(*inputs))
        r.add(opname, "torch_eager", shape, dtype, base_ms, cost)
        compiled = torch.compile(eager, dynamic=False)
        check(f"{opname}.torch.compile", compiled(*inputs), ref)
        r.add(opname, "torch.compile", shape, dtype, time_ms(lambda: compiled(*inputs)), cost)
        # None: what a call picks (configs.FUSE_DEFAULT; blocked for the contiguous case, rows for the
        # bias row); the named kernels beside it, the round-2 ones (contiguous, strided) included.
        variants = [None, "blocked", "contiguous", "strided"] if len(inputs) == 1 else [None, "rows", "strided"]
        out = torch.empty_like(ref)
        for v in variants:
            out.fill_(float("nan"))
            fused(*inputs, out=out, variant=v)
            check(f"{opname}.{v}", out, ref)
            # Timed with a new output per call, as eager and torch.compile return one.
            ms = time_ms(lambda: fused(*inputs, variant=v))
            r.add(opname, v or "auto", shape, dtype, ms, cost, baseline="torch_eager", baseline_ms=base_ms)
        del ref, out
        torch.cuda.empty_cache()
