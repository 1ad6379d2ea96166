"""Which keys a query tile visits and keeps, for the Triton kernels: the causal key range, the
band's key and query ranges, and the score mods (softcap, ALiBi)."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _key_range(start_m, Sk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # Key tiles [0, n_full) need neither the bounds nor the causal test; [n_full, hi) do. Causal
    # stops at the last key the last row of query tile start_m sees: tiles above the diagonal are
    # never loaded.
    if CAUSAL:
        hi = tl.minimum(Sk, (start_m + 1) * BLOCK_M)
        n_full = tl.minimum(((start_m * BLOCK_M + 1) // BLOCK_N) * BLOCK_N, (Sk // BLOCK_N) * BLOCK_N)
    else:
        hi = Sk
        n_full = (Sk // BLOCK_N) * BLOCK_N
    return n_full, hi


@triton.jit
def _band_keys(m0, Sk, band_lo, band_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Key tiles [lo, hi) hold every key a query in [m0, m0 + BLOCK_M) keeps; hi == lo: none (hi is held at
    # lo or above, so _band_inner's ranges stay inside [lo, hi) for a query tile the band gives no key).
    lo = (tl.maximum(m0 + band_lo, 0) // BLOCK_N) * BLOCK_N
    hi = tl.maximum(tl.minimum(m0 + BLOCK_M + band_hi, Sk), lo)
    return lo, hi


@triton.jit
def _band_inner(m0, Sk, band_lo, band_hi, lo, hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Key tiles [a, b) of [lo, hi) that every query in [m0, m0 + BLOCK_M) keeps whole: no band or bounds
    # test there, only in [lo, a) and [b, hi). lo <= a <= b <= hi; a, b tile starts unless equal to hi.
    first = tl.maximum(m0 + BLOCK_M - 1 + band_lo, 0)  # the first key the last row keeps
    a = tl.minimum(tl.maximum(lo, tl.cdiv(first, BLOCK_N) * BLOCK_N), hi)
    end = tl.maximum(m0 + band_hi + 1, 0)  # one past the last key the first row keeps
    b = tl.minimum((end // BLOCK_N) * BLOCK_N, (Sk // BLOCK_N) * BLOCK_N)
    return a, tl.maximum(a, b)


@triton.jit
def _band_queries(n0, Sq, band_lo, band_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Query tiles [lo, hi) hold every query that keeps a key in [n0, n0 + BLOCK_N).
    lo = (tl.maximum(n0 - band_hi, 0) // BLOCK_M) * BLOCK_M
    hi = tl.minimum(n0 + BLOCK_N - band_lo, Sq)
    return lo, hi


@triton.jit
def _score_mods(t, rel, cap_t, slope_t, diag, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    # t: q.k (units of 1 / scale; cap_t = cap / scale, slope_t = slope / scale), rel = j - i.
    # Returns the modded scores and d(softcapped)/d(t) = 1 - tanh^2 (1.0 without softcap).
    dcap = 1.0
    if SOFTCAP:
        th = 1.0 - 2.0 / (tl.math.exp2(t * (2.0 * LOG2E / cap_t)) + 1.0)  # tanh(t / cap_t), saturating
        t = cap_t * th
        dcap = 1.0 - th * th
    if ALIBI:
        t = t - slope_t * tl.abs(rel - diag).to(tl.float32)
    return t, dcap


@triton.jit
def _varlen_seq(CuQ, CuK, b, Q, R, K, V, stride_qm, stride_rm, stride_kn, stride_vn):
    # Sequence b of a packed batch: its first row q0 and key k0, its row and key counts, and Q, R (the
    # output or dO: rows like Q's), K, V moved to its first row / key.
    q0 = tl.load(CuQ + b)
    k0 = tl.load(CuK + b)
    Sq = tl.load(CuQ + b + 1) - q0
    Sk = tl.load(CuK + b + 1) - k0
    q0 = q0.to(tl.int64)
    k0 = k0.to(tl.int64)
    return q0, k0, Sq, Sk, Q + q0 * stride_qm, R + q0 * stride_rm, K + k0 * stride_kn, V + k0 * stride_vn
