"""attention: softmax(scale * Q K^T + bias, masked) V over (B, H, S, D) tensors, forward and backward.

Versions (``VARIANTS``, forward; each has a backward through autograd):
    v1_naive:  PyTorch, the full (Sq, Sk) score matrix in fp32, softmax, then P V.
               bound: memory: B H Sq Sk x (4 + 4 + 2) bytes of scores written and read back.
    v2_online: PyTorch, the lectures' tiled online softmax: key tiles of 128, a running max, running
               sum and rescaled accumulator; never holds more than (Sq, 128) scores.
               bound: launch overhead and the (Sq, 128) temporaries (one eager op per line per tile).
    v3_flash2: Triton FlashAttention-2 (``attention_kernels.py``): one program per (query tile,
               batch x head), Q in registers, K/V tiles streamed, online softmax in the log2
               domain, the log-sum-exp (LSE) saved; causal tiles above the diagonal not loaded,
               mask-blocked key tiles skipped from a per-tile "any key live" map. Opt-in
               (``_BIAS_FWD["pair_max_d"]``): a forward for a bias shared by the batch that runs
               two batch elements a program on one bias tile (off: no faster, see ``_BIAS_FWD``).
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
               dBias still are. D > 128 uses v3's backward. Opt-in ``ordered_dq()``: the same
               kernel with deterministic=True, dQ read-modify-written (no float atomics) one key
               tile at a time in a fixed order; reproducible, measured slower than both.
               bound: tensor-core FLOPs, plus the dQ reductions (Sk / BLOCK_N fp32
               read-modify-writes of each dQ element, in L2).
    v4_flash2_tma: v3 whose forward loads Q/K/V tiles by TMA (tensor descriptors) instead of
               per-thread pointers, for contiguous fp16/bf16 inputs without mask or bias and D in
               {32, 64, 128, 256}; opt-in (``use_tma()``: slower than v3's pointer loads there).
               Its kernel with a dense-row bias is the default bias forward (``_BIAS_FWD["tma"]``).
               bound: as v3.
    v5_flash2_ws: the forward warp-specialized in Gluon (``attention_gluon.py``, sm_90, fp16/bf16,
               D 64 / 128, no mask; a dense-row bias): a TMA loader warp feeds a ring of K/V (and
               bias) stages to two or three consumer warpgroups of 64 query rows, each running
               its own S = QK^T, softmax and PV, so one warpgroup's exponentials overlap another's
               wgmma. The default where ``_WS_RULES`` measured it faster (D = 128; D = 64 from
               Sq = 4096); at D = 128 without causal on a persistent grid (one CTA an SM,
               ``attention_gluon.PERSISTENT_RULES``). bound: tensor-core FLOPs and, at D = 64, the
               exponentials (MUFU: one per score).
    v6 (backward; bench row ``v6_flash2_ws_bwd``): the deterministic backward's dK / dV and dQ
               kernels warp-specialized in Gluon (``attention_gluon_bwd.py``, sm_90, D 64 / 128,
               no mask or bias): a TMA loader warp streams Q / dO (dK / dV kernel) or K / V (dQ
               kernel) tiles to two consumer warpgroups of 64 keys / query rows. The default
               backward where ``_WS_BWD_RULES`` say (D = 128, with causal from S = 2048; D = 64
               from S = 4096), else v3's.
               bound: tensor-core FLOPs: 7 matmuls a tile pair, as v3's two kernels (S and dP
               are computed in both), where the fused atomic kernel does 5.

Semantics follow ``torch.nn.functional.scaled_dot_product_attention`` (SDPA): ``mask`` True =
attend; ``causal`` is top-left aligned (query i sees keys j <= i, also when Sq != Sk); GQA as
SDPA's ``enable_gqa`` (query head h uses K/V head h // (H // Hkv)). One difference: a row whose
every key is masked gives output 0 and LSE -inf (SDPA gives NaN), and gradients 0 for it.

Why each tile table, route and default below is what it is, with the measurements behind it:
docs/tuning/attention.md (one section per decision; the comments here name the section).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from typing import Optional

import torch

from ..cost import Cost
from ..runtime.triton_launch import launch as _launch

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_BIAS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------

def _expand_kv(k: torch.Tensor, h: int) -> torch.Tensor:
    return k if k.shape[1] == h else k.repeat_interleave(h // k.shape[1], dim=1)


def _logits_mask(b, h, sq, sk, causal, mask, device):
    """The boolean (.., Sq, Sk) 'attend' map combining causal and mask, or None."""
    keep = None
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
    if mask is not None:
        keep = mask if keep is None else keep & mask
    return keep


def reference(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False):
    """v1_naive: the full score matrix in fp32 (B H Sq Sk x 4 bytes written, then read twice).

    Shapes as in ``flash_attention``; returns out in q's dtype (and LSE (B, H, Sq) fp32). Rows with
    every key masked give 0 and LSE -inf.
    """
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    ct = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    kf, vf = _expand_kv(k, H).to(ct), _expand_kv(v, H).to(ct)
    s = torch.matmul(q.to(ct), kf.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.to(ct)
    keep = _logits_mask(B, H, Sq, Sk, causal, mask, q.device)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # exp(s - lse) is NaN on an all -inf row; those rows are defined as 0.
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    out = torch.matmul(p, vf).to(q.dtype)
    return (out, lse) if return_lse else out


def reference_tiled(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False,
                    block_n: int = 128):
    """v2_online: the online softmax over key tiles of ``block_n`` (running max m, sum l, and an
    accumulator rescaled by exp(m_old - m_new) whenever the max grows). Same contract as
    ``reference``; only (B, H, Sq, block_n) scores exist at a time."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    ct = torch.promote_types(q.dtype, torch.float32)
    kf, vf, qf = _expand_kv(k, H).to(ct), _expand_kv(v, H).to(ct), q.to(ct)
    keep = _logits_mask(B, H, Sq, Sk, causal, mask, q.device)
    if keep is not None:
        keep = keep.expand(B, H, Sq, Sk)
    if bias is not None:
        bias = bias.expand(B, H, Sq, Sk)
    m = torch.full((B, H, Sq), float("-inf"), device=q.device, dtype=ct)
    l = torch.zeros((B, H, Sq), device=q.device, dtype=ct)
    acc = torch.zeros((B, H, Sq, D), device=q.device, dtype=ct)
    for n0 in range(0, Sk, block_n):
        n1 = min(Sk, n0 + block_n)
        s = torch.matmul(qf, kf[:, :, n0:n1].transpose(-1, -2)) * scale
        if bias is not None:
            s = s + bias[..., n0:n1].to(ct)
        if keep is not None:
            s = s.masked_fill(~keep[..., n0:n1], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = m_new.masked_fill(torch.isinf(m_new) & (m_new < 0), 0.0)  # no -inf - -inf
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.matmul(p, vf[:, :, n0:n1])
        m = m_new
    empty = l == 0
    out = (acc / l.masked_fill(empty, 1.0)[..., None]).to(q.dtype)
    lse = torch.where(empty, torch.full_like(l, float("-inf")), m + torch.log(l.masked_fill(empty, 1.0)))
    return (out, lse) if return_lse else out


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
    flops = 4.0 * B * H * Sq * Sk * D
    if causal:
        flops /= 2
    q_bytes = B * H * Sq * D * item
    kv_bytes = 2 * B * Hkv * Sk * D * item
    lse_bytes = B * H * Sq * 4
    fwd_bytes = q_bytes + kv_bytes + q_bytes + lse_bytes
    if not backward:
        return Cost(flops, fwd_bytes + bias_bytes)
    bwd_bytes = (q_bytes + kv_bytes + 2 * q_bytes + lse_bytes) + (q_bytes + kv_bytes)
    return Cost(3.5 * flops, fwd_bytes + bwd_bytes + bias_bytes)


# ----------------------------------------------------------------------------------------------
# Configurations (block sizes, warps, stages) for sm_90; see docs/tuning/attention.md
# ----------------------------------------------------------------------------------------------

# (BLOCK_M, BLOCK_N, num_warps, num_stages), by the padded head dim: the largest tiles with no spill
# in the sm_90 register report; 8 warps (two warpgroups) so that each wgmma has M = 64 rows per
# warpgroup (docs/tuning/attention.md, "Forward tiles").
_FWD_CONFIGS = {32: (128, 64, 8, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)}
# dK/dV: a key tile of BLOCK_N stays in registers with two fp32 accumulators; query tiles stream;
# tiles from the sm_90 register report (docs/tuning/attention.md, "Deterministic backward tiles").
_DKDV_CONFIGS = {32: (64, 128, 8, 3), 64: (32, 128, 8, 3), 128: (32, 128, 8, 2), 256: (32, 32, 4, 1)}
# 2-byte inputs at D = 64: a 64-key tile in one warpgroup with 4 stages of 32-query tiles ran the
# backward 1.11x faster than 32 x 128 x 8 warps (1.19x causal; same section).
_DKDV_2BYTE = {64: (32, 64, 4, 4)}
# dQ: a query tile of BLOCK_M stays, key tiles stream (same section).
_DQ_CONFIGS = {32: (128, 64, 8, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 2), 256: (64, 32, 8, 2)}
# dQ that also stores dS for the bias gradient: the extra (BLOCK_M, BLOCK_N) store spills at 128 x 64.
_DQ_BIAS_CONFIGS = {**_DQ_CONFIGS, 128: (128, 32, 8, 2)}
# Atomic backward (deterministic=False): a key tile of BLOCK_N in registers as in dK/dV, plus a
# (BLOCK_M, D) fp32 dQ tile per query tile whose atomic add needs one 64-bit address per element.
# 64 x 128 spills a few cold registers at D = 128 yet ran 1.8x the only spill-free tile (16 x 128):
# ptxas' spill count is not the cost. 2-byte inputs at D = 128 take 3 stages (1.09x two; fp32 tiles
# need twice the shared memory) (docs/tuning/attention.md, "Atomic backward tiles").
_ATOMIC_CONFIGS = {32: (64, 128, 8, 2), 64: (64, 128, 8, 2), 128: (64, 128, 8, 2), 256: (16, 32, 4, 1)}
_ATOMIC_2BYTE = {128: (64, 128, 8, 3)}
# + the dS store for the bias gradient: 64 x 64 is spill-free at D = 64; nothing tried at D = 128 is
# (32 x 64: 67 spill instructions, 16 x 128: 71), the fewest-spill wgmma-friendly one is used
# (same section).
_ATOMIC_BIAS_CONFIGS = {**_ATOMIC_CONFIGS, 64: (64, 64, 8, 2), 128: (32, 64, 8, 2)}
# The same kernel with dQ added by a TMA bulk reduce-add (``DQ_TMA``) from shared memory instead of
# per-element atomics: the 64-bit addresses go, and D = 128 fits two stages without a spill
# (bias grad: 18 spill instructions, vs 67 for the pointer path's best). Only where it helps
# (docs/tuning/attention.md, "dQ by TMA reduce-add").
_ATOMIC_TMA_CONFIGS = {128: (16, 128, 8, 2)}
_ATOMIC_TMA_BIAS_CONFIGS = {128: (16, 128, 8, 2)}
_OVERRIDE: dict[str, tuple] = {}
# Forward with a bias shared by the batch (stride 0 over B): the grid runs batch-fastest so that the
# B programs reading one bias tile run together and share it through L2: 1.03-1.06x at D = 64, within
# noise at D = 128, where the math bounds the tile; on everywhere. A hand prefetch of the next key
# tile's bias ran 25-30 % slower (dropped) (docs/tuning/attention.md, "Bias forward: batch-fastest grid").
_BIAS_FWD = {"batch_fastest": True, "pair_max_d": 0, "tma": True}
# With a bias at D = 64 a 64 x 64 tile in one warpgroup ran 1.07x 128 x 64 x 8 warps; at D = 128
# 128 x 64 stays (64 x 64 ran 0.68x) (docs/tuning/attention.md, "Bias forward tiles").
_FWD_BIAS_CONFIGS = {**_FWD_CONFIGS, 64: (64, 64, 4, 3)}
# A bias tile prefetched like K and V (a masked pointer load is synchronous in the sm_90 TTGIR) by
# loading it as the A operand of a product with the identity was tried and removed: it paid a third
# MMA a key tile, 0.925x the add at D = 64 (docs/tuning/attention.md, "Bias through an identity
# product"). The TMA forward (_BIAS_FWD["tma"]) prefetches it without one.
# Bias shared by the batch, no mask, B even, head dim <= _BIAS_FWD["pair_max_d"]: two batch elements
# a program share each bias tile (attention_kernels._attn_fwd_bias_pair_kernel). Off by default
# (pair_max_d 0): 0.93-1.03x the one-element kernel at D = 64. Halving the bias reads did not pay for
# two accumulators' registers (252-255 a thread, half the resident warps): the bias is not what
# bounds the one-element kernel (docs/tuning/attention.md, "Bias pair kernel").
# The bias forward through v4's TMA kernel (``_BIAS_FWD["tma"]``, ``_tma_bias_applies``): 128 x 64 x 8
# warps x 3 stages at D = 64 and 128; at D = 64 it was ahead of 64 x 64 x 4 x 3 in three of four
# comparisons and level in the fourth (docs/tuning/attention.md, "Bias forward by TMA").
_FWD_TMA_BIAS_CONFIGS = {32: (64, 64, 4, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)}
_FWD_BIAS_PAIR_CONFIGS = {32: (64, 64, 4, 3), 64: (128, 64, 8, 3), 128: (64, 64, 4, 2), 256: (32, 32, 4, 1)}


@contextlib.contextmanager
def override_configs(**kinds):
    """Force (BLOCK_M, BLOCK_N, num_warps, num_stages) for kinds 'fwd', 'fwd_bias', 'fwd_tma_bias',
    'fwd_bias_pair', 'dkdv', 'dq',
    'dq_bias',
    'atomic', 'atomic_bias', 'atomic_tma', 'atomic_tma_bias' (the bias-grad kinds default to their
    plain kind's override; tests use tiny tiles so that the interpreter walks several tiles; the
    bench sweeps)."""
    old = dict(_OVERRIDE)
    _OVERRIDE.update(kinds)
    try:
        yield
    finally:
        _OVERRIDE.clear()
        _OVERRIDE.update(old)


def _block_d(D: int) -> int:
    return max(16, 1 << (D - 1).bit_length())


# The table of each kernel kind, and the kinds whose 2-byte inputs have entries of their own.
_TABLES = {"fwd": _FWD_CONFIGS, "fwd_bias": _FWD_BIAS_CONFIGS, "fwd_tma_bias": _FWD_TMA_BIAS_CONFIGS,
           "fwd_bias_pair": _FWD_BIAS_PAIR_CONFIGS,
           "dkdv": _DKDV_CONFIGS, "dq": _DQ_CONFIGS,
           "dq_bias": _DQ_BIAS_CONFIGS, "atomic": _ATOMIC_CONFIGS, "atomic_bias": _ATOMIC_BIAS_CONFIGS,
           "atomic_tma": _ATOMIC_TMA_CONFIGS, "atomic_tma_bias": _ATOMIC_TMA_BIAS_CONFIGS}
_TABLES_2BYTE = {"atomic": _ATOMIC_2BYTE, "dkdv": _DKDV_2BYTE}


def _config(kind: str, D: int, itemsize: int = 4) -> tuple:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of one kernel kind at head dim D for inputs of
    ``itemsize`` bytes (2-byte inputs first look in _TABLES_2BYTE)."""
    if kind in _OVERRIDE:
        return _OVERRIDE[kind]
    if kind.endswith("_bias") and kind[:-5] in _OVERRIDE:
        return _OVERRIDE[kind[:-5]]
    key = min(max(_block_d(D), 32), 256)
    if itemsize == 2 and key in _TABLES_2BYTE.get(kind, {}):
        return _TABLES_2BYTE[kind][key]
    return _TABLES[kind][key]


# ----------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------

def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check(q, k, v, mask, bias, scale):
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
    if q.device.type != "cuda" and not (_interpreting() and q.device.type == "cpu"):  # meta has no data
        raise ValueError(f"flash_attention: 'q' is on {q.device}; tilewise kernels need CUDA tensors "
                         f"(use attention.reference for CPU tensors)")
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


def _check_broadcast(name, t, full, device):
    if t.device != device:
        raise ValueError(f"flash_attention: '{name}' is on {t.device} but 'q' is on {device}")
    ok = t.dim() <= 4 and all(a in (1, b) for a, b in zip(t.shape[::-1], full[::-1]))
    if not ok:
        raise ValueError(f"flash_attention: '{name}' of shape {tuple(t.shape)} does not broadcast to "
                         f"(B, H, Sq, Sk) = {full}")


# ----------------------------------------------------------------------------------------------
# Launchers (v3_flash2)
# ----------------------------------------------------------------------------------------------

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


def _empty_like_out(q):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


# v4 (TMA loads) without a bias is opt-in (``with use_tma(): ...`` or the variant): 5-8 % slower
# than v3's pointer loads on every plain forward measured. With a bias it is the default where it
# applies (``_BIAS_FWD["tma"]``): its bias tile is prefetched, the pointer kernel's is not
# (docs/tuning/attention.md, "v4: TMA forward").
_TMA = {"on": False}


@contextlib.contextmanager
def use_tma(on: bool = True):
    """Forward through v4 (TMA tensor descriptors) where it applies (see ``_tma_applies``)."""
    old = _TMA["on"]
    _TMA["on"] = on
    try:
        yield
    finally:
        _TMA["on"] = old


# v5 (attention_gluon: the warp-specialized Gluon forward, sm_90): the default where ``_WS_RULES``
# has the (head dim, causal, bias) case and Sq reaches its minimum; opt-in elsewhere (``use_ws`` or
# the v5 variant). Each rule: (smallest Sq, v5 config or None for attention_gluon's default of two
# consumer warpgroups). D = 128 (two consumers): 1.03-1.16x the Triton forward from S = 1024. D = 64
# (three consumers, 192 query rows a CTA, 160 registers each): 1.02-1.15x from S = 4096, 0.73-0.96x
# at S = 1024 (2048 short CTAs of one per SM, where v3 keeps several resident). D = 64 S = 2048 and
# causal with a bias (no SDPA baseline) are not measured and keep the Triton forward
# (docs/tuning/attention.md, "v5 forward routes").
_WS = {"on": None}  # None: the rules; True / False: forced where it applies / off
_WS_THREE = (128, 2, 160, None, 3)  # BLOCK_N, STAGES, consumer registers, maxnreg, consumers
_WS_RULES: dict = {(128, False, False): (0, None), (128, True, False): (0, None), (128, False, True): (0, None),
                   (64, False, False): (4096, _WS_THREE), (64, True, False): (4096, _WS_THREE),
                   (64, False, True): (4096, _WS_THREE)}


@contextlib.contextmanager
def use_ws(on: bool | None = True):
    """Forward through v5 (the warp-specialized Gluon kernel) where it applies (``_ws_applies``);
    False: never; None: where ``_WS_RULES`` says."""
    old = _WS["on"]
    _WS["on"] = on
    try:
        yield
    finally:
        _WS["on"] = old


def _ws_applies(q, k, v, mask, bias, bias_strides) -> bool:
    """v5 needs Hopper (wgmma; sm_90 exactly), Gluon, D 64 or 128, the q/k/v layouts v4's TMA
    loads need (``_tma_applies``: 16-bit, contiguous, aligned, no mask) and a bias (if any) that
    TMA reads by rows (``_tma_bias_rows``)."""
    from . import attention_gluon as ag

    return (q.shape[-1] in (64, 128) and ag.available() and q.is_cuda and not _interpreting()
            and _tma_applies(q, k, v, mask, None) and (bias is None or _tma_bias_rows(q, k, bias, bias_strides))
            and torch.cuda.get_device_capability(q.device) == (9, 0))


def _ws_plan(D, causal, has_bias, Sq):
    """(run v5?, its config or None): forced by ``use_ws``, else by ``_WS_RULES``. A forced v5 takes
    the rule's config where there is one."""
    rule = _WS_RULES.get((D, bool(causal), has_bias))
    cfg = rule[1] if rule is not None else None
    if _WS["on"] is not None:
        return _WS["on"], cfg
    return rule is not None and Sq >= rule[0], cfg


# The deterministic backward as one fused kernel (the atomic kernel's 5 matmuls, not the two
# kernels' 7), its dQ adds taken in a fixed key-tile order (``ORDERED`` in the kernel): GPU only
# (the interpreter runs programs one after another, so a causal key tile would wait forever on a
# later one), no mask (skipped tiles would break the count), D <= 128. ``_ORDERED_DQ["on"]``: None
# = where ``_ORDERED_RULES`` has (head dim, bias gradient); True / False: forced where it applies /
# off. Slower than the two-kernel backward everywhere (0.91-0.95x SDPA flash fwd+bwd at D = 128
# against 1.07-1.12x): each dQ read-modify-write's L2 load sits on the query tile loop's critical
# path, so the rules stay empty (docs/tuning/attention.md, "Ordered dQ").
_ORDERED_DQ = {"on": None, "mode": 1}  # mode: the kernel's ORDERED (1 per-thread counts, 2 per-warp)
_ORDERED_RULES: set = set()


@contextlib.contextmanager
def ordered_dq(on: bool | None = True):
    """Deterministic backward through the fused kernel with ordered dQ adds where it applies
    (True), never (False), or where ``_ORDERED_RULES`` says (None). Read when the backward runs:
    the ``with`` block must contain the backward call, not only the forward."""
    old = _ORDERED_DQ["on"]
    _ORDERED_DQ["on"] = on
    try:
        yield
    finally:
        _ORDERED_DQ["on"] = old


# v6 (attention_gluon_bwd): the backward's dK / dV and dQ kernels warp-specialized in Gluon (sm_90,
# D 64 / 128, no mask or bias; deterministic). ``_WS_BWD["on"]``: None = where ``_WS_BWD_RULES``
# say, True / False forced where it applies / off; read when the backward runs, as ``ordered_dq``.
# The deterministic backward only: ``deterministic=False`` keeps the fused atomic kernel, which is
# slower than v6 where the rules send v6 (D = 128 S = 4096: atomic 3.82 ms, v6 3.07 ms, v3's two
# kernels 4.62 ms), so at D = 128 the default is also the fastest. Rules, (head dim, causal) ->
# least min(Sq, Sk): D = 128 1.38-1.61x v3's two kernels from S = 1024; D = 64 0.85-0.88x at
# S = 1024, 1.05-1.24x from 4096. Causal D = 128 from S = 2048: at S = 1024 the call is host-bound
# (v5 + v6 ~1.0 ms of host time against v3's ~0.7) and v3's path ran faster
# (docs/tuning/attention.md, "v6 backward routes").
_WS_BWD = {"on": None, "dq": True}
_WS_BWD_RULES = {(128, False): 1, (128, True): 2048, (64, False): 4096, (64, True): 4096}


@contextlib.contextmanager
def use_ws_bwd(on: bool | None = True, dq: bool = True):
    """The deterministic backward through v6's Gluon kernels where they apply (``_ws_bwd_applies``):
    forced (True), never (False: v3's two kernels, or the ordered kernel if ``ordered_dq`` says), or
    where ``_WS_BWD_RULES`` say (None, the default). dK / dV, and dQ too unless ``dq=False`` (v3's
    dQ kernel then). Read when the backward runs: the ``with`` block must contain it."""
    old = dict(_WS_BWD)
    _WS_BWD.update(on=on, dq=dq)
    try:
        yield
    finally:
        _WS_BWD.update(old)


def _ws_bwd_applies(q, k, v, do, mask, bias) -> bool:
    """v6's kernels run where v5's forward does without a bias (``_ws_applies``: Gluon, sm_90, D 64
    or 128, q / k / v as TMA loads them, no mask), with dO laid out as q."""
    return (bias is None and do.dtype == q.dtype and do.is_contiguous() and do.data_ptr() % 16 == 0
            and _ws_applies(q, k, v, mask, None, None))


def _ws_bwd_rule(D, causal, Sq, Sk) -> bool:
    least = _WS_BWD_RULES.get((D, bool(causal)))
    return least is not None and min(Sq, Sk) >= least


def _ws_bwd_plan(q, k, v, do, mask, bias, causal) -> bool:
    on = _WS_BWD["on"]
    if on is False or (on is None and not _ws_bwd_rule(q.shape[-1], causal, q.shape[2], k.shape[2])):
        return False
    return _ws_bwd_applies(q, k, v, do, mask, bias)


def _empty_grad_like(t: torch.Tensor) -> torch.Tensor:
    """The backward's dQ / dK / dV buffers (tests swap in NaN-filled ones)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _ordered_plan(q, D, mask, bias_grad) -> bool:
    if mask is not None or not q.is_cuda or _interpreting():
        return False
    on = _ORDERED_DQ["on"]
    return on if on is not None else (D, bool(bias_grad)) in _ORDERED_RULES


# dQ of the atomic backward by TMA reduce-add where ``_ATOMIC_TMA_CONFIGS`` has the head dim; GPU
# only (the interpreter has no descriptor reduce). "works" turns False at the first build failure
# (e.g. a Triton without descriptor atomic_add), after which pointer atomics are used.
# Off by default: on the H200 the TMA reduce-add path's best tile (32 x 128) ran 263.4 TFLOP/s
# against 330.8 for pointer atomics at 64 x 128 (D = 128, non-causal; docs/tuning/attention.md,
# "dQ by TMA reduce-add").
_DQ_TMA = {"on": False, "works": None}


@contextlib.contextmanager
def dq_tma(on: bool = True):
    """Turn the atomic backward's TMA reduce-add of dQ on or off (experiments, tests)."""
    old = _DQ_TMA["on"]
    _DQ_TMA["on"] = on
    try:
        yield
    finally:
        _DQ_TMA["on"] = old


def _dq_tma_applies(q, D) -> bool:
    """sm_90+, and a head dim with a TMA config that equals its tile width (the fp32 (B * H, Sq, D)
    dQ view then has 16-byte rows and the box never exceeds the tensor's last dim)."""
    return (_DQ_TMA["on"] and _DQ_TMA["works"] is not False and not _interpreting() and q.is_cuda
            and D in _ATOMIC_TMA_CONFIGS and torch.cuda.get_device_capability(q.device)[0] >= 9)


def _tma_applies(q, k, v, mask, bias) -> bool:
    """v4 needs dense (rows, D) views with 16-byte aligned rows, a power-of-two D, no mask or bias,
    and row indices that fit int32."""
    D = q.shape[-1]
    return (mask is None and bias is None and D in (32, 64, 128, 256) and q.dtype in (torch.float16, torch.bfloat16)
            and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v))
            and q.numel() // D < 2 ** 31 and k.numel() // D < 2 ** 31)


def _tma_bias_rows(q, k, bias, bias_strides) -> bool:
    """A bias TMA can read by rows: q's dtype, contiguous, its rows not broadcast (its query dim is
    real, so its storage is a dense (rows, Sk) matrix), 16-byte aligned base and rows."""
    Sk = k.shape[2]
    return (bias.dtype == q.dtype and bias.is_contiguous() and bias.data_ptr() % 16 == 0 and bias_strides[3] == 1
            and bias_strides[2] == Sk and (Sk * bias.element_size()) % 16 == 0 and bias.numel() // Sk < 2 ** 31)


def _tma_bias_applies(q, k, v, bias, bias_strides) -> bool:
    """The bias forward through v4's TMA kernel (``_BIAS_FWD["tma"]``): q/k/v as ``_tma_applies``
    asks and a bias as ``_tma_bias_rows`` asks, on sm_90+."""
    return (_BIAS_FWD["tma"] and _tma_applies(q, k, v, None, None) and _tma_bias_rows(q, k, bias, bias_strides)
            and (_interpreting() or (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9)))


def _fwd_tma(q, k, v, causal, scale, out, lse, bias=None, bias_strides=None):
    from triton.tools.tensor_descriptor import TensorDescriptor

    from . import attention_kernels as K_

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    bm, bn, warps, stages = _config("fwd_tma_bias" if bias is not None else "fwd", D)
    q2, k2, v2 = q.view(-1, D), k.view(-1, D), v.view(-1, D)
    qd = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [bm, D])
    kd = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [bn, D])
    vd = TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [bn, D])
    bd, rows_b, rows_h, batch_fastest = None, 0, 0, False
    if bias is not None:
        b2 = bias.reshape(-1, Sk)
        bd = TensorDescriptor(b2, list(b2.shape), list(b2.stride()), [bm, bn])
        rows_b, rows_h = bias_strides[0] // Sk, bias_strides[1] // Sk
        batch_fastest = B > 1 and rows_b == 0 and _BIAS_FWD["batch_fastest"]
    _launch(K_._attn_fwd_tma_kernel, (-(-Sq // bm), B * H),
        qd, kd, vd, bd, out, lse, H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, rows_b, rows_h, *out.stride(),
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, CAUSAL=causal, HAS_BIAS=bias is not None,
        BATCH_FASTEST=batch_fastest, num_warps=warps, num_stages=stages)
    return out, lse


def _fwd_impl(q, k, v, mask, bias, causal, scale):
    from . import attention_kernels as K_

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    out = _empty_like_out(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    if Sk == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    if scale <= 0:
        # The kernels take the row max on q.k unscaled (the scale rides in the exponent, see
        # attention_kernels._fwd_update), which needs a positive scale: scale * q.k is
        # (-scale) * (-q).k, and a zero scale leaves the bias alone (0 = 0 * k with scale 1).
        q, scale = (-q, -scale) if scale < 0 else (torch.zeros_like(q), 1.0)
    full = (B, H, Sq, Sk)
    bias_strides = _bcast_strides(bias, full)
    ws, ws_cfg = _ws_plan(D, causal, bias is not None, Sq)
    if ws and _ws_applies(q, k, v, mask, bias, bias_strides):
        from . import attention_gluon as ag
        return ag.fwd(q, k, v, causal, scale, out, lse, bias, bias_strides, launch=_launch, config=ws_cfg)
    if _TMA["on"] and _tma_applies(q, k, v, mask, bias):
        return _fwd_tma(q, k, v, causal, scale, out, lse)
    if bias is not None and mask is None and _tma_bias_applies(q, k, v, bias, bias_strides):
        return _fwd_tma(q, k, v, causal, scale, out, lse, bias, bias_strides)
    if (bias is not None and mask is None and B % 2 == 0 and bias_strides[0] == 0
            and D <= _BIAS_FWD["pair_max_d"]):
        return _fwd_bias_pair(q, k, v, bias_strides, bias, causal, scale, out, lse)
    bm, bn, warps, stages = _config("fwd_bias" if bias is not None else "fwd", D)
    flags = _block_flags(mask, full, bm, bn) if mask is not None else None
    mask8 = mask.view(torch.uint8) if mask is not None else None
    dummy = q
    grid = (-(-Sq // bm), B * H)
    batch_fastest = bias is not None and B > 1 and bias_strides[0] == 0 and _BIAS_FWD["batch_fastest"]
    _launch(K_._attn_fwd_kernel, grid,
        q, k, v, out, lse,
        bias if bias is not None else dummy, mask8 if mask8 is not None else dummy,
        flags if flags is not None else dummy,
        H, H // Hkv, Sq, Sk, scale * 1.4426950408889634,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *bias_strides, *_bcast_strides(mask8, full),
        *(flags.stride() if flags is not None else (0, 0, 0, 0)),
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=_block_d(D), CAUSAL=causal,
        HAS_BIAS=bias is not None, HAS_MASK=mask is not None, HAS_FLAGS=flags is not None,
        PREC="ieee" if q.dtype == torch.float32 else None, BATCH_FASTEST=batch_fastest,
        num_warps=warps, num_stages=stages)
    return out, lse


def _fwd_bias_pair(q, k, v, bias_strides, bias, causal, scale, out, lse):
    from . import attention_kernels as K_

    B, H, Sq, D = q.shape
    bm, bn, warps, stages = _config("fwd_bias_pair", D)
    _launch(K_._attn_fwd_bias_pair_kernel, (-(-Sq // bm), B // 2 * H),
        q, k, v, out, lse, bias, H, H // k.shape[1], Sq, k.shape[2], scale * 1.4426950408889634,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *bias_strides[1:],
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=_block_d(D), CAUSAL=causal,
        PREC="ieee" if q.dtype == torch.float32 else None, num_warps=warps, num_stages=stages)
    return out, lse


def _bwd_impl(do, q, k, v, out, lse, dlse, mask, bias, causal, scale, bias_grad, deterministic=True):
    from . import attention_kernels as K_

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    # Every element of dQ, dK, dV is stored by the kernels (rows with no live key store 0).
    dq = _empty_grad_like(q)
    dk = _empty_grad_like(k)
    dv = _empty_grad_like(v)
    dbias = q.new_empty((0,))
    if q.numel() == 0 or Sk == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        if bias_grad:
            dbias = torch.zeros_like(bias, memory_format=torch.contiguous_format)
        return dq, dk, dv, dbias
    full = (B, H, Sq, Sk)
    bd = _block_d(D)
    prec = "ieee" if q.dtype == torch.float32 else None  # fp32: no tf32 rounding
    dummy = q

    delta = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    # v6 (deterministic) unless the fused kernel with ordered dQ adds is forced (``ordered_dq(True)``).
    ws_bwd = deterministic and _ORDERED_DQ["on"] is not True and _ws_bwd_plan(q, k, v, do, mask, bias, causal)
    # D > 128: the fused kernel spills even at 16 x 32 tiles (sm_90 report), so those head dims
    # keep the two-kernel backward whatever ``deterministic`` says.
    ordered = not ws_bwd and deterministic and bd <= 128 and _ordered_plan(q, D, mask, bias_grad)
    atomic = not ws_bwd and (not deterministic or ordered) and bd <= 128
    # The atomic (and ordered) path's fp32 dQ accumulator, zeroed by the preprocess kernel.
    dq_acc = None if not atomic else torch.empty((B, H, Sq, D), dtype=torch.float32, device=q.device)
    pm = 64
    _launch(K_._attn_bwd_preprocess_kernel, (-(-Sq // pm), B * H),
        out, do, dlse if dlse is not None else delta, delta, dq_acc if dq_acc is not None else delta,
        H, Sq, *out.stride(), *do.stride(),
        BLOCK_M=pm, HEAD_DIM=D, BLOCK_D=bd, HAS_DLSE=dlse is not None, ZERO_DQ=dq_acc is not None)

    if ws_bwd:  # v6 (no mask, no bias): dK / dV, and dQ unless v3's is asked for, by the Gluon kernels
        from . import attention_gluon_bwd as gb

        memo: dict = {}  # the TMA descriptors both kernels use, built once
        gb.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv, launch=_launch, memo=memo)
        if _WS_BWD["dq"]:
            gb.dq(q, k, v, do, lse, delta, causal, scale, dq, launch=_launch, memo=memo)
            return dq, dk, dv, dbias

    mask8 = mask.view(torch.uint8) if mask is not None else None
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride(),
              *_bcast_strides(bias, full), *_bcast_strides(mask8, full))
    bias_arg = bias if bias is not None else dummy
    mask_arg = mask8 if mask8 is not None else dummy
    # A bias of the full (B, H, Sq, Sk) shape takes dS directly (contiguous, its own dtype); a
    # broadcast one gets an fp32 (B, H, Sq, Sk) buffer, summed in a fixed order afterwards.
    # Without causal or mask every (query, key) of dS is stored by the kernels: no zero fill
    # (4.3 GB of writes at B=4, H=16, S=4096 in fp32, about 1 ms).
    direct = bias_grad and tuple(_as4(bias).shape) == full
    alloc = torch.zeros if (causal or mask is not None) else torch.empty
    if direct:
        ds = alloc(full, dtype=bias.dtype, device=q.device)
    else:
        ds = alloc(full, dtype=torch.float32, device=q.device) if bias_grad else dummy

    if atomic:
        def launch(use_tma):
            kind = ("atomic_tma" if use_tma else "atomic") + ("_bias" if bias_grad else "")
            bm, bn, warps, stages = _config(kind, D, q.dtype.itemsize)
            flags = _block_flags(mask, full, bm, bn) if mask is not None else None
            # Ordered: one int32 count per (batch x head, query tile), zeroed here.
            sem = torch.zeros((B * H, -(-Sq // bm)), dtype=torch.int32, device=q.device) if ordered else dummy
            dq_arg = dq_acc
            if use_tma:
                from triton.tools.tensor_descriptor import TensorDescriptor

                d3 = dq_acc.view(B * H, Sq, D)
                dq_arg = TensorDescriptor(d3, list(d3.shape), list(d3.stride()), [1, bm, bd])
            _launch(K_._attn_bwd_atomic_kernel, (-(-Sk // bn), B * Hkv),
                q, k, v, do, lse, delta, dk, dv, dq_arg, ds, bias_arg, mask_arg,
                flags if flags is not None else dummy, sem,
                H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, scale, *common,
                *(flags.stride() if flags is not None else (0, 0, 0, 0)),
                BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=bd, CAUSAL=causal, HAS_BIAS=bias is not None,
                HAS_MASK=mask is not None, HAS_FLAGS=flags is not None, BIAS_GRAD=bias_grad, DQ_TMA=use_tma,
                ORDERED=_ORDERED_DQ["mode"] if ordered else 0, NTHREADS=32 * warps, PREC=prec, num_warps=warps,
                num_stages=stages)

        if ordered:
            launch(False)
        elif _dq_tma_applies(q, D):
            try:
                launch(True)
                _DQ_TMA["works"] = True
            except Exception as e:  # compile error before any launch: dq_acc is still zero
                if _DQ_TMA["works"]:
                    raise
                _DQ_TMA["works"] = False
                warnings.warn(f"tilewise attention: dQ by TMA reduce-add failed to build ({type(e).__name__}: "
                              f"{str(e)[:200]}); using pointer atomics from now on")
                launch(False)
        else:
            launch(False)
        dq = dq_acc if q.dtype == torch.float32 else dq_acc.to(q.dtype)
        return dq, dk, dv, _reduce_dbias(ds, bias, direct) if bias_grad else dbias

    if not ws_bwd:  # (v6 launched its dK / dV kernel above)
        bm, bn, warps, stages = _config("dkdv", D, q.dtype.itemsize)
        flags = _block_flags(mask, full, bm, bn) if mask is not None else None
        _launch(K_._attn_bwd_dkdv_kernel, (-(-Sk // bn), B * Hkv),
            q, k, v, do, lse, delta, dk, dv, bias_arg, mask_arg, flags if flags is not None else dummy,
            H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, scale, *common,
            *(flags.stride() if flags is not None else (0, 0, 0, 0)),
            BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=bd, CAUSAL=causal, HAS_BIAS=bias is not None,
            HAS_MASK=mask is not None, HAS_FLAGS=flags is not None, PREC=prec,
            num_warps=warps, num_stages=stages)

    bm, bn, warps, stages = _config("dq_bias" if bias_grad else "dq", D)
    flags = _block_flags(mask, full, bm, bn) if mask is not None else None
    _launch(K_._attn_bwd_dq_kernel, (-(-Sq // bm), B * H),
        q, k, v, do, lse, delta, dq, ds, bias_arg, mask_arg, flags if flags is not None else dummy,
        H, H // Hkv, Sq, Sk, scale * 1.4426950408889634, scale, *common,
        *(flags.stride() if flags is not None else (0, 0, 0, 0)),
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, BLOCK_D=bd, CAUSAL=causal, HAS_BIAS=bias is not None,
        HAS_MASK=mask is not None, HAS_FLAGS=flags is not None, BIAS_GRAD=bias_grad, PREC=prec,
        num_warps=warps, num_stages=stages)
    if bias_grad:
        dbias = _reduce_dbias(ds, bias, direct)
    return dq, dk, dv, dbias


def _reduce_dbias(ds, bias, direct):
    """dBias = dS summed over the dims the bias was broadcast along (a fixed-order reduction)."""
    return ds.reshape(bias.shape) if direct else ds.sum_to_size(_as4(bias).shape).reshape(bias.shape).to(bias.dtype)


# ----------------------------------------------------------------------------------------------
# torch.library custom ops (eager, autograd, torch.compile)
# ----------------------------------------------------------------------------------------------

@torch.library.custom_op("tilewise::flash_attention_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
            bias: Optional[torch.Tensor], causal: bool, scale: float,
            deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # ``deterministic`` only selects the backward; it is an argument here so that autograd's
    # setup_context sees it (and torch.compile traces it as a plain bool).
    return _fwd_impl(q, k, v, mask, bias, causal, scale)


@_fwd_op.register_fake
def _(q, k, v, mask, bias, causal, scale, deterministic):
    B, H, Sq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("tilewise::flash_attention_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, dlse: Optional[torch.Tensor], mask: Optional[torch.Tensor],
            bias: Optional[torch.Tensor], causal: bool, scale: float,
            bias_grad: bool, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(do, q, k, v, out, lse, dlse, mask, bias, causal, scale, bias_grad, deterministic)


@_bwd_op.register_fake
def _(do, q, k, v, out, lse, dlse, mask, bias, causal, scale, bias_grad, deterministic):
    c = torch.contiguous_format
    db = torch.empty_like(bias, memory_format=c) if bias_grad else q.new_empty((0,))
    return (torch.empty_like(q, memory_format=c), torch.empty_like(k, memory_format=c),
            torch.empty_like(v, memory_format=c), db)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, bias, causal, scale, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, bias)
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, mask, bias = ctx.saved_tensors
    if dout is None and dlse is None:
        return None, None, None, None, None, None, None, None
    if dout is None:
        dout = torch.zeros_like(out)
    if dlse is not None:
        dlse = dlse.float().contiguous()  # e.g. sum()'s gradient is an expanded, stride-0 tensor
    bias_grad = bias is not None and ctx.needs_input_grad[4]
    bwd = _bwd_impl if getattr(ctx, "eager", False) else _bwd_op
    dq, dk, dv, db = bwd(dout, q, k, v, out, lse, dlse, mask, bias, ctx.causal, ctx.scale, bias_grad,
                         ctx.deterministic)
    return dq, dk, dv, None, (db if bias_grad else None), None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerFlash(torch.autograd.Function):
    """What ``_fwd_op`` and its autograd registration do, for eager calls: the custom-op dispatcher
    costs about 20 us a call on a fast host and more on the H200's (a 16 us S = 1024 forward ran
    host-bound; docs/tuning/attention.md, "Eager calls"). Traced code (torch.compile) keeps the
    custom ops, whose fake implementations it needs."""

    @staticmethod
    def forward(ctx, q, k, v, mask, bias, causal, scale, deterministic):
        out, lse = _fwd_impl(q, k, v, mask, bias, causal, scale)
        _setup_context(ctx, (q, k, v, mask, bias, causal, scale, deterministic), (out, lse))
        ctx.eager = True
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    mask: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                    scale: Optional[float] = None, return_lse: bool = False, deterministic: bool = True):
    """FlashAttention-2: ``softmax(scale * q @ k^T + bias, where mask) @ v`` without an S x S tensor.

    q:      (B, H, Sq, D) CUDA tensor, float16 / bfloat16 (float32 works, slower: no tensor cores).
            Any strides (read through them). D in [1, 256]; 64 and 128 are the tuned ones.
    k, v:   (B, Hkv, Sk, D), q's dtype and device; H must be a multiple of Hkv (grouped-query
            attention: query head h reads K/V head h // (H // Hkv)). Sk may differ from Sq.
    causal: top-left aligned like SDPA's ``is_causal``: query i attends to keys j <= i.
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

    Returns out (B, H, Sq, D) in q's dtype, contiguous; or (out, lse) with ``return_lse``.
    Differentiable in q, k, v and bias. Under ``torch.compile`` it is the
    ``torch.library.custom_op`` ``torch.ops.tilewise.flash_attention_fwd`` (with a fake
    implementation and autograd); eager calls run the same kernels through an
    ``autograd.Function``, without the custom-op dispatcher's host time.
    """
    _check(q, k, v, mask, bias, scale)
    if not isinstance(deterministic, bool):
        raise ValueError(f"flash_attention: 'deterministic' must be a bool, got {deterministic!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    op = _fwd_op if torch.compiler.is_compiling() else _EagerFlash.apply
    out, lse = op(q, k, v, mask, bias, bool(causal), scale, deterministic)
    return (out, lse) if return_lse else out


def v3_flash2(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False):
    """The Triton forward (v3; v4's TMA kernel for a bias where it applies), without v5. The backward
    is ``flash_attention``'s (``use_ws_bwd`` decides; the bench's row of this name times v3's)."""
    with use_ws(False):
        return flash_attention(q, k, v, causal=causal, mask=mask, bias=bias, scale=scale, return_lse=return_lse)


def v3_flash2_atomic(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False):
    """``flash_attention``'s default forward (v5 where ``_WS_RULES`` say, else v3); the backward
    is the fused atomic-dQ kernel (``deterministic=False``)."""
    return flash_attention(q, k, v, causal=causal, mask=mask, bias=bias, scale=scale, return_lse=return_lse,
                           deterministic=False)


def v4_flash2_tma(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False):
    """v3 with the forward's Q/K/V tiles loaded by TMA where ``_tma_applies`` (else v3 exactly);
    the backward is ``flash_attention``'s (the bench's row times v3's)."""
    with use_tma(), use_ws(False):
        return flash_attention(q, k, v, causal=causal, mask=mask, bias=bias, scale=scale, return_lse=return_lse)


def v5_flash2_ws(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False):
    """The forward through v5 (warp-specialized Gluon kernel, ``attention_gluon``) where
    ``_ws_applies`` (else as v3); the backward is ``flash_attention``'s (the bench's row times v3's;
    ``v6_flash2_ws_bwd`` v6's)."""
    with use_ws():
        return flash_attention(q, k, v, causal=causal, mask=mask, bias=bias, scale=scale, return_lse=return_lse)


VARIANTS = {"v1_naive": reference, "v2_online": reference_tiled, "v3_flash2": v3_flash2,
            "v3_flash2_atomic": v3_flash2_atomic, "v4_flash2_tma": v4_flash2_tma, "v5_flash2_ws": v5_flash2_ws}
