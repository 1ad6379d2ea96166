"""The Triton GEMM kernels and their launchers: ``C = epilogue(scale_a * scale_b * (A @ B) + bias)``
with the epilogue (scales, bias, ReLU / GELU, the pre-activation ``aux``, the output cast) on the
fp32 accumulator in registers. Tiles and autotuner configs come from ``configs``; argument checks
and the choice between these kernels are ``api``'s.

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
    v3_tma_split:      v3 with a 128 x (128 + 64) tile as two accumulators.
    v4_streamk:        stream-K: the (tile, K-step) iterations of the whole problem are dealt out
                       in equal contiguous ranges to one program per SM, so a tile count that
                       does not divide into waves costs no second, nearly empty wave. A program
                       that covers part of a tile leaves its fp32 partial in a workspace and counts
                       itself in; the last to arrive adds the partials in program order
                       (deterministic) and runs the epilogue. TMA loads where the rows allow. Fixed
                       tile, no autotuning, not the default (docs/tuning/gemm.md, "v4_streamk: not
                       the default").
    split-K:           K in slices, each slice's fp32 partial to its own slab of a workspace, a
                       second kernel sums the slabs in a fixed order and runs the epilogue.

Each autotuned kernel tries a short config list (per dtype class: K tile 128 for fp8, 64 for
16-bit, 32 for fp32), keyed on (M, N, K) and the dtypes. Under TRITON_INTERPRET=1 (CPU tests), one
small config runs without autotuning and CPU tensors are accepted.
"""

from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from ...runtime import cuda as rt
from ...runtime.triton_launch import cdiv as _cdiv, launch as _launch, next_power_of_2 as _next_pow2
from ...runtime.autotune_store import stored_autotune
from .configs import (AUTOTUNE, BK_FOR_ITEMSIZE, IN_DTYPES, INTERP_TILE, SMEM_LIMIT, SPLIT_TILE,
                      SPLIT_TILE_INTERP, SPLITK_TILE, STREAMK_TILE, TINY_FLOPS, TWO_BYTE, Operand, Tile)
from .configs import tma_applies as _tma_applies, tma_loads_ok as _tma_loads_ok

# The activation constexpr the kernels take.
ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "gelu": 2}


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
def _tile_origin(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # The TMA kernels address tiles by their first row and column (descriptor coordinates).
    pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
    return pid_m * BLOCK_M, pid_n * BLOCK_N


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
def _store(c_ptr, aux_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr,
           STORE_AUX: tl.constexpr, ACTIVATION: tl.constexpr):
    # The pointer kernels' epilogue of tile (pid_m, pid_n): scales and bias, the pre-activation aux
    # copy, the activation and the masked store.
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS, HAS_SCALES)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if STORE_AUX:
        tl.store(aux_ptr + offs, acc.to(aux_ptr.dtype.element_ty), mask=mask)
    acc = _activate(acc, ACTIVATION)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pointer_tile(a_ptr, b_ptr, c_ptr, bias_ptr, aux_ptr, scale_a_ptr, scale_b_ptr, pid_m, pid_n, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr, STORE_AUX: tl.constexpr,
                  ACTIVATION: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # One output tile of the pointer kernels (v1, v2): the K loop, the epilogue and the masked store.
    acc = _mainloop(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
    _store(c_ptr, aux_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
           BLOCK_M, BLOCK_N, HAS_BIAS, HAS_SCALES, STORE_AUX, ACTIVATION)


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, aux_ptr, scale_a_ptr, scale_b_ptr,
                 M, N, K,
                 stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr, STORE_AUX: tl.constexpr,
                 ACTIVATION: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    _pointer_tile(a_ptr, b_ptr, c_ptr, bias_ptr, aux_ptr, scale_a_ptr, scale_b_ptr, pid_m, pid_n, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K,
                  HAS_BIAS, HAS_SCALES, STORE_AUX, ACTIVATION, PRECISION, UPCAST)


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
        _pointer_tile(a_ptr, b_ptr, c_ptr, bias_ptr, aux_ptr, scale_a_ptr, scale_b_ptr, pid_m, pid_n, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K,
                      HAS_BIAS, HAS_SCALES, STORE_AUX, ACTIVATION, PRECISION, UPCAST)


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
            _store(c_ptr, aux_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
                   BLOCK_M, BLOCK_N, HAS_BIAS, HAS_SCALES, STORE_AUX, ACTIVATION)


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
        off_m, off_n = _tile_origin(tile, num_pid_m, num_pid_n, GROUP_M, BLOCK_M, BLOCK_N)
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
        off_m, off_n = _tile_origin(tile, num_pid_m, num_pid_n, GROUP_M, BLOCK_M, BN)
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


# Whether Triton built these kernels for its interpreter (TRITON_INTERPRET=1 when they were defined):
# the launchers then run INTERP_TILE without autotuning, on CPU tensors.
INTERPRET = not isinstance(_gemm_kernel, JITFunction)


# --------------------------------------------------------------------------- autotuning


def _triton_config(t: Tile, pre_hook=None) -> triton.Config:
    return triton.Config(t.meta(), num_stages=t.stages, num_warps=t.warps, pre_hook=pre_hook)


_CONFIGS = [_triton_config(t) for t in AUTOTUNE]


def _dtype_of(arg):
    if hasattr(arg, "dtype") and isinstance(arg.dtype, torch.dtype):
        return arg.dtype
    base = getattr(arg, "base", None)  # a TensorDescriptor
    return base.dtype


def _prune(configs, named_args, **kwargs):
    first = named_args.get("a_ptr", named_args.get("a_desc"))
    bk = BK_FOR_ITEMSIZE[_dtype_of(first).itemsize]
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

        kept = [c for c in kept if smem(c) <= SMEM_LIMIT] or kept[-1:]
    M, N = named_args["M"], named_args["N"]
    # Tiles far larger than the problem only waste work; keep at least one config.
    small = [c for c in kept if c.kwargs["BLOCK_M"] <= max(64, _next_pow2(M))
             and c.kwargs["BLOCK_N"] <= max(64, _next_pow2(N))] or kept[-1:]
    # A tiny problem takes the smallest kept tile (the list's last) without an autotune.
    return small[-1:] if 2 * M * N * named_args["K"] <= TINY_FLOPS else small


_KEY = ["M", "N", "K"]


def _tma_pre_hook(nargs):
    # Descriptors are built with a placeholder block shape; the chosen config sets the real one.
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk] if nargs["B_KMAJOR"] else [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn]
    nargs["aux_desc"].block_shape = [bm, bn]


def _tma_configs():
    return [_triton_config(t, _tma_pre_hook) for t in AUTOTUNE]


if INTERPRET:
    _tiled = _gemm_kernel
    _persistent = _gemm_persistent_kernel
    _tma = _gemm_tma_persistent_kernel
else:
    _prune_opts = {"early_config_prune": _prune}
    # Picks kept on disk (runtime/autotune_store.py): a new process skips the timing.
    _tiled = stored_autotune(_CONFIGS, key=_KEY, prune_configs_by=_prune_opts)(_gemm_kernel)
    _persistent = stored_autotune(_CONFIGS, key=_KEY, prune_configs_by=_prune_opts)(_gemm_persistent_kernel)
    _tma = stored_autotune(_tma_configs(), key=_KEY + ["B_KMAJOR", "dtype_tag"], prune_configs_by=_prune_opts)(
        _gemm_tma_persistent_kernel)


def num_sms(device_index: int) -> int:
    # (-1 is a CPU tensor's device: routing it is harmless, the checked path names the device)
    if INTERPRET or not torch.cuda.is_available() or device_index < 0:
        return 4
    return rt.sm_count(device_index)


# --------------------------------------------------------------------------- launchers


def _common_meta(a, bias, activation, scale_a, precision, aux):
    # input_precision matters only for fp32 operands; "tf32" is Triton's default for the others.
    return dict(HAS_BIAS=bias is not None, HAS_SCALES=scale_a is not None, STORE_AUX=aux is not None,
                ACTIVATION=ACTIVATIONS[activation], PRECISION=precision if a.dtype == torch.float32 else "tf32",
                UPCAST=INTERPRET and a.dtype == torch.bfloat16)


def _pointer_args(a, b, out, bias, scale_a, scale_b, aux) -> tuple:
    """The pointer kernels' leading arguments: the seven pointers (out stands in for the optional
    ones, never read when the matching constexpr flag is off), then M, N, K and the six strides."""
    dummy = out
    ptrs = (a, b, out, bias if bias is not None else dummy, aux if aux is not None else dummy,
            scale_a if scale_a is not None else dummy, scale_b if scale_b is not None else dummy)
    M, K = a.shape
    return ptrs + (M, b.shape[1], K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))


def _pointer_launch(kind, a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed: Tile | None = None):
    """(kernel, grid, args, kwargs) of v1_tiled ("tiled") or v2_persistent ("persistent"),
    autotuned; ``fixed`` runs the persistent kernel with that tile instead, no autotuner. The args
    start with ``_pointer_args``' seven pointers (``route.PLAN_LEAD``)."""
    M, N = out.shape
    args = _pointer_args(a, b, out, bias, scale_a, scale_b, aux)
    meta = _common_meta(a, bias, activation, scale_a, precision, aux)
    interp = INTERP_TILE.meta() if INTERPRET else {}
    if kind == "tiled":
        grid = lambda META: (_cdiv(M, META["BLOCK_M"]) * _cdiv(N, META["BLOCK_N"]),)  # noqa: E731
        return _tiled, grid, args, dict(meta, **interp)
    sms = num_sms(a.get_device())
    if fixed is not None:
        bm, bn = fixed.bm, fixed.bn
        return (_gemm_persistent_kernel, (min(sms, _cdiv(M, bm) * _cdiv(N, bn)),), args + (sms,),
                dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=fixed.bk, GROUP_M=8, **meta, num_warps=fixed.warps,
                     num_stages=fixed.stages))
    grid = lambda META: (min(sms, _cdiv(M, META["BLOCK_M"]) * _cdiv(N, META["BLOCK_N"])),)  # noqa: E731
    return _persistent, grid, args + (sms,), dict(meta, **interp)


def run_pointer(kind, a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed: Tile | None = None):
    """Launch ``_pointer_launch``'s kernel."""
    fn, grid, args, kw = _pointer_launch(kind, a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed)
    _launch(fn, grid, *args, **kw)
    return out


# Per-tile arrival counters, zero between calls (the last arrival zeroes its tile's), one buffer a
# (device, stream): two stream-K GEMMs on one stream never overlap, on two streams they get two buffers.
_STREAMK_COUNTS: dict = {}
_STREAMK_LOCK = threading.Lock()


def _streamk_counts(device: torch.device, tiles: int) -> torch.Tensor:
    cuda = device.type == "cuda"
    key = (device, torch.cuda.current_stream(device).cuda_stream if cuda else 0)
    buf = _STREAMK_COUNTS.get(key)
    if buf is None or buf.numel() < tiles:
        if cuda and torch.cuda.is_current_stream_capturing():
            # Not kept: memory from a graph's pool. The captured memset zeroes it on each replay.
            return torch.zeros(tiles, device=device, dtype=torch.int32)
        with _STREAMK_LOCK:  # one buffer a stream, whichever thread makes it
            buf = _STREAMK_COUNTS.get(key)
            if buf is None or buf.numel() < tiles:
                buf = torch.zeros(max(tiles, 4096), device=device, dtype=torch.int32)
                _STREAMK_COUNTS[key] = buf
    return buf


def run_streamk(a, b, out, bias, activation, scale_a, scale_b, precision, aux, tile: Tile | None = None):
    """v4_streamk: one program an SM, equal contiguous ranges of (tile, K-step) iterations; TMA
    loads where ``tma_loads_ok`` (else pointer loads). ``tile`` overrides STREAMK_TILE (experiments)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[1]
    if INTERPRET:
        bm, bn, bk = INTERP_TILE.bm, INTERP_TILE.bn, INTERP_TILE.bk
        opts = {}
    else:
        t = tile or STREAMK_TILE[a.element_size()]
        bm, bn, bk = t.bm, t.bn, t.bk
        opts = dict(num_stages=t.stages, num_warps=t.warps)
    if K == 0:  # no K-steps: the epilogue alone (act(bias) or act(0)), as the tiled kernel does
        return run_pointer("tiled", a, b, out, bias, activation, scale_a, scale_b, precision, aux)
    tiles = _cdiv(M, bm) * _cdiv(N, bn)
    total = tiles * _cdiv(K, bk)
    progs = min(num_sms(a.get_device()), total)
    ipp = _cdiv(total, progs)
    progs = _cdiv(total, ipp)  # no program without work
    ws = torch.empty((2 * progs, bm * bn), device=a.device, dtype=torch.float32)
    counts = _streamk_counts(a.device, tiles)
    use_tma = _tma_loads_ok(Operand.of(a), Operand.of(b))  # the C tile is stored through pointers
    b_kmajor = b.stride(1) != 1
    if use_tma:
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        b_desc = _b_desc(b, bn, bk, b_kmajor)
    else:
        a_desc, b_desc = a, b  # unused
    args = _pointer_args(a, b, out, bias, scale_a, scale_b, aux)
    _launch(_gemm_streamk_kernel, (progs,),
        args[0], args[1], a_desc, b_desc, *args[2:7], ws, counts, *args[7:], ipp,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=INTERP_TILE.group if INTERPRET else 8,
        USE_TMA=use_tma, B_KMAJOR=b_kmajor, **_common_meta(a, bias, activation, scale_a, precision, aux), **opts)
    return out


def tma_applies(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None,
                out: torch.Tensor | None = None) -> bool:
    """Whether v3_tma_persistent takes these 2-D operands (A K-contiguous; B N- or K-contiguous;
    pointers and row strides 16-byte aligned; the output's too: ``out`` if given, else a
    contiguous (M, N) result, whose rows must then be whole 16-byte multiples)."""
    return _tma_applies(Operand.of(a), Operand.of(b), out_dtype, Operand.of(out) if out is not None else None)


def _check_tma_layout(name, a, b, out, aux):
    if not (tma_applies(a, b, out.dtype, out) and (aux is None or Operand.of(aux).tma_ok(1))):
        raise ValueError(f"gemm.{name}: TMA needs 'a' with unit stride along K, 'b' with unit stride along N "
                         "or K, 16-byte aligned pointers and row strides (also of out and aux); use v1_tiled "
                         "or gemm() for other layouts")


def _b_desc(b, bn, bk, b_kmajor):
    """B's descriptor: (bn, bk) boxes over b.T when B is K-major, else (bk, bn) boxes over b."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(b.t(), [bn, bk]) if b_kmajor else TensorDescriptor.from_tensor(b, [bk, bn])


def _tma_launch(a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed: Tile | None = None):
    """(kernel, grid, args, kwargs) of v3_tma_persistent; ``fixed`` launches that one config without
    the autotuner (gemm()'s 64 x 128 choice, ``configs.TMA_64x128``). The args start with the four
    descriptors (A, B, C, aux) and the three optional pointers (``route.PLAN_LEAD``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[1]
    b_kmajor = b.stride(1) != 1
    if INTERPRET:
        bm, bn, bk = INTERP_TILE.bm, INTERP_TILE.bn, INTERP_TILE.bk
    elif fixed is not None:
        bm, bn, bk = fixed.bm, fixed.bn, fixed.bk
    else:
        bm = bn = bk = 16  # placeholder blocks; the autotuner's pre-hook sets the chosen config's
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = _b_desc(b, bn, bk, b_kmajor)
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    aux_desc = TensorDescriptor.from_tensor(aux, [bm, bn]) if aux is not None else c_desc
    dummy = out
    sms = num_sms(a.get_device())
    meta = _common_meta(a, bias, activation, scale_a, precision, aux)
    ptrs = (bias if bias is not None else dummy, scale_a if scale_a is not None else dummy,
            scale_b if scale_b is not None else dummy)
    if fixed is not None and not INTERPRET:
        return (_gemm_tma_persistent_kernel, (min(sms, _cdiv(M, bm) * _cdiv(N, bn)),),
                (a_desc, b_desc, c_desc, aux_desc) + ptrs + (M, N, K, sms, 0),
                dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, B_KMAJOR=b_kmajor, **meta,
                     num_stages=fixed.stages, num_warps=fixed.warps))
    grid = lambda META: (min(sms, _cdiv(M, META["BLOCK_M"]) * _cdiv(N, META["BLOCK_N"])),)  # noqa: E731
    return (_tma, grid, (a_desc, b_desc, c_desc, aux_desc) + ptrs + (M, N, K, sms, 100 + IN_DTYPES.index(a.dtype)),
            dict(B_KMAJOR=b_kmajor, **meta, **(INTERP_TILE.meta() if INTERPRET else {})))


def run_tma(a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed: Tile | None = None):
    """v3_tma_persistent (``_tma_launch``), after checking the layouts take TMA."""
    _check_tma_layout("v3_tma_persistent", a, b, out, aux)
    fn, grid, args, kw = _tma_launch(a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed)
    _launch(fn, grid, *args, **kw)
    return out


def _split_launch(a, b, out, bias, activation, scale_a, scale_b, precision, aux):
    """(kernel, grid, args, kwargs) of v3_tma_split. The args start with the seven descriptors (A,
    B, B2, C, C2, aux, aux2) and the three optional pointers (``route.PLAN_LEAD``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[1]
    t = SPLIT_TILE_INTERP if INTERPRET else SPLIT_TILE
    bm, bn, bn2, bk = t.bm, t.bn, t.bn2, t.bk
    b_kmajor = b.stride(1) != 1
    c_desc, c2_desc = TensorDescriptor.from_tensor(out, [bm, bn]), TensorDescriptor.from_tensor(out, [bm, bn2])
    aux_desc, aux2_desc = ((TensorDescriptor.from_tensor(aux, [bm, bn]), TensorDescriptor.from_tensor(aux, [bm, bn2]))
                           if aux is not None else (c_desc, c2_desc))
    sms = num_sms(a.get_device())
    dummy = out
    meta = _common_meta(a, bias, activation, scale_a, precision, aux)
    args = (TensorDescriptor.from_tensor(a, [bm, bk]), _b_desc(b, bn, bk, b_kmajor), _b_desc(b, bn2, bk, b_kmajor),
            c_desc, c2_desc, aux_desc, aux2_desc, bias if bias is not None else dummy,
            scale_a if scale_a is not None else dummy, scale_b if scale_b is not None else dummy, M, N, K, sms)
    return (_gemm_tma_split_kernel, (min(sms, _cdiv(M, bm) * _cdiv(N, bn + bn2)),), args,
            dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_N2=bn2, BLOCK_K=bk, GROUP_M=8, B_KMAJOR=b_kmajor, **meta,
                 num_stages=t.stages, num_warps=t.warps))


def run_tma_split(a, b, out, bias, activation, scale_a, scale_b, precision, aux):
    if a.dtype not in TWO_BYTE or out.element_size() != 2:
        raise ValueError(f"gemm.v3_tma_split: float16 / bfloat16 inputs and output only (its tile and "
                         f"stages are sized for 2-byte types), got {a.dtype} -> {out.dtype}; use "
                         f"v3_tma_persistent or gemm()")
    _check_tma_layout("v3_tma_split", a, b, out, aux)
    fn, grid, args, kw = _split_launch(a, b, out, bias, activation, scale_a, scale_b, precision, aux)
    _launch(fn, grid, *args, **kw)
    return out


def run_splitk(a, b, out, bias, activation, precision, splits: int):
    """gemm_splitk's two launches for checked, non-empty operands: K in ``splits`` slices (rounded
    to whole K tiles), one kernel writing each slice's fp32 partial product to a workspace (slices x
    M x N x 4 bytes), a second summing the slices in a fixed order (deterministic) with bias,
    activation and the output cast."""
    M, K = a.shape
    N = b.shape[1]
    bk = INTERP_TILE.bk if INTERPRET else BK_FOR_ITEMSIZE[a.element_size()]
    k_per = _cdiv(_cdiv(K, splits), bk) * bk
    S = _cdiv(K, k_per)
    ws = torch.empty((S, M, N), device=a.device, dtype=torch.float32)
    bm = bn = INTERP_TILE.bm if INTERPRET else SPLITK_TILE
    meta = dict(PRECISION=precision if a.dtype == torch.float32 else "tf32",
                UPCAST=INTERPRET and a.dtype == torch.bfloat16)
    opts = {} if INTERPRET else dict(num_warps=4, num_stages=3)
    _launch(_gemm_splitk_kernel, (_cdiv(M, bm), _cdiv(N, bn), S),
        a, b, ws, M, N, K, k_per, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **meta, **opts)
    block = 256 if INTERPRET else 1024
    _launch(_splitk_reduce_kernel, (_cdiv(M * N, block),),
        ws, out, bias if bias is not None else ws, M, N, S, out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, ACTIVATION=ACTIVATIONS[activation], BLOCK=block)
    return out
