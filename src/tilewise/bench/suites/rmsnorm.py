"""RMSNorm (Llama's, bf16) beside HF's eager formula, torch.compile of it (full runs) and Liger-Kernel's
(when its wheel is carried), forward and forward + backward, at (tokens, hidden) far larger than L2.
Then the residual add before it (``add_rms_norm``, rows add_rmsnorm_*): against the model's add and
HF's formula, torch.compile of both, and the add with Liger's RMSNorm (Liger has no fused add); the
forward + backward rows use both outputs, so the sum's gradient is added in."""

from __future__ import annotations

import torch

from ...ops.norm import api as op
from ..harness import check
from ._llama_ops import candidates, setup, time_rows


def run(r) -> None:
    shapes = [(16384, 4096)] if r.quick else [(16384, 4096), (32768, 2048), (8192, 8192), (4096, 16384)]
    dtype, eps = torch.bfloat16, 1e-6
    g, compiled, liger_cls = setup(r, op.reference, "transformers.rms_norm", "LigerRMSNorm")
    for M, N in shapes:
        shape = f"{M}x{N}"
        x = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        w = (torch.rand(N, device="cuda", generator=g) + 0.5).to(dtype)
        dy = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        ref = op.reference(x.float(), w.float(), eps).to(dtype)
        lig = None
        if liger_cls is not None:
            m = liger_cls(N, eps=eps, offset=0.0, casting_mode="llama").cuda()
            m.weight.data.copy_(w)
            lig = lambda a, b: m(a)  # noqa: E731 - its own weight, a copy of w
        cands = candidates(r, lambda a, b: op.reference(a, b, eps), lambda a, b: compiled(a, b, eps),
                           lambda a, b: op.rms_norm(a, b, eps), lig)

        def check_out(name, y):
            check(f"rmsnorm {name}", y.float(), ref.float(), dtype=dtype, tol=2e-2)

        for opname, backward in (("rmsnorm_fwd", False), ("rmsnorm_fwd_bwd", True)):
            time_rows(r, opname, shape, dtype, op.cost(M, N, dtype, backward=backward), cands, (x, w), check_out,
                      backward, diff=(0, 1), grad_outputs=dy)
        del x, w, dy, ref
        torch.cuda.empty_cache()
    _add_rows(r, [(16384, 2048)] if r.quick else [(16384, 2048), (16384, 4096)], dtype, eps, g, liger_cls)


def _add_rows(r, shapes, dtype, eps, g, liger_cls) -> None:
    compiled = torch.compile(op.add_reference, dynamic=False)
    for M, N in shapes:
        shape = f"{M}x{N}"
        x, res, dy, ds = (torch.randn(M, N, device="cuda", dtype=dtype, generator=g) for _ in range(4))
        w = (torch.rand(N, device="cuda", generator=g) + 0.5).to(dtype)
        ref = op.add_reference(x.float(), res.float(), w.float(), eps)
        lig = None
        if liger_cls is not None:
            m = liger_cls(N, eps=eps, offset=0.0, casting_mode="llama").cuda()
            m.weight.data.copy_(w)

            def lig(a, b, c):
                s = a + b
                return m(s), s

        cands = candidates(r, lambda a, b, c: op.add_reference(a, b, c, eps), lambda a, b, c: compiled(a, b, c, eps),
                           lambda a, b, c: op.add_rms_norm(a, b, c, eps), lig)

        def check_out(name, out):
            for what, got, want in zip(("y", "sum"), out, ref):
                check(f"add_rmsnorm {name} {what}", got.float(), want.float(), dtype=dtype, tol=2e-2)

        for opname, backward in (("add_rmsnorm_fwd", False), ("add_rmsnorm_fwd_bwd", True)):
            time_rows(r, opname, shape, dtype, op.cost(M, N, dtype, backward=backward, residual=True), cands,
                      (x, res, w), check_out, backward, diff=(0, 1, 2), grad_outputs=(dy, ds))
        del x, res, dy, ds, w, ref
        torch.cuda.empty_cache()
