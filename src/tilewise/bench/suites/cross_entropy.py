"""cross_entropy forward + backward (the gradient of the mean loss w.r.t. the logits), beside
F.cross_entropy and its torch.compile; forward only (no grad) as well; peak extra memory logged.

Each timed call returns the gradient through torch.autograd.grad (no accumulation into .grad).
Our calls include one host sync (the target range check, tens of microseconds).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...ops.rowwise import cross_entropy as op
from ...ops.rowwise import cluster as rc
from ..harness import check, peak_extra_bytes, time_ms
from . import _rowwise as rw


def _shapes(quick: bool):
    return [(8192, 131072)] if quick else [(8192, 131072), (16384, 32000), (65536, 2)]


def run(r) -> None:
    for dtype, N, C, shape, g in rw.cases(r, "cross_entropy", _shapes(r.quick)):
        x = (torch.randn(N, C, device="cuda", dtype=dtype, generator=g) * 2).requires_grad_()
        t = torch.randint(0, C, (N,), device="cuda", generator=g)
        cost = op.cost(N, C, dtype, grad=True)
        grad_bytes = N * C * x.element_size()

        xr = x.detach().float().requires_grad_()
        ref_loss = F.cross_entropy(xr, t)
        (ref_grad,) = torch.autograd.grad(ref_loss, xr)
        del xr

        def eager():
            return torch.autograd.grad(F.cross_entropy(x, t), x)[0]

        base_ms = time_ms(eager)
        r.add("cross_entropy", "F.cross_entropy", shape, dtype, base_ms, cost)
        r.log(f"  F.cross_entropy fwd+bwd peak extra memory: {peak_extra_bytes(eager) / 2**30:.2f} GiB "
              f"(gradient {grad_bytes / 2**30:.2f} GiB)")

        compiled_loss = torch.compile(lambda a, b: F.cross_entropy(a, b), dynamic=False)

        def comp():
            return torch.autograd.grad(compiled_loss(x, t), x)[0]

        comp()
        r.add("cross_entropy", "torch.compile", shape, dtype, time_ms(comp), cost)

        for name in ("v2_fused", "v3_online", "v4_cluster", "v5_cluster_cuda", "v6_cluster_pipe", "v7_cluster_tma"):
            if name == "v2_fused" and C > op.MAX_FUSED or name == "v4_cluster" and C > op.MAX_CLUSTER:
                continue
            if name == "v5_cluster_cuda" and (C <= op.MAX_FUSED or rc.unsupported_reason(x, kind="ce")):
                continue
            if name == "v6_cluster_pipe" and (C <= op.MAX_FUSED or rc.pipe_unsupported_reason(x, kind="ce")):
                continue
            if name == "v7_cluster_tma" and (C <= op.MAX_FUSED or rc.tma_unsupported_reason(x, kind="ce")):
                continue
            why = rw.cluster_skip(name, C)
            if why:
                r.log(f"  cross_entropy.v4_cluster {shape} {dtype} skipped: {why}")
                continue

            def ours(name=name):
                return torch.autograd.grad(op.cross_entropy(x, t, variant=name), x)[0]

            def run_checks():
                loss = op.cross_entropy(x, t, variant=name)
                check(f"cross_entropy.{name} loss", loss.float(), ref_loss, dtype=dtype)
                check(f"cross_entropy.{name} grad", ours(), ref_grad, dtype=dtype)

            if not rw.checked(r, "cross_entropy", name, shape, dtype, run_checks):
                continue
            ms = time_ms(ours)
            r.add("cross_entropy", name, shape, dtype, ms, cost, baseline="F.cross_entropy",
                  baseline_ms=base_ms)
            r.log(f"  {name} fwd+bwd peak extra memory: {peak_extra_bytes(ours) / 2**30:.2f} GiB "
                  f"(gradient {grad_bytes / 2**30:.2f} GiB)")

        # The kernel alone (loss + gradient, no autograd, still the target check's host sync):
        # tells the kernel's time from the autograd wrapper's.
        kernels = [op.default_variant(x)]
        if C > op.MAX_FUSED and not rc.unsupported_reason(x, kind="ce"):
            kernels.append("v5_cluster_cuda")
        if C > op.MAX_FUSED and not rc.pipe_unsupported_reason(x, kind="ce"):
            kernels.append("v6_cluster_pipe")
        for v in dict.fromkeys(kernels):
            ms = time_ms(lambda v=v: op._launch(x.detach(), t, "mean", -100, 0.0, True, v))
            r.add("cross_entropy_kernel", v, shape, dtype, ms, cost, baseline="F.cross_entropy",
                  baseline_ms=base_ms)

        # Forward only, no gradient wanted: one read of the logits.
        fcost = op.cost(N, C, dtype, grad=False)
        with torch.no_grad():
            fb = time_ms(lambda: F.cross_entropy(x, t))
            r.add("cross_entropy_fwd", "F.cross_entropy", shape, dtype, fb, fcost)
            v = op.default_variant(x)
            check(f"cross_entropy_fwd.{v}", op.cross_entropy(x, t, variant=v).float(), ref_loss,
                  dtype=dtype)
            ms = time_ms(lambda: op.cross_entropy(x, t, variant=v))
            r.add("cross_entropy_fwd", v, shape, dtype, ms, fcost, baseline="F.cross_entropy",
                  baseline_ms=fb)
        del x, t, ref_grad
        torch.cuda.empty_cache()
