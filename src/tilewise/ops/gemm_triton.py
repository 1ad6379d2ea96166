"""gemm (Triton, tensor cores): ``C = epilogue(scale_a * scale_b * (A @ B) + bias)``.

A is (M, K), B is (K, N); fp16 / bf16 (fp32 accumulate), fp32 as TF32 (or IEEE fp32), fp8 e4m3
with per-tensor scales (float32 tensors of one element). The epilogue runs on the fp32
accumulator in registers before the one store: scales, bias (N,), activation (relu, gelu with
erf), the cast to the output dtype; optionally the pre-activation is stored too (``aux``, for
the backward of GELU). ``linear(x, w, b, activation)`` is ``act(x @ w.T + b)`` as an autograd op
whose backward runs on this GEMM too.

Versions (F = 2 M N K; floor F / peak of the dtype: bf16 ~700-790, fp16 ~667, tf32 ~345, fp8
~1,240 TFLOP/s on H200; bytes (M K + K N) itemsize + M N out_itemsize are far from binding above
~512):
    v1_tiled:          one program per C tile, tiles in grouped order (GROUP_M tile rows share
                       their B columns in L2), pointer loads, software-pipelined K loop
                       (num_stages), autotuned tile shape. bound: tensor-core throughput, minus
                       the prologue/epilogue of each tile and the last, partial wave.
    v2_persistent:     v1 with one program per SM looping over tiles (grid = #SMs): no launch of
                       later waves, the epilogue of one tile overlaps the loads of the next.
    v3_tma_persistent: v2 with TMA tensor descriptors for A, B (and C): the copy engine moves
                       tiles (out-of-range parts read as zero), fewer registers spent on address
                       arithmetic; needs unit-stride rows and 16-byte aligned strides.
    v4_streamk:        stream-K: the (tile, K-step) iterations of the whole problem are dealt out
                       in equal contiguous ranges to one program per SM, so a tile count that
                       does not divide into waves (1536^2: 144 tiles of 128 x 128 on 132 SMs) costs
                       no second, nearly empty wave. A program that covers part of a tile leaves
                       its fp32 partial in a workspace and counts itself in; the last to arrive
                       adds the partials in program order (deterministic) and runs the epilogue.
                       TMA loads where the rows allow. Fixed tile, no autotuning, not the default:
                       0.47x (1536) to 0.97x (2048, 128 x 256) cuBLAS on the H200, bound by L2
                       bandwidth whatever the split, plus the fix-up's 5-6 us (docs/tuning/gemm.md,
                       "v4_streamk: not the default").

Each kernel is autotuned over a short config list (per dtype class: K tile 128 for fp8, 64 for
16-bit, 32 for fp32), keyed on (M, N, K) and the dtypes. Under TRITON_INTERPRET=1 (CPU tests),
one small config runs without autotuning and CPU tensors are accepted.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..cost import Cost
from ..runtime import cuda as rt
from . import gemm_sm90 as _sm90
from . import transpose as _transpose
from ._memory import check_no_overlap, may_overlap, span
from ..runtime.triton_launch import bind as _bind, cdiv as _cdiv, launch as _launch, next_power_of_2 as _next_pow2

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

_IN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "gelu": 2}
_PRECISIONS = ("tf32", "ieee")


# --------------------------------------------------------------------------- reference and cost


def reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
              activation: str | None = None, out_dtype: torch.dtype | None = None,
              scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None) -> torch.Tensor:
    """float32 PyTorch: reads A, B (and bias) once, writes C once; unfused, it also writes and
    re-reads the M x N product once per epilogue step (bias add, activation, cast)."""
    c = a.float() @ b.float()
    if scale_a is not None:
        c = c * (scale_a.float() * scale_b.float())
    if bias is not None:
        c = c + bias.float()
    if activation == "relu":
        c = torch.relu(c)
    elif activation == "gelu":
        c = torch.nn.functional.gelu(c)
    return c.to(out_dtype or _default_out_dtype(a.dtype))


def cost(M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None,
         bias: bool = False) -> Cost:
    """2 M N K FLOPs (the epilogue's M N are not counted); bytes: A, B, bias once, C once."""
    it = dtype.itemsize
    ot = (out_dtype or _default_out_dtype(dtype)).itemsize
    return Cost(flops=2 * M * N * K, bytes=it * (M * K + K * N) + ot * M * N + (4 * N if bias else 0))


def _default_out_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype


# --------------------------------------------------------------------------- kernels


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # Grouped order: GROUP_M tile rows are walked column by column, so the programs running at
    # once share a few B column panels and A row panels in L2 instead of streaming all of B.
    width = GROUP_M * num_pid_n
    group = tile // width
    first_m = group * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % rows
    pid_n = (tile % width) // rows
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr,
              HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr):
    if HAS_SCALES:
        acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    return acc


@triton.jit
def _activate(acc, ACTIVATION: tl.constexpr):
    if ACTIVATION == 1:
        acc = tl.maximum(acc, 0.0)
    elif ACTIVATION == 2:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    return acc


@triton.jit
def _mainloop(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # Row/column indices wrap (% M, % N) so the loads need no M/N mask: the wrapped rows compute
    # values that the masked store drops. Only the K tail is masked (zeros add nothing).
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:
            # Triton 3.9's interpreter multiplies bf16 tiles as raw 16-bit integers in tl.dot
            # (results ~1e10 off); upcasting first is exact, so CPU tests stay meaningful.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _store(c_ptr, aux_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, STORE_AUX: tl.constexpr,
           ACTIVATION: tl.constexpr):
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if STORE_AUX:
        tl.store(aux_ptr + offs, acc.to(aux_ptr.dtype.element_ty), mask=mask)
    acc = _activate(acc, ACTIVATION)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, aux_ptr, scale_a_ptr, scale_b_ptr,
                 M, N, K,
                 stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr, STORE_AUX: tl.constexpr,
                 ACTIVATION: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = _mainloop(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS, HAS_SCALES)
    _store(c_ptr, aux_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, STORE_AUX, ACTIVATION)


@triton.jit
def _gemm_splitk_kernel(a_ptr, b_ptr, ws_ptr, M, N, K, K_PER,
                        stride_am, stride_ak, stride_bk, stride_bn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # One (tile, K slice) per program: the fp32 partial product of K_PER columns of a and rows of
    # b, stored to its own (M, N) slab of the workspace (no atomics: the reduce sums slabs in order).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    s = tl.program_id(2)
    k0 = s * K_PER
    kn = tl.minimum(K - k0, K_PER)
    acc = _mainloop(a_ptr + k0 * stride_ak, b_ptr + k0 * stride_bk, pid_m, pid_n, M, N, kn,
                    stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(ws_ptr + s.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _splitk_reduce_kernel(ws_ptr, c_ptr, bias_ptr, M, N, S, stride_cm, stride_cn,
                          HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, S):  # slab order fixed: the same bits every run
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    m = offs // N
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    acc = _activate(acc, ACTIVATION)
    tl.store(c_ptr + m * stride_cm + n * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemm_persistent_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, aux_ptr, scale_a_ptr, scale_b_ptr,
                            M, N, K,
                            stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                            NUM_SMS,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr,
                            STORE_AUX: tl.constexpr, ACTIVATION: tl.constexpr, PRECISION: tl.constexpr,
                            UPCAST: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = _mainloop(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS, HAS_SCALES)
        _store(c_ptr, aux_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, STORE_AUX, ACTIVATION)


@triton.jit
def _tma_load_b(b_desc, off_n, off_k, B_KMAJOR: tl.constexpr):
    """B's (BLOCK_K, BLOCK_N) tile at (off_k, off_n); a K-major B (given as its (N, K) transpose)
    loads as (BLOCK_N, BLOCK_K) and enters the dot transposed."""
    if B_KMAJOR:
        b = b_desc.load([off_n, off_k]).T
    else:
        b = b_desc.load([off_k, off_n])
    return b


@triton.jit
def _tma_mainloop(a_desc, b_desc, off_m, off_n, k0, k1, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, B_KMAJOR: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # K-steps k0 .. k1 - 1 of one tile through TMA descriptors (out-of-range rows/columns read as
    # zero); v3_tma_persistent's whole K and v4_streamk's segments.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(k0, k1):
        off_k = kk * BLOCK_K
        a = a_desc.load([off_m, off_k])
        b = _tma_load_b(b_desc, off_n, off_k, B_KMAJOR)
        if UPCAST:  # see _mainloop: Triton 3.9 interpreter's bf16 tl.dot
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _gemm_streamk_kernel(a_ptr, b_ptr, a_desc, b_desc, c_ptr, bias_ptr, aux_ptr, scale_a_ptr, scale_b_ptr,
                         ws_ptr, count_ptr, M, N, K,
                         stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                         ITERS_PER_PROG,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr,
                         STORE_AUX: tl.constexpr, ACTIVATION: tl.constexpr, PRECISION: tl.constexpr,
                         UPCAST: tl.constexpr):
    # Iteration i is K-step i % ipt of tile i // ipt; program p owns [p * IPP, (p + 1) * IPP). A
    # tile split over programs first .. last: each leaves its fp32 partial in its workspace slab (slot
    # 0 for the first segment of its range, 1 for the last; a program has at most two partial
    # segments) and counts itself in on the tile's counter; the last to arrive adds all partials in
    # program order (the same bits whoever arrives last), runs the epilogue and zeroes the counter
    # for the next call. Nobody waits, so no order of programs can deadlock (the interpreter runs
    # them one after another). The counters start at zero and are left at zero.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    ipt = tl.cdiv(K, BLOCK_K)
    total = num_pid_m * num_pid_n * ipt
    start = pid * ITERS_PER_PROG
    end = tl.minimum(start + ITERS_PER_PROG, total)
    slab = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    first_tile = start // ipt
    # One segment a tile the range touches, as a counted loop (the shape of v3's tile loop, whose
    # inner K loop Triton software-pipelines).
    for seg in range(0, (end - 1) // ipt - first_tile + 1):
        tile = first_tile + seg
        k0 = tl.maximum(start - tile * ipt, 0)
        k1 = tl.minimum(end - tile * ipt, ipt)
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        if USE_TMA:
            acc = _tma_mainloop(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k0, k1, BLOCK_M, BLOCK_N,
                                BLOCK_K, B_KMAJOR, PRECISION, UPCAST)
        else:
            kb = k0 * BLOCK_K
            acc = _mainloop(a_ptr + kb * stride_ak, b_ptr + kb * stride_bk, pid_m, pid_n, M, N,
                            tl.minimum(K - kb, (k1 - k0) * BLOCK_K), stride_am, stride_ak, stride_bk, stride_bn,
                            BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
        done = (k0 == 0) & (k1 == ipt)  # the whole tile in this program
        if not done:
            first = (tile * ipt) // ITERS_PER_PROG
            last = ((tile + 1) * ipt - 1) // ITERS_PER_PROG
            slot = tl.minimum(seg, 1)  # 0: the first segment of the range, 1: the last
            tl.store(ws_ptr + (2 * pid + slot) * (BLOCK_M * BLOCK_N) + slab, acc)
            tl.debug_barrier()  # every thread's part of the slab is out before the count
            arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
            done = arrived == last - first
            if done:
                tl.debug_barrier()
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for q in range(first, last + 1):
                    q_slot = (tile != (q * ITERS_PER_PROG) // ipt).to(tl.int32)
                    acc += tl.load(ws_ptr + (2 * q + q_slot) * (BLOCK_M * BLOCK_N) + slab, cache_modifier=".cg")
                tl.atomic_xchg(count_ptr + tile, 0)
        if done:
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS, HAS_SCALES)
            _store(c_ptr, aux_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, STORE_AUX, ACTIVATION)


@triton.jit
def _gemm_tma_persistent_kernel(a_desc, b_desc, c_desc, aux_desc, bias_ptr, scale_a_ptr, scale_b_ptr,
                                M, N, K, NUM_SMS, dtype_tag,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr,
                                HAS_SCALES: tl.constexpr, STORE_AUX: tl.constexpr, ACTIVATION: tl.constexpr,
                                PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # dtype_tag: unused here; it keys the autotuner on the input dtype, which descriptors hide.
    # B_KMAJOR: B is given as its transpose (N, K) with unit stride along K (a weight w with
    # B = w.T): tiles load as (BLOCK_N, BLOCK_K) and enter the dot transposed.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_mainloop(a_desc, b_desc, off_m, off_n, 0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K, B_KMAJOR,
                            PRECISION, UPCAST)
        _tma_store_tile(acc, c_desc, aux_desc, off_m, off_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                        BLOCK_M, BLOCK_N, HAS_BIAS, HAS_SCALES, STORE_AUX, ACTIVATION)


@triton.jit
def _tma_store_tile(acc, c_desc, aux_desc, off_m, off_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr,
                    STORE_AUX: tl.constexpr, ACTIVATION: tl.constexpr):
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    acc = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS, HAS_SCALES)
    if STORE_AUX:
        aux_desc.store([off_m, off_n], acc.to(aux_desc.dtype))
    acc = _activate(acc, ACTIVATION)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))  # the copy engine clips at M, N


@triton.jit
def _gemm_tma_split_kernel(a_desc, b_desc, b2_desc, c_desc, c2_desc, aux_desc, aux2_desc, bias_ptr, scale_a_ptr,
                           scale_b_ptr, M, N, K, NUM_SMS,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_N2: tl.constexpr,
                           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr,
                           HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr, STORE_AUX: tl.constexpr,
                           ACTIVATION: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """v3_tma_split: v3_tma_persistent with a BLOCK_M x (BLOCK_N + BLOCK_N2) tile, a width Triton
    cannot give one tensor (128 + 64 = 192): two accumulators fed by one A tile and two B tiles, two
    products a K-step, each half stored through its own descriptors."""
    BN: tl.constexpr = BLOCK_N + BLOCK_N2
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BN
        off_n2 = off_n + BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N2), dtype=tl.float32)
        for kk in range(0, k_tiles):
            # The second B tile is loaded after the first product: the pipeliner then gives it a
            # barrier of its own, and the first product waits only for A and the first B tile
            # (8 barriers against 4 when the three loads come first): 0.88x cuBLAS at 3072^3 against
            # 0.75x-0.81x (docs/tuning/gemm.md, "v3_tma_split: load order in the K loop").
            off_k = kk * BLOCK_K
            a = a_desc.load([off_m, off_k])
            b = _tma_load_b(b_desc, off_n, off_k, B_KMAJOR)
            if UPCAST:  # see _mainloop
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            b2 = _tma_load_b(b2_desc, off_n2, off_k, B_KMAJOR)
            if UPCAST:
                b2 = b2.to(tl.float32)
            acc2 = tl.dot(a, b2, acc2, input_precision=PRECISION)
        _tma_store_tile(acc, c_desc, aux_desc, off_m, off_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                        BLOCK_M, BLOCK_N, HAS_BIAS, HAS_SCALES, STORE_AUX, ACTIVATION)
        _tma_store_tile(acc2, c2_desc, aux2_desc, off_m, off_n2, M, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                        BLOCK_M, BLOCK_N2, HAS_BIAS, HAS_SCALES, STORE_AUX, ACTIVATION)


# --------------------------------------------------------------------------- autotuning


def _cfg(bm, bn, bk, stages, warps, group=8):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                         num_stages=stages, num_warps=warps)


# A short list for H200 (228 KiB smem/SM): large tiles for big squares, 128 x 128 / 64-wide for
# small or skinny problems where the big tiles leave SMs idle. Each dtype class keeps only its
# own K tile (prune below), so autotuning times 4 or 5 configs per shape.
_CONFIGS = [
    # 16-bit inputs: K tile 64
    _cfg(128, 256, 64, 3, 8), _cfg(256, 128, 64, 3, 8), _cfg(128, 128, 64, 4, 8),
    _cfg(128, 128, 64, 4, 4), _cfg(64, 128, 64, 4, 4),
    # fp8: K tile 128
    _cfg(128, 256, 128, 3, 8), _cfg(256, 128, 128, 3, 8), _cfg(128, 128, 128, 4, 8), _cfg(64, 128, 128, 4, 4),
    # fp32 (tf32 / ieee): K tile 32
    _cfg(128, 256, 32, 3, 8), _cfg(128, 128, 32, 4, 8), _cfg(128, 128, 32, 3, 4), _cfg(64, 128, 32, 4, 4),
]
_BK_FOR_ITEMSIZE = {1: 128, 2: 64, 4: 32}
_SMEM_LIMIT = rt.SM90_SHARED_OPT_IN  # opt-in shared memory per block on H100 / H200


def _dtype_of(arg):
    if hasattr(arg, "dtype") and isinstance(arg.dtype, torch.dtype):
        return arg.dtype
    base = getattr(arg, "base", None)  # a TensorDescriptor
    return base.dtype


def _prune(configs, named_args, **kwargs):
    first = named_args.get("a_ptr", named_args.get("a_desc"))
    bk = _BK_FOR_ITEMSIZE[_dtype_of(first).itemsize]
    kept = [c for c in configs if c.kwargs["BLOCK_K"] == bk]
    if "a_desc" in named_args:
        # The TMA kernel also stages the C tile in shared memory for the store (aux reuses it;
        # ptxas-level check with Triton 3.9 for sm_90): drop configs past the 227 KiB a block may
        # have (fp32 128 x 256 x 32 would need 272 KiB).
        it = _dtype_of(first).itemsize
        out_it = _dtype_of(named_args["c_desc"]).itemsize

        def smem(c):
            bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
            return c.num_stages * (bm + bn) * bk * it + bm * bn * out_it

        kept = [c for c in kept if smem(c) <= _SMEM_LIMIT] or kept[-1:]
    M, N = named_args["M"], named_args["N"]
    # Tiles far larger than the problem only waste work; keep at least one config.
    small = [c for c in kept if c.kwargs["BLOCK_M"] <= max(64, _next_pow2(M))
             and c.kwargs["BLOCK_N"] <= max(64, _next_pow2(N))]
    return small or kept[-1:]


_KEY = ["M", "N", "K"]


def _tma_pre_hook(nargs):
    # Descriptors are built with a placeholder block shape; the chosen config sets the real one.
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk] if nargs["B_KMAJOR"] else [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn]
    nargs["aux_desc"].block_shape = [bm, bn]


def _tma_configs():
    out = []
    for c in _CONFIGS:
        out.append(triton.Config(dict(c.kwargs), num_stages=c.num_stages, num_warps=c.num_warps,
                                 pre_hook=_tma_pre_hook))
    return out


if _INTERPRET:
    _tiled = _gemm_kernel
    _persistent = _gemm_persistent_kernel
    _tma = _gemm_tma_persistent_kernel
else:
    _prune_opts = {"early_config_prune": _prune}
    _tiled = triton.autotune(_CONFIGS, key=_KEY, prune_configs_by=_prune_opts)(_gemm_kernel)
    _persistent = triton.autotune(_CONFIGS, key=_KEY, prune_configs_by=_prune_opts)(_gemm_persistent_kernel)
    _tma = triton.autotune(_tma_configs(), key=_KEY + ["B_KMAJOR", "dtype_tag"], prune_configs_by=_prune_opts)(
        _gemm_tma_persistent_kernel)

# The one config the interpreter runs (small, so odd sizes cross several tiles).
_INTERP_META = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}


def _num_sms(device_index: int) -> int:
    if _INTERPRET or not torch.cuda.is_available():
        return 4
    return rt.sm_count(device_index)


# --------------------------------------------------------------------------- launchers


def _check_kinds(a, b, bias, out_dtype, out, aux) -> None:
    """The arguments' kinds, before routing reads them (a list reached the routers as an
    AttributeError); one isinstance each, so a planned call stays cheap. _check does the rest."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("bias", bias), ("out", out), ("aux", aux)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: '{name}' must be a torch.Tensor or None, got {type(t).__name__}")
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"gemm: 'out_dtype' must be a torch.dtype or None, got {out_dtype!r}")


def _check(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out):
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"gemm: '{name}' must be 2-D, got shape {tuple(t.shape)} "
                             f"(for batches use tilewise.matmul or flatten leading dimensions)")
        if not t.is_cuda and not _INTERPRET:
            raise ValueError(f"gemm: '{name}' is on {t.device}; Triton kernels need CUDA tensors "
                             f"(use gemm_triton.reference for CPU tensors)")
        if t.dtype not in _IN_DTYPES:
            raise ValueError(f"gemm: '{name}' has dtype {t.dtype}; supported: float16, bfloat16, float32, "
                             f"float8_e4m3fn")
        if t.numel() >= 2**31:
            raise ValueError(f"gemm: '{name}' has {t.numel()} elements; 32-bit offsets allow < 2^31")
    if a.dtype != b.dtype:
        raise ValueError(f"gemm: 'a' is {a.dtype} but 'b' is {b.dtype}; both must have one dtype")
    if a.device != b.device:
        raise ValueError(f"gemm: 'a' is on {a.device} but 'b' is on {b.device}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm: inner dimensions differ: 'a' is {tuple(a.shape)}, 'b' is {tuple(b.shape)}")
    M, K = a.shape
    N = b.shape[1]
    if not isinstance(activation, (str, type(None))) or activation not in _ACTIVATIONS:
        raise ValueError(f"gemm: activation {activation!r} is not one of None, 'relu', 'gelu'")
    if precision not in _PRECISIONS:
        raise ValueError(f"gemm: precision {precision!r} is not one of {_PRECISIONS}")
    out_dtype = out_dtype or _default_out_dtype(a.dtype)
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"gemm: out_dtype {out_dtype} is not one of float16, bfloat16, float32")
    fp8 = a.dtype == torch.float8_e4m3fn
    if fp8 and (scale_a is None or scale_b is None):
        raise ValueError("gemm: float8_e4m3fn inputs need scale_a and scale_b (float32 tensors of one "
                         "element: the per-tensor dequantization scales); pass torch.ones(1) for none")
    if not fp8 and (scale_a is not None or scale_b is not None):
        raise ValueError("gemm: scale_a / scale_b apply to float8_e4m3fn inputs only")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s is not None and (not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32
                              or s.device != a.device):
            raise ValueError(f"gemm: '{name}' must be a float32 tensor of one element on {a.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (N,) or bias.device != a.device:
            raise ValueError(f"gemm: bias must be a tensor of shape ({N},) on {a.device}")
        if not bias.is_contiguous():
            raise ValueError("gemm: bias must be contiguous")
    if out is None:
        out = torch.empty((M, N), device=a.device, dtype=out_dtype)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N) or out.dtype != out_dtype
          or out.device != a.device):
        raise ValueError(f"gemm: out must be a ({M}, {N}) {out_dtype} tensor on {a.device}")
    else:
        check_no_overlap("gemm", "out", out, a=a, b=b, bias=bias)
    return out


def _common_meta(a, bias, activation, scale_a, precision, aux):
    # input_precision matters only for fp32 operands; "tf32" is Triton's default for the others.
    return dict(HAS_BIAS=bias is not None, HAS_SCALES=scale_a is not None, STORE_AUX=aux is not None,
                ACTIVATION=_ACTIVATIONS[activation], PRECISION=precision if a.dtype == torch.float32 else "tf32",
                UPCAST=_INTERPRET and a.dtype == torch.bfloat16)


def _pointer_args(a, b, out, bias, scale_a, scale_b, aux) -> tuple:
    """The pointer kernels' leading arguments: the seven pointers (out stands in for the optional
    ones, never read when the matching constexpr flag is off), then M, N, K and the six strides."""
    dummy = out
    ptrs = (a, b, out, bias if bias is not None else dummy, aux if aux is not None else dummy,
            scale_a if scale_a is not None else dummy, scale_b if scale_b is not None else dummy)
    M, K = a.shape
    return ptrs + (M, b.shape[1], K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))


def _pointer_launch(kind, a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed=None):
    """(kernel, grid, args, kwargs) of v1_tiled ("tiled") or v2_persistent ("persistent"),
    autotuned; ``fixed`` = (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) runs the persistent
    kernel with that tile instead, no autotuner. The args start with ``_pointer_args``' seven
    pointers (``_PLAN_LEAD``)."""
    M, N = out.shape
    args = _pointer_args(a, b, out, bias, scale_a, scale_b, aux)
    meta = _common_meta(a, bias, activation, scale_a, precision, aux)
    interp = _INTERP_META if _INTERPRET else {}
    if kind == "tiled":
        grid = lambda META: (_cdiv(M, META["BLOCK_M"]) * _cdiv(N, META["BLOCK_N"]),)  # noqa: E731
        return _tiled, grid, args, dict(meta, **interp)
    sms = _num_sms(a.get_device())
    if fixed is not None:
        bm, bn, bk, stages, warps = fixed
        return (_gemm_persistent_kernel, (min(sms, _cdiv(M, bm) * _cdiv(N, bn)),), args + (sms,),
                dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, **meta, num_warps=warps, num_stages=stages))
    grid = lambda META: (min(sms, _cdiv(M, META["BLOCK_M"]) * _cdiv(N, META["BLOCK_N"])),)  # noqa: E731
    return _persistent, grid, args + (sms,), dict(meta, **interp)


def _run_pointer(kind, a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed=None):
    """Launch ``_pointer_launch``'s kernel."""
    fn, grid, args, kw = _pointer_launch(kind, a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed)
    _launch(fn, grid, *args, **kw)
    return out


# v4_streamk's fixed tile per input itemsize: (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps).
_STREAMK_TILE = {1: (128, 128, 128, 3, 8), 2: (128, 128, 64, 4, 8), 4: (128, 128, 32, 3, 8)}
# Per-tile arrival counters, zero between calls (the last arrival zeroes its tile's), one buffer a
# (device, stream): two stream-K GEMMs on one stream never overlap, on two streams they get two buffers.
_STREAMK_COUNTS: dict = {}


def _streamk_counts(device: torch.device, tiles: int) -> torch.Tensor:
    cuda = device.type == "cuda"
    key = (device, torch.cuda.current_stream(device).cuda_stream if cuda else 0)
    buf = _STREAMK_COUNTS.get(key)
    if buf is None or buf.numel() < tiles:
        if cuda and torch.cuda.is_current_stream_capturing():
            # Not kept: memory from a graph's pool. The captured memset zeroes it on each replay.
            return torch.zeros(tiles, device=device, dtype=torch.int32)
        buf = torch.zeros(max(tiles, 4096), device=device, dtype=torch.int32)
        _STREAMK_COUNTS[key] = buf
    return buf


def _run_streamk(a, b, out, bias, activation, scale_a, scale_b, precision, aux, tile=None):
    """v4_streamk: one program an SM, equal contiguous ranges of (tile, K-step) iterations; TMA
    loads where ``_tma_loads_ok`` (else pointer loads). ``tile`` = (BLOCK_M, BLOCK_N, BLOCK_K,
    num_stages, num_warps) overrides _STREAMK_TILE (experiments)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[1]
    if _INTERPRET:
        bm, bn, bk = _INTERP_META["BLOCK_M"], _INTERP_META["BLOCK_N"], _INTERP_META["BLOCK_K"]
        opts = {}
    else:
        bm, bn, bk, stages, warps = tile or _STREAMK_TILE[a.element_size()]
        opts = dict(num_stages=stages, num_warps=warps)
    if K == 0:  # no K-steps: the epilogue alone (act(bias) or act(0)), as the tiled kernel does
        return _run_pointer("tiled", a, b, out, bias, activation, scale_a, scale_b, precision, aux)
    tiles = _cdiv(M, bm) * _cdiv(N, bn)
    total = tiles * _cdiv(K, bk)
    progs = min(_num_sms(a.get_device()), total)
    ipp = _cdiv(total, progs)
    progs = _cdiv(total, ipp)  # no program without work
    ws = torch.empty((2 * progs, bm * bn), device=a.device, dtype=torch.float32)
    counts = _streamk_counts(a.device, tiles)
    use_tma = _tma_loads_ok(a, b)  # the C tile is stored through pointers
    b_kmajor = b.stride(1) != 1
    if use_tma:
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        b_desc = _b_desc(b, bn, bk, b_kmajor)
    else:
        a_desc, b_desc = a, b  # unused
    args = _pointer_args(a, b, out, bias, scale_a, scale_b, aux)
    _launch(_gemm_streamk_kernel, (progs,),
        args[0], args[1], a_desc, b_desc, *args[2:7], ws, counts, *args[7:], ipp,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=_INTERP_META["GROUP_M"] if _INTERPRET else 8,
        USE_TMA=use_tma, B_KMAJOR=b_kmajor, **_common_meta(a, bias, activation, scale_a, precision, aux), **opts)
    return out


def _tma_ok(t: torch.Tensor, *, unit_dim: int) -> bool:
    """TMA wants the unit-stride dimension last in memory order, other strides and base 16-byte aligned."""
    it = t.element_size()
    other = 1 - unit_dim
    return (t.stride(unit_dim) == 1 and (t.stride(other) * it) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.shape[other] >= 1)


def _tma_loads_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """A K-contiguous, B N- or K-contiguous, 16-byte aligned: both load through TMA descriptors."""
    return _tma_ok(a, unit_dim=1) and (_tma_ok(b, unit_dim=1) or _tma_ok(b, unit_dim=0))


def tma_applies(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None,
                out: torch.Tensor | None = None) -> bool:
    """Whether v3_tma_persistent takes these operands (A K-contiguous; B N- or K-contiguous;
    pointers and row strides 16-byte aligned; the output's too: ``out`` if given, else a
    contiguous (M, N) result, whose rows must then be whole 16-byte multiples)."""
    if out is not None:
        return _tma_loads_ok(a, b) and _tma_ok(out, unit_dim=1)
    ot = (out_dtype or _default_out_dtype(a.dtype)).itemsize
    return _tma_loads_ok(a, b) and (b.shape[1] * ot) % 16 == 0


def _check_tma_layout(name, a, b, out, aux):
    if not (tma_applies(a, b, out.dtype, out) and (aux is None or _tma_ok(aux, unit_dim=1))):
        raise ValueError(f"gemm.{name}: TMA needs 'a' with unit stride along K, 'b' with unit stride along N "
                         "or K, 16-byte aligned pointers and row strides (also of out and aux); use v1_tiled "
                         "or gemm() for other layouts")


def _b_desc(b, bn, bk, b_kmajor):
    """B's descriptor: (bn, bk) boxes over b.T when B is K-major, else (bk, bn) boxes over b."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(b.t(), [bn, bk]) if b_kmajor else TensorDescriptor.from_tensor(b, [bk, bn])


def _tma_launch(a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed=None):
    """(kernel, grid, args, kwargs) of v3_tma_persistent; ``fixed`` = (BLOCK_M, BLOCK_N, BLOCK_K,
    num_stages, num_warps) launches that one config without the autotuner (gemm()'s 64 x 128
    choice, see ``tma_tile_for``). The args start with the four descriptors (A, B, C, aux) and the
    three optional pointers (``_PLAN_LEAD``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[1]
    b_kmajor = b.stride(1) != 1
    if _INTERPRET:
        bm, bn, bk = _INTERP_META["BLOCK_M"], _INTERP_META["BLOCK_N"], _INTERP_META["BLOCK_K"]
    elif fixed is not None:
        bm, bn, bk = fixed[:3]
    else:
        bm = bn = bk = 16  # placeholder blocks; the autotuner's pre-hook sets the chosen config's
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = _b_desc(b, bn, bk, b_kmajor)
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    aux_desc = TensorDescriptor.from_tensor(aux, [bm, bn]) if aux is not None else c_desc
    dummy = out
    sms = _num_sms(a.get_device())
    meta = _common_meta(a, bias, activation, scale_a, precision, aux)
    ptrs = (bias if bias is not None else dummy, scale_a if scale_a is not None else dummy,
            scale_b if scale_b is not None else dummy)
    if fixed is not None and not _INTERPRET:
        stages, warps = fixed[3:]
        return (_gemm_tma_persistent_kernel, (min(sms, _cdiv(M, bm) * _cdiv(N, bn)),),
                (a_desc, b_desc, c_desc, aux_desc) + ptrs + (M, N, K, sms, 0),
                dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, B_KMAJOR=b_kmajor, **meta,
                     num_stages=stages, num_warps=warps))
    grid = lambda META: (min(sms, _cdiv(M, META["BLOCK_M"]) * _cdiv(N, META["BLOCK_N"])),)  # noqa: E731
    return (_tma, grid, (a_desc, b_desc, c_desc, aux_desc) + ptrs + (M, N, K, sms, 100 + _IN_DTYPES.index(a.dtype)),
            dict(B_KMAJOR=b_kmajor, **meta, **(_INTERP_META if _INTERPRET else {})))


def _run_tma(a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed=None):
    """v3_tma_persistent (``_tma_launch``), after checking the layouts take TMA."""
    _check_tma_layout("v3_tma_persistent", a, b, out, aux)
    fn, grid, args, kw = _tma_launch(a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed)
    _launch(fn, grid, *args, **kw)
    return out


# v3_tma_split's one config: (BLOCK_M, BLOCK_N, BLOCK_N2, BLOCK_K, num_stages, num_warps); the
# interpreter's keeps a split (16 + 16) so that odd sizes cross both halves.
_SPLIT_TILE = (128, 128, 64, 64, 4, 8)
_SPLIT_TILE_INTERP = (16, 16, 16, 16, 1, 4)


def _split_launch(a, b, out, bias, activation, scale_a, scale_b, precision, aux):
    """(kernel, grid, args, kwargs) of v3_tma_split. The args start with the seven descriptors (A,
    B, B2, C, C2, aux, aux2) and the three optional pointers (``_PLAN_LEAD``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[1]
    bm, bn, bn2, bk, stages, warps = _SPLIT_TILE_INTERP if _INTERPRET else _SPLIT_TILE
    b_kmajor = b.stride(1) != 1
    c_desc, c2_desc = TensorDescriptor.from_tensor(out, [bm, bn]), TensorDescriptor.from_tensor(out, [bm, bn2])
    aux_desc, aux2_desc = ((TensorDescriptor.from_tensor(aux, [bm, bn]), TensorDescriptor.from_tensor(aux, [bm, bn2]))
                           if aux is not None else (c_desc, c2_desc))
    sms = _num_sms(a.get_device())
    dummy = out
    meta = _common_meta(a, bias, activation, scale_a, precision, aux)
    args = (TensorDescriptor.from_tensor(a, [bm, bk]), _b_desc(b, bn, bk, b_kmajor), _b_desc(b, bn2, bk, b_kmajor),
            c_desc, c2_desc, aux_desc, aux2_desc, bias if bias is not None else dummy,
            scale_a if scale_a is not None else dummy, scale_b if scale_b is not None else dummy, M, N, K, sms)
    return (_gemm_tma_split_kernel, (min(sms, _cdiv(M, bm) * _cdiv(N, bn + bn2)),), args,
            dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_N2=bn2, BLOCK_K=bk, GROUP_M=8, B_KMAJOR=b_kmajor, **meta,
                 num_stages=stages, num_warps=warps))


def _run_tma_split(a, b, out, bias, activation, scale_a, scale_b, precision, aux):
    if a.dtype not in (torch.float16, torch.bfloat16) or out.element_size() != 2:
        raise ValueError(f"gemm.v3_tma_split: float16 / bfloat16 inputs and output only (its tile and "
                         f"stages are sized for 2-byte types), got {a.dtype} -> {out.dtype}; use "
                         f"v3_tma_persistent or gemm()")
    _check_tma_layout("v3_tma_split", a, b, out, aux)
    fn, grid, args, kw = _split_launch(a, b, out, bias, activation, scale_a, scale_b, precision, aux)
    _launch(fn, grid, *args, **kw)
    return out


# The tiles gemm() weighs for 16-bit TMA problems: (BLOCK_M, BLOCK_N, throughput at equal wave
# fill relative to 128 x 128), each measured graph-replayed (bf16, H200) at a size where it and
# 128 x 128 fill the last wave alike
# (docs/tuning/gemm.md, "TMA tile choice (_TMA_TILES, tma_tile_for)").
_TMA_TILES = {"64x128": (64, 128, 0.83), "128x128": (128, 128, 1.0), "128x192": (128, 192, 0.98),
              "128x256": (128, 256, 1.03)}
_TMA_64x128 = (64, 128, 64, 4, 4)  # BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps


def tma_tile_for(M: int, N: int, sms: int) -> str:
    """The key of ``_TMA_TILES`` whose wave fill x relative throughput is highest for an (M, N)
    output on ``sms`` SMs (fill: tiles / (ceil(tiles / sms) * sms), the share of SM slots busy over
    the waves). gemm() runs "64x128" as one fixed config, "128x192" as v3_tma_split, the others
    through v3_tma_persistent's autotuner. On 132 SMs: 768-1000 -> 64 x 128 (1000^2: 128 tiles,
    one wave); 1536^2 and 3072^2 -> 128 x 192 (96 and 384 tiles: 0.73 and 0.97 fill, against
    0.55 and 0.87 for 128 x 128); 1280, 2048, 2304, 4096 -> the autotuner. The measurements
    against the autotuner: docs/tuning/gemm.md, "TMA tile choice (_TMA_TILES, tma_tile_for)"."""
    def score(name):
        bm, bn, rel = _TMA_TILES[name]
        tiles = _cdiv(M, bm) * _cdiv(N, bn)
        return rel * tiles / (_cdiv(tiles, sms) * sms) if tiles else 0.0

    return max(_TMA_TILES, key=score)


_SPLITK_TILE = 64


def split_k_for(M: int, N: int, K: int) -> int:
    """K slices for a problem whose output has too few 64 x 64 tiles to fill the GPU and a long K
    (the weight gradient of a linear layer: (out, in) from K = tokens); 1 = no split. Each slice
    keeps at least 128 of K; slices x tiles aims at two CTAs an SM of the H200."""
    tiles = _cdiv(M, _SPLITK_TILE) * _cdiv(N, _SPLITK_TILE)
    if tiles >= 64 or K < 1024:
        return 1
    return max(1, min(64, _cdiv(K, 128), 264 // tiles))


def gemm_splitk(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
                activation: str | None = None, out_dtype: torch.dtype | None = None,
                precision: str = "tf32", out: torch.Tensor | None = None, splits: int | None = None) -> torch.Tensor:
    """``act(a @ b + bias)`` with K split into ``splits`` slices (default ``split_k_for``): one
    kernel writes each slice's fp32 partial product to a workspace (splits x M x N x 4 bytes), a
    second sums the slices in a fixed order (deterministic) and applies bias, activation and the
    output cast. For small outputs with a long K, where one CTA per output tile leaves most SMs
    idle. Same operands as ``gemm`` without fp8 scales or aux."""
    out = _check(a, b, bias, activation, out_dtype, None, None, precision, out)
    M, K = a.shape
    N = b.shape[1]
    if a.dtype == torch.float8_e4m3fn:
        raise ValueError("gemm_splitk: float8 inputs are not supported (use gemm)")
    if M == 0 or N == 0:
        return out
    if K == 0:  # an empty sum: act(bias) or act(0)
        z = torch.zeros((M, N), device=a.device, dtype=torch.float32) + (bias.float() if bias is not None else 0.0)
        z = torch.relu(z) if activation == "relu" else F.gelu(z) if activation == "gelu" else z
        return out.copy_(z)
    S = split_k_for(M, N, K) if splits is None else int(splits)
    if S < 1:
        raise ValueError(f"gemm_splitk: splits must be >= 1, got {splits}")
    bk = _INTERP_META["BLOCK_K"] if _INTERPRET else _BK_FOR_ITEMSIZE[a.element_size()]
    k_per = _cdiv(_cdiv(K, S), bk) * bk
    S = _cdiv(K, k_per)
    ws = torch.empty((S, M, N), device=a.device, dtype=torch.float32)
    bm = bn = _INTERP_META["BLOCK_M"] if _INTERPRET else _SPLITK_TILE
    meta = dict(PRECISION=precision if a.dtype == torch.float32 else "tf32",
                UPCAST=_INTERPRET and a.dtype == torch.bfloat16)
    opts = {} if _INTERPRET else dict(num_warps=4, num_stages=3)
    _launch(_gemm_splitk_kernel, (_cdiv(M, bm), _cdiv(N, bn), S),
        a, b, ws, M, N, K, k_per, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **meta, **opts)
    block = 256 if _INTERPRET else 1024
    _launch(_splitk_reduce_kernel, (_cdiv(M * N, block),),
        ws, out, bias if bias is not None else ws, M, N, S, out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, ACTIVATION=_ACTIVATIONS[activation], BLOCK=block)
    return out


def _variant(kind):
    def fn(a, b, bias=None, activation=None, out_dtype=None, scale_a=None, scale_b=None,
           precision="tf32", out=None, aux=None):
        out = _check(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out)
        M, N = out.shape
        if aux is not None and (tuple(aux.shape) != (M, N) or not aux.is_contiguous()):
            raise ValueError(f"gemm: aux must be a contiguous ({M}, {N}) tensor")
        if aux is not None:
            check_no_overlap("gemm", "aux", aux, a=a, b=b, bias=bias, out=out)
        if M == 0 or N == 0:
            return out
        if kind == "tma":
            return _run_tma(a, b, out, bias, activation, scale_a, scale_b, precision, aux)
        if kind == "tma_64x128":
            return _run_tma(a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed=_TMA_64x128)
        if kind == "tma_split":
            return _run_tma_split(a, b, out, bias, activation, scale_a, scale_b, precision, aux)
        if kind == "streamk":
            return _run_streamk(a, b, out, bias, activation, scale_a, scale_b, precision, aux)
        return _run_pointer(kind, a, b, out, bias, activation, scale_a, scale_b, precision, aux)

    return fn


VARIANTS = {"v1_tiled": _variant("tiled"), "v2_persistent": _variant("persistent"),
            "v3_tma_persistent": _variant("tma"), "v3_tma_split": _variant("tma_split"),
            "v4_streamk": _variant("streamk")}
_TMA_FIXED_64x128 = _variant("tma_64x128")  # gemm()'s pick where tma_tile_for says "64x128"


# Small problems (at most 16 tiles of 128 x 128, e.g. 512 x 512): the persistent kernel with a fixed
# 64 x 64 tile, no autotuner: 0.95x / 1.04x cuBLAS at 512^3 (bf16 / fp16) against the autotuned TMA
# path's 0.84x / 0.41x; at 768 the TMA path is ahead, so the rule stops at 16 tiles. The pointer
# kernel needs 16-byte rows to vectorize, hence the alignment test
# (docs/tuning/gemm.md, "Small problems: fixed 64 x 64 tile").
_V1_FROM_MN = 7168 * 7168  # outputs at least this large go to v1_tiled (16-bit), see gemm()
_SMALL_TILE = (64, 64, 64, 4, 4)  # BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps
_SMALL_MAX_TILES = 16


def _small_applies(a, b, bias, activation, out_dtype, scale_a, scale_b, out, aux) -> bool:
    if _INTERPRET or not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dim() != 2 or b.dim() != 2 or a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype:
        return False
    if scale_a is not None or scale_b is not None or aux is not None or not a.is_cuda:
        return False
    M, K = a.shape
    N = b.shape[1]
    if K != b.shape[0] or M == 0 or N == 0 or K == 0:
        return False
    if _cdiv(M, 128) * _cdiv(N, 128) > _SMALL_MAX_TILES:
        return False

    def aligned(t):  # one unit stride, the other stride and the base 16-byte aligned (2-byte types)
        return _tma_ok(t, unit_dim=1) or _tma_ok(t, unit_dim=0)

    return aligned(a) and aligned(b) and (out is None or aligned(out))


def _run_small(a, b, bias, activation, out_dtype, precision, out):
    out = _check(a, b, bias, activation, out_dtype, None, None, precision, out)
    return _run_pointer("persistent", a, b, out, bias, activation, None, None, precision, None, fixed=_SMALL_TILE)


# Rows whose length in bytes is not a multiple of 16 (odd K or N, e.g. 2999) rule out TMA and
# 16-byte vector loads: v1_tiled then runs 2999^3 at ~130 TFLOP/s (cuBLAS 108), against ~600-650
# for the TMA kernel on aligned rows. gemm() instead copies the operands into zero-padded buffers
# with aligned rows (K and N rounded up to 16 bytes; zero pad columns of A meet zero pad rows of
# B, so the sum is unchanged), runs the TMA kernel into an output with aligned rows and copies the
# (M, N) result out. Modelled time of each route, in the measured rates: v1 at
# _V1_UNALIGNED_TFLOPS, padded at _TMA_TFLOPS plus the copies' bytes at _COPY_GBPS plus
# _COPY_LAUNCH_US a copy; padding where it models at most 0.8x v1's time. The 16-bit rates are
# measured; fp8 and tf32 are scaled by their tensor-core peaks (x2, x0.5). 2999^3 bf16: 0.41 ms on
# v1, 0.18 ms padded (2.7x cuBLAS) (docs/tuning/gemm.md, "Unaligned rows: padded route").
_V1_UNALIGNED_TFLOPS = 130.0
_TMA_TFLOPS = {1: 1200.0, 2: 600.0, 4: 300.0}
_COPY_GBPS = 2500.0
_COPY_LAUNCH_US = 4.0


def _padded_cols(t: torch.Tensor, cols: int) -> torch.Tensor:
    """A row-major copy of 2-D t with ``cols`` >= t.shape[1] columns, the extra ones zero."""
    p = torch.empty((t.shape[0], cols), device=t.device, dtype=t.dtype)
    p[:, t.shape[1]:].zero_()
    p[:, :t.shape[1]].copy_(t)
    return p


def _pad_plan(a, b, out_dtype, out):
    """What the padded route copies: (pad a, pad b, pad out) flags, or None where it cannot help
    (non-unit strides of the operands are left to v1_tiled)."""
    unit_a = 16 // a.element_size()
    K = a.shape[1]
    a_ok = _tma_ok(a, unit_dim=1)
    b_kmajor = b.stride(0) == 1 and b.stride(1) != 1
    b_ok = _tma_ok(b, unit_dim=0 if b_kmajor else 1)
    if not (a.stride(1) == 1 or a_ok) or not (b.stride(1) == 1 or b.stride(0) == 1):
        return None
    pad_k = K % unit_a != 0
    od = out.dtype if out is not None else (out_dtype or _default_out_dtype(a.dtype))
    out_ok = _tma_ok(out, unit_dim=1) if out is not None else (b.shape[1] * od.itemsize) % 16 == 0
    return (not a_ok or pad_k, not b_ok or pad_k, not out_ok)


def _padding_plan(a, b, out_dtype, out, aux):
    """``_pad_plan``'s copies where the padded route pays (modelled time <= 0.8x v1's), else None."""
    if _INTERPRET or aux is not None or not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    if a.dim() != 2 or b.dim() != 2 or a.dtype not in _IN_DTYPES or b.dtype != a.dtype or not a.is_cuda:
        return None
    M, K = a.shape
    N = b.shape[1]
    if K != b.shape[0] or min(M, N, K) == 0 or (out is not None and tuple(out.shape) != (M, N)):
        return None
    plan = _pad_plan(a, b, out_dtype, out)
    if plan is None or not any(plan):
        return None
    od = out.dtype if out is not None else (out_dtype or _default_out_dtype(a.dtype))
    return plan if _padded_time_ratio(M, N, K, a.element_size(), od.itemsize, plan) <= 0.8 else None


def _padded_time_ratio(M: int, N: int, K: int, itemsize: int, out_itemsize: int, plan) -> float:
    """Modelled time of the padded route over v1_tiled's on unaligned rows (plan: which of a, b,
    out are copied)."""
    copy_bytes = 2 * (plan[0] * M * K * itemsize + plan[1] * K * N * itemsize + plan[2] * M * N * out_itemsize)
    flops = 2.0 * M * N * K
    t_v1 = flops / (_V1_UNALIGNED_TFLOPS * 1e12)
    t_pad = (flops / (_TMA_TFLOPS[itemsize] * 1e12) + copy_bytes / (_COPY_GBPS * 1e9)
             + sum(plan) * _COPY_LAUNCH_US * 1e-6)
    return t_pad / t_v1


def _run_padded(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, plan=None):
    """gemm() through zero-padded copies with 16-byte rows (see _V1_UNALIGNED_TFLOPS); ``plan``:
    which of a, b, out to copy (default ``_pad_plan``'s)."""
    out = _check(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out)
    pad_a, pad_b, pad_out = plan if plan is not None else _pad_plan(a, b, out_dtype, out)
    M, K = a.shape
    N = b.shape[1]
    k_pad = _cdiv(K, 16 // a.element_size()) * (16 // a.element_size())
    a_p = _padded_cols(a, k_pad) if pad_a else a
    if pad_b:
        if b.stride(0) == 1 and b.stride(1) != 1:  # K-major (w.t() of an (N, K) weight): pad w's rows
            b_p = _padded_cols(b.t(), k_pad).t()
        else:  # N-major: K rows padded with zero rows, each row padded to 16 bytes
            n_pad = _cdiv(N, 16 // b.element_size()) * (16 // b.element_size())
            buf = torch.empty((k_pad, n_pad), device=b.device, dtype=b.dtype)
            buf[K:].zero_()
            buf[:K, :N].copy_(b)
            b_p = buf[:, :N]
    else:
        b_p = b
    if pad_out:
        n_pad = _cdiv(N, 16 // out.element_size()) * (16 // out.element_size())
        c = torch.empty((M, n_pad), device=out.device, dtype=out.dtype)[:, :N]
    else:
        c = out
    gemm(a_p, b_p, bias=bias, activation=activation, out_dtype=out.dtype, scale_a=scale_a, scale_b=scale_b,
         precision=precision, out=c)
    if c is not out:
        out.copy_(c)
    return out


# --------------------------------------------------------------------------- call plans
#
# gemm()'s default route for a call without out / aux / scales depends only on what ``_plan_key``
# holds (shapes, strides, dtypes, 16-byte alignment of each pointer, devices, bias layout,
# activation, out_dtype, precision), and so do the checks of ``_check`` and the launch's
# arguments other than the tensors. The first call of a key checks, routes and launches through
# Triton; it leaves a plan that later calls run directly: allocate the output, build the
# descriptors without re-validating them, launch the compiled kernel (runtime.triton_launch.Bound).
# Host time of a 1000^3 bf16 call on the H200's host: see docs/notes-matmul.md ("Call plans").

_PLANS: dict = {}
_PLANS_MAX = 4096  # cleared when full
_PLANS_ON = os.environ.get("TILEWISE_GEMM_PLANS", "1") not in ("0", "")


def _plan_key(a, b, bias, activation, out_dtype, precision, out):
    """Everything gemm()'s route, checks and launch arguments depend on, besides the tensors'
    addresses (and whether ``out`` overlaps an input, which each call checks). Raises
    (AttributeError, TypeError, RuntimeError) for arguments that are not plain tensors; the
    caller then takes the checked path."""
    bk = None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.data_ptr() & 15, bias.get_device())
    ok = None if out is None else (out.dtype, out.shape, out.stride(), out.data_ptr() & 15, out.get_device())
    dev = a.get_device()
    key = (a.dtype, b.dtype, a.shape, b.shape, a.stride(), b.stride(), a.data_ptr() & 15, b.data_ptr() & 15,
           dev, b.get_device(), torch.cuda.current_device() if dev >= 0 else -1, bk, ok, activation, out_dtype,
           precision)
    hash(key)
    return key


def _extent(t: torch.Tensor) -> int:
    """Bytes from a tensor's first to its last element's last byte (``_memory.span``'s width)."""
    first, last = span(t)
    return last - first


_TD_FAST: dict = {}  # TensorDescriptor class -> whether a copy can be filled in without its checks


def _desc_maker(proto):
    """x -> a copy of TensorDescriptor ``proto`` (checked when it was built) with base x, for tensors
    of the dtype, shape, strides and alignment proto's base has (a plan's key): the checks of
    TensorDescriptor's constructor are not run again. ``x`` only lends its address: for a K-major
    B, proto's base is b.t() and x is b. Holds no reference to proto's base."""
    import dataclasses

    TD = type(proto)
    fast = _TD_FAST.get(TD)
    if fast is None:
        fast = _TD_FAST[TD] = not hasattr(TD, "__slots__") and all(
            f.default is not dataclasses.MISSING for f in dataclasses.fields(TD)
            if f.name not in ("base", "shape", "strides", "block_shape"))
    fields = {f.name: getattr(proto, f.name) for f in dataclasses.fields(TD) if f.name != "base"}
    if not fast:
        return lambda x: TD(x, **fields)
    new = TD.__new__

    def make(x):
        d = new(TD)
        d.__dict__.update(fields)
        d.base = x
        return d

    return make


# Per plan kind: how many leading kernel arguments are the call's tensors (descriptors and
# pointers, rebuilt each call); the rest (sizes, strides, SM count) are the plan's constants.
_PLAN_LEAD = {"ptr": 7, "tma": 7, "split": 10}


def _meets_inputs(out, extents, a, b, bias) -> bool:
    """Whether a given out's byte range meets a's, b's or bias's (as _check's check_no_overlap),
    from the plan's byte extents (a, b, bias, out) and the tensors' addresses."""
    ea, eb, ebias, eo = extents
    o0 = out.data_ptr()
    o1 = o0 + eo
    x = a.data_ptr()
    if x <= o1 and o0 <= x + ea:
        return True
    x = b.data_ptr()
    if x <= o1 and o0 <= x + eb:
        return True
    if bias is not None:
        x = bias.data_ptr()
        if x <= o1 and o0 <= x + ebias:
            return True
    return False


def _keep_plan(key, plan) -> None:
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan


class _Plan:
    """One gemm() route for one ``_plan_key``: ``plan(a, b, bias, out)`` allocates the output (out
    None) and launches; None when the call needs the checked path (a given out whose addresses
    meet an input's, an allocation without 16-byte alignment).
    kind: "tma" (``_tma_launch``: a fixed config or the autotuner's), "split" (``_split_launch``),
    "ptr" (``_pointer_launch``: v1_tiled autotuned, or the persistent kernel with a fixed tile).
    ``spec(a, b, bias, out)`` is the route's launch (kernel, grid, args, kwargs), as its variant
    builds it: the plan launches it through Triton until runtime.triton_launch.bind gives a Bound,
    then keeps the Bound, the trailing constant arguments and, for TMA, descriptor makers taken
    from that launch's descriptors (the autotuner's pre-hook has set their blocks by then)."""

    __slots__ = ("kind", "spec", "tail", "out_shape", "out_dtype", "device", "bound", "makers", "extents")

    def __call__(self, a, b, bias, out):
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
            if out.data_ptr() & 15:
                return None
        elif _meets_inputs(out, self.extents, a, b, bias):
            return None
        bound = self.bound
        if bound is None:
            return self._bind(a, b, bias, out)
        dummy = out
        bptr = bias if bias is not None else dummy
        if self.kind == "ptr":
            bound(a, b, out, bptr, dummy, dummy, dummy, *self.tail)
        elif self.kind == "tma":
            ma, mb, mc = self.makers
            c = mc(out)
            bound(ma(a), mb(b), c, c, bptr, dummy, dummy, *self.tail)
        else:  # split
            ma, mb, mb2, mc, mc2 = self.makers
            c, c2 = mc(out), mc2(out)
            bound(ma(a), mb(b), mb2(b), c, c2, c, c2, bptr, dummy, dummy, *self.tail)
        return out

    def _bind(self, a, b, bias, out):
        """A launch through Triton (``spec``), then the Bound where the cached path applies (not
        while launch hooks are installed, nor in the interpreter: the next call tries again). The
        only pre-hook among these kernels' configs, ``_tma_pre_hook``, sets the descriptors'
        blocks, which the makers copy, so the Bound runs none."""
        fn, grid, args, kw = self.spec(a, b, bias, out)
        bound = _bind(fn, grid, *args, run_pre_hook=False, **kw)
        if bound is not None:
            lead = _PLAN_LEAD[self.kind]
            self.tail = args[lead:]
            descs = {"ptr": (), "tma": (0, 1, 2), "split": (0, 1, 2, 3, 4)}[self.kind]
            self.makers = tuple(_desc_maker(args[i]) for i in descs)
            self.bound = bound
        return out


def _make_plan(route, a, b, bias, activation, out_dtype, precision, out) -> _Plan:
    """The plan of gemm()'s route ("small", "tma_64x128", "tma", "split" or "v1") for these
    operands (``out``: the (M, N) output the checks accepted); the first call of the plan
    launches through Triton's dispatch."""
    M = a.shape[0]
    N = b.shape[1]
    p = _Plan()
    p.out_dtype = out.dtype
    p.out_shape = (M, N)
    p.device = a.device
    p.extents = (_extent(a), _extent(b), _extent(bias) if bias is not None else 0, _extent(out))
    p.bound = p.makers = p.tail = None
    launch, kind, extra = {"small": (_pointer_launch, "ptr", ("persistent",)),
                           "v1": (_pointer_launch, "ptr", ("tiled",)),
                           "tma": (_tma_launch, "tma", ()), "tma_64x128": (_tma_launch, "tma", ()),
                           "split": (_split_launch, "split", ())}[route]
    fixed = {"small": dict(fixed=_SMALL_TILE), "tma_64x128": dict(fixed=_TMA_64x128)}.get(route, {})
    p.kind = kind
    p.spec = lambda a, b, bias, out: launch(*extra, a, b, out, bias, activation, None, None, precision, None, **fixed)
    return p


class _Sm90Plan:
    """gemm()'s route to the CUDA C kernel (ops/gemm_sm90) for one plan key: the same call
    contract as _Plan (None when a given out meets an input's bytes: the checked path refuses it)."""

    __slots__ = ("config", "cfg", "out_shape", "out_dtype", "device", "extents")

    def __call__(self, a, b, bias, out):
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
            if out.data_ptr() & 15:
                return None  # (the checked path allocates its own)
        elif _meets_inputs(out, self.extents, a, b, None):
            return None
        # the key covers what gemm_sm90's checks read (dtypes, shapes, strides, 16-byte alignment,
        # devices): its launch runs without them
        return _sm90._launch(a, b, out, self.cfg)


def _sm90_config(a, b, bias, activation, out_dtype, out) -> str | None:
    """The gemm_sm90 config for a plain 16-bit product whose layouts it takes, where its route
    rule says it wins (``gemm_sm90.route_for``); None otherwise."""
    if bias is not None or activation not in (None, "none") or (out_dtype is not None and out_dtype != a.dtype):
        return None
    if not _sm90.applies(a, b) or _sm90.b_layout(b) != 1:
        return None  # (the rule was measured with B's rows unit-stride; w.T stays on Triton)
    if out is not None and _sm90.out_problem(out, a.dtype, a.device, a.shape[0], b.shape[1]) is not None:
        return None
    return _sm90.route_for(a.shape[0], b.shape[1], a.shape[1], _num_sms(a.get_device()), b.stride(0))


def _run_sm90(key, config, a, b, out):
    """gemm_sm90 through the checked path (the overlap refusal), leaving a plan under key."""
    out = _check(a, b, None, None, None, None, None, "tf32", out)
    res = _sm90.gemm_sm90(a, b, out=out, config=config)
    if key is not None:
        p = _Sm90Plan()
        p.config, p.out_shape, p.out_dtype, p.device = config, tuple(res.shape), res.dtype, a.device
        p.cfg = _sm90.CONFIGS[config]  # (the route takes B with unit-stride rows: trans_b 1, as CONFIGS)
        p.extents = (_extent(a), _extent(b), 0, _extent(res))
        _keep_plan(key, p)
    return res


def _planned(route, key, a, b, bias, activation, out_dtype, precision, out):
    """First call of a plan key: the checks (errors as the variants raise them), then the plan."""
    given = out
    out = _check(a, b, bias, activation, out_dtype, None, None, precision, out)
    if given is None and out.data_ptr() & 15:  # an allocator without 16-byte aligned blocks: no plan
        return VARIANTS["v1_tiled"](a, b, bias, activation, out_dtype, None, None, precision, out, None)
    plan = _make_plan(route, a, b, bias, activation, out_dtype, precision, out)
    res = plan(a, b, bias, out)  # out passes the overlap test: _check refused any other
    _keep_plan(key, plan)
    return res


# tf32 with B given (K, N) row-major: wgmma takes tf32 operands from shared memory K-major only, so
# the kernels re-lay B out inside the K loop (0.20-0.25x cuBLAS TF32 at 4096^3, K-major 1.015x).
# gemm() therefore transposes a row-major fp32 B first with tilewise's transpose (one read and one
# write of B: ~35 us at 4096^2 against a ~1,600 us loss); not below 2^16 elements of B, where the
# extra launch is not worth measuring for (docs/tuning/gemm.md, "tf32 row-major B: transposing copy").
_TF32_KMAJOR_FROM = 1 << 16


def _tf32_wants_kmajor(a, b, precision, scale_a, scale_b, out) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and not _INTERPRET
            and a.dtype == torch.float32 and b.dtype == torch.float32 and precision == "tf32"
            and scale_a is None and scale_b is None and a.dim() == 2 and b.dim() == 2 and b.is_cuda
            and a.device == b.device and a.shape[1] == b.shape[0] and b.is_contiguous()
            and b.numel() >= _TF32_KMAJOR_FROM and min(b.shape) > 1
            and not (isinstance(out, torch.Tensor) and may_overlap(out, b)))  # (the checks refuse that)


# tf32 with row-major B on sm_90, no bias, activation or scales, fp32 out: gemm_sm90.gemm_tf32, which
# takes B as given (wgmma on C's transposed tile with B's block in registers): ahead of the
# transposing copy + Triton at every shape of a 15-shape sweep (4096^3: 1.04x against 0.88x cuBLAS
# TF32; docs/tuning/gemm.md, "tf32 row-major B: gemm_tf32 route"). Not where split_k_for splits K
# (outputs too small to fill the GPU).
def _tf32_rowmajor_b(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux) -> bool:
    return (not _INTERPRET and bias is None and activation is None and aux is None and scale_a is None
            and scale_b is None and precision == "tf32" and out_dtype in (None, torch.float32)
            and _sm90.tf32_applies(a, b, out)
            and not (out is not None and (may_overlap(out, a) or may_overlap(out, b)))
            and split_k_for(a.shape[0], b.shape[1], a.shape[1]) == 1)


def gemm(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, activation: str | None = None,
         out_dtype: torch.dtype | None = None, scale_a: torch.Tensor | None = None,
         scale_b: torch.Tensor | None = None, precision: str = "tf32", out: torch.Tensor | None = None,
         aux: torch.Tensor | None = None, variant: str | None = None) -> torch.Tensor:
    """``act(scale_a * scale_b * (a @ b) + bias)`` on tensor cores, fp32 accumulate.

    a:          (M, K) CUDA tensor, float16 / bfloat16 / float32 / float8_e4m3fn, any strides.
    b:          (K, N), same dtype as a, any strides (``w.t()`` of an (N, K) weight needs no copy).
    bias:       optional (N,) contiguous tensor (any float dtype; added in fp32).
    activation: None, "relu" or "gelu" (exact, erf form, as torch.nn.functional.gelu).
    out_dtype:  float16 / bfloat16 / float32; default a's dtype (bfloat16 for fp8 inputs).
    scale_a, scale_b: float32 one-element tensors, required for fp8 inputs (per-tensor scales),
                rejected otherwise.
    precision:  for float32 inputs: "tf32" (default; tensor cores) or "ieee" (full fp32).
    out:        optional (M, N) tensor of out_dtype to write into (any strides for v1/v2); it may
                not share memory with a, b or bias (refused: tiles would read overwritten inputs).
    aux:        optional contiguous (M, N) tensor receiving the pre-activation values.
    variant:    None (fp32 with a row-major B and no bias, activation or scales on an sm_90 GPU:
                ``gemm_sm90.gemm_tf32``, B as given; ``gemm_splitk`` when ``split_k_for`` says the
                output is too small for the GPU and K is long; the persistent kernel with a fixed 64 x 64 tile for small
                16-bit problems (<= 16 tiles of 128 x 128, 16-byte rows); plain 16-bit products on an
                sm_90 GPU where ``gemm_sm90.route_for`` says the CUDA C wgmma + TMA-multicast kernel
                wins (M, N >= 2048 with K >= 1024; 1536^2, 3072^2-like shapes; 1000^2-like ones
                whose B rows are not whole 128-byte lines); else v3_tma_persistent
                where the layouts allow TMA (16-bit: the tile ``tma_tile_for``'s wave model picks,
                v3_tma_split's 128 x 192 or a fixed 64 x 128 where they fill the GPU better), else
                v1_tiled) or a key of VARIANTS.
    Returns the (M, N) result of dtype out_dtype.

    With variant None and no aux or scales, the first call of a layout leaves a plan that later
    calls with the same layout run without routing or re-checking (see "call plans" above; the
    overlap of a given out with the inputs is still checked each call; TILEWISE_GEMM_PLANS=0
    turns plans off).
    """
    _check_kinds(a, b, bias, out_dtype, out, aux)
    if variant is None and _tf32_rowmajor_b(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux):
        return _sm90._tf32_launch(a, b, out)  # (_tf32_rowmajor_b made gemm_tf32's checks)
    if variant is None and _tf32_wants_kmajor(a, b, precision, scale_a, scale_b, out):
        b = _transpose.transpose(b).t()  # the same (K, N) values, K-major
    key = None
    if variant is None and aux is None and scale_a is None and scale_b is None and _PLANS_ON and not _INTERPRET:
        try:
            key = _plan_key(a, b, bias, activation, out_dtype, precision, out)
            plan = _PLANS.get(key)
        except (AttributeError, TypeError, RuntimeError):
            key = plan = None
        if plan is not None:
            res = plan(a, b, bias, out)
            if res is not None:
                return res
        elif key is not None and (a.dim() != 2 or b.dim() != 2 or a.numel() == 0 or b.numel() == 0):
            key = None  # no plan for these: the checks' errors, or the variants' empty handling
    if (variant is None and aux is None and scale_a is None and scale_b is None and isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2 and a.dtype != torch.float8_e4m3fn
            and split_k_for(a.shape[0], b.shape[1], a.shape[1]) > 1):
        return gemm_splitk(a, b, bias=bias, activation=activation, out_dtype=out_dtype, precision=precision, out=out)
    if variant is None and _small_applies(a, b, bias, activation, out_dtype, scale_a, scale_b, out, aux):
        if key is not None:
            return _planned("small", key, a, b, bias, activation, out_dtype, precision, out)
        return _run_small(a, b, bias, activation, out_dtype, precision, out)
    if variant is None and aux is None and scale_a is None and scale_b is None and not _INTERPRET \
            and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        cfg = _sm90_config(a, b, bias, activation, out_dtype, out)
        if cfg is not None:
            return _run_sm90(key, cfg, a, b, out)
    if variant is None:
        ok = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2
              and a.dtype in _IN_DTYPES and tma_applies(a, b, out_dtype, out)
              and (aux is None or _tma_ok(aux, unit_dim=1)))
        plan = None if ok else _padding_plan(a, b, out_dtype, out, aux)
        if plan is not None:
            return _run_padded(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, plan)
        # Large 16-bit squares: v1_tiled is ahead of v3 at 8192^3 (bf16 ~1.0x cuBLAS against ~0.93x),
        # level with or behind it at 4096^3
        # (docs/tuning/gemm.md, "Large 16-bit squares: v1_tiled (_V1_FROM_MN)").
        two_byte = a.dtype in (torch.float16, torch.bfloat16)
        big = two_byte and a.shape[0] * b.shape[1] >= _V1_FROM_MN
        variant = "v3_tma_persistent" if ok and not big else "v1_tiled"
        od = out.dtype if out is not None else (out_dtype or a.dtype)
        if variant == "v3_tma_persistent" and two_byte and od.itemsize == 2:
            tile = tma_tile_for(a.shape[0], b.shape[1], _num_sms(a.get_device()))
            if tile == "128x192":
                variant = "v3_tma_split"
            elif tile == "64x128":
                if key is not None:
                    return _planned("tma_64x128", key, a, b, bias, activation, out_dtype, precision, out)
                return _TMA_FIXED_64x128(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux)
        if key is not None:
            route = {"v3_tma_persistent": "tma", "v3_tma_split": "split", "v1_tiled": "v1"}[variant]
            return _planned(route, key, a, b, bias, activation, out_dtype, precision, out)
    if variant not in VARIANTS:
        raise ValueError(f"gemm: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    return VARIANTS[variant](a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux)


# --------------------------------------------------------------------------- linear (autograd)


def _gelu_grad(pre: torch.Tensor) -> torch.Tensor:
    x = pre.float()
    cdf = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + x * pdf


# torch.library custom ops, so that torch.compile traces through linear (the fake implementations
# give shapes and dtypes) and autograd runs the backward below, itself made of gemm ops.


@torch.library.custom_op("tilewise::gemm_triton", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    return gemm(a, b, bias=bias, activation=activation or None)


@_gemm_op.register_fake
def _(a, b, bias, activation):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_default_out_dtype(a.dtype))


def _act_grad(gy, saved, activation, dtype):
    if activation == "relu":
        return (gy * (saved > 0)).to(dtype)
    if activation == "gelu":
        return (gy.float() * _gelu_grad(saved)).to(dtype)
    return gy.to(dtype)


def _linear_backward(x2, w, bias_dtype, saved, activation, gy, needs, eager=False):
    g = _act_grad(gy, saved, activation, x2.dtype)
    mm = (lambda a, b, bias, act: gemm(a, b)) if eager else _gemm_op
    gx = mm(g, w, None, "") if needs[0] else None  # (M, N) @ (N, K)
    gw = mm(g.t(), x2, None, "") if needs[1] else None  # (N, M) @ (M, K), g.t() by strides
    gb = g.float().sum(0).to(bias_dtype) if bias_dtype is not None and needs[2] else None
    return gx, gw, gb


def _linear_fwd(x2, w, b, activation, need_pre):
    pre = (torch.empty((x2.shape[0], w.shape[0]), device=x2.device, dtype=x2.dtype) if need_pre
           else x2.new_empty((0,)))
    y = gemm(x2, w.t(), bias=b, activation=activation or None, aux=pre if need_pre else None)
    return y, pre


@torch.library.custom_op("tilewise::gemm_triton_linear", mutates_args=())
def _linear_op(x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, activation: str,
               need_pre: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(act(x2 @ w.T + b), pre-activation when need_pre else an empty tensor)."""
    return _linear_fwd(x2, w, b, activation, need_pre)


@_linear_op.register_fake
def _(x2, w, b, activation, need_pre):
    shape = (x2.shape[0], w.shape[0])
    return x2.new_empty(shape), x2.new_empty(shape if need_pre else (0,))


def _linear_setup(ctx, inputs, output):
    x2, w, b, activation, need_pre = inputs
    y, pre = output
    ctx.activation = activation
    ctx.bias_dtype = b.dtype if b is not None else None
    # ReLU's derivative comes from the output; GELU's from the pre-activation the forward stored.
    ctx.save_for_backward(x2, w, y if activation == "relu" else pre)


def _linear_bwd(ctx, gy, _gpre):
    x2, w, saved = ctx.saved_tensors
    if ctx.activation == "gelu" and saved.numel() == 0 and gy.numel() != 0:
        raise RuntimeError("linear: GELU backward needs the pre-activation; call linear() with grad enabled")
    gx, gw, gb = _linear_backward(x2, w, ctx.bias_dtype, saved, ctx.activation, gy, ctx.needs_input_grad[:3],
                                  eager=getattr(ctx, "eager", False))
    return gx, gw, gb, None, None


_linear_op.register_autograd(_linear_bwd, setup_context=_linear_setup)


class _EagerLinear(torch.autograd.Function):
    """``_linear_op`` with its autograd, for eager calls: no custom-op dispatcher (about 20 us a
    call on a fast host, more on the H200's;
    docs/tuning/gemm.md, "Eager linear without the custom-op dispatcher"). Traced code
    (torch.compile) keeps the custom ops."""

    @staticmethod
    def forward(ctx, x2, w, b, activation, need_pre):
        y, pre = _linear_fwd(x2, w, b, activation, need_pre)
        _linear_setup(ctx, (x2, w, b, activation, need_pre), (y, pre))
        ctx.eager = True
        ctx.mark_non_differentiable(pre)
        return y, pre

    @staticmethod
    def backward(ctx, gy, gpre):
        return _linear_bwd(ctx, gy, gpre)


def _check_linear(x, w, b, activation) -> None:
    """linear's arguments by their own names (gemm's checks would call x and w.t() 'a' and 'b')."""
    for name, t in (("x", x), ("w", w), ("b", b)):
        if name == "b" and t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"linear: '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _OUT_DTYPES and not (name == "b" and t.is_floating_point()):
            raise ValueError(f"linear: '{name}' has dtype {t.dtype}; supported: float16, bfloat16, float32 "
                             f"(fp8 is not differentiable here: use gemm() with scales)")
        if t.device != x.device:
            raise ValueError(f"linear: '{name}' is on {t.device} but 'x' is on {x.device}")
    if not x.is_cuda and not _INTERPRET:
        raise ValueError(f"linear: 'x' is on {x.device}; Triton kernels need CUDA tensors")
    if w.dtype != x.dtype:
        raise ValueError(f"linear: 'w' has dtype {w.dtype} but 'x' has {x.dtype}")
    if x.dim() < 1 or w.dim() != 2:
        raise ValueError(f"linear: 'x' must be (..., K) and 'w' (N, K); got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: 'x' has K={x.shape[-1]} but 'w' is {tuple(w.shape)} (N, K)")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ValueError(f"linear: 'b' has shape {tuple(b.shape)}; 'w' {tuple(w.shape)} needs ({w.shape[0]},)")
    if b is not None and not b.is_contiguous():
        raise ValueError(f"linear: 'b' is not contiguous (strides {tuple(b.stride())}); pass b.contiguous()")
    if not isinstance(activation, (str, type(None))) or activation not in _ACTIVATIONS:
        raise ValueError(f"linear: activation {activation!r} is not one of None, 'relu', 'gelu'")


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, activation: str | None = None,
           *, variant: str | None = None) -> torch.Tensor:
    """``act(x @ w.T + b)`` with bias and activation fused into the GEMM's store; differentiable.

    x: (..., K) CUDA float16 / bfloat16 / float32 (TF32); w: (N, K) same dtype; b: optional (N,).
    activation: None, "relu" or "gelu". The backward (grad x = g @ w, grad w = g.T @ x) runs on
    ``gemm`` as well; GELU stores its pre-activation in the forward for the backward.
    Returns (..., N) of x's dtype.
    """
    _check_linear(x, w, b, activation)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if variant is not None:  # a named version: plain call, no autograd (for benchmarks and tests)
        y = gemm(x2, w.t(), bias=b, activation=activation, variant=variant)
    else:
        need_pre = activation == "gelu" and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, w, b))
        op = _linear_op if torch.compiler.is_compiling() else _EagerLinear.apply
        y, _ = op(x2, w, b, activation or "", need_pre)
    return y.reshape(*lead, w.shape[0])
