"""RMSNorm (Llama's, bf16) beside HF's eager formula, torch.compile of it (full runs) and Liger-Kernel's
(when its wheel is carried), forward and forward + backward, at (tokens, hidden) far larger than L2."""

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
