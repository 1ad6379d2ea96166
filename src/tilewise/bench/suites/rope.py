"""RoPE on Llama's q and k (32 / 8 heads, D = 128, bf16, Llama 3 frequencies) beside HF's eager
formula, torch.compile of it and Liger-Kernel's (when its wheel is carried), forward and forward +
backward, at (B, S) = (4, 4096)."""

from __future__ import annotations

import torch

from ...ops.rope import api as op
from ..harness import check, time_ms


def _liger():
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        return None
    return liger_rotary_pos_emb


def run(r) -> None:
    shapes = [(4, 32, 8, 4096, 128)] if r.quick else [(4, 32, 8, 4096, 128), (1, 32, 8, 16384, 128),
                                                       (8, 16, 16, 2048, 64)]
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    compiled = torch.compile(op.reference, dynamic=False)
    liger = _liger()
    if liger is None:
        r.log("  liger: not installed (carry its wheel in .whl/): no row")
    for B, Hq, Hk, S, D in shapes:
        shape = f"B={B},Hq={Hq},Hk={Hk},S={S},D={D}"
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(B, Hk, S, D, device="cuda", dtype=dtype, generator=g)
        pos = torch.arange(S, device="cuda", dtype=torch.float32)
        inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
        emb = torch.cat([pos[:, None] * inv[None, :]] * 2, -1)[None]
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        rq, rk = op.reference(q.float(), k.float(), cos.float(), sin.float())
        cands = {"torch_eager": op.reference, "torch.compile": compiled, "tilewise": op.apply_rotary}
        if r.quick:  # torch.compile's compile time would push gpu-check past 9 minutes
            del cands["torch.compile"]
        if liger is not None:
            cands["liger"] = liger
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        for opname, backward in (("rope_fwd", False), ("rope_fwd_bwd", True)):
            cost = op.cost(B, Hq, Hk, S, D, dtype)
            if backward:
                cost = type(cost)(2 * cost.flops, 2 * cost.bytes)
            times = {}
            for name, fn in cands.items():
                r.status(f"{opname} {shape} {name}")
                oq, ok = fn(q, k, cos, sin)
                check(f"rope {name} q", oq.float(), rq, dtype=dtype, tol=2e-2)
                check(f"rope {name} k", ok.float(), rk, dtype=dtype, tol=2e-2)
                if backward:
                    qi, ki = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
                    ms = time_ms(lambda: torch.autograd.grad(fn(qi, ki, cos, sin), (qi, ki), (gq, gk)))
                else:
                    ms = time_ms(lambda: fn(q, k, cos, sin))
                times[name] = ms
                base = next((b for b in ("torch.compile", "torch_eager") if b != name and b in times), "")
                r.add(opname, name, shape, dtype, ms, cost, baseline=base,
                      baseline_ms=times.get(base) if base else None)
        del q, k, rq, rk, gq, gk
        torch.cuda.empty_cache()
