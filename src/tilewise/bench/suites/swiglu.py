"""SwiGLU's activation on a Llama MLP's projections (tokens x intermediate, bf16) beside HF's eager
formula, torch.compile of it (full runs) and Liger-Kernel's SiLU-mul (when its wheel is carried),
forward and forward + backward; then ``swiglu_packed`` on one (tokens, 2 x intermediate) projection
output, the others given its two halves (their gradients then come back as one tensor through
autograd's slicing)."""

from __future__ import annotations

import torch

from ...ops.pointwise import swiglu as op
from ..harness import check
from ._llama_ops import candidates, setup, time_rows


def run(r) -> None:
    shapes = [(16384, 14336)] if r.quick else [(16384, 14336), (32768, 8192), (4096, 28672)]
    dtype = torch.bfloat16
    g, compiled, lig = setup(r, op.reference, "ops.swiglu", "LigerSiLUMulFunction")
    compiled_packed = torch.compile(op.reference_packed, dynamic=False)
    for M, N in shapes:
        shape = f"{M}x{N}"
        gate = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        up = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        dy = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        ref = op.reference(gate.float(), up.float())
        cands = candidates(r, op.reference, compiled, op.swiglu, lig.apply if lig is not None else None)

        def check_out(name, y):
            check(f"swiglu {name}", y.float(), ref, dtype=dtype, tol=2e-2)

        for opname, backward in (("swiglu_fwd", False), ("swiglu_fwd_bwd", True)):
            time_rows(r, opname, shape, dtype, op.cost(M * N, dtype, backward=backward), cands, (gate, up), check_out,
                      backward, diff=(0, 1), grad_outputs=dy)
        del gate, up, ref
        gu = torch.randn(M, 2 * N, device="cuda", dtype=dtype, generator=g)
        ref = op.reference_packed(gu.float())

        def halves(fn):
            return lambda t: fn(*t.chunk(2, -1))

        cands = candidates(r, op.reference_packed, compiled_packed, op.swiglu_packed,
                           halves(lig.apply) if lig is not None else None)

        def check_packed(name, y):
            check(f"swiglu_packed {name}", y.float(), ref, dtype=dtype, tol=2e-2)

        for opname, backward in (("swiglu_packed_fwd", False), ("swiglu_packed_fwd_bwd", True)):
            time_rows(r, opname, shape, dtype, op.cost(M * N, dtype, backward=backward), cands, (gu,), check_packed,
                      backward, diff=(0,), grad_outputs=dy)
        del gu, dy, ref
        torch.cuda.empty_cache()
