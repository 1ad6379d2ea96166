"""Triton kernels of FlashAttention-2 (see ``api.py`` for the versions, shapes and launchers).

Conventions shared by every kernel here:
- scores run in the log2 domain: ``s2 = (scale * q.k + bias) * log2(e)``, so ``exp2`` replaces
  ``exp`` (one MUFU instruction, no multiply per element);
- masked scores are ``-inf``; a row whose running maximum is still ``-inf`` uses 0 in its place,
  so ``exp2(-inf - 0) = 0`` and no ``inf - inf`` NaN appears (rows with every key masked give 0);
- batch and head offsets are int64 (a (B, H, S, S) bias passes 2^31 elements at S = 16384);
- causal is top-left aligned as in SDPA's ``is_causal``: query i sees keys j <= i;
- a band (BAND; sliding windows, bottom-right causal) keeps key j for query i where
  band_lo <= j - i <= band_hi: the forward and the two-kernel backward visit only the key
  (query) tiles the band reaches and mask inside them;
- score mods (SOFTCAP, ALIBI; v3 forward and two-kernel backward): softcap on q.k, then ALiBi's
  -slope * |j - i - diag|, then bias and masks (``_score_mods``);
- VARLEN (v3 forward, two-kernel backward): packed sequences, (1, H, total, D) views; program b
  takes sequence b's rows [CuQ[b], CuQ[b + 1]) and keys [CuK[b], CuK[b + 1]); LSE / Delta rows
  are (H, total), dQ / dK / dV packed (total, heads, D) like q / k / v.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_masks import _band_inner, _band_keys, _band_queries, _key_range, _score_mods, _varlen_seq
from .triton_online import _fwd_finish, _fwd_update, _online_softmax
from .triton_sync import _count_release, _count_release_warp, _wait_count, _wait_count_warp

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, K, V, Bias, Mask, start_n, offs_m, offs_d, Sq, Sk,
              stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, stride_mm, stride_mn,
              qk_scale,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_MASK: tl.constexpr, PREC: tl.constexpr, band_lo=0, band_hi=0, BAND: tl.constexpr = False,
              cap_t=1.0, slope_t=0.0, diag=0, SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kv_mask = offs_d[None, :] < HEAD_DIM
    if BOUNDS:
        kv_mask = kv_mask & (offs_n[:, None] < Sk)
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    t = tl.dot(q, tl.trans(k), input_precision=PREC)
    if SOFTCAP or ALIBI:
        t, _ = _score_mods(t, offs_n[None, :] - offs_m[:, None], cap_t, slope_t, diag, SOFTCAP, ALIBI)
    if HAS_BIAS or HAS_MASK:
        mn_mask = (offs_m[:, None] < Sq) & (offs_n[None, :] < Sk)
    if HAS_BIAS:
        b = tl.load(Bias + offs_m[:, None] * stride_bm + offs_n[None, :] * stride_bn, mask=mn_mask, other=0.0)
        t = tl.fma(b.to(tl.float32), LOG2E / qk_scale, t)  # fma: see _fwd_tile_tma
    if HAS_MASK:
        mk = tl.load(Mask + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn, mask=mn_mask, other=0)
        t = tl.where(mk != 0, t, float("-inf"))
    if BAND:
        rel = offs_n[None, :] - offs_m[:, None]
        t = tl.where((rel >= band_lo) & (rel <= band_hi), t, float("-inf"))
    return _fwd_update(acc, l_i, m_i, t, V, offs_n, offs_m, offs_d, kv_mask, Sk, stride_vn, stride_vd, qk_scale,
                       CAUSAL, BOUNDS, PREC)


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, K, V, Bias, Mask, Flags, lo, hi, offs_m, offs_d, Sq, Sk,
              stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, stride_mm, stride_mn,
              stride_fn, qk_scale,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_MASK: tl.constexpr, HAS_FLAGS: tl.constexpr, PREC: tl.constexpr,
              band_lo=0, band_hi=0, BAND: tl.constexpr = False, cap_t=1.0, slope_t=0.0, diag=0,
              SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False):
    for start_n in range(lo, hi, BLOCK_N):
        if HAS_FLAGS:
            # A key tile that the mask blocks for every row of this query tile is not computed.
            live = tl.load(Flags + (start_n // BLOCK_N) * stride_fn)
            if live != 0:
                acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, K, V, Bias, Mask, start_n, offs_m, offs_d, Sq, Sk,
                                          stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                                          stride_mm, stride_mn, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D,
                                          CAUSAL, BOUNDS, HAS_BIAS, HAS_MASK, PREC, band_lo, band_hi, BAND,
                                          cap_t, slope_t, diag, SOFTCAP, ALIBI)
        else:
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, K, V, Bias, Mask, start_n, offs_m, offs_d, Sq, Sk,
                                      stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                                      stride_mm, stride_mn, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D,
                                      CAUSAL, BOUNDS, HAS_BIAS, HAS_MASK, PREC, band_lo, band_hi, BAND,
                                      cap_t, slope_t, diag, SOFTCAP, ALIBI)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(Q, K, V, Out, Lse, Bias, Mask, Flags,
                     H, GROUP, Sq, Sk, qk_scale, band_lo, band_hi, cap_t, Slopes, diag, CuQ, CuK, TQ,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_ob, stride_oh, stride_om, stride_od,
                     stride_bb, stride_bh, stride_bm, stride_bn,
                     stride_mb, stride_mh, stride_mm, stride_mn,
                     stride_fb, stride_fh, stride_fm, stride_fn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HAS_MASK: tl.constexpr, HAS_FLAGS: tl.constexpr, PREC: tl.constexpr,
                     BATCH_FASTEST: tl.constexpr = False, BAND: tl.constexpr = False,
                     SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False, VARLEN: tl.constexpr = False):
    start_m = tl.program_id(0)
    if CAUSAL:  # the longest rows (last query tiles) start first: a shorter tail on the last wave
        start_m = tl.num_programs(0) - 1 - start_m
    bh = tl.program_id(1)
    if BATCH_FASTEST:
        # A bias shared by the batch: the B programs of one head and query tile run together, so
        # its tiles come from DRAM once and from L2 B - 1 times.
        nb = tl.num_programs(1) // H
        off_b = (bh % nb).to(tl.int64)
        off_h = (bh // nb).to(tl.int64)
    else:
        off_b = (bh // H).to(tl.int64)
        off_h = (bh % H).to(tl.int64)
    off_hk = off_h // GROUP  # grouped-query attention: GROUP query heads share one K/V head
    if VARLEN:  # (the batch strides are 0: sequence off_b's rows start at q0)
        q0, _, Sq, Sk, Q, Out, K, V = _varlen_seq(CuQ, CuK, off_b, Q, Out, K, V, stride_qm, stride_om, stride_kn,
                                                  stride_vn)
        if start_m * BLOCK_M >= Sq:
            return
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    K += off_b * stride_kb + off_hk * stride_kh
    V += off_b * stride_vb + off_hk * stride_vh
    Bias += off_b * stride_bb + off_h * stride_bh
    Mask += off_b * stride_mb + off_h * stride_mh
    Flags += off_b * stride_fb + off_h * stride_fh + start_m * stride_fm

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    slope_t = 0.0
    if ALIBI:
        slope_t = tl.load(Slopes + off_b * H + off_h)

    if BAND:  # only the key tiles the band reaches; only the ones it cuts are masked
        lo, hi = _band_keys(start_m * BLOCK_M, Sk, band_lo, band_hi, BLOCK_M, BLOCK_N)
        a, b = _band_inner(start_m * BLOCK_M, Sk, band_lo, band_hi, lo, hi, BLOCK_M, BLOCK_N)
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K, V, Bias, Mask, Flags, lo, a, offs_m, offs_d, Sq, Sk,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                                  stride_mm, stride_mn, stride_fn, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D,
                                  False, True, HAS_BIAS, HAS_MASK, HAS_FLAGS, PREC, band_lo, band_hi, True,
                                  cap_t, slope_t, diag, SOFTCAP, ALIBI)
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K, V, Bias, Mask, Flags, a, b, offs_m, offs_d, Sq, Sk,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                                  stride_mm, stride_mn, stride_fn, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D,
                                  False, False, HAS_BIAS, HAS_MASK, HAS_FLAGS, PREC, 0, 0, False,
                                  cap_t, slope_t, diag, SOFTCAP, ALIBI)
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K, V, Bias, Mask, Flags, b, hi, offs_m, offs_d, Sq, Sk,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                                  stride_mm, stride_mn, stride_fn, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D,
                                  False, True, HAS_BIAS, HAS_MASK, HAS_FLAGS, PREC, band_lo, band_hi, True,
                                  cap_t, slope_t, diag, SOFTCAP, ALIBI)
    else:
        n_full, hi = _key_range(start_m, Sk, BLOCK_M, BLOCK_N, CAUSAL)
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K, V, Bias, Mask, Flags, 0, n_full, offs_m, offs_d, Sq, Sk,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                                  stride_mm, stride_mn, stride_fn, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D,
                                  CAUSAL, False, HAS_BIAS, HAS_MASK, HAS_FLAGS, PREC, 0, 0, False,
                                  cap_t, slope_t, diag, SOFTCAP, ALIBI)
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K, V, Bias, Mask, Flags, n_full, hi, offs_m, offs_d, Sq, Sk,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
                                  stride_mm, stride_mn, stride_fn, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D,
                                  CAUSAL, True, HAS_BIAS, HAS_MASK, HAS_FLAGS, PREC, 0, 0, False,
                                  cap_t, slope_t, diag, SOFTCAP, ALIBI)
    if VARLEN:
        Lrow = Lse + off_h * TQ + q0  # this (batch, head)'s LSE row
    else:
        Lrow = Lse + (off_b * H + off_h) * Sq
    _fwd_finish(acc, l_i, m_i, Out, Lrow, off_b, off_h, Sq, offs_m, offs_d,
                stride_ob, stride_oh, stride_om, stride_od, HEAD_DIM)


@triton.jit
def _fwd_pair_step(acc, l_i, m_i, q, K, V, b2, offs_n, offs_m, offs_d, Sk,
                   stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                   HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, PREC: tl.constexpr):
    # One key tile of one batch element, given the bias tile in _fwd_update's units (b2).
    kv_mask = offs_d[None, :] < HEAD_DIM
    if BOUNDS:
        kv_mask = kv_mask & (offs_n[:, None] < Sk)
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    t = tl.dot(q, tl.trans(k), input_precision=PREC) + b2
    return _fwd_update(acc, l_i, m_i, t, V, offs_n, offs_m, offs_d, kv_mask, Sk, stride_vn, stride_vd, qk_scale,
                       CAUSAL, BOUNDS, PREC)


@triton.jit
def _fwd_pair_loop(acc0, l0, m0, acc1, l1, m1, q0, q1, K0, V0, K1, V1, Bias, lo, hi, offs_m, offs_d, Sq, Sk,
                   stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, qk_scale,
                   BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr,
                   PREC: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mn_mask = (offs_m[:, None] < Sq) & (offs_n[None, :] < Sk)
        b2 = tl.load(Bias + offs_m[:, None] * stride_bm + offs_n[None, :] * stride_bn, mask=mn_mask,
                     other=0.0).to(tl.float32) * (LOG2E / qk_scale)
        acc0, l0, m0 = _fwd_pair_step(acc0, l0, m0, q0, K0, V0, b2, offs_n, offs_m, offs_d, Sk, stride_kn, stride_kd,
                                      stride_vn, stride_vd, qk_scale, HEAD_DIM, CAUSAL, BOUNDS, PREC)
        acc1, l1, m1 = _fwd_pair_step(acc1, l1, m1, q1, K1, V1, b2, offs_n, offs_m, offs_d, Sk, stride_kn, stride_kd,
                                      stride_vn, stride_vd, qk_scale, HEAD_DIM, CAUSAL, BOUNDS, PREC)
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def _attn_fwd_bias_pair_kernel(Q, K, V, Out, Lse, Bias,
                               H, GROUP, Sq, Sk, qk_scale,
                               stride_qb, stride_qh, stride_qm, stride_qd,
                               stride_kb, stride_kh, stride_kn, stride_kd,
                               stride_vb, stride_vh, stride_vn, stride_vd,
                               stride_ob, stride_oh, stride_om, stride_od,
                               stride_bh, stride_bm, stride_bn,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """The forward for a bias shared by the batch (no mask), two batch elements a program: each
    bias tile is loaded once for both, halving the bias traffic from L2 (and the exposed latency of
    a load Triton does not pipeline). The grid is (query tiles, B / 2 * H), pairs fastest, so the
    B / 2 programs reading one bias tile run together."""
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m
    ph = tl.program_id(1)
    npairs = tl.num_programs(1) // H
    off_b0 = 2 * (ph % npairs).to(tl.int64)
    off_h = (ph // npairs).to(tl.int64)
    off_hk = off_h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    q_off = off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q0 = tl.load(Q + off_b0 * stride_qb + q_off, mask=q_mask, other=0.0)
    q1 = tl.load(Q + (off_b0 + 1) * stride_qb + q_off, mask=q_mask, other=0.0)
    K0 = K + off_b0 * stride_kb + off_hk * stride_kh
    V0 = V + off_b0 * stride_vb + off_hk * stride_vh
    K1 = K0 + stride_kb
    V1 = V0 + stride_vb
    Bias += off_h * stride_bh

    m0 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l0 = tl.zeros([BLOCK_M], tl.float32)
    acc0 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_full, hi = _key_range(start_m, Sk, BLOCK_M, BLOCK_N, CAUSAL)
    acc0, l0, m0, acc1, l1, m1 = _fwd_pair_loop(acc0, l0, m0, acc1, l1, m1, q0, q1, K0, V0, K1, V1, Bias, 0, n_full,
                                                offs_m, offs_d, Sq, Sk, stride_kn, stride_kd, stride_vn, stride_vd,
                                                stride_bm, stride_bn, qk_scale, BLOCK_N, HEAD_DIM, CAUSAL, False, PREC)
    acc0, l0, m0, acc1, l1, m1 = _fwd_pair_loop(acc0, l0, m0, acc1, l1, m1, q0, q1, K0, V0, K1, V1, Bias, n_full, hi,
                                                offs_m, offs_d, Sq, Sk, stride_kn, stride_kd, stride_vn, stride_vd,
                                                stride_bm, stride_bn, qk_scale, BLOCK_N, HEAD_DIM, CAUSAL, True, PREC)
    _fwd_finish(acc0, l0, m0, Out, Lse + (off_b0 * H + off_h) * Sq, off_b0, off_h, Sq, offs_m, offs_d,
                stride_ob, stride_oh, stride_om, stride_od, HEAD_DIM)
    _fwd_finish(acc1, l1, m1, Out, Lse + ((off_b0 + 1) * H + off_h) * Sq, off_b0 + 1, off_h, Sq, offs_m, offs_d,
                stride_ob, stride_oh, stride_om, stride_od, HEAD_DIM)


@triton.jit
def _attn_bwd_preprocess_kernel(Out, DO, Dlse, Delta, DQacc, H, Sq,
                                stride_ob, stride_oh, stride_om, stride_od,
                                stride_db, stride_dh, stride_dm, stride_dd,
                                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                                HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr):
    """Delta = rowsum(dO * O) - dLSE: the row term of dS = P * (dP - Delta). With ZERO_DQ also
    zeroes the fp32 (B, H, Sq, HEAD_DIM) dQ accumulator of the atomic backward (no memset launch)."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    msk = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=msk, other=0.0).to(tl.float32)
    do = tl.load(DO + off_b * stride_db + off_h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                 mask=msk, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    if HAS_DLSE:
        delta -= tl.load(Dlse + bh.to(tl.int64) * Sq + offs_m, mask=offs_m < Sq, other=0.0)
    tl.store(Delta + bh.to(tl.int64) * Sq + offs_m, delta, mask=offs_m < Sq)
    if ZERO_DQ:
        tl.store(DQacc + bh.to(tl.int64) * Sq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                 tl.zeros([BLOCK_M, BLOCK_D], tl.float32), mask=msk)


@triton.jit
def _attn_bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, Bias, Mask, Flags,
                          H, GROUP, Sq, Sk, qk_scale, sm_scale, band_lo, band_hi, cap_t, Slopes, diag,
                          CuQ, CuK, TQ,
                          stride_qb, stride_qh, stride_qm, stride_qd,
                          stride_kb, stride_kh, stride_kn, stride_kd,
                          stride_vb, stride_vh, stride_vn, stride_vd,
                          stride_db, stride_dh, stride_dm, stride_dd,
                          stride_bb, stride_bh, stride_bm, stride_bn,
                          stride_mb, stride_mh, stride_mm, stride_mn,
                          stride_fb, stride_fh, stride_fm, stride_fn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                          HAS_MASK: tl.constexpr, HAS_FLAGS: tl.constexpr, PREC: tl.constexpr,
                          BAND: tl.constexpr = False, SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
                          VARLEN: tl.constexpr = False):
    """One key tile of one K/V head: dK and dV summed over its GROUP query heads and every query
    tile, in registers, then stored once (no atomics: deterministic)."""
    start_n = tl.program_id(0)
    bhk = tl.program_id(1)
    HK = H // GROUP
    off_b = (bhk // HK).to(tl.int64)
    off_hk = (bhk % HK).to(tl.int64)
    q0 = off_b * 0
    # dK / dV: (B, Hkv, Sk, D) contiguous, or (total_k, Hkv, D) packed with VARLEN
    dbase = bhk.to(tl.int64) * Sk * HEAD_DIM
    drows = HEAD_DIM
    if VARLEN:
        q0, k0, Sq, Sk, Q, DO, K, V = _varlen_seq(CuQ, CuK, off_b, Q, DO, K, V, stride_qm, stride_dm, stride_kn,
                                                  stride_vn)
        if start_n * BLOCK_N >= Sk:
            return
        dbase = (k0 * HK + off_hk) * HEAD_DIM
        drows = HK * HEAD_DIM
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    nd_mask = (offs_n[:, None] < Sk) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=nd_mask, other=0.0)
    v = tl.load(V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=nd_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # Causal: queries before this tile's first key see none of it.
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
    hi = Sq
    if BAND:
        lo, hi = _band_queries(start_n * BLOCK_N, Sq, band_lo, band_hi, BLOCK_M, BLOCK_N)
    for g in range(0, GROUP):
        off_h = off_hk * GROUP + g
        bh = off_b * H + off_h
        lrow = bh * Sq
        if VARLEN:
            lrow = off_h * TQ + q0
        Qh = Q + off_b * stride_qb + off_h * stride_qh
        DOh = DO + off_b * stride_db + off_h * stride_dh
        Bh = Bias + off_b * stride_bb + off_h * stride_bh
        Mh = Mask + off_b * stride_mb + off_h * stride_mh
        Fh = Flags + off_b * stride_fb + off_h * stride_fh + start_n * stride_fn
        slope_t = 0.0
        if ALIBI:
            slope_t = tl.load(Slopes + off_b * H + off_h)
        for start_m in range(lo, hi, BLOCK_M):
            live = 1
            if HAS_FLAGS:
                live = tl.load(Fh + (start_m // BLOCK_M) * stride_fm)
            if live != 0:
                offs_m = start_m + tl.arange(0, BLOCK_M)
                md_mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
                q = tl.load(Qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=md_mask, other=0.0)
                do = tl.load(DOh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, mask=md_mask, other=0.0)
                lse = tl.load(Lse + lrow + offs_m, mask=offs_m < Sq, other=0.0) * LOG2E
                lse = tl.where(lse == float("-inf"), 0.0, lse)
                delta = tl.load(Delta + lrow + offs_m, mask=offs_m < Sq, other=0.0)
                sT = tl.dot(k, tl.trans(q), input_precision=PREC)  # (BLOCK_N, BLOCK_M)
                if SOFTCAP or ALIBI:
                    sT, dcapT = _score_mods(sT, offs_n[:, None] - offs_m[None, :], cap_t, slope_t, diag, SOFTCAP,
                                            ALIBI)
                sT = sT * qk_scale
                keep = (offs_n[:, None] < Sk) & (offs_m[None, :] < Sq)
                if HAS_BIAS:
                    b = tl.load(Bh + offs_m[None, :] * stride_bm + offs_n[:, None] * stride_bn, mask=keep, other=0.0)
                    sT += b.to(tl.float32) * LOG2E
                if HAS_MASK:
                    mk = tl.load(Mh + offs_m[None, :] * stride_mm + offs_n[:, None] * stride_mn, mask=keep, other=0)
                    keep = keep & (mk != 0)
                if CAUSAL:
                    keep = keep & (offs_n[:, None] <= offs_m[None, :])
                if BAND:
                    rel = offs_n[:, None] - offs_m[None, :]
                    keep = keep & (rel >= band_lo) & (rel <= band_hi)
                sT = tl.where(keep, sT, float("-inf"))
                pT = tl.math.exp2(sT - lse[None, :])
                dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=PREC)
                dpT = tl.dot(v, tl.trans(do), input_precision=PREC)
                dsT = pT * (dpT - delta[None, :])
                if SOFTCAP:  # through the tanh
                    dsT = dsT * dcapT
                dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=PREC)
    dk *= sm_scale
    tl.store(DK + dbase + offs_n[:, None] * drows + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=nd_mask)
    tl.store(DV + dbase + offs_n[:, None] * drows + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=nd_mask)


@triton.jit
def _attn_bwd_dq_kernel(Q, K, V, DO, Lse, Delta, DQ, DBias, Bias, Mask, Flags,
                        H, GROUP, Sq, Sk, qk_scale, sm_scale, band_lo, band_hi, cap_t, Slopes, diag,
                        CuQ, CuK, TQ,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_kb, stride_kh, stride_kn, stride_kd,
                        stride_vb, stride_vh, stride_vn, stride_vd,
                        stride_db, stride_dh, stride_dm, stride_dd,
                        stride_bb, stride_bh, stride_bm, stride_bn,
                        stride_mb, stride_mh, stride_mm, stride_mn,
                        stride_fb, stride_fh, stride_fm, stride_fn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_MASK: tl.constexpr, HAS_FLAGS: tl.constexpr, BIAS_GRAD: tl.constexpr,
                        PREC: tl.constexpr, BAND: tl.constexpr = False, SOFTCAP: tl.constexpr = False,
                        ALIBI: tl.constexpr = False, VARLEN: tl.constexpr = False):
    """One query tile of one head: dQ over every key tile it sees; with BIAS_GRAD also dS, written
    to a (B, H, Sq, Sk) fp32 buffer that the launcher reduces to the bias's shape."""
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m
    bh = tl.program_id(1)
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    off_hk = off_h // GROUP
    q0 = off_b * 0
    if VARLEN:
        q0, _, Sq, Sk, Q, DO, K, V = _varlen_seq(CuQ, CuK, off_b, Q, DO, K, V, stride_qm, stride_dm, stride_kn,
                                                 stride_vn)
        if start_m * BLOCK_M >= Sq:
            return
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    md_mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=md_mask, other=0.0)
    do = tl.load(DO + off_b * stride_db + off_h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                 mask=md_mask, other=0.0)
    bh64 = bh.to(tl.int64)
    lrow = bh64 * Sq
    # dQ: (B, H, Sq, D) contiguous, or (total_q, H, D) packed with VARLEN
    dbase = lrow * HEAD_DIM
    drows = HEAD_DIM
    if VARLEN:
        lrow = off_h * TQ + q0
        dbase = (q0 * H + off_h) * HEAD_DIM
        drows = H * HEAD_DIM
    lse = tl.load(Lse + lrow + offs_m, mask=offs_m < Sq, other=0.0) * LOG2E
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    delta = tl.load(Delta + lrow + offs_m, mask=offs_m < Sq, other=0.0)
    K += off_b * stride_kb + off_hk * stride_kh
    V += off_b * stride_vb + off_hk * stride_vh
    Bias += off_b * stride_bb + off_h * stride_bh
    Mask += off_b * stride_mb + off_h * stride_mh
    Flags += off_b * stride_fb + off_h * stride_fh + start_m * stride_fm
    DBias += bh64 * Sq * Sk
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    slope_t = 0.0
    if ALIBI:
        slope_t = tl.load(Slopes + bh64)
    lo = 0
    hi = tl.minimum(Sk, (start_m + 1) * BLOCK_M) if CAUSAL else Sk
    if BAND:
        lo, hi = _band_keys(start_m * BLOCK_M, Sk, band_lo, band_hi, BLOCK_M, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        live = 1
        if HAS_FLAGS:
            live = tl.load(Flags + (start_n // BLOCK_N) * stride_fn)
        if live != 0:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            nd_mask = (offs_n[:, None] < Sk) & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=nd_mask, other=0.0)
            v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=nd_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PREC)
            if SOFTCAP or ALIBI:
                s, dcap = _score_mods(s, offs_n[None, :] - offs_m[:, None], cap_t, slope_t, diag, SOFTCAP, ALIBI)
            s = s * qk_scale
            inb = (offs_m[:, None] < Sq) & (offs_n[None, :] < Sk)
            keep = inb
            if HAS_BIAS:
                b = tl.load(Bias + offs_m[:, None] * stride_bm + offs_n[None, :] * stride_bn, mask=inb, other=0.0)
                s += b.to(tl.float32) * LOG2E
            if HAS_MASK:
                mk = tl.load(Mask + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn, mask=inb, other=0)
                keep = keep & (mk != 0)
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            if BAND:
                rel = offs_n[None, :] - offs_m[:, None]
                keep = keep & (rel >= band_lo) & (rel <= band_hi)
            s = tl.where(keep, s, float("-inf"))
            p = tl.math.exp2(s - lse[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=PREC)
            ds = p * (dp - delta[:, None])
            if BIAS_GRAD:
                tl.store(DBias + offs_m[:, None] * Sk + offs_n[None, :], ds.to(DBias.dtype.element_ty), mask=inb)
            if SOFTCAP:  # (the bias is added after the softcap: its gradient is dS before this)
                ds = ds * dcap
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PREC)
    dq *= sm_scale
    tl.store(DQ + dbase + offs_m[:, None] * drows + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=md_mask)


@triton.jit
def _fwd_tile_tma(acc, l_i, m_i, q, Kd, Vd, Bd, kv_row, b_row, start_n, offs_m, Sk, qk_scale,
                  BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, HAS_BIAS: tl.constexpr):
    # Rows past Sk belong to the next head (or are TMA zero-fill at the end): their scores are set
    # to -inf below, so they add exp2(-inf) * v = 0. Likewise the bias tile's columns past Sk (zero
    # fill) and rows past Sq (the next head's rows, never stored).
    k = Kd.load([kv_row + start_n, 0])
    t = tl.dot(q, tl.trans(k))
    if HAS_BIAS:
        # A descriptor load is prefetched num_stages ahead by Triton's pipeliner (TMA copy +
        # barrier in the sm_90 TTGIR), where a masked pointer load is not. An explicit fma, not
        # `t += b * c`: Triton folds an add onto a dot into the dot's accumulator, and a load
        # that feeds the accumulator is left synchronous (Triton 3.6 and 3.9).
        t = tl.fma(Bd.load([b_row, start_n]).to(tl.float32), LOG2E / qk_scale, t)
    # As _fwd_update (t in units of 1 / qk_scale; the scale rides in the exponent's FFMA).
    offs_n = start_n + tl.arange(0, BLOCK_N)
    p, acc, l_i, m_new = _online_softmax(acc, l_i, m_i, t, qk_scale, offs_n, offs_m, Sk, CAUSAL, BOUNDS)
    v = Vd.load([kv_row + start_n, 0])
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _attn_fwd_tma_kernel(Qd, Kd, Vd, Bd, Out, Lse, H, GROUP, Sq, Sk, qk_scale, bias_rows_b, bias_rows_h,
                         stride_ob, stride_oh, stride_om, stride_od,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                         CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr = False, BATCH_FASTEST: tl.constexpr = False):
    """v4: the forward of v3 for contiguous inputs without a mask, Q/K/V tiles loaded by TMA
    (tensor descriptors over the (rows, D) views) instead of per-thread pointers: no address
    registers, and the copy engine fills shared memory while the warps compute. With HAS_BIAS, Bd
    is a descriptor over the bias's dense (rows, Sk) storage: row ``b * bias_rows_b + h *
    bias_rows_h + m`` holds query m of (b, h) (0 for a dim the bias broadcasts over)."""
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m
    bh = tl.program_id(1)
    if BATCH_FASTEST:  # as in _attn_fwd_kernel: the B programs sharing a bias tile run together
        nb = tl.num_programs(1) // H
        off_b = bh % nb
        off_h = bh // nb
        bh = off_b * H + off_h
    else:
        off_b = bh // H
        off_h = bh % H
    HK = H // GROUP
    kv_row = (off_b * HK + off_h // GROUP) * Sk
    b_row = off_b * bias_rows_b + off_h * bias_rows_h + start_m * BLOCK_M
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = Qd.load([bh * Sq + start_m * BLOCK_M, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_full, hi = _key_range(start_m, Sk, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in range(0, n_full, BLOCK_N):
        acc, l_i, m_i = _fwd_tile_tma(acc, l_i, m_i, q, Kd, Vd, Bd, kv_row, b_row, start_n, offs_m, Sk, qk_scale,
                                      BLOCK_N, CAUSAL, False, HAS_BIAS)
    for start_n in range(n_full, hi, BLOCK_N):
        acc, l_i, m_i = _fwd_tile_tma(acc, l_i, m_i, q, Kd, Vd, Bd, kv_row, b_row, start_n, offs_m, Sk, qk_scale,
                                      BLOCK_N, CAUSAL, True, HAS_BIAS)
    _fwd_finish(acc, l_i, m_i, Out, Lse + (off_b.to(tl.int64) * H + off_h.to(tl.int64)) * Sq, off_b.to(tl.int64),
                off_h.to(tl.int64), Sq, offs_m, tl.arange(0, HEAD_DIM), stride_ob, stride_oh, stride_om, stride_od,
                HEAD_DIM)


@triton.jit
def _bwd_atomic_tile(dk, dv, k, v, Qh, DOh, DQh, Lh, Dh, Bh, Mh, DSh, Semh, start_m, dq_head, kv_blk, n_kv,
                     offs_n, offs_d, Sq, Sk,
                     stride_qm, stride_qd, stride_dm, stride_dd, stride_bm, stride_bn, stride_mm, stride_mn,
                     qk_scale, sm_scale,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HAS_MASK: tl.constexpr, BIAS_GRAD: tl.constexpr, DQ_TMA: tl.constexpr, ORDERED: tl.constexpr,
                     NTHREADS: tl.constexpr, PREC: tl.constexpr):
    # BOUNDS=False is only used on tiles with every row < Sq, every key < Sk and (causal) every key
    # at or before every query: no row/key tests, unmasked loads.
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q_ptrs = Qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    do_ptrs = DOh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd
    if BOUNDS:
        md_mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
        q = tl.load(q_ptrs, mask=md_mask, other=0.0)
        do = tl.load(do_ptrs, mask=md_mask, other=0.0)
        lse = tl.load(Lh + offs_m, mask=offs_m < Sq, other=0.0)
        delta = tl.load(Dh + offs_m, mask=offs_m < Sq, other=0.0)
    else:
        md_mask = offs_d[None, :] < HEAD_DIM
        if BLOCK_D == HEAD_DIM:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
        else:
            q = tl.load(q_ptrs, mask=md_mask, other=0.0)
            do = tl.load(do_ptrs, mask=md_mask, other=0.0)
        lse = tl.load(Lh + offs_m)
        delta = tl.load(Dh + offs_m)
    lse = lse * LOG2E
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    sT = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale  # (BLOCK_N, BLOCK_M)
    if BOUNDS:
        inb = (offs_n[:, None] < Sk) & (offs_m[None, :] < Sq)
        keep = inb
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :])
    if HAS_BIAS:
        b_ptrs = Bh + offs_m[None, :] * stride_bm + offs_n[:, None] * stride_bn
        if BOUNDS:
            b = tl.load(b_ptrs, mask=inb, other=0.0)
        else:
            b = tl.load(b_ptrs)
        sT += b.to(tl.float32) * LOG2E
    if HAS_MASK:
        m_ptrs = Mh + offs_m[None, :] * stride_mm + offs_n[:, None] * stride_mn
        if BOUNDS:
            keep = keep & (tl.load(m_ptrs, mask=inb, other=0) != 0)
        else:
            keep = tl.load(m_ptrs) != 0
    if BOUNDS or HAS_MASK:
        sT = tl.where(keep, sT, float("-inf"))
    pT = tl.math.exp2(sT - lse[None, :])
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=PREC)
    dpT = tl.dot(v, tl.trans(do), input_precision=PREC)
    dsT = pT * (dpT - delta[None, :])
    if BIAS_GRAD:
        # Each (query, key) of a head belongs to one key tile: dS is written once, no atomics.
        ds_ptrs = DSh + offs_m[None, :] * Sk + offs_n[:, None]
        if BOUNDS:
            tl.store(ds_ptrs, dsT.to(DSh.dtype.element_ty), mask=inb)
        else:
            tl.store(ds_ptrs, dsT.to(DSh.dtype.element_ty))
    ds16 = dsT.to(q.dtype)
    dk = tl.dot(ds16, q, dk, input_precision=PREC)
    dq = tl.dot(tl.trans(ds16), k, input_precision=PREC) * sm_scale  # (BLOCK_M, BLOCK_D)
    if ORDERED:
        # Deterministic: the key tiles add into one query tile's dQ one at a time, in a fixed order
        # (ascending key tile; descending when causal, the order in which the causal schedule
        # reaches the query tile), by a plain read-modify-write of the fp32 buffer: no float
        # atomics, the same sums in the same order on every run. Semh[i] counts, per thread, the
        # key tiles done with query tile i of this head (NTHREADS per tile; zeroed before the
        # launch): each thread releases after its own stores, a thread of the next key tile
        # waits for all of them. Lower-numbered programs are dispatched first, so a key tile
        # waits only on programs that are running or done (causal: on higher key tiles of its
        # head, which start at most a few tiles behind it). ORDERED == 2 counts per warp (lane 0
        # polls and releases); ORDERED == 3 (timing experiments only, NOT deterministic or even
        # correct) does the read-modify-write without waiting, to price the wait alone.
        sem_ptr = Semh + start_m // BLOCK_M
        if CAUSAL:
            turn = tl.minimum((start_m + BLOCK_M - 1) // BLOCK_N, n_kv - 1) - kv_blk
        else:
            turn = kv_blk
        if ORDERED == 1:
            _wait_count(sem_ptr, turn * NTHREADS)
        elif ORDERED == 2:
            _wait_count_warp(sem_ptr, turn * (NTHREADS // 32))
        dq_ptrs = DQh + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        # .cg: read from L2, where the previous key tile's stores are, not a stale L1 line.
        if BOUNDS or BLOCK_D != HEAD_DIM:
            acc = tl.load(dq_ptrs, mask=md_mask, other=0.0, cache_modifier=".cg")
            tl.store(dq_ptrs, acc + dq, mask=md_mask)
        else:
            acc = tl.load(dq_ptrs, cache_modifier=".cg")
            tl.store(dq_ptrs, acc + dq)
        if ORDERED == 1:
            _count_release(sem_ptr)
        elif ORDERED == 2:
            _count_release_warp(sem_ptr)
    elif DQ_TMA:
        # One TMA reduce-add of the tile from shared memory (the copy engine clips rows past Sq and
        # columns past HEAD_DIM): no per-element addresses in registers.
        DQh.atomic_add([dq_head, start_m, 0], dq.reshape([1, BLOCK_M, BLOCK_D]))
    else:
        # relaxed: only the sum matters, no ordering with other memory (acq_rel fences each add).
        # The (BLOCK_M, BLOCK_D) 64-bit addresses are formed only here, not live across the dots.
        dq_ptrs = DQh + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        if BOUNDS:
            tl.atomic_add(dq_ptrs, dq, mask=md_mask, sem="relaxed")
        elif BLOCK_D == HEAD_DIM:
            tl.atomic_add(dq_ptrs, dq, sem="relaxed")
        else:
            tl.atomic_add(dq_ptrs, dq, mask=md_mask, sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_atomic_loop(dk, dv, k, v, Qh, DOh, DQh, Lh, Dh, Bh, Mh, DSh, Fh, Semh, dq_head, kv_blk, n_kv, lo, hi,
                     offs_n, offs_d, Sq, Sk,
                     stride_qm, stride_qd, stride_dm, stride_dd, stride_bm, stride_bn, stride_mm, stride_mn,
                     stride_fm, qk_scale, sm_scale,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HAS_MASK: tl.constexpr, HAS_FLAGS: tl.constexpr, BIAS_GRAD: tl.constexpr,
                     DQ_TMA: tl.constexpr, ORDERED: tl.constexpr, NTHREADS: tl.constexpr, PREC: tl.constexpr):
    for start_m in range(lo, hi, BLOCK_M):
        live = 1
        if HAS_FLAGS:
            live = tl.load(Fh + (start_m // BLOCK_M) * stride_fm)
        if live != 0:
            dk, dv = _bwd_atomic_tile(dk, dv, k, v, Qh, DOh, DQh, Lh, Dh, Bh, Mh, DSh, Semh, start_m, dq_head,
                                      kv_blk, n_kv, offs_n, offs_d, Sq, Sk, stride_qm, stride_qd, stride_dm,
                                      stride_dd, stride_bm, stride_bn, stride_mm, stride_mn, qk_scale, sm_scale,
                                      BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, CAUSAL, BOUNDS, HAS_BIAS, HAS_MASK,
                                      BIAS_GRAD, DQ_TMA, ORDERED, NTHREADS, PREC)
    return dk, dv


@triton.jit
def _attn_bwd_atomic_kernel(Q, K, V, DO, Lse, Delta, DK, DV, DQ, DBias, Bias, Mask, Flags, Sem,
                            H, GROUP, Sq, Sk, qk_scale, sm_scale,
                            stride_qb, stride_qh, stride_qm, stride_qd,
                            stride_kb, stride_kh, stride_kn, stride_kd,
                            stride_vb, stride_vh, stride_vn, stride_vd,
                            stride_db, stride_dh, stride_dm, stride_dd,
                            stride_bb, stride_bh, stride_bm, stride_bn,
                            stride_mb, stride_mh, stride_mm, stride_mn,
                            stride_fb, stride_fh, stride_fm, stride_fn,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                            BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                            HAS_MASK: tl.constexpr, HAS_FLAGS: tl.constexpr, BIAS_GRAD: tl.constexpr,
                            DQ_TMA: tl.constexpr, ORDERED: tl.constexpr, NTHREADS: tl.constexpr,
                            PREC: tl.constexpr):
    """v3 backward with ``deterministic=False``: one key tile of one K/V head, dK and dV in
    registers as in the dK/dV kernel, and each query tile's dQ contribution (dS K, scaled) added
    with fp32 atomics into DQ, a (B, H, Sq, HEAD_DIM) fp32 buffer zeroed by the preprocess kernel
    (DQ_TMA: DQ is a (B * H, Sq, HEAD_DIM) tensor descriptor and each tile is one TMA reduce-add).
    Q K^T and dO V^T are computed once per tile pair: 5 matmuls instead of 7. With BIAS_GRAD, dS is
    also stored (to a (B, H, Sq, Sk) buffer), as the dQ kernel does. ORDERED (no mask): the dQ
    adds are plain read-modify-writes taken in a fixed key-tile order through Sem, a zeroed int32
    (B * H, cdiv(Sq, BLOCK_M)) count per query tile (NTHREADS = num_warps x 32 a key tile);
    deterministic, no float atomics."""
    start_n = tl.program_id(0)
    bhk = tl.program_id(1)
    HK = H // GROUP
    off_b = (bhk // HK).to(tl.int64)
    off_hk = (bhk % HK).to(tl.int64)
    n0 = start_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    nd_mask = (offs_n[:, None] < Sk) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=nd_mask, other=0.0)
    v = tl.load(V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=nd_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # Query tiles [lo, mid) cross the causal diagonal, [mid, full) need no test at all, [full, Sq)
    # is the partial last tile. A partial key tile (n0 + BLOCK_N > Sk) tests everywhere.
    full = (Sq // BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M
        mid = tl.maximum(tl.minimum(((n0 + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, full), lo)
    else:
        lo = 0
        mid = 0
    if n0 + BLOCK_N <= Sk:
        clean_hi = tl.maximum(full, mid)
    else:
        clean_hi = mid
    for g in range(0, GROUP):
        off_h = off_hk * GROUP + g
        bh = off_b * H + off_h
        Qh = Q + off_b * stride_qb + off_h * stride_qh
        DOh = DO + off_b * stride_db + off_h * stride_dh
        if DQ_TMA:
            DQh = DQ
        else:
            DQh = DQ + bh * Sq * HEAD_DIM
        Lh = Lse + bh * Sq
        Dh = Delta + bh * Sq
        Bh = Bias + off_b * stride_bb + off_h * stride_bh
        Mh = Mask + off_b * stride_mb + off_h * stride_mh
        DSh = DBias + bh * Sq * Sk
        Fh = Flags + off_b * stride_fb + off_h * stride_fh + start_n * stride_fn
        Semh = Sem + bh * tl.cdiv(Sq, BLOCK_M)
        bh32 = bh.to(tl.int32)
        for part in tl.static_range(3):
            if part == 0:
                p_lo, p_hi = lo, mid
            elif part == 1:
                p_lo, p_hi = mid, clean_hi
            else:
                p_lo, p_hi = clean_hi, Sq
            dk, dv = _bwd_atomic_loop(dk, dv, k, v, Qh, DOh, DQh, Lh, Dh, Bh, Mh, DSh, Fh, Semh, bh32, start_n,
                                      tl.cdiv(Sk, BLOCK_N), p_lo, p_hi, offs_n, offs_d, Sq, Sk, stride_qm,
                                      stride_qd, stride_dm, stride_dd, stride_bm, stride_bn, stride_mm, stride_mn,
                                      stride_fm, qk_scale, sm_scale, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, CAUSAL,
                                      part != 1, HAS_BIAS, HAS_MASK, HAS_FLAGS, BIAS_GRAD, DQ_TMA, ORDERED,
                                      NTHREADS, PREC)
    dk *= sm_scale
    tl.store(DK + bhk.to(tl.int64) * Sk * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=nd_mask)
    tl.store(DV + bhk.to(tl.int64) * Sk * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=nd_mask)
