"""FlashAttention over packed sequences (varlen): no padding rows are stored, read or computed.

q (total_q, H, D), k and v (total_k, Hkv, D) hold B sequences back to back; sequence b is rows
[cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v.
The v3 kernels run on (1, H, total, D) views with the batch stride 0: program (tile, b * H + h)
reads sequence b's offsets and returns at once past its length (``triton_kernels``, VARLEN). Where v5 / v6
apply (sm_90, D 64 / 128, fp16 / bf16, no window, softcap or ALiBi) and the policy asks for them ("ws"),
the forward is v5's persistent kernel instead (``gluon_fwd.fwd_varlen``: work items by sequence, those past a
sequence's queries skipped) and the backward v6's two kernels (``gluon_bwd.dkdv`` / ``dq`` with ``varlen``:
the grids by sequence, CTAs past a sequence's keys or queries idle). The default policy
(``configs.choose_varlen_policy``) asks for them at D 128 only: at D 64 v3's measured faster.
"""

from __future__ import annotations

from typing import Optional

import torch

from ... import settings
from .._custom import eager_twin
from . import configs
from .._checks import runs_reference
from .api import _check_band, _check_mods, _launch, _mod_args
from .configs import AttentionPolicy, block_d, choose_varlen_policy
from .reference import band as _band_of
from .routes import ws_applies, ws_bwd_applies

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634


def reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, window=None, softcap=None,
              alibi_slopes=None, return_lse=False):
    """Each sequence alone through ``attention.reference`` (fp32 scores), packed back: out
    (total_q, H, D) in q's dtype (and LSE (H, total_q) float32)."""
    from .reference import reference as dense

    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qs, ks, vs = (t[c[b]:c[b + 1]].transpose(0, 1)[None] for t, c in ((q, cq), (k, ck), (v, ck)))
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b]
        o, lse = dense(qs, ks, vs, causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=slopes,
                       return_lse=True)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    out = torch.cat(outs) if outs else q.new_empty((0,) + tuple(q.shape[1:]))
    lse = torch.cat(lses, 1) if lses else q.new_empty((q.shape[1], 0), dtype=torch.float32)
    return (out, lse.float()) if return_lse else out


def _packed4(t: torch.Tensor) -> tuple:
    """The (1, H, total, D) strides of a (total, H, D) tensor, batch stride 0."""
    return 0, t.stride(1), t.stride(0), t.stride(2)


def _check(q, k, v, cu_q, cu_k, max_q, max_k, check_seqlens):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"flash_attention_varlen: '{name}' must be a 3-D tensor (total, heads, D), "
                             f"got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise ValueError(f"flash_attention_varlen: '{name}' has dtype {t.dtype}; supported: float16, bfloat16, "
                             f"float32")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"flash_attention_varlen: '{name}' is {t.dtype} on {t.device} but 'q' is {q.dtype} on "
                             f"{q.device}")
    if k.shape != v.shape or k.shape[2] != q.shape[2] or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"flash_attention_varlen: 'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} must have one "
                         f"shape (total_k, Hkv, D) with the D of 'q' {tuple(q.shape)} and Hkv dividing its heads")
    if not 1 <= q.shape[2] <= 256:
        raise ValueError(f"flash_attention_varlen: 'q' has head dim D={q.shape[2]}; it must be in [1, 256]")
    offsets = (("cu_seqlens_q", cu_q, "q", "max_seqlen_q", max_q), ("cu_seqlens_k", cu_k, "k", "max_seqlen_k", max_k))
    for name, cu, _, mname, mx in offsets:
        if not isinstance(mx, int) or isinstance(mx, bool) or mx < 0:
            raise ValueError(f"flash_attention_varlen: '{mname}' must be an int >= 0, got {mx!r}")
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"flash_attention_varlen: '{name}' must be a 1-D int32 tensor of B + 1 offsets")
        if cu.device != q.device:
            raise ValueError(f"flash_attention_varlen: '{name}' is on {cu.device} but 'q' is on {q.device}")
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"flash_attention_varlen: 'cu_seqlens_q' has {cu_q.numel()} offsets, 'cu_seqlens_k' "
                         f"{cu_k.numel()}: one per sequence boundary each")
    if not check_seqlens:
        return
    both = torch.stack([cu_q, cu_k]).tolist()  # one device-to-host copy of 2 (B + 1) ints
    for (name, _, rows, mname, mx), offs in zip(offsets, both):
        total = (q if rows == "q" else k).shape[0]
        lens = [b - a for a, b in zip(offs, offs[1:])]
        if offs[0] != 0 or offs[-1] != total or min(lens) < 0 or max(lens) > mx:
            raise ValueError(f"flash_attention_varlen: '{name}' must rise from 0 to {total} (the rows of "
                             f"'{rows}') in steps of at most '{mname}' = {mx}; got {offs[:8]}"
                             f"{' ...' if len(offs) > 8 else ''}")


def _fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, band, softcap, alibi, policy):
    from . import triton_kernels as K_

    TQ, H, D = q.shape
    TK, Hkv, _ = k.shape
    nseq = cu_q.numel() - 1
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((H, TQ), dtype=torch.float32, device=q.device)
    if TQ == 0 or max_q == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    if band is None and not softcap and alibi is None and scale > 0 and policy.forward == "ws":
        q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))  # (1, heads, total, D) views
        cfg = configs.ws_fwd_config(D, False, policy.ws_config)
        if cfg[3] is None and ws_applies(q4, k4, v4, None, None, None):
            from . import gluon_fwd
            return gluon_fwd.fwd_varlen(q, k, v, cu_q, cu_k, max_q, causal, scale, out, lse, config=cfg)
    bm, bn, warps, stages = policy.tile("fwd", D)
    dummy = q
    _launch(K_._attn_fwd_kernel, (-(-max_q // bm), nseq * H),
        q, k, v, out, lse, dummy, dummy, dummy,
        H, H // Hkv, max_q, max_k, scale * LOG2E, *(band or (0, 0)), *_mod_args(softcap, alibi, 0, scale, dummy),
        cu_q, cu_k, TQ,
        *_packed4(q), *_packed4(k), *_packed4(v), *_packed4(out), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=block_d(D), CAUSAL=causal, HAS_BIAS=False, HAS_MASK=False,
        HAS_FLAGS=False, PREC="ieee" if q.dtype == torch.float32 else None, BAND=band is not None,
        SOFTCAP=bool(softcap), ALIBI=alibi is not None, VARLEN=True, num_warps=warps, num_stages=stages)
    return out, lse


def _bwd(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, band, softcap, alibi, policy):
    from . import triton_kernels as K_

    TQ, H, D = q.shape
    TK, Hkv, _ = k.shape
    nseq = cu_q.numel() - 1
    # packed like q, k, v: the kernels store every row of a sequence (a sequence with no key: dQ = 0)
    dq = torch.empty((TQ, H, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((TK, Hkv, D), dtype=k.dtype, device=q.device)
    dv = torch.empty((TK, Hkv, D), dtype=v.dtype, device=q.device)
    if TQ == 0 or TK == 0 or max_q == 0 or max_k == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    bd, prec, dummy = block_d(D), ("ieee" if q.dtype == torch.float32 else None), q
    delta = torch.empty((H, TQ), dtype=torch.float32, device=q.device)
    _launch(K_._attn_bwd_preprocess_kernel, (-(-TQ // 64), H),
        out, do, delta, delta, delta, H, TQ, *_packed4(out), *_packed4(do),
        BLOCK_M=64, HEAD_DIM=D, BLOCK_D=bd, HAS_DLSE=False, ZERO_DQ=False)
    mods = _mod_args(softcap, alibi, 0, scale, dummy)
    common = (*_packed4(q), *_packed4(k), *_packed4(v), *_packed4(do), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    flags = dict(CAUSAL=causal, HAS_BIAS=False, HAS_MASK=False, HAS_FLAGS=False, PREC=prec, BAND=band is not None,
                 SOFTCAP=bool(softcap), ALIBI=alibi is not None, VARLEN=True)
    v6 = band is None and not softcap and alibi is None and scale > 0 and policy.backward == "ws"
    if v6:
        views = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v, do, dq, dk, dv)]  # (1, heads, total, D)
        v6 = ws_bwd_applies(*views[:4], None, None)
    if v6:  # v6's kernels (gluon_bwd), by sequence
        from . import gluon_bwd

        q4, k4, v4, do4, dq4, dk4, dv4 = views
        packed = (cu_q, cu_k, max_q, max_k)
        gluon_bwd.dkdv(q4, k4, v4, do4, lse, delta, causal, scale, dk4, dv4,
                       config=configs.ws_bwd_dkdv_config(D, policy.ws_bwd_config), varlen=packed)
        if policy.ws_bwd_dq:
            gluon_bwd.dq(q4, k4, v4, do4, lse, delta, causal, scale, dq4,
                         config=configs.ws_bwd_dq_config(D, policy.ws_bwd_dq_config), varlen=packed)
            return dq, dk, dv
    else:
        bm, bn, warps, stages = policy.tile("dkdv", D, q.dtype.itemsize)
        _launch(K_._attn_bwd_dkdv_kernel, (-(-max_k // bn), nseq * Hkv),
            q, k, v, do, lse, delta, dk, dv, dummy, dummy, dummy,
            H, H // Hkv, max_q, max_k, scale * LOG2E, scale, *(band or (0, 0)), *mods, cu_q, cu_k, TQ, *common,
            BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=bd, **flags, num_warps=warps, num_stages=stages)
    bm, bn, warps, stages = policy.tile("dq", D)  # v3's dQ (after v6's dK / dV where ws_bwd_dq is off)
    _launch(K_._attn_bwd_dq_kernel, (-(-max_q // bm), nseq * H),
        q, k, v, do, lse, delta, dq, dummy, dummy, dummy, dummy,
        H, H // Hkv, max_q, max_k, scale * LOG2E, scale, *(band or (0, 0)), *mods, cu_q, cu_k, TQ, *common,
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=bd, BIAS_GRAD=False, **flags, num_warps=warps,
        num_stages=stages)
    return dq, dk, dv


def _policy(key: str, q, max_q, max_k, causal) -> AttentionPolicy:
    # a custom op's policy: an explicit policy's key, or "" for the default (from the arguments alone)
    return configs.policy_from_key(key) if key else choose_varlen_policy(q.shape[-1], max_q, max_k, causal=causal)


@torch.library.custom_op("tilewise::flash_attention_varlen_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int,
            max_k: int, causal: bool, scale: float, band: Optional[list[int]], softcap: float,
            alibi: Optional[torch.Tensor], policy: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, band, softcap, alibi,
                _policy(policy, q, max_q, max_k, causal))


@_fwd_op.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, band, softcap, alibi, policy):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


@torch.library.custom_op("tilewise::flash_attention_varlen_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool,
            scale: float, band: Optional[list[int]], softcap: float, alibi: Optional[torch.Tensor],
            policy: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, band, softcap, alibi,
                _policy(policy, q, max_q, max_k, causal))


@_bwd_op.register_fake
def _(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, band, softcap, alibi, policy):
    c = torch.contiguous_format
    return (torch.empty_like(q, memory_format=c), torch.empty_like(k, memory_format=c),
            torch.empty_like(v, memory_format=c))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, band, softcap, alibi, policy = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k, alibi)
    ctx.args = (max_q, max_k, causal, scale, band, softcap, policy)


def _op_backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k, alibi = ctx.saved_tensors
    max_q, max_k, causal, scale, band, softcap, policy = ctx.args
    # eager (the twin below): the policy is the object and the implementation runs directly
    bwd = _bwd if getattr(ctx, "eager", False) else _bwd_op
    dq, dk, dv = bwd(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, band, softcap,
                     alibi, policy)
    return (dq, dk, dv) + (None,) * 10


_fwd_op.register_autograd(_op_backward, setup_context=_setup_context)

# What the custom ops do, for eager calls (without the dispatcher's host time).
_Varlen = eager_twin("_Varlen", _fwd, _setup_context, _op_backward, nondifferentiable=(1,))


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                           causal: bool = False, scale: Optional[float] = None, window: Optional[tuple] = None,
                           softcap: Optional[float] = None, alibi_slopes: Optional[torch.Tensor] = None,
                           return_lse: bool = False, check_seqlens: bool = True,
                           policy: Optional[AttentionPolicy] = None):
    """``flash_attention`` over B sequences packed back to back, with no padding work.

    q:             (total_q, H, D) CUDA tensor, float16 / bfloat16 / float32 (any strides). CPU
                   tensors run ``reference`` (each sequence through the fp32 dense reference).
    k, v:          (total_k, Hkv, D), q's dtype and device; Hkv divides H (GQA).
    cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 on q's device, 0 = cu[0] <= cu[1] <= ... = total:
                   sequence b is rows [cu[b], cu[b + 1]) (lengths may be 0 or 1, and differ between
                   q and k).
    max_seqlen_q, max_seqlen_k: ints, at least every length (the grid's size).
    causal, scale, window, softcap, alibi_slopes (of shape (H,) or (B, H)): as ``flash_attention``,
                   within each sequence, top-left aligned (query i of a sequence sees its keys j <= i).
    check_seqlens: True (default) checks the offsets against the totals and max lengths: one
                   copy of 2 (B + 1) ints to the host (a synchronization). False skips it, and so
                   does torch.compile; offsets out of order then give wrong rows.
    policy:        its tiles (``AttentionPolicy.tiles``) apply; default ``choose_varlen_policy`` for D
                   and the max lengths (v5 / v6 at D 128 only). The forward is v5's persistent
                   kernel where the policy's forward is "ws" and v5 applies (sm_90, D 64 / 128,
                   fp16 / bf16, no window, softcap or ALiBi), else v3's; the backward v6's two
                   kernels where its backward is "ws" and they apply, else v3's two (both
                   deterministic).

    Returns out (total_q, H, D) in q's dtype (rows of a sequence with no key: 0); with ``return_lse``
    also the log-sum-exp (H, total_q) float32 (-inf for such rows; not differentiable).
    Differentiable in q, k and v. Under ``torch.compile`` it is the custom op
    ``torch.ops.tilewise.flash_attention_varlen_fwd`` (the LSE's gradient is not propagated).
    """
    # (traced code cannot read the offsets: torch.compile skips their check)
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
           check_seqlens and not torch.compiler.is_compiling())
    cpu = runs_reference("flash_attention_varlen", {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q,
                                                    "cu_seqlens_k": cu_seqlens_k, "alibi_slopes": alibi_slopes},
                         interpreter=True)
    if q.device.type != "cuda" and not (q.device.type == "cpu" and (cpu or settings.triton_interpret())):
        raise ValueError(f"flash_attention_varlen: 'q' is on {q.device}; tilewise kernels need CUDA tensors")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    causal = bool(causal)
    _check_band(causal, window, "top_left")
    nseq = cu_seqlens_q.numel() - 1
    alibi = _check_mods(nseq, q.shape[1], q.device, softcap, alibi_slopes, scale)
    if cpu:  # the one CPU rule: each sequence through the fp32 reference, differentiable by PyTorch
        return reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale, window=window,
                         softcap=softcap, alibi_slopes=alibi_slopes, return_lse=return_lse)
    band = _band_of(causal, window, "top_left", max_seqlen_q, max_seqlen_k)
    if band is not None:
        band, causal = tuple(band), False
    cu_q, cu_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()  # the kernels index them densely
    if torch.compiler.is_compiling():  # the policy travels as its key; "" = chosen inside the ops
        out, lse = _fwd_op(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, scale,
                           list(band) if band is not None else None, float(softcap or 0.0), alibi,
                           policy.key if policy is not None else "")
        return (out, lse) if return_lse else out
    if policy is None:
        policy = choose_varlen_policy(q.shape[-1], max_seqlen_q, max_seqlen_k, causal=causal)
    out, lse = _Varlen.apply(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, scale, band,
                             float(softcap or 0.0), alibi, policy)
    return (out, lse) if return_lse else out
