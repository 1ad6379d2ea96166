"""RoPE on Llama's q and k (32 / 8 heads, D = 128, bf16, Llama 3's base frequency) beside HF's eager
formula, torch.compile of it (full runs) and Liger-Kernel's (when its wheel is carried), forward and
forward + backward, at (B, S) = (4, 4096). Then ``apply_rotary_qkv`` (rows rope_qkv_*) on a fused
projection's output at Llama-3.2-1B's attention (32 / 8 heads, D = 64): against HF's formula on the
three column blocks (what a fused projection gives HF's attention), torch.compile of it and Liger's
RoPE on the blocks; the backward's rows produce the gradient of the fused output."""

from __future__ import annotations

import torch

from ...cost import Cost
from ...ops.rope import api as op
from ..harness import check
from ._llama_ops import candidates, setup, time_rows


def _cos_sin(S: int, D: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, S, D) cos and sin as HF's rotary embedding gives them, Llama 3's base frequency (500000)."""
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
    emb = torch.cat([torch.arange(S, device="cuda", dtype=torch.float32)[:, None] * inv[None, :]] * 2, -1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def run(r) -> None:
    shapes = [(4, 32, 8, 4096, 128)] if r.quick else [(4, 32, 8, 4096, 128), (1, 32, 8, 16384, 128),
                                                       (8, 16, 16, 2048, 64)]
    dtype = torch.bfloat16
    g, compiled, lig = setup(r, op.reference, "transformers.rope", "liger_rotary_pos_emb")
    for B, Hq, Hk, S, D in shapes:
        shape = f"B={B},Hq={Hq},Hk={Hk},S={S},D={D}"
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(B, Hk, S, D, device="cuda", dtype=dtype, generator=g)
        cos, sin = _cos_sin(S, D, dtype)
        rq, rk = op.reference(q.float(), k.float(), cos.float(), sin.float())
        cands = candidates(r, op.reference, compiled, op.apply_rotary, lig)

        def check_out(name, out):
            check(f"rope {name} q", out[0].float(), rq, dtype=dtype, tol=2e-2)
            check(f"rope {name} k", out[1].float(), rk, dtype=dtype, tol=2e-2)

        grads = (torch.randn_like(q), torch.randn_like(k))
        for opname, backward in (("rope_fwd", False), ("rope_fwd_bwd", True)):
            cost = op.cost(B, Hq, Hk, S, D, dtype)
            if backward:  # the backward is the same rotation again
                cost = Cost(2 * cost.flops, 2 * cost.bytes)
            time_rows(r, opname, shape, dtype, cost, cands, (q, k, cos, sin), check_out, backward, diff=(0, 1),
                      grad_outputs=grads)
        del q, k, rq, rk, grads
        torch.cuda.empty_cache()
    _qkv_rows(r, [(4, 4096, 32, 8, 64)] if r.quick else [(4, 4096, 32, 8, 64), (1, 16384, 32, 8, 64)], dtype, g, lig)


def _qkv_rows(r, shapes, dtype, g, lig) -> None:
    compiled = torch.compile(op.qkv_reference, dynamic=False)
    for B, S, Hq, Hk, D in shapes:
        shape = f"B={B},S={S},Hq={Hq},Hk={Hk},D={D}"
        qkv = torch.randn(B, S, (Hq + 2 * Hk) * D, device="cuda", dtype=dtype, generator=g)
        cos, sin = _cos_sin(S, D, dtype)
        ref = op.qkv_reference(qkv.float(), cos.float(), sin.float(), Hq, Hk)
        liger_fn = None
        if lig is not None:
            def liger_fn(x, c, s_, hq, hk):
                q, k, v = op._split(x, hq, hk)
                return (*lig(q, k, c, s_), v)

        cands = candidates(r, op.qkv_reference, compiled, op.apply_rotary_qkv, liger_fn)

        def check_out(name, out):
            for what, got, want in zip("qkv", out, ref):
                check(f"rope_qkv {name} {what}", got.float(), want, dtype=dtype, tol=2e-2)

        grads = tuple(torch.randn(t.shape, device="cuda", dtype=dtype, generator=g) for t in ref)
        for opname, backward in (("rope_qkv_fwd", False), ("rope_qkv_fwd_bwd", True)):
            e = qkv.numel() * qkv.element_size()  # q, k, v read and written once a direction
            cost = Cost((4 if backward else 2) * 3.0 * B * S * (Hq + Hk) * D, (4 if backward else 2) * e)
            time_rows(r, opname, shape, dtype, cost, cands, (qkv, cos, sin, Hq, Hk), check_out, backward, diff=(0,),
                      grad_outputs=grads)
        del qkv, ref, grads
        torch.cuda.empty_cache()
