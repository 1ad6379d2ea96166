"""Rotary position embeddings: ``apply_rotary(q, k, cos, sin)``, its reference and cost.

    v1_reference: PyTorch, HF's ``apply_rotary_pos_emb`` (``x * cos + rotate_half(x) * sin``; five
                  passes and temporaries).
    v2_fused:     one Triton kernel (``triton_kernels``): a program per (batch, position) reads that
                  position's cos and sin once and rotates every head of q and k; the backward is the
                  same kernel with the rotation transposed. Bound: bytes (q and k read and written once).

cos and sin are what HF's rotary embedding modules return (Llama 3's frequency scaling included), so
any scaling they apply carries over.
"""

from __future__ import annotations

import torch

from ...cost import Cost
from ...runtime.triton_launch import launch as _launch
from .._checks import check_kernel_inputs, runs_reference
from .._custom import eager_twin
from .configs import launch_for

def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def reference(q, k, cos, sin):
    """v1_reference: HF's apply_rotary_pos_emb with unsqueeze_dim=1 (cos, sin (B or 1, S, D))."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def cost(B: int, Hq: int, Hk: int, S: int, D: int, dtype: torch.dtype = torch.bfloat16) -> Cost:
    """q and k read and written once, cos and sin read once (B = 1's rows); 6 FLOPs an element."""
    e = B * (Hq + Hk) * S * D
    return Cost(6.0 * e, 2 * e * dtype.itemsize + 2 * S * D * dtype.itemsize)


def _check(q, k, cos, sin, cpu=False):
    check_kernel_inputs("apply_rotary", {"q": q, "k": k, "cos": cos, "sin": sin}, every=True, interpreter=True,
                        cpu=cpu)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"apply_rotary: 'q' {tuple(q.shape)} and 'k' {tuple(k.shape)} must be (B, heads, S, D)")
    B, _, S, D = q.shape
    if k.shape[0] != B or k.shape[2:] != (S, D):
        raise ValueError(f"apply_rotary: 'k' has shape {tuple(k.shape)}; 'q' {tuple(q.shape)} needs (B, Hk, S, D) "
                         f"with B={B}, S={S}, D={D}")
    if D % 2 or D == 0:
        raise ValueError(f"apply_rotary: 'q' has head dim D={D}; it must be even (two halves rotate)")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3 or t.shape[0] not in (1, B) or t.shape[1:] != (S, D):
            raise ValueError(f"apply_rotary: '{name}' has shape {tuple(t.shape)}; expected ({B} or 1, {S}, {D})")


def _unit(t):
    return t if t.stride(-1) == 1 else t.contiguous()  # the kernel walks the head dim densely


def _rotate(q, k, cos, sin, backward):
    q, k = _unit(q), _unit(k)
    B, Hq, S, D = q.shape
    Hk = k.shape[1]
    qo = torch.empty_like(q, memory_format=torch.contiguous_format)
    ko = torch.empty_like(k, memory_format=torch.contiguous_format)
    if B * S == 0 or q.numel() + k.numel() == 0:
        return qo, ko
    half = D // 2
    L = launch_for(Hq, Hk, half)
    if sin.shape[0] != cos.shape[0]:
        cos, sin = cos.expand(B, S, D), sin.expand(B, S, D)
    cos, sin = cos.contiguous(), sin.contiguous()  # (S x D a row of the batch: small beside q and k)
    sc_b = S * D if cos.shape[0] > 1 else 0
    from . import triton_kernels as K

    _launch(K._rope_kernel, (B * S,),
            q, k, qo, ko, cos, sin, S, Hq, Hk, half,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
            sc_b, D, HB=L.HB, DB=L.DB, BACKWARD=backward, num_warps=L.warps)
    return qo, ko


@torch.library.custom_op("tilewise::apply_rotary", mutates_args=())
def _op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _rotate(q, k, cos, sin, backward)


@_op.register_fake
def _(q, k, cos, sin, backward):
    c = torch.contiguous_format
    return torch.empty_like(q, memory_format=c), torch.empty_like(k, memory_format=c)


def _setup(ctx, inputs, output):
    q, k, cos, sin, _ = inputs
    ctx.save_for_backward(cos, sin)
    ctx.shapes = (q.shape, q.dtype, k.shape, k.dtype)


def _grad(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    qs, qd, ks, kd = ctx.shapes
    dq = cos.new_zeros(qs, dtype=qd) if dq is None else dq  # (only one of the outputs was used)
    dk = cos.new_zeros(ks, dtype=kd) if dk is None else dk
    rot = _rotate if getattr(ctx, "eager", False) else _op
    gq, gk = rot(dq, dk, cos, sin, True)
    return gq, gk, None, None, None


_op.register_autograd(_grad, setup_context=_setup)


_Eager = eager_twin("_Eager", lambda q, k, cos, sin, _backward: _rotate(q, k, cos, sin, False), _setup, _grad)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """HF's ``apply_rotary_pos_emb(q, k, cos, sin)`` in one kernel, differentiable in q and k.

    q:   (B, Hq, S, D) CUDA tensor, float32 / float16 / bfloat16, D even, any strides (a copy if the
         last dim is strided). CPU tensors run the PyTorch reference (fp32 inside).
    k:   (B, Hk, S, D), q's device (GQA: Hk may differ from Hq).
    cos, sin: (B or 1, S, D), as HF's rotary embedding modules return them (halves equal or not).
    Returns (q_embed, k_embed), new contiguous tensors in q's and k's dtypes; no gradient for cos
    and sin. Under ``torch.compile`` it is the custom op ``torch.ops.tilewise.apply_rotary``.
    """
    cpu = runs_reference("apply_rotary", {"q": q, "k": k, "cos": cos, "sin": sin}, interpreter=True)
    _check(q, k, cos, sin, cpu=cpu)
    if cpu:
        qe, ke = reference(q.float(), k.float(), cos.float(), sin.float())  # fp32 inside, as the kernel
        return qe.to(q.dtype), ke.to(k.dtype)
    if torch.compiler.is_compiling():
        return _op(q, k, cos, sin, False)
    return _Eager.apply(q, k, cos, sin, False)


def v1_reference(q, k, cos, sin):
    return reference(q, k, cos, sin)


VARIANTS = {"v1_reference": v1_reference, "v2_fused": apply_rotary}
