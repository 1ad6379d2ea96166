"""SwiGLU's activation on a Llama MLP's projections (tokens x intermediate, bf16) beside HF's eager
formula, torch.compile of it and Liger-Kernel's SiLU-mul (when its wheel is carried), forward and
forward + backward."""

from __future__ import annotations

import torch

from ...ops.pointwise import swiglu as op
from ..harness import check, time_ms


def _liger():
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError:
        return None
    return LigerSiLUMulFunction.apply


def run(r) -> None:
    shapes = [(16384, 14336)] if r.quick else [(16384, 14336), (32768, 8192), (4096, 28672)]
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    compiled = torch.compile(op.reference, dynamic=False)
    liger = _liger()
    if liger is None:
        r.log("  liger: not installed (carry its wheel in .whl/): no row")
    for M, N in shapes:
        shape = f"{M}x{N}"
        gate = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        up = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        dy = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        ref = op.reference(gate.float(), up.float())
        cands = {"torch_eager": op.reference, "torch.compile": compiled, "tilewise": op.swiglu}
        if r.quick:  # torch.compile's compile time would push gpu-check past 9 minutes
            del cands["torch.compile"]
        if liger is not None:
            cands["liger"] = liger
        for opname, backward in (("swiglu_fwd", False), ("swiglu_fwd_bwd", True)):
            cost = op.cost(M * N, dtype, backward=backward)
            times = {}
            for name, fn in cands.items():
                r.status(f"{opname} {shape} {name}")
                check(f"swiglu {name}", fn(gate, up).float(), ref, dtype=dtype, tol=2e-2)
                if backward:
                    gi, ui = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
                    ms = time_ms(lambda: torch.autograd.grad(fn(gi, ui), (gi, ui), dy))
                else:
                    ms = time_ms(lambda: fn(gate, up))
                times[name] = ms
                base = next((b for b in ("torch.compile", "torch_eager") if b != name and b in times), "")
                r.add(opname, name, shape, dtype, ms, cost, baseline=base,
                      baseline_ms=times.get(base) if base else None)
        del gate, up, dy, ref
        torch.cuda.empty_cache()
