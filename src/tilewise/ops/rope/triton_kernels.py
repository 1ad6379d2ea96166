"""RoPE's Triton kernel: for each (batch, position) row, the cos / sin row is read once and applied to
every head of q and of k: with x = [x1, x2] (the two halves of the head dim), y1 = x1 cos1 - x2 sin1 and
y2 = x2 cos2 + x1 sin2 (HF's x * cos + rotate_half(x) * sin). The backward is the transposed rotation
(BACKWARD: sin negated, each half taking the other half's sin). HAS_V: a third group of heads is copied
as it is (``apply_rotary_qkv``'s v, forward and backward), in the same pass over the row."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rope_heads(X, Y, sx_h, sy_h, nheads, c1, c2, s1, s2, half, HB: tl.constexpr, DB: tl.constexpr,
                BACKWARD: tl.constexpr, ROTATE: tl.constexpr):
    hs = tl.arange(0, HB)
    ds = tl.arange(0, DB)
    for h0 in range(0, nheads, HB):
        m = ((h0 + hs) < nheads)[:, None] & (ds < half)[None, :]
        off_x = (h0 + hs).to(tl.int64)[:, None] * sx_h + ds[None, :]
        off_y = (h0 + hs).to(tl.int64)[:, None] * sy_h + ds[None, :]
        x1 = tl.load(X + off_x, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(X + off_x + half, mask=m, other=0.0).to(tl.float32)
        if not ROTATE:  # copied as it is
            y1 = x1
            y2 = x2
        elif BACKWARD:  # the transpose: dx1 = dy1 cos1 + dy2 sin2, dx2 = dy2 cos2 - dy1 sin1
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        tl.store(Y + off_y, y1.to(Y.dtype.element_ty), mask=m)
        tl.store(Y + off_y + half, y2.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _rope_kernel(Q, K, QO, KO, COS, SIN, S, Hq, Hk, half,
                 sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sqo_b, sqo_h, sqo_s, sko_b, sko_h, sko_s,
                 sc_b, sc_s, V, VO, sv_b, sv_h, sv_s, svo_b, svo_h, svo_s,
                 HB: tl.constexpr, DB: tl.constexpr, BACKWARD: tl.constexpr, HAS_V: tl.constexpr):
    row = tl.program_id(0)  # b * S + s
    b = (row // S).to(tl.int64)
    s = (row % S).to(tl.int64)
    ds = tl.arange(0, DB)
    dm = ds < half
    cs = COS + b * sc_b + s * sc_s
    sn = SIN + b * sc_b + s * sc_s
    c1 = tl.load(cs + ds, mask=dm, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cs + half + ds, mask=dm, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sn + ds, mask=dm, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sn + half + ds, mask=dm, other=0.0).to(tl.float32)[None, :]
    _rope_heads(Q + b * sq_b + s * sq_s, QO + b * sqo_b + s * sqo_s, sq_h, sqo_h, Hq, c1, c2, s1, s2, half,
                HB, DB, BACKWARD, True)
    _rope_heads(K + b * sk_b + s * sk_s, KO + b * sko_b + s * sko_s, sk_h, sko_h, Hk, c1, c2, s1, s2, half,
                HB, DB, BACKWARD, True)
    if HAS_V:  # v has k's heads
        _rope_heads(V + b * sv_b + s * sv_s, VO + b * svo_b + s * svo_s, sv_h, svo_h, Hk, c1, c2, s1, s2, half,
                    HB, DB, BACKWARD, False)
