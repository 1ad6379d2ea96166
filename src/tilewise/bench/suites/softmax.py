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


def _cluster_skip(name: str, N: int) -> str | None:
    """Why v4_cluster is not run at this row length (its multi-CTA kernel does not build on this
    Triton), else None. Rows of <= 16384 are one CTA: the v2 kernel, always built."""
    if name != "v4_cluster" or N <= op.CLUSTER_SLICE:
        return None
    return op.cluster_unsupported_reason()


def run(r) -> None:
    dtypes = [torch.bfloat16] if r.quick else [torch.bfloat16, torch.float32]
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in dtypes:
        for M, N in _shapes(r.quick):
            shape = f"{M}x{N}"
            r.status(f"softmax {shape} {dtype}")
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
                why = _cluster_skip(name, N)
                if why:
                    r.log(f"  softmax.v4_cluster {shape} {dtype} skipped: {why}")
                    continue
                y.fill_(float("nan"))
                try:
                    fn(x, y)
                    check(f"softmax.{name}", y, ref)
                except Exception as e:  # v4_cluster is experimental: keep the other rows
                    if name != "v4_cluster":
                        raise
                    r.log(f"  softmax.v4_cluster {shape} {dtype} FAILED, not timed: {e}")
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
            dx = None
            for name, fn in op.BACKWARD_VARIANTS.items():
                if (not _applies(name, N, x, "bwd") or name == "v1_unfused" and r.quick
                        or _cluster_skip(name, N)):
                    continue
                try:
                    dx = fn(ref, dy)
                    check(f"softmax_bwd.{name}", dx, dref)
                except Exception as e:
                    if name != "v4_cluster":
                        raise
                    r.log(f"  softmax_bwd.v4_cluster {shape} {dtype} FAILED, not timed: {e}")
                    continue
                ms = time_ms(lambda: fn(ref, dy))
                r.add("softmax_bwd", name, shape, dtype, ms, bcost, baseline="torch",
                      baseline_ms=tb)
            del dx, dref, dy

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
