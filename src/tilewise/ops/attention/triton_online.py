"""The online softmax of the Triton forward kernels: one key tile's step (running max, sum and the
rescaled accumulator) and the tile's finish (output and log-sum-exp stored). Conventions as in
``triton_kernels``: scores in units of 1 / qk_scale, the max and LSE in the log2 domain."""

from __future__ import annotations

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _online_softmax(acc, l_i, m_i, t, qk_scale, offs_n, offs_m, Sk, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr):
    """One key tile's online-softmax step on scores t in units of 1 / qk_scale (qk_scale > 0):
    keys past Sk (BOUNDS) and above the diagonal (CAUSAL too) set to -inf, then the row max taken
    on t with the scale riding in the exponent's FFMA, so no multiply per score; m_i (log2
    domain) and l_i are the running max and sum. Returns (p, acc, l_i, m_i) with acc and l_i
    rescaled to the new max, p = exp2(qk_scale * t - m_i).

    Tried and dropped: rescaling acc and l only when some row's max grows by more than 2^8 (a
    CTA-wide reduction and branch a tile): 8-20 % slower on every forward measured
    (docs/tuning/attention.md, "Lazy rescaling")."""
    if BOUNDS:
        keep = offs_n[None, :] < Sk
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        t = tl.where(keep, t, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(t, 1) * qk_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(t * qk_scale - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, acc, l_i, m_new


@triton.jit
def _fwd_update(acc, l_i, m_i, t, V, offs_n, offs_m, offs_d, kv_mask, Sk, stride_vn, stride_vd, qk_scale,
                CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, PREC: tl.constexpr):
    # The online softmax step for one key tile. t holds the scores in units of 1 / qk_scale (q.k,
    # plus bias * log2(e) / qk_scale): the log2-domain score is qk_scale * t (qk_scale > 0, the
    # launcher sees to it), so the row max is taken on t and the scale rides in the exponent's
    # FFMA instead of a multiply per score. m_i stays in the log2 domain. Then bounds and causal
    # masking, running max and sum, the accumulator rescaled, and P V added.
    p, acc, l_i, m_new = _online_softmax(acc, l_i, m_i, t, qk_scale, offs_n, offs_m, Sk, CAUSAL, BOUNDS)
    v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PREC)
    return acc, l_i, m_new


@triton.jit
def _fwd_finish(acc, l_i, m_i, Out, Lrow, off_b, off_h, Sq, offs_m, offs_d,
                stride_ob, stride_oh, stride_om, stride_od, HEAD_DIM: tl.constexpr):
    # Lrow: the LSE of query 0 of this (batch, head); its rows follow with unit stride
    empty = l_i == 0.0  # every key masked: output 0, log-sum-exp -inf
    l_div = tl.where(empty, 1.0, l_i)
    out = acc / l_div[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_div)) * LN2)
    row_ok = offs_m < Sq
    tl.store(Lrow + offs_m, lse, mask=row_ok)
    tl.store(Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
