"""Rotary position embeddings: ``apply_rotary(q, k, cos, sin)``, its reference and cost.

    v1_reference: PyTorch, HF's ``apply_rotary_pos_emb`` (``x * cos + rotate_half(x) * sin``; five
                  passes and temporaries).
    v2_fused:     one Triton kernel (``triton_kernels``): a program per (batch, position) reads that
                  position's cos and sin once and rotates every head of q and k; the backward is the
                  same kernel with the rotation transposed. Bound: bytes (q and k read and written once).

cos and sin are what HF's rotary embedding modules return (Llama 3's frequency scaling included), so
any scaling they apply carries over.

``apply_rotary_qkv(qkv, cos, sin, num_heads, num_kv_heads)``: the same kernel on a fused q / k / v
projection's output (one GEMM instead of three), v copied in the same pass; its backward writes the
one gradient of qkv, so the projection's input gradient is one GEMM too, with no sums of three.
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


def _run(q, k, qo, ko, cos, sin, backward, v=None, vo=None):
    """The kernel over (B, heads, S, D) views of any strides with unit last stride: q, k rotated into qo,
    ko; v copied into vo where given (k's heads)."""
    B, Hq, S, D = q.shape
    Hk = k.shape[1]
    if B * S == 0 or q.numel() + k.numel() == 0:
        return
    half = D // 2
    L = launch_for(Hq, Hk, half)
    if sin.shape[0] != cos.shape[0]:
        cos, sin = cos.expand(B, S, D), sin.expand(B, S, D)
    cos, sin = cos.contiguous(), sin.contiguous()  # (S x D a row of the batch: small beside q and k)
    sc_b = S * D if cos.shape[0] > 1 else 0
    has_v = v is not None
    v, vo = (v, vo) if has_v else (q, qo)
    from . import triton_kernels as K

    _launch(K._rope_kernel, (B * S,),
            q, k, qo, ko, cos, sin, S, Hq, Hk, half,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
            sc_b, D, v, vo, v.stride(0), v.stride(1), v.stride(2), vo.stride(0), vo.stride(1), vo.stride(2),
            HB=L.HB, DB=L.DB, BACKWARD=backward, HAS_V=has_v, num_warps=L.warps)


def _rotate(q, k, cos, sin, backward):
    q, k = _unit(q), _unit(k)
    qo = torch.empty_like(q, memory_format=torch.contiguous_format)
    ko = torch.empty_like(k, memory_format=torch.contiguous_format)
    _run(q, k, qo, ko, cos, sin, backward)
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


def _heads(t, heads):
    """(B, S, heads * D) columns as (B, heads, S, D) (a view)."""
    return t.unflatten(-1, (heads, t.shape[-1] // heads)).transpose(1, 2)


def _split(qkv, num_heads, num_kv_heads):
    D = qkv.shape[-1] // (num_heads + 2 * num_kv_heads)
    nq, nk = num_heads * D, num_kv_heads * D
    return (_heads(qkv[..., :nq], num_heads), _heads(qkv[..., nq:nq + nk], num_kv_heads),
            _heads(qkv[..., nq + nk:], num_kv_heads))


def qkv_reference(qkv, cos, sin, num_heads, num_kv_heads):
    """``apply_rotary_qkv``'s reference: the three column blocks as HF's projections' outputs, then HF's RoPE."""
    q, k, v = _split(qkv, num_heads, num_kv_heads)
    qe, ke = reference(q, k, cos, sin)
    return qe, ke, v


def _seq_major(B, heads, S, D, like):
    return torch.empty((B, S, heads, D), dtype=like.dtype, device=like.device).transpose(1, 2)


def _qkv_forward(qkv, cos, sin, num_heads, num_kv_heads):
    q, k, v = _split(qkv, num_heads, num_kv_heads)
    B, _, S, D = q.shape
    qo, ko, vo = (_seq_major(B, h, S, D, qkv) for h in (num_heads, num_kv_heads, num_kv_heads))
    _run(q, k, qo, ko, cos, sin, False, v, vo)
    return qo, ko, vo


def _qkv_backward(dq, dk, dv, cos, sin):
    B, Hq, S, D = dq.shape
    Hk = dk.shape[1]
    g = torch.empty((B, S, (Hq + 2 * Hk) * D), dtype=dq.dtype, device=dq.device)
    gq, gk, gv = _split(g, Hq, Hk)
    _run(_unit(dq), _unit(dk), gq, gk, cos, sin, True, _unit(dv), gv)
    return g


@torch.library.custom_op("tilewise::apply_rotary_qkv", mutates_args=())
def _qkv_op(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
            num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _qkv_forward(qkv, cos, sin, num_heads, num_kv_heads)


@_qkv_op.register_fake
def _(qkv, cos, sin, num_heads, num_kv_heads):
    B, S, W = qkv.shape
    D = W // (num_heads + 2 * num_kv_heads)
    return tuple(_seq_major(B, h, S, D, qkv) for h in (num_heads, num_kv_heads, num_kv_heads))


@torch.library.custom_op("tilewise::apply_rotary_qkv_bwd", mutates_args=())
def _qkv_bwd_op(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
    return _qkv_backward(dq, dk, dv, cos, sin)


@_qkv_bwd_op.register_fake
def _(dq, dk, dv, cos, sin):
    B, Hq, S, D = dq.shape
    return dq.new_empty((B, S, (Hq + 2 * dk.shape[1]) * D))


def _qkv_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], inputs[2])
    ctx.outs = tuple((o.shape, o.dtype) for o in output)


def _qkv_grad(ctx, dq, dk, dv):
    cos, sin = ctx.saved_tensors
    dq, dk, dv = (cos.new_zeros(sh, dtype=dt) if g is None else g for g, (sh, dt) in zip((dq, dk, dv), ctx.outs))
    bwd = _qkv_backward if getattr(ctx, "eager", False) else _qkv_bwd_op
    return bwd(dq, dk, dv, cos, sin), None, None, None, None


_qkv_op.register_autograd(_qkv_grad, setup_context=_qkv_setup)


_QKVEager = eager_twin("_QKVEager", _qkv_forward, _qkv_setup, _qkv_grad)


def apply_rotary_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int):
    """RoPE on a fused q / k / v projection's output, and the attention's three inputs out of it, in one
    kernel each way; differentiable in qkv.

    qkv:  (B, S, (num_heads + 2 * num_kv_heads) * D) CUDA tensor, float32 / float16 / bfloat16, D even:
          ``x @ torch.cat([Wq, Wk, Wv]).T`` (columns q, then k, then v, each heads x D).
    cos, sin: (B or 1, S, D), as HF's rotary embedding modules return them.
    Returns (q, k, v): q (B, num_heads, S, D) and k (B, num_kv_heads, S, D) rotated, v (B, num_kv_heads,
    S, D) copied; each (B, S, heads, D) in memory (what ``flash_attention`` reads in place). The backward
    writes the one gradient of qkv (rotation transposed for q and k, dv copied), so the projection's input
    gradient is one GEMM. CPU tensors run ``qkv_reference``. Under ``torch.compile``:
    ``torch.ops.tilewise.apply_rotary_qkv``.
    """
    cpu = runs_reference("apply_rotary_qkv", {"qkv": qkv, "cos": cos, "sin": sin}, interpreter=True)
    check_kernel_inputs("apply_rotary_qkv", {"qkv": qkv, "cos": cos, "sin": sin}, every=True, interpreter=True,
                        cpu=cpu)
    for name, n in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"apply_rotary_qkv: '{name}' must be an int >= 1, got {n!r}")
    width = num_heads + 2 * num_kv_heads
    if qkv.dim() != 3 or qkv.shape[-1] % width or (qkv.shape[-1] // width) % 2 or qkv.shape[-1] == 0:
        raise ValueError(f"apply_rotary_qkv: 'qkv' has shape {tuple(qkv.shape)}; expected (B, S, "
                         f"{width} * D) with D even and > 0 for num_heads={num_heads}, num_kv_heads={num_kv_heads}")
    B, S, D = qkv.shape[0], qkv.shape[1], qkv.shape[-1] // width
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3 or t.shape[0] not in (1, B) or t.shape[1:] != (S, D):
            raise ValueError(f"apply_rotary_qkv: '{name}' has shape {tuple(t.shape)}; 'qkv' of shape "
                             f"{tuple(qkv.shape)} needs ({B} or 1, {S}, {D})")
    if cpu:
        qe, ke, v = qkv_reference(qkv.float(), cos.float(), sin.float(), num_heads, num_kv_heads)
        return qe.to(qkv.dtype), ke.to(qkv.dtype), v.to(qkv.dtype)
    q2 = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    if torch.compiler.is_compiling():
        return _qkv_op(q2, cos, sin, num_heads, num_kv_heads)
    return _QKVEager.apply(q2, cos, sin, num_heads, num_kv_heads)


def v1_reference(q, k, cos, sin):
    return reference(q, k, cos, sin)


VARIANTS = {"v1_reference": v1_reference, "v2_fused": apply_rotary}
