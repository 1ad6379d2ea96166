"""RMSNorm (Llama's, bf16) beside HF's eager formula, torch.compile of it and Liger-Kernel's (when
its wheel is carried), forward and forward + backward, at (tokens, hidden) far larger than L2."""

from __future__ import annotations

import torch

from ...ops.norm import api as op
from ..harness import check, time_ms


def _liger(hidden: int, eps: float):
    """Liger-Kernel's RMSNorm in Llama mode, or None where it is not installed."""
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except ImportError:
        return None
    return LigerRMSNorm(hidden, eps=eps, offset=0.0, casting_mode="llama").cuda()


def run(r) -> None:
    shapes = [(16384, 4096)] if r.quick else [(16384, 4096), (32768, 2048), (8192, 8192), (4096, 16384)]
    dtype, eps = torch.bfloat16, 1e-6
    g = torch.Generator(device="cuda").manual_seed(0)
    compiled = torch.compile(op.reference, dynamic=False)
    for M, N in shapes:
        shape = f"{M}x{N}"
        x = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        w = (torch.rand(N, device="cuda", generator=g) + 0.5).to(dtype)
        dy = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
        ref = op.reference(x.float(), w.float(), eps).to(dtype)
        liger = _liger(N, eps)
        if liger is not None:
            liger.weight.data.copy_(w)
        cands = {"torch_eager": lambda a, b: op.reference(a, b, eps), "torch.compile": lambda a, b: compiled(a, b, eps),
                 "tilewise": lambda a, b: op.rms_norm(a, b, eps)}
        if r.quick:  # torch.compile's compile time would push gpu-check past 9 minutes
            del cands["torch.compile"]
        if liger is not None:
            cands["liger"] = lambda a, b: liger(a)
        else:
            r.log("  liger: not installed (carry its wheel in .whl/): no row")
        for opname, backward in (("rmsnorm_fwd", False), ("rmsnorm_fwd_bwd", True)):
            cost = op.cost(M, N, dtype, backward=backward)
            times = {}
            for name, fn in cands.items():
                r.status(f"{opname} {shape} {name}")
                check(f"rmsnorm {name}", fn(x, w).float(), ref.float(), dtype=dtype, tol=2e-2)
                if backward:
                    xi = x.detach().requires_grad_(True)
                    wi = liger.weight if name == "liger" else w.detach().requires_grad_(True)
                    ms = time_ms(lambda: torch.autograd.grad(fn(xi, wi), (xi, wi), dy))
                else:
                    ms = time_ms(lambda: fn(x, w))
                times[name] = ms
                base = next((b for b in ("torch.compile", "torch_eager") if b != name and b in times), "")
                r.add(opname, name, shape, dtype, ms, cost, baseline=base,
                      baseline_ms=times.get(base) if base else None)
        del x, w, dy, ref
        torch.cuda.empty_cache()
