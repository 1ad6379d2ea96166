"""RMSNorm's Triton kernels: y = w * cast(x * rstd) (Llama: the normalized row cast to x's dtype, then
times the weight) or cast((offset + w) * x * rstd) (Gemma, offset 1), rstd = 1 / sqrt(mean(x^2) + eps),
accumulated in fp32. Persistent programs walk blocks of ROWS rows; the backward leaves one fp32
partial sum of dW per program, reduced afterwards in a fixed order (deterministic).

HAS_RESIDUAL (``add_rms_norm``): the forward normalizes s = x + r, rounded to x's dtype as a model's
``residual + hidden_states`` is, and stores s; HAS_DS: the backward adds the gradient s gets from its
other use (the residual stream) into dx, so no separate add runs in either direction."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_block(rb, M, cmask, ROWS: tl.constexpr):
    # rows [rb * ROWS, (rb + 1) * ROWS): their indices, which exist, int64 row numbers, the tile's mask
    rows = rb * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    return rows, rmask, rows.to(tl.int64)[:, None], rmask[:, None] & cmask[None, :]


@triton.jit
def _rms_norm_fwd_kernel(X, W, Y, RSTD, M, N, stride_x, stride_y, eps, offset, R, S, stride_r, stride_s,
                         BLOCK: tl.constexpr, ROWS: tl.constexpr, CAST_FIRST: tl.constexpr,
                         HAS_RESIDUAL: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
    for rb in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows, rmask, r64, m = _row_block(rb, M, cmask, ROWS)
        x = tl.load(X + r64 * stride_x + cols[None, :], mask=m, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            x = (x + tl.load(R + r64 * stride_r + cols[None, :], mask=m, other=0.0).to(tl.float32)).to(
                S.dtype.element_ty)
            tl.store(S + r64 * stride_s + cols[None, :], x, mask=m)
            x = x.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, 1) / N + eps)
        xh = x * rstd[:, None]
        if CAST_FIRST:  # as HF's LlamaRMSNorm: weight * hidden.to(input_dtype)
            xh = xh.to(X.dtype.element_ty).to(tl.float32)
        tl.store(Y + r64 * stride_y + cols[None, :], (xh * w[None, :]).to(Y.dtype.element_ty), mask=m)
        tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def _rms_norm_bwd_kernel(DY, X, W, RSTD, DX, DW, M, N, stride_dy, stride_x, stride_dx, offset, DS, stride_ds,
                         BLOCK: tl.constexpr, ROWS: tl.constexpr, CAST_FIRST: tl.constexpr, HAS_DS: tl.constexpr):
    # dxh = dy * w; dx = rstd * (dxh - xh * mean(dxh * xh)); this program's dW = sum of dy * xh
    # (xh cast to x's dtype first with CAST_FIRST, as the forward multiplied it).
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
    dw = tl.zeros([BLOCK], tl.float32)
    for rb in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows, rmask, r64, m = _row_block(rb, M, cmask, ROWS)
        x = tl.load(X + r64 * stride_x + cols[None, :], mask=m, other=0.0).to(tl.float32)
        dy = tl.load(DY + r64 * stride_dy + cols[None, :], mask=m, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xh = x * rstd[:, None]
        dxh = dy * w[None, :]
        dx = rstd[:, None] * (dxh - xh * (tl.sum(dxh * xh, 1) / N)[:, None])
        if HAS_DS:
            dx += tl.load(DS + r64 * stride_ds + cols[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(DX + r64 * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=m)
        if CAST_FIRST:
            xh = xh.to(X.dtype.element_ty).to(tl.float32)
        dw += tl.sum(dy * xh, 0)
    tl.store(DW + pid.to(tl.int64) * BLOCK + cols, dw, mask=cmask)


@triton.jit
def _dw_sum_kernel(PART, DW, rows, N, stride_p, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    # dW = the column sums of the backward's (rows, N) fp32 partials, in the weight's dtype: every row of a
    # BLOCK_N-column strip in one load (the partials were just written: L2 hits), one fixed tree order a
    # column (deterministic), the cast in the store (no second kernel).
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    r = tl.arange(0, BLOCK_R)
    m = (r[:, None] < rows) & (cols[None, :] < N)
    p = tl.load(PART + r[:, None] * stride_p + cols[None, :], mask=m, other=0.0)
    tl.store(DW + cols, tl.sum(p, 0).to(DW.dtype.element_ty), mask=cols < N)
