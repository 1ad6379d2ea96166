"""softmax and log-softmax, forward and backward, beside torch.softmax and its torch.compile.

Rows per shape: a plain copy of the input (the bandwidth bar of this run), torch.softmax and
torch.compile(torch.softmax) forward, each of our versions forward (baseline torch.softmax),
PyTorch's softmax backward and ours (op softmax_bwd), and the default log-softmax forward.
"""

from __future__ import annotations

import torch

from ...cost import Cost
from ...ops.rowwise import cluster as rc
from ...ops.rowwise import softmax as op
from ..harness import check, time_ms
from . import _rowwise as rw


def _shapes(quick: bool):
    big = [(32768, 4096), (4096, 131072)]
    return big if quick else big + [(1024, 262147), (65536, 1000)]


def _applies(name: str, N: int, x: torch.Tensor | None = None, kind: str = "fwd") -> bool:
    if name == "v5_cluster_cuda":
        return x is not None and N > op.MAX_FUSED and rc.unsupported_reason(x.view(-1, N), kind=kind) is None
    if name == "v7_cluster_tma":  # forward only (its backward is v5's)
        return (x is not None and kind == "fwd" and N > op.MAX_FUSED
                and rc.tma_unsupported_reason(x.view(-1, N), kind=kind) is None)
    if name == "v6_cluster_pipe":  # forward only (its backward row would repeat v5's)
        return (x is not None and kind == "fwd" and N > op.MAX_FUSED
                and rc.pipe_unsupported_reason(x.view(-1, N), kind=kind) is None)
    return not (name == "v2_fused" and N > op.MAX_FUSED or name == "v4_cluster" and N > op.MAX_CLUSTER)


def run(r) -> None:
    for dtype, M, N, shape, g in rw.cases(r, "softmax", _shapes(r.quick)):
        x = torch.randn(M, N, device="cuda", dtype=dtype, generator=g) * 2
        y = torch.empty_like(x)
        b = x.element_size()

        copy_ms = time_ms(lambda: y.copy_(x))
        r.add("copy", "torch.copy_", shape, dtype, copy_ms, Cost(0, 2 * M * N * b))

        cost = op.cost(M, N, dtype)
        base_ms = time_ms(lambda: torch.softmax(x, -1))
        r.add("softmax", "torch.softmax", shape, dtype, base_ms, cost)
        compiled = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
        compiled(x)
        r.add("softmax", "torch.compile", shape, dtype, time_ms(lambda: compiled(x)), cost)

        ref = op.reference(x)
        for name, fn in op.VARIANTS.items():
            if not _applies(name, N, x):
                continue
            why = rw.cluster_skip(name, N)
            if why:
                r.log(f"  softmax.v4_cluster {shape} {dtype} skipped: {why}")
                continue
            y.fill_(float("nan"))

            def run_checks():
                fn(x, y)
                check(f"softmax.{name}", y, ref)

            if not rw.checked(r, "softmax", name, shape, dtype, run_checks):
                continue
            ms = time_ms(lambda: fn(x, y))
            r.add("softmax", name, shape, dtype, ms, cost, baseline="torch.softmax",
                  baseline_ms=base_ms)

        # Backward: dx from y and dy.
        dy = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        bcost = op.cost(M, N, dtype, backward=True)
        tb = time_ms(lambda: torch._softmax_backward_data(dy, ref, -1, dtype))
        r.add("softmax_bwd", "torch", shape, dtype, tb, bcost)
        dref = op.reference_backward(ref, dy)
        for name, fn in op.BACKWARD_VARIANTS.items():
            if (not _applies(name, N, x, "bwd") or name == "v1_unfused" and r.quick
                    or rw.cluster_skip(name, N)):
                continue
            if not rw.checked(r, "softmax_bwd", name, shape, dtype,
                              lambda: check(f"softmax_bwd.{name}", fn(ref, dy), dref)):
                continue
            ms = time_ms(lambda: fn(ref, dy))
            r.add("softmax_bwd", name, shape, dtype, ms, bcost, baseline="torch",
                  baseline_ms=tb)
        del dref, dy

        # log-softmax, default version only (same kernels with LOG=True).
        lb = time_ms(lambda: torch.log_softmax(x, -1))
        r.add("log_softmax", "torch.log_softmax", shape, dtype, lb, cost)
        v = op.default_variant(x)
        fn = op.LOG_VARIANTS[v]
        y.fill_(float("nan"))
        fn(x, y)
        check(f"log_softmax.{v}", y, op.reference(x, log=True))
        r.add("log_softmax", v, shape, dtype, time_ms(lambda: fn(x, y)), cost,
              baseline="torch.log_softmax", baseline_ms=lb)
        del x, y, ref
        torch.cuda.empty_cache()
