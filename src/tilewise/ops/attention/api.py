"""attention: softmax(scale * Q K^T + bias, masked) V over (B, H, S, D) tensors, forward and backward.

Versions (``VARIANTS``, forward; each has a backward through autograd):
    v1_naive:  PyTorch, the full (Sq, Sk) score matrix in fp32, softmax, then P V.
               bound: memory: B H Sq Sk x (4 + 4 + 2) bytes of scores written and read back.
    v2_online: PyTorch, the lectures' tiled online softmax: key tiles of 128, a running max, running
               sum and rescaled accumulator; never holds more than (Sq, 128) scores.
               bound: launch overhead and the (Sq, 128) temporaries (one eager op per line per tile).
    v3_flash2: Triton FlashAttention-2 (``triton_kernels.py``): one program per (query tile,
               batch x head), Q in registers, K/V tiles streamed, online softmax in the log2
               domain, the log-sum-exp (LSE) saved; causal tiles above the diagonal not loaded,
               mask-blocked key tiles skipped from a per-tile "any key live" map. Opt-in
               (``AttentionPolicy.bias_pair``): a forward for a bias shared by the batch that runs
               two batch elements a program on one bias tile (off: no faster).
               Backward: Delta = rowsum(dO * O) kernel, then a dK/dV kernel (one key tile per
               program, the query heads of a GQA group summed in registers) and a dQ kernel (one
               query tile per program, also writing dS for the bias gradient); P recomputed from
               LSE; no atomics, so results are deterministic.
               bound: tensor-core FLOPs: 4 B H Sq Sk D forward (half when causal), 2.5x that back.
    v3_flash2_atomic: v3 with ``deterministic=False``: the backward is one kernel per key tile
               (grid ceil(Sk / BLOCK_N) x B Hkv) that keeps dK, dV in registers and adds each
               query tile's dQ into an fp32 (B, H, Sq, D) buffer with atomics (zeroed by the Delta
               kernel, cast to q's dtype after): Q K^T and dO V^T once per tile pair, so 5 matmuls
               where v3's two kernels do 7; dS for the bias gradient is stored by the same kernel.
               At D = 128 on sm_90 the dQ tile is added by one TMA bulk reduce-add from shared
               memory (no per-element addresses: the register budget then allows two stages).
               Not bitwise reproducible (the order of the fp32 adds into dQ varies); dK, dV and
               dBias still are. D > 128 uses v3's backward. Opt-in (policy backward "ordered"): the same
               kernel with deterministic=True, dQ read-modify-written (no float atomics) one key
               tile at a time in a fixed order; reproducible, measured slower than both.
               bound: tensor-core FLOPs, plus the dQ reductions (Sk / BLOCK_N fp32
               read-modify-writes of each dQ element, in L2).
    v4_flash2_tma: v3 whose forward loads Q/K/V tiles by TMA (tensor descriptors) instead of
               per-thread pointers, for contiguous fp16/bf16 inputs without mask or bias and D in
               {32, 64, 128, 256}; opt-in (policy forward "tma": slower than v3's pointer loads there).
               Its kernel with a dense-row bias is the default bias forward (``AttentionPolicy.bias_tma``).
               bound: as v3.
    v5_flash2_ws: the forward warp-specialized in Gluon (``gluon_fwd.py``, sm_90, fp16/bf16,
               D 64 / 128, no mask; a dense-row bias): a TMA loader warp feeds a ring of K/V (and
               bias) stages to two or three consumer warpgroups of 64 query rows, each running
               its own S = QK^T, softmax and PV, so one warpgroup's exponentials overlap another's
               wgmma. The default where ``configs.WS_FWD_RULES`` measured it faster (D = 128; D = 64 from
               Sq = 1024, causal from 256); on a persistent grid (one CTA an SM, ``configs.WS_PERSISTENT_RULES``:
               D = 128, D = 64 without causal; causal work items in pairs) with two Q buffers
               (``WS_Q_BUFFER_RULES``); with overlapped consumers (``gluon_overlap.py``; without causal, two Q
               buffers chain the work items) at D = 128 from Sq = 1024, 2048 causal (``WS_OVERLAP_RULES``), at
               D = 64 causal on the persistent grid from 2048 to 8192 (``WS_PERSISTENT_SPANS``: v5's plain two
               from 256, its three consumers on their own grid from 8192).
               bound: tensor-core FLOPs and, at D = 64, the exponentials (MUFU: one per score).
    v6 (backward; bench row ``v6_flash2_ws_bwd``): the deterministic backward's dK / dV and dQ
               kernels warp-specialized in Gluon (``gluon_bwd.py``, sm_90, D 64 / 128,
               no mask or bias): a TMA loader warp streams Q / dO (dK / dV kernel) or K / V (dQ
               kernel) tiles to two consumer warpgroups of 64 keys / query rows. The default
               backward where ``configs.WS_BWD_RULES`` say (D = 128, with causal from S = 512; D = 64
               from S = 1024, with causal from 2048), else v3's.
               bound: tensor-core FLOPs: 7 matmuls a tile pair, as v3's two kernels (S and dP
               are computed in both), where the fused atomic kernel does 5.

Semantics follow ``torch.nn.functional.scaled_dot_product_attention`` (SDPA): ``mask`` True =
attend; ``causal`` is top-left aligned (query i sees keys j <= i, also when Sq != Sk); GQA as
SDPA's ``enable_gqa`` (query head h uses K/V head h // (H // Hkv)). One difference: a row whose
every key is masked gives output 0 and LSE -inf (SDPA gives NaN), and gradients 0 for it.

What runs is one ``AttentionPolicy`` per call (``configs.py``: the tile tables, the routing rules and
``choose_policy``, the default); the autograd Function hands the forward's policy to the backward.
Why each table, route and default is what it is: docs/tuning/attention.md (one section each).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Optional

import torch

from ... import settings
from ...cost import Cost
from ...runtime.triton_launch import launch as _launch
from .._checks import runs_reference
from . import configs, cudnn_bwd as _cudnn_bwd, plans as _plans
from .configs import AttentionPolicy, block_d, choose_policy
from .layout import for_ws as _for_ws, rows as _tma_rows, seq_major_like as _seq_major_like
from .routes import dense as _dense, tma_applies as _tma_applies, tma_bias_applies as _tma_bias_applies
from .routes import ws_applies as _ws_applies, ws_bwd_applies as _ws_bwd_applies
from .reference import ALIGNS, call_band as _call_band, reference, reference_tiled

__all__ = ["AttentionPolicy", "VARIANTS", "choose_policy", "cost", "default_policy", "flash_attention", "reference",
           "reference_tiled"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_BIAS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def cost(B: int, H: int, Sq: int, Sk: int, D: int, dtype: torch.dtype = torch.bfloat16, *,
         causal: bool = False, Hkv: int | None = None, backward: bool = False,
         bias_bytes: int = 0) -> Cost:
    """FLOPs as the field counts them: 4 B H Sq Sk D forward (two matmuls), halved when causal;
    the backward is 2.5x the forward (five matmuls, one of them the recomputed Q K^T).
    Bytes: Q, K, V read and O, LSE written once forward; with ``backward`` also dO read and
    dQ, dK, dV written (Q, K, V, O, LSE read again). ``bias_bytes``: a bias read (and its
    gradient written, pass both) once."""
    Hkv = H if Hkv is None else Hkv
    item = dtype.itemsize
    flops = 4.0 * B * H * Sq * Sk * D / (2 if causal else 1)
    q_bytes = B * H * Sq * D * item
    kv_bytes = 2 * B * Hkv * Sk * D * item
    lse_bytes = B * H * Sq * 4
    fwd_bytes = q_bytes + kv_bytes + q_bytes + lse_bytes
    if not backward:
        return Cost(flops, fwd_bytes + bias_bytes)
    bwd_bytes = (q_bytes + kv_bytes + 2 * q_bytes + lse_bytes) + (q_bytes + kv_bytes)
    return Cost(3.5 * flops, fwd_bytes + bwd_bytes + bias_bytes)


# -------------------------------------------------------------------------------------------------- Input checks


def _check(q, k, v, mask, bias, scale, cpu=False):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"flash_attention: '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"flash_attention: '{name}' must be 4-D (B, H, S, D), got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise ValueError(f"flash_attention: '{name}' has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.device != q.device:
            raise ValueError(f"flash_attention: '{name}' is on {t.device} but 'q' is on {q.device}")
        if t.dtype != q.dtype:
            raise ValueError(f"flash_attention: '{name}' has dtype {t.dtype} but 'q' has {q.dtype}")
    if q.device.type != "cuda" and not ((cpu or settings.triton_interpret()) and q.device.type == "cpu"):
        raise ValueError(f"flash_attention: 'q' is on {q.device}; tilewise kernels need CUDA tensors "
                         f"(use tilewise.flash_attention for CPU tensors)")  # (meta has no data)
    B, H, Sq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"flash_attention: 'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} must have one shape")
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"flash_attention: 'k' has shape {tuple(k.shape)}; 'q' {tuple(q.shape)} needs "
                         f"(B={B}, Hkv, Sk, D={D})")
    Hkv = k.shape[1]
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"flash_attention: the {H} heads of 'q' must be a multiple of the {Hkv} heads of 'k' (GQA)")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"flash_attention: head dim D={D} must be in [1, {MAX_HEAD_DIM}]")
    full = (B, H, Sq, k.shape[2])
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError("flash_attention: 'mask' must be a bool tensor (True = attend); "
                             "pass an additive float mask as 'bias'")
        _check_broadcast("mask", mask, full, q.device)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dtype not in _BIAS_DTYPES:
            raise ValueError("flash_attention: 'bias' must be a float16/bfloat16/float32 tensor")
        _check_broadcast("bias", bias, full, q.device)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"flash_attention: 'scale' must be a finite number or None, got {scale!r}")


def _check_band(causal, window, align):
    if align not in ALIGNS:
        raise ValueError(f"flash_attention: 'align' must be one of {ALIGNS}, got {align!r}")
    if window is None:
        return
    if not isinstance(window, (tuple, list)) or len(window) != 2 or not all(
            w is None or (isinstance(w, int) and not isinstance(w, bool) and w >= 0) for w in window):
        raise ValueError(f"flash_attention: 'window' must be (left, right) with ints >= 0 or None, got {window!r}")
    if causal and window[1] not in (None, 0):
        raise ValueError(f"flash_attention: 'window' = {tuple(window)} looks past the diagonal; with causal=True "
                         f"its right edge must be None or 0")


def _check_mods(B, H, device, softcap, alibi_slopes, scale):
    """The score mods' arguments checked; the slopes as a (B, H) float32 tensor (or None)."""
    if softcap is not None and not (isinstance(softcap, (int, float)) and not isinstance(softcap, bool)
                                    and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"flash_attention: 'softcap' must be a finite number > 0 or None, got {softcap!r}")
    if (softcap is not None or alibi_slopes is not None) and scale <= 0:
        raise ValueError(f"flash_attention: 'softcap' and 'alibi_slopes' need a scale > 0, got {scale!r}")
    if alibi_slopes is None:
        return None
    if (not isinstance(alibi_slopes, torch.Tensor) or not alibi_slopes.is_floating_point()
            or tuple(alibi_slopes.shape) not in ((H,), (B, H))):
        got = tuple(alibi_slopes.shape) if isinstance(alibi_slopes, torch.Tensor) else alibi_slopes
        raise ValueError(f"flash_attention: 'alibi_slopes' must be a float tensor of shape ({H},) or ({B}, {H}), "
                         f"got {got!r}")
    if alibi_slopes.device != device:
        raise ValueError(f"flash_attention: 'alibi_slopes' is on {alibi_slopes.device} but 'q' is on {device}")
    return alibi_slopes.detach().float().expand(B, H).contiguous()


def _check_broadcast(name, t, full, device):
    if t.device != device:
        raise ValueError(f"flash_attention: '{name}' is on {t.device} but 'q' is on {device}")
    ok = t.dim() <= 4 and all(a in (1, b) for a, b in zip(t.shape[::-1], full[::-1]))
    if not ok:
        raise ValueError(f"flash_attention: '{name}' of shape {tuple(t.shape)} does not broadcast to "
                         f"(B, H, Sq, Sk) = {full}")


# -------------------------------------------------------------------------------------------------------- Policy

def default_policy(q: torch.Tensor, k: torch.Tensor, *, causal: bool = False, mask: Optional[torch.Tensor] = None,
                   bias: Optional[torch.Tensor] = None, deterministic: bool = True) -> AttentionPolicy:
    """``choose_policy`` for these inputs: what ``flash_attention`` runs when given no policy. A base
    for a call's own policy: ``default_policy(q, k, causal=True).replace(forward="tma")``."""
    bias_grad = bias is not None and bias.requires_grad and torch.is_grad_enabled()
    return _default(q, k, causal, mask, bias, deterministic, bias_grad)


def _default(q, k, causal, mask, bias, deterministic, bias_grad) -> AttentionPolicy:
    return choose_policy(q.shape[-1], q.shape[2], k.shape[2], causal=causal, has_bias=bias is not None,
                         has_mask=mask is not None, bias_grad=bias_grad, deterministic=deterministic)


def _resolve(policy: str, q, k, mask, bias, causal, deterministic, bias_grad) -> AttentionPolicy:
    """A custom op's policy argument: an explicit policy's key, or "" for the default, which depends
    only on the call's arguments (so the backward op derives the forward's)."""
    return configs.policy_from_key(policy) if policy else _default(q, k, causal, mask, bias, deterministic, bias_grad)


@functools.lru_cache(maxsize=64)
def _changed(policy: AttentionPolicy, changes: tuple) -> AttentionPolicy:
    # The variants derive a policy on every call; building one costs more host time than the lookup.
    return policy.replace(**dict(changes))


# ----------------------------------------------------------------------------------------------------- Launchers

def _as4(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t


def _bcast_strides(t: Optional[torch.Tensor], full) -> tuple:
    if t is None:
        return (0, 0, 0, 0)
    return tuple(_as4(t).expand(full).stride())


def _block_flags(mask: torch.Tensor, full, bm: int, bn: int):
    """uint8 (B|1, H|1, nM|1, nN|1) map: 1 where a (bm x bn) tile of the mask has any live key;
    returned expanded to (B, H, nM, nN) (broadcast dims stay stride 0)."""
    B, H, Sq, Sk = full
    m4 = _as4(mask)
    nM, nN = -(-Sq // bm), -(-Sk // bn)
    tm = bm if m4.shape[2] > 1 else 1
    tn = bn if m4.shape[3] > 1 else 1
    pm = (nM * bm - Sq) if tm > 1 else 0
    pn = (nN * bn - Sk) if tn > 1 else 0
    m8 = m4.to(torch.uint8)
    if pm or pn:
        m8 = torch.nn.functional.pad(m8, (0, pn, 0, pm))
    b, h, sq, sk = m8.shape
    flags = m8.reshape(b, h, sq // tm, tm, sk // tn, tn).amax(dim=(3, 5))
    return flags.expand(B, H, nM, nN)


def _empty_like_out(q, seq_major=False):
    """The forward's output: contiguous, or (``seq_major``) with the strides of a transposed (B, S, H, D)."""
    return _seq_major_like(q) if seq_major else torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _ordered_applies(q, mask) -> bool:
    """The ordered fused backward is GPU only (the interpreter runs programs one after another, so a
    causal key tile would wait forever on a later one) and maskless (skipped tiles would break the count)."""
    return mask is None and q.is_cuda and not settings.triton_interpret()


# Whether this process's Triton builds the atomic kernel's TMA reduce-add of dQ: None until the first
# try. A build failure (a Triton without descriptor atomic_add) falls back to pointer atomics for good.
_DQ_TMA_BUILDS: dict = {"ok": None}


def _dq_tma_applies(q, D) -> bool:
    """sm_90+ (the interpreter has no descriptor reduce), and a head dim with a TMA config that equals
    its tile width (the fp32 (B * H, Sq, D) dQ view then has 16-byte rows and the box never exceeds
    the tensor's last dim)."""
    return (_DQ_TMA_BUILDS["ok"] is not False and not settings.triton_interpret() and q.is_cuda
            and D in configs.ATOMIC_TMA and torch.cuda.get_device_capability(q.device)[0] >= 9)


def _fwd_tma(q, k, v, causal, scale, out, lse, bias, bias_strides, policy, launcher):
    from triton.tools.tensor_descriptor import TensorDescriptor

    from . import triton_kernels as K_

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    bm, bn, warps, stages = policy.tile("fwd_tma_bias" if bias is not None else "fwd", D)
    q2, k2, v2 = q.view(-1, D), k.view(-1, D), v.view(-1, D)
    qd = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [bm, D])
    kd = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [bn, D])
    vd = TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [bn, D])
    bd, rows_b, rows_h, batch_fastest = None, 0, 0, False
    if bias is not None:
        b2 = bias.reshape(-1, Sk)
        bd = TensorDescriptor(b2, list(b2.shape), list(b2.stride()), [bm, bn])
        rows_b, rows_h = bias_strides[0] // Sk, bias_strides[1] // Sk
        batch_fastest = B > 1 and rows_b == 0 and policy.bias_batch_fastest
    launcher(K_._attn_fwd_tma_kernel, (-(-Sq // bm), B * H),
        qd, kd, vd, bd, out, lse, H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, rows_b, rows_h, *out.stride(),
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, CAUSAL=causal, HAS_BIAS=bias is not None,
        BATCH_FASTEST=batch_fastest, num_warps=warps, num_stages=stages)
    return out, lse


def _fwd_impl(q, k, v, mask, bias, causal, scale, policy: AttentionPolicy, band=None, softcap=0.0, alibi=None,
              diag=0, out_seq=False, launcher=None):
    """``out_seq``: the output in sequence-major storage (every kernel but the band one writes
    through its strides; eager plain calls only, ``layout.for_ws``). ``launcher``: what every launch
    goes through (default ``_launch``; ``plans`` records a call's launches with its own)."""
    from . import triton_kernels as K_

    launcher = launcher or _launch
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    out = _empty_like_out(q, out_seq)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    if Sk == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    if scale <= 0:
        # The kernels take the row max on q.k unscaled (the scale rides in the exponent, see
        # triton_kernels._fwd_update), which needs a positive scale: scale * q.k is
        # (-scale) * (-q).k, and a zero scale leaves the bias alone (0 = 0 * k with scale 1).
        q, scale = (-q, -scale) if scale < 0 else (torch.zeros_like(q), 1.0)
    full = (B, H, Sq, Sk)
    bias_strides = _bcast_strides(bias, full)
    # A band (window, bottom-right causal) or a score mod runs on the pointer kernel alone (below).
    plain = band is None and not softcap and alibi is None
    if plain and policy.forward == "ws" and _ws_applies(q, k, v, mask, bias, bias_strides):
        from . import gluon_fwd as ag, gluon_overlap as ao
        cfg = configs.ws_fwd_config(D, bias is not None, policy.ws_config)
        if policy.ws_overlap and not policy.ws_pingpong and ao.applies(bias, cfg):
            return ao.fwd(q, k, v, causal, scale, out, lse, launch=launcher, config=cfg, q_regs=policy.ws_q_regs,
                          persistent=policy.ws_overlap == "persistent", q_buffers=policy.ws_q_buffers)
        return ag.fwd(q, k, v, causal, scale, out, lse, bias, bias_strides, launch=launcher, config=cfg,
                      persistent=policy.ws_persistent, pingpong=policy.ws_pingpong, q_buffers=policy.ws_q_buffers)
    if (band is not None and not softcap and alibi is None and bias is None and policy.forward == "ws"
            and policy.ws_band and _dense(q, k, v, out) and _ws_applies(q, k, v, mask, None, bias_strides)):
        from . import gluon_band
        return gluon_band.fwd_band(q, k, v, band, scale, out, lse, launch=launcher,
                                   persistent=policy.ws_band_persistent, config=policy.ws_config)
    if plain and policy.forward == "tma" and _tma_applies(q, k, v, mask, bias):
        return _fwd_tma(q, k, v, causal, scale, out, lse, None, None, policy, launcher)
    if (plain and bias is not None and mask is None and policy.bias_tma
            and _tma_bias_applies(q, k, v, bias, bias_strides)):
        return _fwd_tma(q, k, v, causal, scale, out, lse, bias, bias_strides, policy, launcher)
    if plain and bias is not None and mask is None and B % 2 == 0 and bias_strides[0] == 0 and policy.bias_pair:
        return _fwd_bias_pair(q, k, v, bias_strides, bias, causal, scale, out, lse, policy, launcher)
    bm, bn, warps, stages = policy.tile("fwd_bias" if bias is not None else "fwd", D)
    flags = _block_flags(mask, full, bm, bn) if mask is not None else None
    mask8 = mask.view(torch.uint8) if mask is not None else None
    dummy = q
    grid = (-(-Sq // bm), B * H)
    batch_fastest = bias is not None and B > 1 and bias_strides[0] == 0 and policy.bias_batch_fastest
    launcher(K_._attn_fwd_kernel, grid,
        q, k, v, out, lse,
        bias if bias is not None else dummy, mask8 if mask8 is not None else dummy,
        flags if flags is not None else dummy,
        H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, *(band or (0, 0)),
        *_mod_args(softcap, alibi, diag, scale, dummy), dummy, dummy, 0,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *bias_strides, *_bcast_strides(mask8, full),
        *(flags.stride() if flags is not None else (0, 0, 0, 0)),
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=block_d(D), CAUSAL=causal,
        HAS_BIAS=bias is not None, HAS_MASK=mask is not None, HAS_FLAGS=flags is not None,
        PREC="ieee" if q.dtype == torch.float32 else None, BATCH_FASTEST=batch_fastest,
        BAND=band is not None, SOFTCAP=bool(softcap), ALIBI=alibi is not None, num_warps=warps, num_stages=stages)
    return out, lse


def _mod_args(softcap, alibi, diag, scale, dummy):
    """The kernels' cap_t, Slopes and diag: softcap and the ALiBi slopes in units of 1 / scale."""
    slopes = (alibi / scale).float().contiguous() if alibi is not None else dummy
    return (softcap / scale if softcap else 1.0), slopes, diag


def _fwd_bias_pair(q, k, v, bias_strides, bias, causal, scale, out, lse, policy, launcher):
    from . import triton_kernels as K_

    B, H, Sq, D = q.shape
    bm, bn, warps, stages = policy.tile("fwd_bias_pair", D)
    launcher(K_._attn_fwd_bias_pair_kernel, (-(-Sq // bm), B // 2 * H),
        q, k, v, out, lse, bias, H, H // k.shape[1], Sq, k.shape[2], scale * 1.4426950408889634,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *bias_strides[1:],
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=block_d(D), CAUSAL=causal,
        PREC="ieee" if q.dtype == torch.float32 else None, num_warps=warps, num_stages=stages)
    return out, lse


def _empty_grad_like(t: torch.Tensor, like=False) -> torch.Tensor:
    """The backward's dQ / dK / dV buffers (tests poison them): contiguous, or with ``t``'s strides
    (``like``: empty_like keeps a dense tensor's, e.g. a sequence-major view's)."""
    return torch.empty_like(t) if like else torch.empty_like(t, memory_format=torch.contiguous_format)


def _bwd_impl(do, q, k, v, out, lse, dlse, mask, bias, causal, scale, bias_grad, policy: AttentionPolicy,
              band=None, softcap=0.0, alibi=None, diag=0, grads_like=False, launcher=None):
    """``grads_like``: the gradients v6 writes get q's, k's and v's strides (sequence-major ones too,
    so the caller's views back to (B, S, H, D) copy nothing); eager calls only. The others are
    contiguous (the Triton kernels write dense rows). ``launcher``: as ``_fwd_impl``'s."""
    from . import triton_kernels as K_

    launcher = launcher or _launch
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    # A score mod runs on the two-kernel backward alone, a band too unless ws_bwd_band gives it to v6.
    plain = band is None and not softcap and alibi is None
    if policy.backward == "cudnn" and _cudnn_bwd.applies(q, k, v, dlse, mask, bias, plain and not diag):
        return _cudnn_bwd.backward(do, q, k, v, out, lse, causal, scale, contiguous=not grads_like)
    v6_band = band is not None and not softcap and alibi is None and policy.ws_bwd_band
    if (plain or v6_band) and policy.backward == "ws" and _tma_rows(do) is None:
        # v6 reads dO by TMA, head-major or sequence-major in place (the gradient of an output the
        # caller transposed back to (B, S, H, D) is sequence-major); another layout is copied.
        do = do.contiguous()
    ws_bwd = (plain or v6_band) and policy.backward == "ws" and _ws_bwd_applies(q, k, v, do, mask, bias)
    # Every element of dQ, dK, dV is stored by the kernels (rows with no live key store 0).
    dq = _empty_grad_like(q, grads_like and ws_bwd and policy.ws_bwd_dq)
    dk = _empty_grad_like(k, grads_like and ws_bwd)
    dv = _empty_grad_like(v, grads_like and ws_bwd)
    dbias = q.new_empty((0,))
    if q.numel() == 0 or Sk == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        if bias_grad:
            dbias = torch.zeros_like(bias, memory_format=torch.contiguous_format)
        return dq, dk, dv, dbias
    full = (B, H, Sq, Sk)
    bd = block_d(D)
    prec = "ieee" if q.dtype == torch.float32 else None  # fp32: no tf32 rounding
    dummy = q

    delta = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    # D > 128: the fused kernel spills even at 16 x 32 tiles (sm_90 report), so those head dims
    # keep the two-kernel backward whatever the policy says.
    fused = plain and bd <= configs.ATOMIC_MAX_D
    ordered = fused and policy.backward == "ordered" and _ordered_applies(q, mask)
    atomic = fused and (policy.backward == "atomic" or ordered)
    # The atomic (and ordered) path's fp32 dQ accumulator, zeroed by the preprocess kernel.
    dq_acc = None if not atomic else torch.empty((B, H, Sq, D), dtype=torch.float32, device=q.device)
    pm = 64
    launcher(K_._attn_bwd_preprocess_kernel, (-(-Sq // pm), B * H),
        out, do, dlse if dlse is not None else delta, delta, dq_acc if dq_acc is not None else delta,
        H, Sq, *out.stride(), *do.stride(),
        BLOCK_M=pm, HEAD_DIM=D, BLOCK_D=bd, HAS_DLSE=dlse is not None, ZERO_DQ=dq_acc is not None)

    if ws_bwd:  # v6 (no mask, no bias): dK / dV, and dQ unless v3's is asked for, by the Gluon kernels
        from . import gluon_bwd as gb

        memo: dict = {}  # the TMA descriptors both kernels use, built once
        gb.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv, launch=launcher, memo=memo,
                config=configs.ws_bwd_dkdv_config(D, policy.ws_bwd_config), band=band)
        if policy.ws_bwd_dq:
            gb.dq(q, k, v, do, lse, delta, causal, scale, dq, launch=launcher, memo=memo,
                  config=configs.ws_bwd_dq_config(D, policy.ws_bwd_dq_config), band=band)
            return dq, dk, dv, dbias

    mask8 = mask.view(torch.uint8) if mask is not None else None
    mods = _mod_args(softcap, alibi, diag, scale, dummy)
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride(),
              *_bcast_strides(bias, full), *_bcast_strides(mask8, full))
    bias_arg = bias if bias is not None else dummy
    mask_arg = mask8 if mask8 is not None else dummy
    # A bias of the full (B, H, Sq, Sk) shape takes dS directly (contiguous, its own dtype); a
    # broadcast one gets an fp32 (B, H, Sq, Sk) buffer, summed in a fixed order afterwards.
    # Without causal or mask every (query, key) of dS is stored by the kernels: no zero fill
    # (4.3 GB of writes at B=4, H=16, S=4096 in fp32, about 1 ms).
    direct = bias_grad and tuple(_as4(bias).shape) == full
    alloc = torch.zeros if (causal or mask is not None or band is not None) else torch.empty
    if direct:
        ds = alloc(full, dtype=bias.dtype, device=q.device)
    else:
        ds = alloc(full, dtype=torch.float32, device=q.device) if bias_grad else dummy

    if atomic:
        def launch(use_tma):
            kind = ("atomic_tma" if use_tma else "atomic") + ("_bias" if bias_grad else "")
            bm, bn, warps, stages = policy.tile(kind, D, q.dtype.itemsize)
            flags = _block_flags(mask, full, bm, bn) if mask is not None else None
            # Ordered: one int32 count per (batch x head, query tile), zeroed here.
            sem = torch.zeros((B * H, -(-Sq // bm)), dtype=torch.int32, device=q.device) if ordered else dummy
            dq_arg = dq_acc
            if use_tma:
                from triton.tools.tensor_descriptor import TensorDescriptor

                d3 = dq_acc.view(B * H, Sq, D)
                dq_arg = TensorDescriptor(d3, list(d3.shape), list(d3.stride()), [1, bm, bd])
            launcher(K_._attn_bwd_atomic_kernel, (-(-Sk // bn), B * Hkv),
                q, k, v, do, lse, delta, dk, dv, dq_arg, ds, bias_arg, mask_arg,
                flags if flags is not None else dummy, sem,
                H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, scale, *common,
                *(flags.stride() if flags is not None else (0, 0, 0, 0)),
                BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=bd, CAUSAL=causal, HAS_BIAS=bias is not None,
                HAS_MASK=mask is not None, HAS_FLAGS=flags is not None, BIAS_GRAD=bias_grad, DQ_TMA=use_tma,
                ORDERED=policy.ordered_mode if ordered else 0, NTHREADS=32 * warps, PREC=prec, num_warps=warps,
                num_stages=stages)

        if ordered:
            launch(False)
        elif policy.dq_tma and _dq_tma_applies(q, D):
            try:
                launch(True)
                _DQ_TMA_BUILDS["ok"] = True
            except Exception as e:  # compile error before any launch: dq_acc is still zero
                if _DQ_TMA_BUILDS["ok"]:
                    raise
                _DQ_TMA_BUILDS["ok"] = False
                warnings.warn(f"tilewise attention: dQ by TMA reduce-add failed to build ({type(e).__name__}: "
                              f"{str(e)[:200]}); using pointer atomics from now on")
                launch(False)
        else:
            launch(False)
        dq = dq_acc if q.dtype == torch.float32 else dq_acc.to(q.dtype)
        return dq, dk, dv, _reduce_dbias(ds, bias, direct) if bias_grad else dbias

    if not ws_bwd:  # (v6 launched its dK / dV kernel above)
        bm, bn, warps, stages = policy.tile("dkdv", D, q.dtype.itemsize)
        flags = _block_flags(mask, full, bm, bn) if mask is not None else None
        launcher(K_._attn_bwd_dkdv_kernel, (-(-Sk // bn), B * Hkv),
            q, k, v, do, lse, delta, dk, dv, bias_arg, mask_arg, flags if flags is not None else dummy,
            H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, scale, *(band or (0, 0)), *mods, dummy, dummy, 0, *common,
            *(flags.stride() if flags is not None else (0, 0, 0, 0)),
            BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=bd, CAUSAL=causal, HAS_BIAS=bias is not None,
            HAS_MASK=mask is not None, HAS_FLAGS=flags is not None, PREC=prec, BAND=band is not None,
            SOFTCAP=bool(softcap), ALIBI=alibi is not None, num_warps=warps, num_stages=stages)

    bm, bn, warps, stages = policy.tile("dq_bias" if bias_grad else "dq", D)
    flags = _block_flags(mask, full, bm, bn) if mask is not None else None
    launcher(K_._attn_bwd_dq_kernel, (-(-Sq // bm), B * H),
        q, k, v, do, lse, delta, dq, ds, bias_arg, mask_arg, flags if flags is not None else dummy,
        H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, scale, *(band or (0, 0)), *mods, dummy, dummy, 0, *common,
        *(flags.stride() if flags is not None else (0, 0, 0, 0)),
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=bd, CAUSAL=causal, HAS_BIAS=bias is not None,
        HAS_MASK=mask is not None, HAS_FLAGS=flags is not None, BIAS_GRAD=bias_grad, PREC=prec,
        BAND=band is not None, SOFTCAP=bool(softcap), ALIBI=alibi is not None, num_warps=warps, num_stages=stages)
    if bias_grad:
        dbias = _reduce_dbias(ds, bias, direct)
    return dq, dk, dv, dbias


def _reduce_dbias(ds, bias, direct):
    """dBias = dS summed over the dims the bias was broadcast along (a fixed-order reduction)."""
    return ds.reshape(bias.shape) if direct else ds.sum_to_size(_as4(bias).shape).reshape(bias.shape).to(bias.dtype)


# ----------------------------------------------------- torch.library custom ops (eager, autograd, torch.compile)

@torch.library.custom_op("tilewise::flash_attention_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
            bias: Optional[torch.Tensor], causal: bool, scale: float, deterministic: bool,
            policy: str, band: Optional[list[int]] = None, softcap: float = 0.0, alibi: Optional[torch.Tensor] = None,
            diag: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    # ``policy``: an AttentionPolicy's key, or "" for the default (custom ops take no objects);
    # ``deterministic`` is here so that autograd's setup_context sees it (torch.compile: a plain bool).
    return _fwd_impl(q, k, v, mask, bias, causal, scale, _resolve(policy, q, k, mask, bias, causal, deterministic,
                                                                   False), band, softcap, alibi, diag)


@_fwd_op.register_fake
def _(q, k, v, mask, bias, causal, scale, deterministic, policy, band=None, softcap=0.0, alibi=None, diag=0):
    B, H, Sq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("tilewise::flash_attention_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, dlse: Optional[torch.Tensor], mask: Optional[torch.Tensor],
            bias: Optional[torch.Tensor], causal: bool, scale: float, bias_grad: bool, deterministic: bool,
            policy: str, band: Optional[list[int]] = None, softcap: float = 0.0, alibi: Optional[torch.Tensor] = None,
            diag: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(do, q, k, v, out, lse, dlse, mask, bias, causal, scale, bias_grad,
                     _resolve(policy, q, k, mask, bias, causal, deterministic, bias_grad), band, softcap, alibi, diag)


@_bwd_op.register_fake
def _(do, q, k, v, out, lse, dlse, mask, bias, causal, scale, bias_grad, deterministic, policy, band=None, softcap=0.0,
      alibi=None, diag=0):
    c = torch.contiguous_format
    db = torch.empty_like(bias, memory_format=c) if bias_grad else q.new_empty((0,))
    return (torch.empty_like(q, memory_format=c), torch.empty_like(k, memory_format=c),
            torch.empty_like(v, memory_format=c), db)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, bias, causal, scale, deterministic, policy, band, softcap, alibi, diag = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, bias, alibi)
    # The forward's policy (an AttentionPolicy eagerly, its key or "" traced): the backward's.
    ctx.causal, ctx.scale, ctx.deterministic, ctx.policy, ctx.band = causal, scale, deterministic, policy, band
    ctx.softcap, ctx.diag = softcap, diag
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, mask, bias, alibi = ctx.saved_tensors
    if dout is None and dlse is None:
        return (None,) * 13
    if dout is None:
        dout = torch.zeros_like(out)
    if dlse is not None:
        dlse = dlse.float().contiguous()  # e.g. sum()'s gradient is an expanded, stride-0 tensor
    bias_grad = bias is not None and ctx.needs_input_grad[4]
    if getattr(ctx, "eager", False):
        dq, dk, dv, db = _bwd_impl(dout, q, k, v, out, lse, dlse, mask, bias, ctx.causal, ctx.scale, bias_grad,
                                   ctx.policy, ctx.band, ctx.softcap, alibi, ctx.diag, grads_like=True)
    else:
        dq, dk, dv, db = _bwd_op(dout, q, k, v, out, lse, dlse, mask, bias, ctx.causal, ctx.scale, bias_grad,
                                 ctx.deterministic, ctx.policy, ctx.band, ctx.softcap, alibi, ctx.diag)
    return (dq, dk, dv, None, (db if bias_grad else None)) + (None,) * 8


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerFlash(torch.autograd.Function):
    """What ``_fwd_op`` and its autograd registration do, for eager calls: the custom-op dispatcher
    costs about 20 us a call on a fast host and more on the H200's (a 16 us S = 1024 forward ran
    host-bound; docs/tuning/attention.md, "Eager calls"). Traced code (torch.compile) keeps the
    custom ops, whose fake implementations it needs. ``policy`` is the AttentionPolicy object.
    Unlike the ops (whose fake implementations declare contiguous results), the output may be
    sequence-major (``out_seq``) and v6's gradients take their inputs' strides."""

    @staticmethod
    def forward(ctx, q, k, v, mask, bias, causal, scale, deterministic, policy, band, softcap, alibi, diag, out_seq):
        out, lse = _fwd_impl(q, k, v, mask, bias, causal, scale, policy, band, softcap, alibi, diag, out_seq)
        _setup_context(ctx, (q, k, v, mask, bias, causal, scale, deterministic, policy, band, softcap, alibi, diag),
                       (out, lse))
        ctx.eager = True
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse) + (None,)  # (out_seq)


def _launch_now(fn, grid, *args, **kwargs):
    return _launch(fn, grid, *args, **kwargs)  # the module's launcher at call time (tests record it)


_IMPL = (_fwd_impl, _bwd_impl, _launch_now)  # what a plan's first call runs (``plans.Plan``)


# ---------------------------------------------------------------------------------------------------- Public API

def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    mask: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                    scale: Optional[float] = None, return_lse: bool = False, deterministic: bool = True,
                    policy: Optional[AttentionPolicy] = None, window: Optional[tuple] = None,
                    align: str = "top_left", softcap: Optional[float] = None,
                    alibi_slopes: Optional[torch.Tensor] = None):
    """FlashAttention-2: ``softmax(scale * q @ k^T + bias, where mask) @ v`` without an S x S tensor.

    q:      (B, H, Sq, D) CUDA tensor, float16 / bfloat16 (float32 works, slower: no tensor cores).
            Any strides (read through them). v5 / v6, which load by TMA, read head-major (contiguous)
            and sequence-major ((B, S, H, D) storage viewed as (B, H, S, D), transformers' layout)
            tensors in place; an eager call routed to them copies other strided q, k, v and dO (and
            all strided ones for a window or score mod) to contiguous first. D in [1, 256]; 64 and
            128 are the tuned ones. CPU tensors run the fp32 reference (``reference``: the whole
            score matrix; any policy).
    k, v:   (B, Hkv, Sk, D), q's dtype and device; H must be a multiple of Hkv (grouped-query
            attention: query head h reads K/V head h // (H // Hkv)). Sk may differ from Sq.
    causal: query i attends to keys up to its diagonal key (``align``): j <= i by default, as SDPA's
            ``is_causal``.
    mask:   optional bool tensor broadcastable to (B, H, Sq, Sk), True = attend, e.g. (Sq, Sk),
            (B, 1, 1, Sk) for padding. Combined with ``causal`` by AND. Key tiles the mask
            blocks for a whole query tile are skipped. A row with no key left gives 0 (not NaN).
    bias:   optional float16/bfloat16/float32 tensor broadcastable to (B, H, Sq, Sk), added to
            the scaled scores (e.g. ALiBi as (1, H, Sq, Sk)); -inf entries act as a mask. When it
            requires grad, its gradient (summed over its broadcast dims) is computed.
    scale:  multiplies q @ k^T; default 1 / sqrt(D).
    return_lse: also return the log-sum-exp of each row of scaled scores, (B, H, Sq) float32
            (-inf for rows with every key masked); differentiable.
    deterministic: True (default): the backward is bitwise reproducible (two kernels, no float
            atomics). False: one fused backward kernel that adds dQ with fp32 atomics (5 matmuls
            instead of 7, faster; dQ may differ in the last bits from run to run; dK, dV and the
            bias gradient stay reproducible). D > 128 always uses the deterministic kernels. The
            forward is the same either way.
    window: (left, right), ints >= 0 or None (unbounded): a sliding window, query i attends to keys
            from left before to right after its diagonal key (Mistral's, FA2's ``window_size``);
            with ``causal``, right must be None or 0. Key tiles outside it are not visited.
    align:  where query i's diagonal key is when Sq != Sk: "top_left" (j = i; SDPA's ``is_causal``,
            the default, unchanged from earlier releases) or "bottom_right" (j = i + Sk - Sq; FA2 >=
            2.1 and SDPA's ``causal_lower_right``: the last query sees every key, as when new
            queries attend to a KV cache). A band (window, bottom-right causal with Sq != Sk) without
            mask, bias or score mods runs on v5's band kernel at D = 128 (``ws_band``) and v6's backward
            where the policy's is "ws" (``ws_bwd_band``), else on v3's kernels; a window as wide as the
            sequence runs as no window.
    softcap: a float > 0: the scores scale * q.k become softcap * tanh(scale * q.k / softcap) (Gemma 2),
            before ``bias``, ALiBi and the masks. v3 kernels only, as windows.
    alibi_slopes: (H,) or (B, H) float tensor on q's device: adds -slope[b, h] * |j - i - diag| to the
            scores, diag the diagonal of ``align`` (0, or Sk - Sq) as FA2's ``alibi_slopes``; no dense
            bias is read. No gradient for the slopes. v3 kernels only, as windows.
    policy: what this call runs, forward and backward (``AttentionPolicy``); default
            ``default_policy(q, k, ...)``, i.e. ``choose_policy``. Its ``backward="atomic"`` needs
            ``deterministic=False``. Build it outside ``torch.compile``d code.

    Returns out (B, H, Sq, D) in q's dtype; or (out, lse) with ``return_lse``. out is contiguous,
    except in an eager call routed to v5 / v6 without a window or score mod where q or v is
    sequence-major: then out is too (the strides of a transposed (B, Sq, H, D), so
    ``out.transpose(1, 2).contiguous()`` copies nothing), and the gradients v6 writes have q's, k's,
    v's strides.
    Differentiable in q, k, v and bias. Under ``torch.compile`` it is the
    ``torch.library.custom_op`` ``torch.ops.tilewise.flash_attention_fwd`` (with a fake
    implementation and autograd); eager calls run the same kernels through an
    ``autograd.Function``, without the custom-op dispatcher's host time. An eager call without mask,
    bias, window or score mod replays the launches of an earlier call of its layout (``plans``: call
    plans, off with ``policy.replace(plans=False)``).
    """
    planned = None  # a plain eager call's plan key (``plans``): its later calls skip what follows
    if (mask is None and bias is None and window is None and softcap is None and alibi_slopes is None
            and not torch.compiler.is_compiling()):
        planned = _plans.key(q, k, v, causal, scale, deterministic, policy, align)
        plan = _plans.lookup(planned) if planned is not None else None
        if plan is not None:
            out, lse = plan(q, k, v)
            return (out, lse) if return_lse else out
    cpu = runs_reference("flash_attention", {"q": q, "k": k, "v": v, "mask": mask, "bias": bias,
                                             "alibi_slopes": alibi_slopes}, interpreter=True)
    _check(q, k, v, mask, bias, scale, cpu=cpu)
    if not isinstance(deterministic, bool):
        raise ValueError(f"flash_attention: 'deterministic' must be a bool, got {deterministic!r}")
    if policy is not None:
        if not isinstance(policy, AttentionPolicy):
            raise ValueError(f"flash_attention: 'policy' must be an AttentionPolicy or None, "
                             f"got {type(policy).__name__}")
        if deterministic and policy.backward in ("atomic", "cudnn"):
            raise ValueError(f"flash_attention: the policy's {policy.backward} backward is not deterministic; "
                             "pass deterministic=False")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    causal = bool(causal)
    _check_band(causal, window, align)
    alibi = _check_mods(q.shape[0], q.shape[1], q.device, softcap, alibi_slopes, scale)
    if cpu:  # the one CPU rule: the fp32 reference (an S x S score matrix), differentiable by PyTorch
        return reference(q, k, v, causal=causal, mask=mask, bias=bias, scale=scale, return_lse=return_lse,
                         window=window, align=align, softcap=softcap, alibi_slopes=alibi_slopes)
    Sq, Sk = q.shape[2], k.shape[2]
    band, causal = _call_band(causal, window, align, Sq, Sk)  # a band holds the causal edge
    softcap, diag = float(softcap or 0.0), (Sk - Sq if align == "bottom_right" else 0)
    if torch.compiler.is_compiling():  # the policy travels as its key; "" = chosen inside the ops
        out, lse = _fwd_op(q, k, v, mask, bias, causal, scale, deterministic, policy.key if policy is not None else "",
                           band, softcap, alibi, diag)
    else:
        if policy is None:
            policy = default_policy(q, k, causal=causal, mask=mask, bias=bias, deterministic=deterministic)
        out_seq, given = False, (q, k, v)
        if policy.forward == "ws" or policy.backward == "ws":
            # v5 / v6 read q, k, v by TMA: head-major or sequence-major (transformers' transposed
            # (B, S, H, D)) in place, another strided view copied (v3's pointer kernels cost more).
            q, k, v, out_seq = _for_ws(q, k, v, band is None and not softcap and alibi is None)
        if planned is not None and _plans.admit(planned, band is None and scale > 0 and q.numel() > 0 and Sk > 0):
            out, lse = _plans.first_call(planned, given, q, k, v, out_seq, causal, scale, policy, _IMPL)
            return (out, lse) if return_lse else out
        out, lse = _EagerFlash.apply(q, k, v, mask, bias, causal, scale, deterministic, policy, band, softcap, alibi,
                                     diag, out_seq)
    return (out, lse) if return_lse else out


def _variant(q, k, v, causal, mask, bias, scale, return_lse, policy, deterministic=True, **changes):
    """flash_attention with ``changes`` to ``policy`` (default: the call's default policy)."""
    if policy is None:
        policy = default_policy(q, k, causal=causal, mask=mask, bias=bias, deterministic=deterministic)
    return flash_attention(q, k, v, causal=causal, mask=mask, bias=bias, scale=scale, return_lse=return_lse,
                           deterministic=deterministic, policy=_changed(policy, tuple(sorted(changes.items()))))


def v3_flash2(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False, policy=None):
    """The Triton forward (v3; v4's TMA kernel for a bias where it applies), without v5. The backward
    is the policy's (the bench's row of this name times v3's). ``policy``: the base, default the call's."""
    return _variant(q, k, v, causal, mask, bias, scale, return_lse, policy, forward="pointer")


def v3_flash2_atomic(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False, policy=None):
    """The policy's forward (v5 where ``configs.WS_FWD_RULES`` say, else v3); the backward is the fused
    atomic-dQ kernel (``deterministic=False``; v3's two kernels above D = 128)."""
    return _variant(q, k, v, causal, mask, bias, scale, return_lse, policy, deterministic=False, backward="atomic")


def v4_flash2_tma(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False, policy=None):
    """v3 with the forward's Q/K/V tiles loaded by TMA where ``_tma_applies`` (else v3 exactly);
    the backward is the policy's (the bench's row times v3's)."""
    return _variant(q, k, v, causal, mask, bias, scale, return_lse, policy, forward="tma")


def v5_flash2_ws(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False, policy=None):
    """The forward through v5 (warp-specialized Gluon kernel, ``gluon_fwd``) where ``_ws_applies``
    (else as v3), with the rules' v5 config; the backward is the policy's (the bench's row times
    v3's; ``v6_flash2_ws_bwd`` v6's)."""
    return _variant(q, k, v, causal, mask, bias, scale, return_lse, policy, forward="ws")


VARIANTS = {"v1_naive": reference, "v2_online": reference_tiled, "v3_flash2": v3_flash2,
            "v3_flash2_atomic": v3_flash2_atomic, "v4_flash2_tma": v4_flash2_tma, "v5_flash2_ws": v5_flash2_ws}
