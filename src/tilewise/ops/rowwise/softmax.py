"""softmax / log-softmax along the last dim, forward and backward, in Triton.

Versions (forward; the backward follows the same pattern):
    v1_unfused: the lecture's starting point, four kernels: row max, subtract-and-exp (an fp32
                M x N intermediate), row sum, divide. Reads x twice and the intermediate twice,
                writes it once: (3 x itemsize + 12) bytes an element against the floor's
                2 x itemsize. bound: bandwidth on 3x (fp32) to 4.5x (bf16) the floor's bytes.
    v2_fused:   one kernel, each row (or a tile of several short rows) held in registers: x read
                once, y written once. Rows up to MAX_FUSED elements.
                bound: copy bandwidth on the floor's bytes (2 x M x N x itemsize).
    v3_online:  one kernel for any row length: pass 1 keeps a running row max (one reduction a
                chunk) and per-lane sums rescaled by one scalar exp a chunk (one exp an element:
                the exp unit, 16 a clock an SM, is otherwise a bound at 131072-long rows); pass 2
                re-reads x and writes y. Both passes issue the next chunk's load before this
                chunk's math (software prefetch: 32 KB an SM in flight). A persistent grid keeps
                few enough rows in flight that pass 2's re-read should hit L2; the backward's
                pass 2 walks the row backwards (Policy.bwd_reverse) so the freshest chunks come first.
                bound: copy bandwidth on the floor's bytes when pass 2 hits L2, on 3/2 x them
                (backward 5/3) when it does not.
    v4_cluster: v2 for rows up to 131072: the row is split over a cluster of up to 8 CTAs
                (Triton num_ctas, sm_90), each holding 16384 elements in registers; the row max,
                sum and dot are reduced across the cluster in distributed shared memory. One
                read, one write, like v2. Experimental: Triton's multi-CTA layouts are little
                used outside matmul; not the default until measured (Policy.triton_cluster). Triton 3.6
                cannot build it (TritonGPUPlanCTAPass fails on the reductions): where the probe
                cluster_unsupported_reason() says so, rows > 16384 raise NotImplementedError.
                bound: copy bandwidth on the floor's bytes.
    v5_cluster_cuda: v4's design in CUDA C (cluster.cu), which the Triton here cannot
                build: a cluster of 2-8 CTAs a row, each thread holding its 16-byte vectors of
                the row packed in registers, block then cluster reductions through distributed
                shared memory, output written from registers. Rows up to 262144 (fp32 backward
                131072) whose length, stride and start are multiples of 16 bytes; the default
                past MAX_FUSED where that holds (Policy.cuda_cluster).
                bound: copy bandwidth on the floor's bytes.
    v6_cluster_pipe: v5 in a persistent grid of clusters (as many as run at once), each thread
                copying its vectors of the next row into shared memory with cp.async (two row
                slices a block) while it reduces, exchanges and writes the current one: loads stay
                in flight through the barriers that idle v5's memory pipe between rows. Forward
                only (the backward is v5's); rows up to 131072. bound: as v5. Measured slower
                than v5 (the per-thread copies cost an instruction per 16 bytes; see
                docs/tuning/rowwise.md, "Pipelined v6").
    v7_cluster_tma: v6's idea with the TMA engine: each CTA's slice of a row is one contiguous
                run, fetched by one thread with one bulk copy (cp.async.bulk) into shared memory,
                completing on an mbarrier; the copy of a CTA's next row starts right after the
                current row's single cluster barrier and runs under its exchange and output and
                under the SM's other CTAs (5 of 128 threads an SM). Stats: each thread's (max,
                sum of exp) pair, combined per warp, all warps' pairs read through distributed
                shared memory; one exp an element, paired bf16/fp16 max. 2-byte types, rows up
                to 131072 (longer or fp32 rows: v5); the default forward where it applies
                (docs/tuning/rowwise.md, "TMA configs"). Backward: v5's.

Backward: dx = y * (dy - sum(y * dy)) (softmax), dx = dy - exp(y) * sum(dy) (log-softmax);
floor 3 x M x N x itemsize (read y and dy, write dx). v1: a row-dot kernel then an elementwise
kernel; v2 and v4: row in registers; v3: two passes over y and dy.

All arithmetic is fp32; fp16/bf16 are rounded once on store. A row of only -inf gives softmax 0
and log-softmax -inf (torch.softmax gives NaN there): a fully masked row contributes nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import settings
from ...cost import Cost
from .._checks import check_kernel_inputs, runs_reference
from ...runtime.triton_launch import cdiv as _cdiv, launch as _launch
from .configs import CLUSTER_SLICE, DEFAULT_POLICY, MAX_CLUSTER, MAX_FUSED, UNFUSED_BLOCK, Policy, default_variant as \
    _default_variant, fused_config, online_config, triton_cluster_config

_NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------
# reference and cost


def reference(x: torch.Tensor, log: bool = False) -> torch.Tensor:
    """PyTorch in fp32, rounded to x's dtype: reads x, writes y (2 x numel x itemsize bytes).

    Unlike torch.softmax, a row of only -inf gives zeros (log: -inf) rather than NaN.
    """
    if x.numel() == 0:
        return torch.empty_like(x)
    xf = x if x.dtype == torch.float64 else x.float()
    m = xf.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(xf - m)
    s = e.sum(-1, keepdim=True)
    if log:
        y = torch.where(s > 0, xf - m - torch.log(s), torch.full_like(xf, _NEG_INF))
    else:
        y = torch.where(s > 0, e / s, torch.zeros_like(e))
    return y.to(x.dtype)


def reference_backward(y: torch.Tensor, dy: torch.Tensor, log: bool = False) -> torch.Tensor:
    """dx from the forward output y and the incoming gradient dy (3 x numel x itemsize bytes)."""
    wide = torch.float64 if y.dtype == torch.float64 else torch.float32
    yf, gf = y.to(wide), dy.to(wide)
    if log:
        dx = gf - torch.exp(yf) * gf.sum(-1, keepdim=True)
    else:
        dx = yf * (gf - (yf * gf).sum(-1, keepdim=True))
    return dx.to(y.dtype)


def cost(M: int, N: int, dtype: torch.dtype = torch.float32, backward: bool = False) -> Cost:
    """Forward: read x, write y; ~5 FLOPs an element (max, subtract, exp, sum, scale).
    Backward: read y and dy, write dx; ~4 FLOPs an element."""
    b = dtype.itemsize
    n = M * N
    return Cost(flops=4 * n, bytes=3 * n * b) if backward else Cost(flops=5 * n, bytes=2 * n * b)


# --------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _block_rows(rb, M, ROWS: tl.constexpr):
    # Row block rb of the forward persistent loops (softmax, cross_entropy): its row indices, which exist.
    rows = rb * ROWS + tl.arange(0, ROWS)
    return rows, rows < M


@triton.jit
def _online_step(m_run, s_vec, x):
    # One chunk of the online pass 1 (here and in cross_entropy): the running row max and the
    # per-lane sums of exp(x - max), rescaled by one exp a row when the max grows.
    m_new = tl.maximum(m_run, tl.max(x, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: exp gives 0, not NaN
    return m_new, s_vec * tl.exp(m_run - m_safe)[:, None] + tl.exp(x - m_safe[:, None])


@triton.jit
def _softmax_fwd_kernel(X, Y, M, N, stride_xm, stride_ym,
                        ROWS: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr,
                        ONE_PASS: tl.constexpr, REVERSE: tl.constexpr = False):
    cols = tl.arange(0, BLOCK)
    for rb in range(tl.program_id(0), tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows, rmask = _block_rows(rb, M, ROWS)
        xrow = X + rows.to(tl.int64)[:, None] * stride_xm
        yrow = Y + rows.to(tl.int64)[:, None] * stride_ym
        if ONE_PASS:
            mask = rmask[:, None] & (cols[None, :] < N)
            x = tl.load(xrow + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
            m = tl.max(x, 1)
            m = tl.where(m == float("-inf"), 0.0, m)  # all -inf row: exp gives 0, not NaN
            e = tl.exp(x - m[:, None])
            s = tl.sum(e, 1)
            if LOG:
                y = tl.where(s[:, None] > 0, x - (m + tl.log(s))[:, None], float("-inf"))
            else:
                y = e * tl.where(s > 0, 1.0 / s, 0.0)[:, None]
            tl.store(yrow + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        else:
            # Pass 1: a running row max (one reduction a chunk) and per-lane sums rescaled by one
            # scalar exp a chunk: one exp an element. (A per-lane running max costs two, and at
            # 2^29 elements the exp unit, 16 a clock an SM, then needs 0.26 ms of the 0.5 ms.)
            # The next chunk's load is issued before this chunk's math, so one chunk (32 KB an
            # SM) stays in flight while the exps run.
            m_run = tl.full([ROWS], float("-inf"), tl.float32)
            s_vec = tl.zeros([ROWS, BLOCK], tl.float32)
            x_nxt = tl.load(xrow + cols[None, :], mask=rmask[:, None] & (cols[None, :] < N),
                            other=float("-inf"), eviction_policy="evict_last")
            for start in range(0, N, BLOCK):
                x = x_nxt.to(tl.float32)
                cn = start + BLOCK + cols
                # Keep pass 1's lines in L2 for pass 2 (the persistent grid sizes what is in flight).
                x_nxt = tl.load(xrow + cn[None, :], mask=rmask[:, None] & (cn[None, :] < N),
                                other=float("-inf"), eviction_policy="evict_last")
                m_run, s_vec = _online_step(m_run, s_vec, x)
            m = tl.where(m_run == float("-inf"), 0.0, m_run)
            s = tl.sum(s_vec, 1)
            inv = tl.where(s > 0, 1.0 / s, 0.0)
            lse = m + tl.log(s)
            # Pass 2, forwards or (REVERSE) backwards: backwards, the chunks pass 1 read last
            # are re-read first, surely still in L2; see research/notes/softmax.md.
            nchunks = tl.cdiv(N, BLOCK)
            step = -BLOCK if REVERSE else BLOCK
            # (A scalar offset is carried, not a column tensor: that would pin 32 registers.)
            start = (nchunks - 1) * BLOCK if REVERSE else 0
            c0 = start + cols
            x_nxt = tl.load(xrow + c0[None, :], mask=rmask[:, None] & (c0[None, :] < N),
                            other=float("-inf"), eviction_policy="evict_first")
            for _ in range(0, nchunks):
                x = x_nxt.to(tl.float32)
                nstart = start + step
                cn = nstart + cols
                x_nxt = tl.load(xrow + cn[None, :],
                                mask=rmask[:, None] & (cn[None, :] >= 0) & (cn[None, :] < N),
                                other=float("-inf"), eviction_policy="evict_first")
                c = start + cols
                if LOG:
                    y = tl.where(s[:, None] > 0, x - lse[:, None], float("-inf"))
                else:
                    y = tl.exp(x - m[:, None]) * inv[:, None]
                tl.store(yrow + c[None, :], y.to(Y.dtype.element_ty),
                         mask=rmask[:, None] & (c[None, :] < N), eviction_policy="evict_first")
                start = nstart


@triton.jit
def _softmax_bwd_kernel(Yp, DY, DX, M, N, stride_ym, stride_dym, stride_dxm,
                        ROWS: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr,
                        ONE_PASS: tl.constexpr, REVERSE: tl.constexpr = False):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    for rb in range(pid, tl.cdiv(M, ROWS), nprog):
        rows = rb * ROWS + tl.arange(0, ROWS)
        rmask = rows < M
        r64 = rows.to(tl.int64)[:, None]
        yrow = Yp + r64 * stride_ym
        grow = DY + r64 * stride_dym
        drow = DX + r64 * stride_dxm
        if ONE_PASS:
            mask = rmask[:, None] & (cols[None, :] < N)
            g = tl.load(grow + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if LOG:
                y = tl.load(yrow + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
                dot = tl.sum(g, 1)
                dx = g - tl.exp(y) * dot[:, None]
            else:
                y = tl.load(yrow + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                dot = tl.sum(y * g, 1)
                dx = y * (g - dot[:, None])
            tl.store(drow + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        else:
            # Pass 1: the row dot; the next chunk's loads go out before this chunk's math.
            acc = tl.zeros([ROWS, BLOCK], tl.float32)
            m0 = rmask[:, None] & (cols[None, :] < N)
            g_nxt = tl.load(grow + cols[None, :], mask=m0, other=0.0, eviction_policy="evict_last")
            if not LOG:
                y_nxt = tl.load(yrow + cols[None, :], mask=m0, other=0.0,
                                eviction_policy="evict_last")
            for start in range(0, N, BLOCK):
                cn = start + BLOCK + cols
                mn = rmask[:, None] & (cn[None, :] < N)
                g = g_nxt.to(tl.float32)
                g_nxt = tl.load(grow + cn[None, :], mask=mn, other=0.0, eviction_policy="evict_last")
                if LOG:
                    acc += g
                else:
                    y = y_nxt.to(tl.float32)
                    y_nxt = tl.load(yrow + cn[None, :], mask=mn, other=0.0,
                                    eviction_policy="evict_last")
                    acc += y * g
            dot = tl.sum(acc, 1)
            # Pass 2 (REVERSE) walks the row backwards: the chunks pass 1 read last are re-read
            # first, while they are surely still in L2 (132 rows of y and dy in flight, 67 MB at
            # 131072 bf16, do not all fit in the 60 MB L2; in the forward order the H200 took
            # the time of 5 streams from DRAM, i.e. every re-read missed; docs/tuning/rowwise.md,
            # "Online pass 2 direction").
            nchunks = tl.cdiv(N, BLOCK)
            for i in range(0, nchunks):
                c = ((nchunks - 1 - i) if REVERSE else i) * BLOCK + cols
                mask = rmask[:, None] & (c[None, :] < N)
                g = tl.load(grow + c[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                if LOG:
                    y = tl.load(yrow + c[None, :], mask=mask, other=float("-inf"),
                                eviction_policy="evict_first").to(tl.float32)
                    dx = g - tl.exp(y) * dot[:, None]
                else:
                    y = tl.load(yrow + c[None, :], mask=mask, other=0.0,
                                eviction_policy="evict_first").to(tl.float32)
                    dx = y * (g - dot[:, None])
                tl.store(drow + c[None, :], dx.to(DX.dtype.element_ty), mask=mask,
                         eviction_policy="evict_first")


# v1_unfused: one kernel per step of the textbook formula, each a full pass over memory.

@triton.jit
def _row_max_kernel(X, MX, N, stride_xm, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, N, BLOCK):
        c = start + cols
        x = tl.load(X + row * stride_xm + c, mask=c < N, other=float("-inf")).to(tl.float32)
        acc = tl.maximum(acc, x)
    m = tl.max(acc, 0)
    tl.store(MX + row, tl.where(m == float("-inf"), 0.0, m))


@triton.jit
def _sub_exp_kernel(X, MX, E, N, stride_xm, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row * stride_xm + c, mask=c < N, other=float("-inf")).to(tl.float32)
    tl.store(E + row * N + c, tl.exp(x - tl.load(MX + row)), mask=c < N)


@triton.jit
def _row_sum_kernel(A, B, S, N, LOG: tl.constexpr, BLOCK: tl.constexpr):
    """S[row] = sum(A) (LOG) or sum(A * B) over a contiguous fp32/any-dtype M x N pair."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        c = start + cols
        a = tl.load(A + row * N + c, mask=c < N, other=0.0).to(tl.float32)
        if LOG:
            acc += a
        else:
            acc += a * tl.load(B + row * N + c, mask=c < N, other=0.0).to(tl.float32)
    tl.store(S + row, tl.sum(acc, 0))


@triton.jit
def _normalize_kernel(X, E, MX, S, Y, N, stride_xm, stride_ym, LOG: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    s = tl.load(S + row)
    if LOG:
        x = tl.load(X + row * stride_xm + c, mask=c < N, other=float("-inf")).to(tl.float32)
        y = x - (tl.load(MX + row) + tl.log(s))
        y = tl.where(s > 0, y, float("-inf"))
    else:
        e = tl.load(E + row * N + c, mask=c < N, other=0.0)
        y = e * tl.where(s > 0, 1.0 / s, 0.0)
    tl.store(Y + row * stride_ym + c, y.to(Y.dtype.element_ty), mask=c < N)


@triton.jit
def _bwd_elementwise_kernel(Yp, DY, D, DX, N, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(DY + row * N + c, mask=c < N, other=0.0).to(tl.float32)
    d = tl.load(D + row)
    if LOG:
        y = tl.load(Yp + row * N + c, mask=c < N, other=float("-inf")).to(tl.float32)
        dx = g - tl.exp(y) * d
    else:
        y = tl.load(Yp + row * N + c, mask=c < N, other=0.0).to(tl.float32)
        dx = y * (g - d)
    tl.store(DX + row * N + c, dx.to(DX.dtype.element_ty), mask=c < N)


# --------------------------------------------------------------------------------------------
# launchers


def _check(x: torch.Tensor, name: str = "x", op: str = "softmax", cpu: bool = False) -> None:
    check_kernel_inputs(op, {name: x}, interpreter=True, cpu=cpu)
    if x.dim() == 0:
        raise ValueError(f"{op}: '{name}' must have at least one dimension")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as a 2-D (rows, N) view; rows must be contiguous along the last dim (copied if not)."""
    N = x.shape[-1]
    x2 = x.reshape(-1, N) if N else x.reshape(-1, 0)
    if N > 1 and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2


def _fwd_fused(x2, y2, log, policy):
    M, N = x2.shape
    if N > MAX_FUSED:
        raise ValueError(f"softmax.v2_fused: rows of {N} elements do not fit in registers "
                         f"(at most {MAX_FUSED}); use v3_online or variant=None")
    rows, block, warps = fused_config(N)
    grid = (_cdiv(M, rows),)
    _launch(_softmax_fwd_kernel, grid, x2, y2, M, N, x2.stride(0), y2.stride(0), ROWS=rows, BLOCK=block,
                              LOG=log, ONE_PASS=True, num_warps=warps)


def _fwd_online(x2, y2, log, policy):
    M, N = x2.shape
    block, warps, progs = online_config(x2, N * x2.element_size(), M)
    _launch(_softmax_fwd_kernel, (progs,), x2, y2, M, N, x2.stride(0), y2.stride(0), ROWS=1, BLOCK=block,
            LOG=log, ONE_PASS=False, REVERSE=policy.fwd_reverse, num_warps=warps)


def _fwd_unfused(x2, y2, log, policy):
    M, N = x2.shape
    B = UNFUSED_BLOCK if x2.is_cuda else 16
    mx = torch.empty(M, device=x2.device, dtype=torch.float32)
    s = torch.empty(M, device=x2.device, dtype=torch.float32)
    e = torch.empty(M, N, device=x2.device, dtype=torch.float32)
    _launch(_row_max_kernel, (M,), x2, mx, N, x2.stride(0), BLOCK=B)
    _launch(_sub_exp_kernel, (M, _cdiv(N, B)), x2, mx, e, N, x2.stride(0), BLOCK=B)
    _launch(_row_sum_kernel, (M,), e, e, s, N, LOG=True, BLOCK=B)
    _launch(_normalize_kernel, (M, _cdiv(N, B)), x2, e, mx, s, y2, N, x2.stride(0), y2.stride(0),
                                              LOG=log, BLOCK=B)


def _bwd_fused(y2, g2, dx2, log, policy):
    M, N = y2.shape
    if N > MAX_FUSED:
        raise ValueError(f"softmax.v2_fused: rows of {N} elements do not fit in registers "
                         f"(at most {MAX_FUSED}); use v3_online or variant=None")
    rows, block, warps = fused_config(N)
    _launch(_softmax_bwd_kernel, (_cdiv(M, rows),), y2, g2, dx2, M, N, y2.stride(0), g2.stride(0),
                                                 dx2.stride(0), ROWS=rows, BLOCK=block, LOG=log,
                                                 ONE_PASS=True, num_warps=warps)


def _bwd_online(y2, g2, dx2, log, policy):
    M, N = y2.shape
    block, warps, progs = online_config(y2, 2 * N * y2.element_size(), M, streams=2)
    _launch(_softmax_bwd_kernel, (progs,), y2, g2, dx2, M, N, y2.stride(0), g2.stride(0), dx2.stride(0),
            ROWS=1, BLOCK=block, LOG=log, ONE_PASS=False, REVERSE=policy.bwd_reverse, num_warps=warps)


def _bwd_unfused(y2, g2, dx2, log, policy):
    M, N = y2.shape
    B = UNFUSED_BLOCK if y2.is_cuda else 16
    y2, g2 = y2.contiguous(), g2.contiguous()
    d = torch.empty(M, device=y2.device, dtype=torch.float32)
    _launch(_row_sum_kernel, (M,), g2, y2, d, N, LOG=log, BLOCK=B)
    _launch(_bwd_elementwise_kernel, (M, _cdiv(N, B)), y2, g2, d, dx2, N, LOG=log, BLOCK=B)


def _cluster_config(x2) -> tuple[int, int, int]:
    """(BLOCK, num_warps, num_ctas) for v4_cluster (``configs.triton_cluster_config``); Triton
    reduces across the cluster through distributed shared memory (sm_90)."""
    N = x2.shape[1]
    if N > MAX_CLUSTER:
        raise ValueError(f"softmax.v4_cluster: rows of {N} elements exceed {MAX_CLUSTER} "
                         f"(8 CTAs x {CLUSTER_SLICE}); use v3_online")
    return triton_cluster_config(N, x2.is_cuda)


_CLUSTER_REASON: dict = {}


def cluster_unsupported_reason(device: torch.device | int | None = None) -> str | None:
    """None when this Triton builds v4_cluster's multi-CTA kernels (num_ctas > 1) for ``device``
    (default: the current CUDA device) and they give the right answer; otherwise why not.

    Found out once per device by compiling and running the forward kernel on one row split over
    2 CTAs (Triton 3.6 fails in TritonGPUPlanCTAPass on the reductions). The interpreter runs
    v4_cluster as one CTA, so it is always supported there.
    """
    if settings.triton_interpret() or not torch.cuda.is_available():
        return None
    dev = torch.device("cuda", torch.cuda.current_device() if device is None else
                       device if isinstance(device, int) else
                       (device.index if device.index is not None else torch.cuda.current_device()))
    if dev.index not in _CLUSTER_REASON:
        n = 2 * CLUSTER_SLICE
        try:
            with torch.cuda.device(dev):
                x = torch.zeros(1, n, device=dev, dtype=torch.bfloat16)
                y = torch.full_like(x, float("nan"))
                _launch(_softmax_fwd_kernel, (1,), x, y, 1, n, n, n, ROWS=1, BLOCK=n, LOG=False,
                                          ONE_PASS=True, num_warps=16, num_ctas=2)
                torch.cuda.synchronize(dev)
            ok = bool(torch.allclose(y.float(), torch.full((1, n), 1.0 / n, device=dev), rtol=1e-2))
            reason = None if ok else "gives wrong results"
        except Exception as e:  # a compile failure: the message is long MLIR; keep its first line
            first = (str(e).strip().splitlines() or [""])[0][:160]
            reason = f"fails to compile ({type(e).__name__}: {first})"
        _CLUSTER_REASON[dev.index] = None if reason is None else (
            f"Triton {triton.__version__} {reason} for multi-CTA (num_ctas > 1) reductions on "
            f"{torch.cuda.get_device_name(dev)}")
    return _CLUSTER_REASON[dev.index]


def _require_cluster(t: torch.Tensor, ctas: int, op: str = "softmax") -> None:
    """Raise NotImplementedError (never run a miscompiled kernel) when a row needs > 1 CTA and
    this Triton cannot build the multi-CTA kernel."""
    if ctas > 1 and t.is_cuda:
        why = cluster_unsupported_reason(t.device)
        if why:
            raise NotImplementedError(f"{op}.v4_cluster: {why}; use v3_online (variant=None)")


def _fwd_cluster(x2, y2, log, policy):
    M, N = x2.shape
    block, warps, ctas = _cluster_config(x2)
    _require_cluster(x2, ctas)
    _launch(_softmax_fwd_kernel, (M,), x2, y2, M, N, x2.stride(0), y2.stride(0), ROWS=1, BLOCK=block,
                              LOG=log, ONE_PASS=True, num_warps=warps, num_ctas=ctas)


def _bwd_cluster(y2, g2, dx2, log, policy):
    M, N = y2.shape
    block, warps, ctas = _cluster_config(y2)
    _require_cluster(y2, ctas, "softmax_backward")
    _launch(_softmax_bwd_kernel, (M,), y2, g2, dx2, M, N, y2.stride(0), g2.stride(0), dx2.stride(0),
                              ROWS=1, BLOCK=block, LOG=log, ONE_PASS=True, num_warps=warps,
                              num_ctas=ctas)


def _require_cuda_cluster(kind: str, *ts: torch.Tensor) -> None:
    from . import cluster as rc

    why = rc.unsupported_reason(*ts, kind=kind)
    if why:
        op = "softmax" if kind == "fwd" else "softmax_backward"
        raise ValueError(f"{op}.v5_cluster_cuda: {why}; use v3_online (variant=None picks it)")


def _fwd_cluster_cuda(x2, y2, log, policy):
    from . import cluster as rc

    _require_cuda_cluster("fwd", x2, y2)
    rc.softmax_fwd(x2, y2, log)


def _bwd_cluster_cuda(y2, g2, dx2, log, policy):
    from . import cluster as rc

    _require_cuda_cluster("bwd", y2, g2, dx2)
    rc.softmax_bwd(y2, g2, dx2, log)


def _fwd_cluster_pipe(x2, y2, log, policy):
    from . import cluster as rc

    why = rc.pipe_unsupported_reason(x2, y2, kind="fwd")
    if why:
        raise ValueError(f"softmax.v6_cluster_pipe: {why}; use v3_online (variant=None picks it)")
    rc.softmax_fwd(x2, y2, log, pipe=True)


def _fwd_cluster_tma(x2, y2, log, policy):
    from . import cluster as rc

    # checks the layout itself (ValueError saying what is missing)
    rc.softmax_fwd_tma(x2, y2, log, config=policy.tma_fwd)


def _tma_ok(policy: Policy, *ts: torch.Tensor) -> bool:
    from . import cluster as rc

    return rc.tma_unsupported_reason(*ts, kind="fwd", config=policy.tma_fwd) is None


def _cuda_cluster_ok(kind: str, *ts: torch.Tensor) -> bool:
    """Whether the CUDA C cluster kernels (v5) take these tensors here (never in the interpreter)."""
    if settings.triton_interpret():
        return False
    from . import cluster as rc

    return rc.unsupported_reason(*ts, kind=kind) is None


_FWD = {"v1_unfused": _fwd_unfused, "v2_fused": _fwd_fused, "v3_online": _fwd_online,
        "v4_cluster": _fwd_cluster, "v5_cluster_cuda": _fwd_cluster_cuda, "v6_cluster_pipe": _fwd_cluster_pipe,
        "v7_cluster_tma": _fwd_cluster_tma}
# v6 has no backward of its own: v5's backward (two inputs in registers) already runs at 84 % of its floor
# (docs/tuning/rowwise.md, "Cluster backward").
_BWD = {"v1_unfused": _bwd_unfused, "v2_fused": _bwd_fused, "v3_online": _bwd_online,
        "v4_cluster": _bwd_cluster, "v5_cluster_cuda": _bwd_cluster_cuda, "v6_cluster_pipe": _bwd_cluster_cuda,
        "v7_cluster_tma": _bwd_cluster_cuda}


def _named(variant: str) -> str:
    if variant not in _FWD:
        raise ValueError(f"softmax: unknown variant {variant!r}; choose from {sorted(_FWD)}")
    return variant


def default_variant(x: torch.Tensor, kind: str = "fwd", policy: Policy | None = None) -> str:
    """The version ``variant=None`` runs for x (kind "fwd") or for y and dy like x ("bwd") under
    ``policy`` (default DEFAULT_POLICY; the rule: ``configs.default_variant``)."""
    policy = policy or DEFAULT_POLICY
    return _default_variant(x.shape[-1], policy, lambda: bool(x.numel()) and _cuda_cluster_ok(kind, _rows(x)),
                            lambda: kind == "fwd" and _tma_ok(policy, _rows(x)))


def _forward(x: torch.Tensor, log: bool, variant: str | None, out: torch.Tensor | None = None,
             policy: Policy = DEFAULT_POLICY):
    _check(x)
    N = x.shape[-1]
    if variant is not None:
        _named(variant)
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype) if out is None else out
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous()):
        raise ValueError(f"softmax: out must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)}")
    if x.numel() == 0:
        return y
    x2, y2 = _rows(x), y.view(-1, N)
    if variant is None:
        variant = _default_variant(N, policy, lambda: _cuda_cluster_ok("fwd", x2, y2), lambda: _tma_ok(policy, x2, y2))
    _FWD[variant](x2, y2, log, policy)
    return y


def _backward(y: torch.Tensor, dy: torch.Tensor, log: bool, variant: str | None, policy: Policy = DEFAULT_POLICY,
              cpu: bool = False):
    """dx by the kernels, or by ``reference_backward`` with ``cpu`` (the one CPU rule), after the same checks."""
    _check(y, "y", "softmax_backward", cpu=cpu)
    _check(dy, "dy", "softmax_backward", cpu=cpu)
    if dy.shape != y.shape or dy.dtype != y.dtype or dy.device != y.device:
        raise ValueError(f"softmax_backward: 'dy' {tuple(dy.shape)} {dy.dtype} on {dy.device} must match y: "
                         f"'y' is {tuple(y.shape)} {y.dtype} on {y.device}")
    N = y.shape[-1]
    if variant is not None:
        _named(variant)
    if cpu:
        return reference_backward(y, dy, log)
    dx = torch.empty(y.shape, device=y.device, dtype=y.dtype)
    if y.numel() == 0:
        return dx
    y2, g2, dx2 = _rows(y), _rows(dy), dx.view(-1, N)
    if variant is None:  # the backward has no TMA kernel: v5's serves every cluster variant
        variant = _default_variant(N, policy, lambda: _cuda_cluster_ok("bwd", y2, g2, dx2), lambda: False)
    _BWD[variant](y2, g2, dx2, log, policy)
    return dx


# --------------------------------------------------------------------------------------------
# autograd ops (torch.compile traces through these via the fake implementations)


# ``policy``: ``Policy.pack()``, what a custom op's schema can carry; empty for DEFAULT_POLICY.
@torch.library.custom_op("tilewise::softmax_fwd", mutates_args=())
def _softmax_op(x: torch.Tensor, log: bool, variant: str, policy: list[int]) -> torch.Tensor:
    return _forward(x, log, variant or None, policy=Policy.unpack(policy))


@_softmax_op.register_fake
def _(x, log, variant, policy):
    return torch.empty(x.shape, device=x.device, dtype=x.dtype)


@torch.library.custom_op("tilewise::softmax_bwd", mutates_args=())
def _softmax_bwd_op(y: torch.Tensor, dy: torch.Tensor, log: bool, variant: str, policy: list[int]) -> torch.Tensor:
    return _backward(y, dy.contiguous(), log, variant or None, Policy.unpack(policy))


@_softmax_bwd_op.register_fake
def _(y, dy, log, variant, policy):
    return torch.empty(y.shape, device=y.device, dtype=y.dtype)


def _setup(ctx, inputs, output):
    _, log, variant, policy = inputs
    ctx.log, ctx.variant, ctx.policy = log, variant, policy
    ctx.save_for_backward(output)


def _grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return _softmax_bwd_op(y, dy, ctx.log, ctx.variant, ctx.policy), None, None, None


_softmax_op.register_autograd(_grad, setup_context=_setup)


# --------------------------------------------------------------------------------------------
# public API


def _variant_fn(name: str, log: bool):
    def fn(x: torch.Tensor, out: torch.Tensor | None = None, *, policy: Policy | None = None) -> torch.Tensor:
        return _forward(x, log, name, out, policy or DEFAULT_POLICY)
    fn.__name__ = name
    return fn


def _backward_fn(name: str):
    def fn(y: torch.Tensor, dy: torch.Tensor, log: bool = False, *, policy: Policy | None = None) -> torch.Tensor:
        return _backward(y, dy, log, name, policy or DEFAULT_POLICY)
    fn.__name__ = name
    return fn


VARIANTS = {v: _variant_fn(v, False) for v in _FWD}
LOG_VARIANTS = {v: _variant_fn(v, True) for v in _FWD}
BACKWARD_VARIANTS = {v: _backward_fn(v) for v in _BWD}


def _cpu_reference(op: str, x, variant) -> bool:
    """The one CPU rule for softmax / log_softmax: x checked as on the GPU, True for the reference."""
    if not runs_reference(op, {"x": x}, interpreter=True):
        return False
    _check(x, op=op, cpu=True)
    if variant is not None:
        _named(variant)
    return True


def _packed(policy: Policy | None) -> list[int]:
    return [] if policy is None or policy == DEFAULT_POLICY else policy.pack()


def softmax(x: torch.Tensor, *, variant: str | None = None, policy: Policy | None = None) -> torch.Tensor:
    """Softmax along the last dim, differentiable.

    x:       CUDA tensor, any shape with at least one dim, float32 / float16 / bfloat16; rows must
             be contiguous along the last dim (other layouts are copied first). A CPU tensor runs
             the PyTorch reference (any variant and policy).
    variant: None (v2_fused when the row has at most MAX_FUSED = 16384 elements, else
             v7_cluster_tma (2-byte rows up to 131072) or v5_cluster_cuda where their layout and
             GPU conditions hold, else v3_online; ``configs.default_variant``) or a key of VARIANTS.
    policy:  a ``configs.Policy`` for this call and its backward (None: DEFAULT_POLICY, the
             measured defaults): what variant=None prefers, v3's pass 2 directions, v7's config.
    Returns y, same shape and dtype as x; fp32 arithmetic. A row of only -inf gives zeros.
    """
    if _cpu_reference("softmax", x, variant):
        return reference(x)
    _check(x)
    return _softmax_op(x, False, "" if variant is None else _named(variant), _packed(policy))


def log_softmax(x: torch.Tensor, *, variant: str | None = None, policy: Policy | None = None) -> torch.Tensor:
    """Log-softmax along the last dim, differentiable; arguments as for ``softmax``.
    A row of only -inf gives -inf."""
    if _cpu_reference("log_softmax", x, variant):
        return reference(x, log=True)
    _check(x)
    return _softmax_op(x, True, "" if variant is None else _named(variant), _packed(policy))


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, *, log: bool = False, variant: str | None = None,
                     policy: Policy | None = None) -> torch.Tensor:
    """dx for y = softmax(x) (log=False) or y = log_softmax(x) (log=True) and incoming gradient
    dy: both CUDA tensors of y's shape and dtype; ``variant`` and ``policy`` as for ``softmax``.
    Returns dx, same shape and dtype."""
    if not isinstance(log, bool):  # a string such as "no" would pick the log backward
        raise ValueError(f"softmax_backward: 'log' must be a bool, got {log!r}")
    return _backward(y, dy, log, variant, policy or DEFAULT_POLICY,
                     cpu=runs_reference("softmax_backward", {"y": y, "dy": dy}, interpreter=True))
