"""A fused warp-specialized backward (v7, research): v6's dK / dV kernel that also computes dQ.

Question: how fast is one Gluon kernel doing the backward's 5 matmuls a tile (S, dP, dV, dK, dQ), with
dQ accumulated in fp32 by atomics, against v6 (7 matmuls: its dQ kernel recomputes S and dP) and
cuDNN's backward? The issue's forward + backward target (>= 1.0x cuDNN) needs the backward at ~2.6 ms
or less at B 4 H 16 S 4096 D 128 (research/notes/attention.md, "Next: a fused warp-specialized backward").

Triton 3.6 (the H200's) has no Gluon TMA reduce-add (``tma`` has async_copy_global_to_shared,
async_copy_shared_to_global, store_wait only), so dQ goes by ``gl.atomic_add`` (red.global.add.f32)
from the consumer's registers, FA2's way; not bitwise reproducible (this is ``deterministic=False``'s
kind of kernel). Per query tile and consumer (64 keys):
    as v6: S^T = K Q^T, dP^T = V dO^T, P^T, dV += P^T dO, dS^T = P^T (dP^T - Delta), dK += dS^T Q
    then:  dS^T (bf16) -> shared memory; dQ_part (BLOCK_M x D) = dS K with dS = (dS^T)^T read from
           shared memory as a transposed A operand; atomics of dQ_part into the fp32 accumulator.
The accumulator is zeroed by the preprocess kernel (which also computes Delta), and turned into
dQ * scale in bf16 at the end.

Prediction (before the first GPU run): v6's dK / dV kernel alone is ~2.0 ms of v6's 3.07 at S 4096
D 128; the dQ product adds a fifth matmul (+25 % of its matmul time, ~0.45 ms at its rate) and
8.6 GB of fp32 atomics to L2 (64 KB a CTA a query tile); if the atomics overlap, ~2.5-2.7 ms
(1.0-1.1x cuDNN's ~2.7), if not ~3 ms. Registers: dK, dV 128 + dQ_part 64 at the dQ product.

Measured (H200, bench/results/logs/attention-fused-bwd-c0709cc.log; research/notes/attention.md,
"Thirteenth session"): correct in every variant. Without writing dQ the kernel runs the backward in
2.25 ms (1.17x cuDNN's 2.63). With the adds, the best variant (dQ's columns split between the
consumers, TMA reduce-add from two staging tiles) takes 3.49 ms against v6's 3.01. Not landed.

Twelfth session (bench/results/logs/attention-fused-bwd-ncu-95ded79.log, attention-fused-bwd-ab72d90.log):
Nsight Compute showed the L2 at 57-61 % with the adds, local-memory spills (hoisted LSE / Delta
addresses) and 5.6-7-way bank conflicts on the fp32 staging stores. STATS 1 (v6's ``query_stats``
loads) took the ceiling 2.245 -> 2.220 ms; with the adds the best stays ~3.45 ms (writer warp), and
ORDER (dS^T through shared memory before dK's product) was slower (3.89 ms). Prepared after the
session's device time, compiled for sm_90 with Triton 3.6 on the CPU, not run: dQ mode 5, mode 4's
writer warp with the staging tile laid out as unswizzled 8-column groups ([group][row][8]), so a
warp's 8-byte stores of 8 rows x 8 columns hit 64 consecutive words (no bank conflicts), reduced
by 8 TMA boxes of [BLOCK_M, 8]; D 128 spill instructions 372 (mode 4) -> 302.

Built again on 2026-12-04 with Triton 3.6 for sm_90 on the CPU (causal, STATS 1, split D), spill
instructions: D 64 mode 4 12, mode 5 0; D 128 mode 4 574, mode 5 496. The quick shapes now start with
the Llama ones (D 64, GQA 32 / 8, causal), where v7's ceiling (mode 3) was 1.79 ms against cuDNN's 1.89.

Prepared on 2026-12-05 without a GPU (compiled for sm_90 under Triton 3.6 on the CPU, not run): dQ mode 6,
mode 4's writer warp with FA3's accumulator layout. A consumer stores its 64 x D/2 fp32 partial through a
linear shared layout (``stage_layout6``) that puts it in register order, 16 bytes a thread a store (D 64:
24 STS.128 where modes 4 / 5 have 50 STS.64; D 128: 48 against 98); the TMA unit reads the tile as plain
rows, one box, into a padded accumulator where each (head, query tile, half of D) partial is contiguous,
and a gather restores dQ's layout (``dq6_index``). Spill instructions (causal, STATS 1): D 64 0 (mode 4: 12),
D 128 522 (mode 4: 574, mode 5: 496); shared memory 230,032 bytes at D 128, as mode 4's. Prediction: B 4
H 16 S 4096 D 128 3.0-3.3 ms (mode 4 3.65, the ceiling 2.22, v6 3.10, cuDNN 2.72); the Llama D 64 shape
1.9-2.0 ms (mode 4 2.18, ceiling 1.79, cuDNN 1.89). Its check against v6's gradients runs first. Also
prepared: K and V as register A operands (the config's 10th field, D 64 only; mode 6 then 57 spill
instructions, mode 3 none), which halves what S^T's and dP^T's products read from shared memory
(research/notes/attention.md, "Nineteenth session"): predicted 3-6 % off modes 3 and 6 at D 64.

Measured 2026-12-05 (H100, bench/results/logs/attention-fused-bwd-0d82c74.log; research/notes/attention.md,
"Twenty-first session"): mode 3 had lost dQ's product as dead code (its SASS: 96 of mode 4's 144 m64n64 HGMMAs),
so every "ceiling" above timed 4 of the 5 products. Mode 7 (dQ kept live, never written) is the real bound:
2.818 ms at B 4 H 16 S 4096 D 128 against cuDNN's 2.717 and v6's 3.106; 0.92-0.99x cuDNN at every quick shape.
Modes 8 / 9 (the next tile's S^T and dP^T issued before this tile's dQ is staged) ran 1.2-1.4x slower than mode 4;
their code is at commit 0d82c74, removed after.

Prepared 2026-12-05 (twenty-second session, compiled for sm_90 on the CPU, not run): STATS 2, the LSE / Delta
staging that made v6's dK / dV kernel 1.04-1.13x faster (the loader stores each query tile's LSE and Delta into
the stage's shared memory; docs/tuning/attention.md, "v6 dK / dV: LSE and Delta staged by the loader"). Triton 3.6
SASS: D 128 mode 7 spill instructions 385 -> 225, BAR.SYNC 72 -> 54; mode 4 372 -> 209; D 64 causal 4 / 12 -> 0 / 0.
Nsight Compute put mode 7 at 57.5 % tensor pipe with 40 M spill requests (cuDNN 65.3 %). Prediction: mode 7
2.53 -> ~2.3 ms under ncu (B 4 H 16 S 4096 D 128; cuDNN 2.35), mode 4 3.42 -> ~3.2 (the adds remain). Run:
`--modes 7,4 --stats 1,2 --d128-first`, then `research/attention_bwd_ncu.sh` with `--stats 1,2`.

Measured 2026-12-05 (twenty-third session, H100, bench/results/logs/attention-fused-bwd-stats2-599ce19.log;
docs/tuning/attention.md, "v7 with staged stats"): STATS 2 took mode 7 at B 4 H 16 S 4096 D 128 from 2.817 to
2.420 ms (cuDNN 2.664: the bound is now 1.10x cuDNN; under ncu 2.56 -> 2.00 ms, tensor pipe 57 -> 74 %), mode 4
from 3.659 to 3.370; at the Llama 1 x 16384 shape mode 4 6.407 ms against v6's 6.670 and cuDNN's 6.273. Writing
dQ still costs 0.95 ms at D 128, with 37.5 M spill requests (mode 7 17.2 M) and L2 throughput as cuDNN's.

Prepared 2026-12-07 (forty-first session, compiled for sm_90 on the CPU under Triton 3.6 and 3.9, not run): a
CTA a query head (config field 11, `--head-major`), cuDNN's order: the grid walks (key block, query head), each CTA
reads its group's K / V (the kernel's KV_DIV) and writes fp32 dK / dV partials of its query head, summed over the
group after. `attention_dq_reduce_floor.py` (H100) put the dQ adds' traffic at 4.9-5.9 ms walking a KV group a CTA
(v7's order) against 4.9 ms a query head a CTA with 64-row tiles and 3.0 ms with 128-row tiles, at the Llama's
1 x 16384 D 64 causal. D 64 builds: 0 spill instructions (modes 4 and 7), 132,592 bytes of shared memory (mode 4).
Prediction: mode 4 head-major within ~0.2 ms of mode 7 at 1 x 16384 (v7's order: 0.52 ms apart at 599ce19), the
extra partials' traffic and their sum ~0.1 ms; mode 7 head-major as v7's order (the same products). If so, the
remaining gap is the products' rate (mode 7 ~468 TFLOP/s against v6's dK / dV kernel's ~670): v6's pipe schedule
in v7 is what would follow.

Run on the GPU: PYTHONPATH=src python3 research/attention_fused_bwd.py [--shapes quick|grid] [--head-major]
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch

from tilewise.ops.attention import configs

from tilewise.ops.attention.gluon_bwd import KEYS, LOG2E, _tma_load

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton._C.libtriton import ir

_KEYS = gl.constexpr(KEYS)
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # Triton 3.6's name, 3.9's
_store_wait = tma.store_wait


@builtin
def _tma_reduce_add_36(tensor_desc, coord, src, _semantic=None):
    """global[box at coord] += shared ``src`` (cp.reduce.async.bulk.tensor .add), for Triton 3.6, whose
    Gluon has the builder op but no Python function for it (3.9: ``tma.async_atomic_add``)."""
    conv = getattr(_semantic, "_convert_to_ir_values", None)
    handles = conv(coord, require_i64=False) if conv else [_semantic.to_tensor(c).handle for c in coord]
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, handles, src.handle)


_tma_reduce_add = getattr(tma, "async_atomic_add", None) or _tma_reduce_add_36


@gluon.constexpr_function
def stage_layout6(half):
    """Mode 6: a staging tile's shared layout as the consumers store it, [64, half] fp32. Its bases say which
    (row, column) of the BLOCK_M (64) x ``half`` dQ partial each bit of the offset stands for, in the wgmma
    accumulator's register order: offset = r % 4 + 4 * lane + 128 * warp + 512 * (r // 4) for register r of a
    thread (bit 0: column + 1, bit 1: row + 8, bits 2-6: the lane's columns + 2, + 4 and rows + 1, + 2, + 4,
    bits 7-8: the warp's rows + 16, + 32, then columns + 8, ...). A warp's stores of 4 consecutive registers
    land on 512 consecutive bytes (16-byte stores, no bank conflicts), and the TMA unit reads the tile as
    plain rows: a partial is one contiguous box of the padded accumulator, FA3's layout."""
    bases = [[0, 1], [8, 0], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0], [16, 0], [32, 0]]
    return gl.SharedLinearLayout(bases + [[0, 8 << j] for j in range(half.bit_length() - 4)])


@gluon.jit
def _red_add(ptrs, vals, keep, VEC: gl.constexpr):
    """fp32 ``vals`` added at ``ptrs`` where ``keep`` (int32, nonzero), fire and forget. VEC: pairs of a
    thread's consecutive elements (adjacent addresses in the wgmma accumulator layout) by one
    red.global.add.v2.f32 (sm_90), else Triton's scalar red per element."""
    if VEC:
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $6, 0; @p red.global.gpu.relaxed.add.v2.f32 [$2], {$4, $5}; "
            "mov.u32 $0, 0; mov.u32 $1, 0; }",
            "=r,=r,l,l,f,f,r,r", [ptrs.to(gl.int64, bitcast=True), vals, keep], dtype=gl.int32, is_pure=False, pack=2)
    else:
        gl.atomic_add(ptrs, vals, mask=keep != 0, sem="relaxed")


@gluon.jit
def query_stats(lse_ptr, delta_ptr, head_row, i, Sq, col: gl.constexpr, BLOCK_M: gl.constexpr,
                MASKED: gl.constexpr):
    """STATS 1: LSE (log2 units; 0 where -inf) and Delta of query tile ``i``, in S^T's column layout ``col``,
    loaded one element a thread by each consumer, then converted through shared memory (v6's dK / dV kernel did
    this until its loader staged them). Loaded in ``col`` directly, each thread's 16 64-bit addresses a tensor
    were hoisted out of the query loop and spilled to local memory."""
    blk: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=blk)
    if MASKED:
        lse = gl.load(lse_ptr + head_row + offs, mask=offs < Sq, other=0.0)
        delta = gl.load(delta_ptr + head_row + offs, mask=offs < Sq, other=0.0)
    else:
        lse = gl.load(lse_ptr + head_row + offs)
        delta = gl.load(delta_ptr + head_row + offs)
    lse = gl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
    return gl.convert_layout(lse, col), gl.convert_layout(delta, col)


@gluon.jit
def _ftile(t, dk, dv, k_smem, v_buf, k_a, q_smem, do_smem, ds_smem, ds_ready, ds_free, ready, empty, stats, lse_ptr,
           delta_ptr, dq_ptr, dq_desc, dq_stage, dq_bars, head_row, i, key_lo, Sq, Sk, qk_scale,
           st_layout: gl.constexpr, BLOCK_M: gl.constexpr,
           HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr,
           SPLIT: gl.constexpr, VEC: gl.constexpr, TMA: gl.constexpr, ORDER: gl.constexpr, STATS: gl.constexpr,
           which: gl.constexpr):
    k_buf = k_smem.index(which)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    col: gl.constexpr = gl.SliceLayout(0, st_layout)
    s = t % STAGES
    ph = (t // STAGES) & 1
    q_buf = q_smem.index(s)
    do_buf = do_smem.index(s)
    zero = gl.zeros([_KEYS, BLOCK_M], gl.float32, layout=st_layout)
    offs_m = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=col)
    if STATS == 2:  # staged in shared memory by the loader (v6's dK / dV kernel), read after the ready wait
        lse = gl.zeros([BLOCK_M], gl.float32, layout=col)
        delta = gl.zeros([BLOCK_M], gl.float32, layout=col)
    elif STATS == 1:  # one element a thread, converted through shared memory (v6's earlier query_stats)
        lse, delta = query_stats(lse_ptr, delta_ptr, head_row, i, Sq, col, BLOCK_M, MASKED)
    elif MASKED:
        lse = gl.load(lse_ptr + head_row + offs_m, mask=offs_m < Sq, other=0.0)
        delta = gl.load(delta_ptr + head_row + offs_m, mask=offs_m < Sq, other=0.0)
    else:
        lse = gl.load(lse_ptr + head_row + offs_m)
        delta = gl.load(delta_ptr + head_row + offs_m)
    if STATS == 0:
        lse = gl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
    mbarrier.wait(ready.index(s), ph)
    if STATS == 2:
        lse = stats.index(2 * s).load(col)
        delta = stats.index(2 * s + 1).load(col)
    st = warpgroup_mma(k_a, q_buf.permute((1, 0)), zero, use_acc=False, is_async=True)  # k_a: K (smem or registers)
    dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
    st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
    pt = gl.exp2(st * qk_scale - lse[None, :])
    if MASKED:
        offs_n = key_lo + gl.arange(0, _KEYS, layout=gl.SliceLayout(1, st_layout))
        keep = (offs_m[None, :] < Sq) & (offs_n[:, None] < Sk)
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :])
        pt = gl.where(keep, pt, 0.0)
    pt_op = gl.convert_layout(pt.to(do_buf.dtype), a_layout)
    dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
    dpt, pt_op = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt_op))
    dst = (pt * (dpt - delta[None, :])).to(q_buf.dtype)
    if SPLIT and ORDER:
        # dS^T to shared memory first: dK's product reads it there (no register copy of dS^T), and dV's
        # product is waited for (P^T's registers free) before dQ's accumulator goes live.
        b = t % 2
        bph = (t // 2) & 1
        ds_buf = ds_smem.index(b * 2 + which)
        mbarrier.wait(ds_free.index(b), bph ^ 1)
        ds_buf.store(dst)
        fence_async_shared()
        _barrier()
        mbarrier.arrive(ds_ready.index(b), count=1)
        dk = warpgroup_mma(ds_buf, q_buf, dk, is_async=True)
        dv, pt_op = warpgroup_mma_wait(num_outstanding=1, deps=(dv, pt_op))
    else:
        dst_op = gl.convert_layout(dst, a_layout)
        dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
    if SPLIT:
        # Both consumers' dS^T (128 keys) in a double buffer; each computes dQ for its half of D.
        b = t % 2
        bph = (t // 2) & 1
        HALF: gl.constexpr = HEAD_DIM // 2
        half_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                              instr_shape=[16, HALF, 16])
        if not ORDER:
            mbarrier.wait(ds_free.index(b), bph ^ 1)
            ds_smem.index(b * 2 + which).store(dst)
            fence_async_shared()
            _barrier()
            mbarrier.arrive(ds_ready.index(b), count=1)
        mbarrier.wait(ds_ready.index(b), bph)
        dq = warpgroup_mma(ds_smem.index(b * 2).permute((1, 0)), k_smem.index(0).slice(which * HALF, HALF, dim=1),
                           gl.zeros([BLOCK_M, HALF], gl.float32, layout=half_layout), use_acc=False, is_async=True)
        dq = warpgroup_mma(ds_smem.index(b * 2 + 1).permute((1, 0)),
                           k_smem.index(1).slice(which * HALF, HALF, dim=1), dq, is_async=True)
        if ORDER:
            dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dq))
        else:
            dv, dk, dq, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, pt_op, dst_op))
        mbarrier.arrive(ds_free.index(b), count=1)
        mbarrier.arrive(empty.index(s), count=1)
        if TMA == 1 or TMA == 2:
            # Rows past Sq (the next head's) get dS = 0, so the box adds zeros there. TMA (1 or 2)
            # staging tiles a consumer: wait until at most TMA - 1 reduces still read theirs.
            stage = dq_stage.index(which * TMA + t % TMA)
            _store_wait(TMA - 1)
            _barrier()
            stage.store(dq)
            fence_async_shared()
            _barrier()
            _tma_reduce_add(dq_desc, [head_row + i * BLOCK_M, which * HALF], stage)
        elif TMA == 4 or TMA == 5 or TMA == 6:
            # The writer warp owns the reduces: hand it the tile (two staging tiles a consumer) and go on.
            b2 = which * 2 + t % 2
            mbarrier.wait(dq_bars.index(4 + b2), ((t // 2) & 1) ^ 1)  # the reduce two tiles back has read it
            if TMA == 5:
                # Unswizzled 8-column groups, [group][row][8]: a warp's stores of 8 rows x 8 columns land
                # on 64 consecutive words (no bank conflicts; 128B-swizzled fp32 rows had 5.6-7-way).
                G5: gl.constexpr = HALF // 8
                l3: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
                tiles = dq_stage._reinterpret(gl.float32, [4, G5, BLOCK_M, 8], l3)
                tiles.index(b2).permute((1, 0, 2)).reshape([BLOCK_M, HALF]).store(dq)
            elif TMA == 6:  # the same bytes seen through a linear layout that puts the tile in register order
                dq_stage.index(b2)._reinterpret(gl.float32, [BLOCK_M, HALF], stage_layout6(HALF)).store(dq)
            else:  # 128B-swizzled rows
                dq_stage.index(b2).store(dq)
            fence_async_shared()
            _barrier()
            mbarrier.arrive(dq_bars.index(b2), count=1)
        elif TMA == 3:  # timing only: dQ not written, and so its product removed as dead code (see mode 7)
            pass
        elif TMA == 7:  # timing only: dQ computed and kept live, written only if Sq < 0 (never)
            if Sq < 0:
                rows = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, half_layout))
                cols = which * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, half_layout))
                gl.store(dq_ptr + (rows * HEAD_DIM)[:, None] + cols[None, :], dq)
        else:
            rows = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, half_layout))
            cols = which * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, half_layout))
            ptrs = dq_ptr + ((head_row + rows).to(gl.int64) * HEAD_DIM)[:, None] + cols[None, :]
            keep = gl.full([BLOCK_M, HALF], 1, gl.int32, layout=half_layout)
            if MASKED:
                keep = gl.where((rows < Sq)[:, None], keep, 0)
            _red_add(ptrs, dq, keep, VEC)
    elif BLOCK_M >= 64:
        ds_buf = ds_smem.index(which)
        ds_buf.store(dst)
        fence_async_shared()
        _barrier()
        dq = warpgroup_mma(ds_buf.permute((1, 0)), k_buf,
                           gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=acc_layout), use_acc=False, is_async=True)
        dv, dk, dq, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, pt_op, dst_op))
        mbarrier.arrive(empty.index(s), count=1)
        rows = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
        ptrs = dq_ptr + ((head_row + rows).to(gl.int64) * HEAD_DIM)[:, None] + cols[None, :]
        keep = gl.full([BLOCK_M, HEAD_DIM], 1, gl.int32, layout=acc_layout)
        if MASKED:
            keep = gl.where((rows < Sq)[:, None], keep, 0)
        _red_add(ptrs, dq, keep, VEC)
    else:
        # wgmma's M is 64 or more: at 32 query rows dQ goes transposed, dQ^T (D x BLOCK_M) = K^T dS^T.
        ds_buf = ds_smem.index(which)
        ds_buf.store(dst)
        fence_async_shared()
        _barrier()
        dqt_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BLOCK_M, 16])
        dqt = warpgroup_mma(k_buf.permute((1, 0)), ds_buf,
                            gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, layout=dqt_layout), use_acc=False,
                            is_async=True)
        dv, dk, dqt, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dqt, pt_op, dst_op))
        mbarrier.arrive(empty.index(s), count=1)
        dcol = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, dqt_layout))
        mrow = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, dqt_layout))
        ptrs = dq_ptr + ((head_row + mrow).to(gl.int64) * HEAD_DIM)[None, :] + dcol[:, None]
        keep = gl.full([HEAD_DIM, BLOCK_M], 1, gl.int32, layout=dqt_layout)
        if MASKED:
            keep = gl.where((mrow < Sq)[None, :], keep, 0)
        _red_add(ptrs, dqt, keep, False)
    return dk, dv


@gluon.jit
def _ranges(n0, m_first, n_m, Sq, Sk, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr):
    """v6's query-tile ranges of a CTA: [m_first, m_clean) cross the causal diagonal, [m_clean, m_full)
    need no test, [m_full, n_m) is the partial last tile; every tile is tested when the keys pass Sk."""
    if CAUSAL:
        m_clean = gl.minimum(gl.maximum(gl.cdiv(n0 + NUM_CONS * _KEYS - 1, BLOCK_M), m_first), n_m)
    else:
        m_clean = m_first
    m_full = gl.minimum(gl.maximum(Sq // BLOCK_M, m_clean), n_m)
    if n0 + NUM_CONS * _KEYS > Sk:
        m_clean = n_m
        m_full = n_m
    return m_clean, m_full


@gluon.jit
def _order(pos, g, start_n, m_clean, m_full, GROUP, ROT: gl.constexpr):
    """The query tile and head a CTA visits at position ``pos`` of head ``g``'s walk. With ROT the
    clean range starts at a per-CTA offset and the heads of a GQA group at a per-CTA head, so the
    CTAs running at once add into different dQ rows (all in step, they queue on the same L2 lines)."""
    i = pos
    gg = g
    if ROT:
        n_clean = m_full - m_clean
        if pos >= m_clean and pos < m_full:
            i = m_clean + (pos - m_clean + start_n) % n_clean
        gg = (g + start_n) % GROUP
    return i, gg


@gluon.jit
def _floader(k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty, stats, lse_ptr,
             delta_ptr, kv_row, q_head0, m_first, n_m, GROUP, Sq, Sk, n0, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
             CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr, ROT: gl.constexpr, STATS: gl.constexpr):
    mbarrier.expect(kv_bar, NUM_CONS * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for c in gl.static_range(NUM_CONS):
        _tma_load(k_desc, [kv_row + c * _KEYS, 0], kv_bar, k_smem.index(c))
        _tma_load(v_desc, [kv_row + c * _KEYS, 0], kv_bar, v_smem.index(c))
    m_clean, m_full = _ranges(n0, m_first, n_m, Sq, Sk, BLOCK_M, CAUSAL, NUM_CONS)
    start_n = n0 // (NUM_CONS * _KEYS)
    n_tiles = n_m - m_first
    for t in range(GROUP * n_tiles):
        i, g = _order(m_first + t % n_tiles, t // n_tiles, start_n, m_clean, m_full, GROUP, ROT)
        s = t % STAGES
        ph = (t // STAGES) & 1
        if STATS == 2:  # as v6's loader: the tile's LSE (log2, 0 where -inf or past Sq) and Delta with Q and dO
            stat_layout: gl.constexpr = gl.BlockedLayout([2], [32], [1], [0])
            rows = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=stat_layout)
            lse = gl.load(lse_ptr + (q_head0 + g) * Sq + rows, mask=rows < Sq, other=0.0)
            delta = gl.load(delta_ptr + (q_head0 + g) * Sq + rows, mask=rows < Sq, other=0.0)
            lse = gl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
            mbarrier.wait(empty.index(s), ph ^ 1)
            stats.index(2 * s).store(lse)
            stats.index(2 * s + 1).store(delta)
        else:
            mbarrier.wait(empty.index(s), ph ^ 1)
        mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        row = (q_head0 + g) * Sq + i * BLOCK_M
        _tma_load(q_desc, [row, 0], ready.index(s), q_smem.index(s))
        _tma_load(do_desc, [row, 0], ready.index(s), do_smem.index(s))


@gluon.jit
def _fwriter(dq_desc, dq_stage, dq_bars, q_head0, m_first, n_m, GROUP, Sq, Sk, n0, BLOCK_M: gl.constexpr,
             CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr, ROT: gl.constexpr, HEAD_DIM: gl.constexpr,
             TMA: gl.constexpr):
    """dQ modes 4-6: one warp issues the TMA reduce-adds of the consumers' staging tiles (dq_bars 0-3:
    a tile is full, 4-7: its reduce has read it), so the consumers never wait on a bulk group. Mode 6: a
    staging tile's bytes are one contiguous box of the padded accumulator (``dq6_index``)."""
    HALF: gl.constexpr = HEAD_DIM // 2

    G5: gl.constexpr = HALF // 8 if TMA == 5 else 1  # TMA 5: a reduce an 8-column group
    m_clean, m_full = _ranges(n0, m_first, n_m, Sq, Sk, BLOCK_M, CAUSAL, NUM_CONS)
    start_n = n0 // (NUM_CONS * _KEYS)
    n_tiles = n_m - m_first
    for t in range(GROUP * n_tiles):
        i, g = _order(m_first + t % n_tiles, t // n_tiles, start_n, m_clean, m_full, GROUP, ROT)
        row = (q_head0 + g) * Sq + i * BLOCK_M
        for c in gl.static_range(NUM_CONS):
            b2 = c * 2 + t % 2
            mbarrier.wait(dq_bars.index(b2), (t // 2) & 1)
            if TMA == 5:
                for g5 in gl.static_range(G5):
                    _tma_reduce_add(dq_desc, [row, c * HALF + g5 * 8], dq_stage.index(b2 * G5 + g5))
            elif TMA == 6:  # box (head, query tile, half) of the padded accumulator, BLOCK_M x HALF contiguous
                _tma_reduce_add(dq_desc, [(((q_head0 + g) * n_m + i) * NUM_CONS + c) * BLOCK_M, 0], dq_stage.index(b2))
            else:
                _tma_reduce_add(dq_desc, [row, c * HALF], dq_stage.index(b2))
        _store_wait(NUM_CONS * G5)  # at most this tile's reduces pending: the previous tile's have read theirs
        if t > 0:
            for c in gl.static_range(NUM_CONS):
                mbarrier.arrive(dq_bars.index(4 + c * 2 + (t - 1) % 2), count=1)
    _store_wait(0)


@gluon.jit
def _fspan(lo, hi, dk, dv, args, st_layout: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
           STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr, SPLIT: gl.constexpr, VEC: gl.constexpr,
           TMA: gl.constexpr, ROT: gl.constexpr, ORDER: gl.constexpr, STATS: gl.constexpr, GROUP,
           which: gl.constexpr):
    """Positions [lo, hi) of a head's query-tile walk through ``_ftile`` (``args``: _fconsumer's state)."""
    (t0, g, start_n, m_clean, m_full, k_smem, v_buf, k_a, q_smem, do_smem, ds_smem, ds_ready, ds_free, ready, empty,
     stats, lse_ptr, delta_ptr, dq_ptr, dq_desc, dq_stage, dq_bars, q_head0, key_lo, Sq, Sk, qk_scale) = args
    for p in range(lo, hi):
        i, gg = _order(p, g, start_n, m_clean, m_full, GROUP, ROT)
        dk, dv = _ftile(t0 + p, dk, dv, k_smem, v_buf, k_a, q_smem, do_smem, ds_smem, ds_ready, ds_free, ready, empty,
                        stats, lse_ptr, delta_ptr, dq_ptr, dq_desc, dq_stage, dq_bars, (q_head0 + gg) * Sq, i, key_lo,
                        Sq, Sk, qk_scale, st_layout, BLOCK_M, HEAD_DIM, STAGES, CAUSAL, MASKED, SPLIT, VEC, TMA, ORDER,
                        STATS, which)
    return dk, dv


@gluon.jit
def _fconsumer(k_smem, v_smem, q_smem, do_smem, ds_smem, ds_ready, ds_free, dq_desc, dq_stage, dq_bars, kv_bar, ready,
               empty, stats, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr, kv_row, q_head0, m_first, n_m, GROUP, Sq, Sk,
               n0, qk_scale, sm_scale, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
               CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr, SPLIT: gl.constexpr, VEC: gl.constexpr,
               TMA: gl.constexpr, ROT: gl.constexpr, ORDER: gl.constexpr, STATS: gl.constexpr,
               KV_REGS: gl.constexpr, which: gl.constexpr):
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    key_lo = n0 + which * _KEYS
    v_buf = v_smem.index(which)
    dk = gl.zeros([_KEYS, HEAD_DIM], gl.float32, layout=acc_layout)
    dv = gl.zeros([_KEYS, HEAD_DIM], gl.float32, layout=acc_layout)
    m_clean, m_full = _ranges(n0, m_first, n_m, Sq, Sk, BLOCK_M, CAUSAL, NUM_CONS)
    start_n = n0 // (NUM_CONS * _KEYS)
    n_tiles = n_m - m_first
    mbarrier.wait(kv_bar, 0)
    k_a = k_smem.index(which)
    if KV_REGS:  # K and V as register A operands of S^T's and dP^T's products (dQ's still reads K's smem)
        kv_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=2)
        k_a = k_a.load(kv_op)
        v_buf = v_buf.load(kv_op)
    for g in range(GROUP):
        t0 = g * n_tiles - m_first
        args = (t0, g, start_n, m_clean, m_full, k_smem, v_buf, k_a, q_smem, do_smem, ds_smem, ds_ready, ds_free, ready,
                empty, stats, lse_ptr, delta_ptr, dq_ptr, dq_desc, dq_stage, dq_bars, q_head0, key_lo, Sq, Sk, qk_scale)
        # Tiles crossing the diagonal (masked), the clean ones, the partial last one (masked).
        dk, dv = _fspan(m_first, m_clean, dk, dv, args, st_layout, BLOCK_M, HEAD_DIM, STAGES, CAUSAL, True, SPLIT,
                        VEC, TMA, ROT, ORDER, STATS, GROUP, which)
        dk, dv = _fspan(m_clean, m_full, dk, dv, args, st_layout, BLOCK_M, HEAD_DIM, STAGES, CAUSAL, False, SPLIT,
                        VEC, TMA, ROT, ORDER, STATS, GROUP, which)
        dk, dv = _fspan(m_full, n_m, dk, dv, args, st_layout, BLOCK_M, HEAD_DIM, STAGES, CAUSAL, True, SPLIT,
                        VEC, TMA, ROT, ORDER, STATS, GROUP, which)
    rows = key_lo + gl.arange(0, _KEYS, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    offs = ((kv_row - n0 + rows).to(gl.int64) * HEAD_DIM)[:, None] + cols[None, :]
    keep = (rows < Sk)[:, None]
    gl.store(dk_ptr + offs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=keep)
    gl.store(dv_ptr + offs, dv.to(dv_ptr.dtype.element_ty), mask=keep)


@gluon.jit
def attn_bwd_fused_ws_kernel(k_desc, v_desc, q_desc, do_desc, dq_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr,
                             H, GROUP, Sq, Sk, qk_scale, sm_scale, KV_DIV,
                             BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                             CONSUMER_REGS: gl.constexpr, DS_LAYOUT: gl.constexpr, SPLIT: gl.constexpr,
                             VEC: gl.constexpr, TMA: gl.constexpr, ROT: gl.constexpr, ORDER: gl.constexpr = False,
                             STATS: gl.constexpr = 0, NUM_CONS: gl.constexpr = 2, KV_REGS: gl.constexpr = False):
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    start_n = gl.program_id(0)
    bhk = gl.program_id(1)
    HK = H // GROUP
    off_b = bhk // HK
    off_hk = bhk % HK
    n0 = start_n * (NUM_CONS * _KEYS)
    kv_row = bhk * Sk + n0  # dK / dV's rows (a query head's partial where KV_DIV > 1)
    src_row = (bhk // KV_DIV) * Sk + n0  # K / V's rows: a CTA a query head reads its group's K / V (KV_DIV > 1)
    q_head0 = off_b * H + off_hk * GROUP
    m_first = 0
    if CAUSAL:
        m_first = n0 // BLOCK_M
    n_m = gl.cdiv(Sq, BLOCK_M)
    m_first = gl.minimum(m_first, n_m)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_CONS, _KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [NUM_CONS, _KEYS, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    DS_BUFS: gl.constexpr = 2 * NUM_CONS if SPLIT else NUM_CONS
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [DS_BUFS, _KEYS, BLOCK_M], DS_LAYOUT)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    STAGE_BUFS: gl.constexpr = NUM_CONS * TMA if (TMA == 1 or TMA == 2) else (
        NUM_CONS * 2 if (TMA == 4 or TMA == 5 or TMA == 6) else 1)
    dq_bars = gl.allocate_shared_memory(gl.int64, [8, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(8):
        mbarrier.init(dq_bars.index(b), count=1)
    if TMA == 5:  # a staging tile is [8-column group, row, 8]
        dq_stage = gl.allocate_shared_memory(gl.float32, [STAGE_BUFS * (HEAD_DIM // 16), BLOCK_M, 8], dq_desc.layout)
    elif TMA == 6:  # plain rows for the TMA unit; the consumers store through ``stage_layout6``
        l2: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        dq_stage = gl.allocate_shared_memory(gl.float32, [STAGE_BUFS, BLOCK_M, HEAD_DIM // 2], l2)
    else:
        dq_stage = gl.allocate_shared_memory(gl.float32, [STAGE_BUFS] + dq_desc.block_type.shape, dq_desc.layout)
    for b in gl.static_range(2):
        mbarrier.init(ds_ready.index(b), count=NUM_CONS)
        mbarrier.init(ds_free.index(b), count=NUM_CONS)
    stats = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=NUM_CONS)
    # The tuples spelled out: a tuple built by + in the kernel loses its constexprs.
    if TMA == 4 or TMA == 5 or TMA == 6:
        gl.warp_specialize([
            (_fconsumer, (k_smem, v_smem, q_smem, do_smem, ds_smem, ds_ready, ds_free, dq_desc, dq_stage, dq_bars,
                          kv_bar, ready, empty, stats, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr, kv_row, q_head0,
                          m_first, n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M, HEAD_DIM, STAGES, CAUSAL,
                          NUM_CONS, SPLIT, VEC, TMA, ROT, ORDER, STATS, KV_REGS, 0)),
            (_fconsumer, (k_smem, v_smem, q_smem, do_smem, ds_smem, ds_ready, ds_free, dq_desc, dq_stage, dq_bars,
                          kv_bar, ready, empty, stats, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr, kv_row, q_head0,
                          m_first, n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M, HEAD_DIM, STAGES, CAUSAL,
                          NUM_CONS, SPLIT, VEC, TMA, ROT, ORDER, STATS, KV_REGS, 1)),
            (_floader, (k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty, stats,
                        lse_ptr, delta_ptr, src_row, q_head0, m_first, n_m, GROUP, Sq, Sk, n0, BLOCK_M, STAGES, CAUSAL,
                        NUM_CONS, ROT, STATS)),
            (_fwriter, (dq_desc, dq_stage, dq_bars, q_head0, m_first, n_m, GROUP, Sq, Sk, n0, BLOCK_M, CAUSAL,
                        NUM_CONS, ROT, HEAD_DIM, TMA)),
        ], [4, 1, 1], [CONSUMER_REGS, 24, 24])
    else:
        gl.warp_specialize([
            (_fconsumer, (k_smem, v_smem, q_smem, do_smem, ds_smem, ds_ready, ds_free, dq_desc, dq_stage, dq_bars,
                          kv_bar, ready, empty, stats, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr, kv_row, q_head0,
                          m_first, n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M, HEAD_DIM, STAGES, CAUSAL,
                          NUM_CONS, SPLIT, VEC, TMA, ROT, ORDER, STATS, KV_REGS, 0)),
            (_fconsumer, (k_smem, v_smem, q_smem, do_smem, ds_smem, ds_ready, ds_free, dq_desc, dq_stage, dq_bars,
                          kv_bar, ready, empty, stats, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr, kv_row, q_head0,
                          m_first, n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M, HEAD_DIM, STAGES, CAUSAL,
                          NUM_CONS, SPLIT, VEC, TMA, ROT, ORDER, STATS, KV_REGS, 1)),
            (_floader, (k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty, stats,
                        lse_ptr, delta_ptr, src_row, q_head0, m_first, n_m, GROUP, Sq, Sk, n0, BLOCK_M, STAGES, CAUSAL,
                        NUM_CONS, ROT, STATS)),
        ], [4, 1], [CONSUMER_REGS, 24])


def ds_layout(bm):
    """dS^T's shared-memory layout ([64 keys, bm queries], bf16): the A operand of the dQ product, read
    transposed."""
    return gl.NVMMASharedLayout.get_default_for([KEYS, bm], gl.bfloat16)


def dq6_index(half):
    """(64, half) long: each element's staging offset (the inverse of ``stage_layout6``'s bases)."""
    bases = stage_layout6(half).offset_bases
    idx = torch.empty(64, half, dtype=torch.long)
    for off in range(64 * half):
        r = sum(b[0] for i, b in enumerate(bases) if off >> i & 1)
        c = sum(b[1] for i, b in enumerate(bases) if off >> i & 1)
        idx[r, c] = off
    return idx


@functools.lru_cache(maxsize=None)
def _dq6_gather(D, device):
    """Flat offsets, within a query tile's 2 partials, of its (64, D) elements, row by row (``dq6_index``)."""
    half = dq6_index(D // 2)
    return torch.cat([half, half + 64 * (D // 2)], dim=1).view(-1).to(device)


def _fp32_desc(t2, block):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for(list(block), gl.float32)
    return TensorDescriptor(t2, list(t2.shape), list(t2.stride()), list(block), layout)


def fused_bwd(q, k, v, out, do, lse, causal, scale, config=(64, 2, 240, False, False, 0, False)):
    """(dq, dk, dv) of contiguous bf16 (B, H / Hkv, S, D) tensors: the project's preprocess kernel
    (Delta, and the fp32 dQ accumulator zeroed), the fused kernel, dQ * scale -> bf16."""
    from tilewise.ops.attention import api as A
    from tilewise.ops.attention import triton_kernels as K_
    from tilewise.ops.attention.gluon_fwd import _desc, run

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    bm, stages, regs, split, vec, use_tma, rot = config[:7]
    order = bool(config[7]) if len(config) > 7 else False
    stats = int(config[8]) if len(config) > 8 else 0
    kv_regs = bool(config[9]) if len(config) > 9 else False
    # a CTA a query head (cuDNN's order): dK / dV partials per query head in fp32, summed over the group after
    head_major = bool(config[10]) if len(config) > 10 else False
    delta = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    n_m = -(-Sq // bm)
    if use_tma == 6 and bm != 64:
        raise ValueError(f"dQ mode 6 lays out 64-row partials, got BLOCK_M {bm}")
    if use_tma == 6:  # padded: a (head, query tile, half of D) partial is bm x D / 2 contiguous floats
        dq_acc = torch.zeros((B * H * n_m * 2 * bm, D // 2), dtype=torch.float32, device=q.device)
    else:
        dq_acc = torch.empty((B, H, Sq, D), dtype=torch.float32, device=q.device)
    G = H // Hkv
    if head_major:
        dk, dv = (torch.empty((B, H, Sk, D), dtype=torch.float32, device=q.device) for _ in range(2))
    else:
        dk, dv = torch.empty_like(k), torch.empty_like(v)
    A._launch(K_._attn_bwd_preprocess_kernel, (-(-Sq // 64), B * H), out, do, delta, delta,
              delta if use_tma == 6 else dq_acc, H, Sq, *out.stride(), *do.stride(), BLOCK_M=64, HEAD_DIM=D,
              BLOCK_D=D, HAS_DLSE=False, ZERO_DQ=use_tma != 6)
    memo: dict = {}
    kd, vd = _desc(k.view(-1, D), (KEYS, D), memo), _desc(v.view(-1, D), (KEYS, D), memo)
    qd, dod = _desc(q.view(-1, D), (bm, D), memo), _desc(do.view(-1, D), (bm, D), memo)
    # fp32 TMA box of the dQ accumulator: BLOCK_M rows x half of D (a tiny one when unused).
    if use_tma == 5:  # unswizzled boxes of 8 columns (the staging layout's groups)
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        t2 = dq_acc.view(-1, D)
        dqd = TensorDescriptor(t2, list(t2.shape), list(t2.stride()), [bm, 8],
                               gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
    elif use_tma == 6:  # plain rows: the box is the staging tile's bytes as they are
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        dqd = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), [bm, D // 2],
                               gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
    else:
        dqd = _fp32_desc(dq_acc.view(-1, D), (bm, D // 2) if use_tma in (1, 2, 4) else (8, 8))
    grid = (-(-Sk // (2 * KEYS)), B * (H if head_major else Hkv))
    args = (kd, vd, qd, dod, dqd, lse, delta, dk, dv, dq_acc, H, 1 if head_major else G, Sq, Sk, scale * LOG2E, scale,
            G if head_major else 1)
    meta = dict(BLOCK_M=bm, STAGES=stages, CAUSAL=bool(causal), CONSUMER_REGS=regs, DS_LAYOUT=ds_layout(bm),
                SPLIT=split, VEC=vec, TMA=use_tma, ROT=rot, ORDER=order, STATS=stats, NUM_CONS=2,
                KV_REGS=kv_regs, num_warps=4)
    run(attn_bwd_fused_ws_kernel, grid, args, meta, A._launch)
    if head_major:
        dk, dv = (t.view(B, Hkv, G, Sk, D).sum(2).to(k.dtype) for t in (dk, dv))
    if use_tma == 6:  # back to (B, H, Sq, D): column c * D / 2 + j of row m is offset c * bm * D / 2 + e(m, j)
        idx = _dq6_gather(D, str(q.device))
        dq = dq_acc.view(B * H, n_m, 2 * bm * (D // 2))[:, :, idx].view(B, H, n_m * bm, D)[:, :, :Sq]
        return (dq * scale).to(q.dtype), dk, dv
    dq = (dq_acc * scale).to(q.dtype)
    return dq, dk, dv


def _err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


def _kv_regs_skip(cfg, D):
    """K and V in registers are meant for D 64: at D 128 dK, dV and both tiles do not fit (v6: 529-650 spill
    instructions)."""
    return len(cfg) > 9 and cfg[9] and D > 64


def case(B, H, Hkv, S, D, causal, configs_, check=True):
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tilewise.ops.attention import api as A

    g = torch.Generator(device="cuda").manual_seed(S * D + causal)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
            for _ in range(2))
    go = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = D ** -0.5
    from tilewise.ops.attention.api import _fwd_impl

    policy = A.default_policy(q, k, causal=causal)
    with torch.no_grad():
        out, lse = _fwd_impl(q, k, v, None, None, causal, scale, policy)
    out_v6 = A.flash_attention(q, k, v, causal=causal)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out_cudnn = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H)

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")

    res = {}
    if check:
        # fp32 reference on a slice of heads would be exact; compare with v6 (tested against fp32) instead.
        ref = torch.autograd.grad(out_v6, (q, k, v), go, retain_graph=True)
        for cfg in list(configs_):
            if _kv_regs_skip(cfg, D):
                continue
            try:
                got = fused_bwd(q.detach(), k.detach(), v.detach(), out.detach(), go, lse, causal, scale, cfg)
            except Exception as e:  # noqa: BLE001 - a config that does not build: report, go on
                print(f"  {cfg}: {type(e).__name__}: {str(e).splitlines()[-1][:300]}", flush=True)
                configs_.remove(cfg)
                continue
            errs = [_err(a, b) for a, b in zip(got, ref)]
            ok = max(errs) < 2e-2 and all(torch.isfinite(t).all() for t in got)
            print(f"  check {cfg}: rel max err dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e} "
                  f"{'ok' if ok else 'FAIL'}", flush=True)
            if not ok and cfg[5] not in (3, 7):
                configs_.remove(cfg)
    res["v6"] = bench(lambda: torch.autograd.grad(out_v6, (q, k, v), go, retain_graph=True))
    res["cudnn"] = bench(lambda: torch.autograd.grad(out_cudnn, (q, k, v), go, retain_graph=True))
    for cfg in configs_:
        if _kv_regs_skip(cfg, D):
            continue
        res[f"fused{cfg}"] = bench(lambda: fused_bwd(q.detach(), k.detach(), v.detach(), out.detach(), go, lse,
                                                     causal, scale, cfg))
    flops = 4 * B * H * S * S * D * 2.5 / (2 if causal else 1)
    line = "  ".join(f"{n} {ms:.3f} ms ({flops / ms / 1e9:.0f} TF)" for n, ms in res.items())
    print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal}: {line}", flush=True)
    return res


def ncu_cases(modes=(4, 5, 6, 3), stats=(1,), dims=(128,)):
    """For Nsight Compute: are the dQ adds limited by the L2 (lts throughput, red sectors) or by the
    consumers waiting (stall at the bulk-group wait / the writer's barrier)? Run on the GPU:
        ncu --clock-control none --kernel-name attn_bwd_fused_ws_kernel --set full \\
            python3 research/attention_fused_bwd.py --ncu
    """
    from tilewise.ops.attention import api as A
    from tilewise.ops.attention.api import _fwd_impl

    B, H, S = 4, 16, 4096
    for D in dims:
        g = torch.Generator(device="cuda").manual_seed(D)
        q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        scale = D ** -0.5
        out, lse = _fwd_impl(q, k, v, None, None, False, scale, A.default_policy(q, k))
        for mode in modes:
            for st in stats:
                print(f"ncu case: D {D} dQ mode {mode} STATS {st}", flush=True)
                fused_bwd(q, k, v, out, do, lse, False, scale, (64, 2, 240, True, False, mode, False, False, st))
                torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="quick", choices=("quick", "grid"))
    p.add_argument("--tiles", action="store_true", help="also BLOCK_M 32 x 3 stages")
    p.add_argument("--ncu", action="store_true",
                   help="one launch each of dQ modes 4, 5, 6 and 3 at B 4 H 16 S 4096 D 128, for Nsight Compute")
    p.add_argument("--modes", default="",
                   help="comma-separated dQ modes to time (split D, no rotation; --stats), e.g. 3,7,4,6")
    p.add_argument("--stats", default="1",
                   help="with --modes or --ncu: comma-separated LSE / Delta loads, each mode with each: 1 each "
                        "consumer loads and converts them (v6's earlier query_stats), 2 the loader stages them in "
                        "shared memory (v6's dK / dV kernel now)")
    p.add_argument("--ncu-dims", default="128", help="with --ncu: comma-separated head dims (B 4 H 16 S 4096)")
    p.add_argument("--d128-first", action="store_true", help="the D 128 shapes before the Llama ones")
    p.add_argument("--head-major", action="store_true",
                   help="modes 7 and 4 (STATS 2) with a CTA a KV group (as v6) and a CTA a query head (cuDNN's order, "
                        "dK / dV summed over the group after), the Llama shapes and B 1 H 32 / 8 S 16384 D 128")
    a = p.parse_args(argv)
    stats = tuple(int(x) for x in a.stats.split(","))
    if a.ncu:
        return ncu_cases(tuple(int(m) for m in a.modes.split(",")) if a.modes else (4, 5, 6, 3), stats,
                         tuple(int(d) for d in a.ncu_dims.split(",")))
    # (BLOCK_M, STAGES, regs, split D, vector reds, dQ by: 0 reds, 1 / 2 TMA reduce with 1 / 2 staging
    # tiles, 3 not written (timing only: its check fails; the compiler drops the dQ product, so it times 4 of
    # the 5 products), 7 computed and kept live but not written (the true ceiling), 4 TMA reduce by a writer
    # warp, 5 as 4 from
    # unswizzled 8-column staging groups (no bank conflicts), 6 as 4 from staging tiles in register order,
    # one contiguous box each (FA3's layout; 16-byte stores), rotated order)
    # (8 and 9, the next tile's S^T and dP^T issued before this tile's dQ is staged, ran at 0d82c74 and were
    # removed: 1.2-1.4x slower than mode 4)
    # (..., K and V as register A operands of S^T's and dP^T's products (D 64 only; mode 6: 57 spill
    # instructions under Triton 3.6, mode 3: none))
    # (..., dS^T to shared memory before dK's product (ORDER), LSE / Delta loads (STATS 1: each consumer's,
    # converted through shared memory; 2: staged in shared memory by the loader))
    cfgs = [(64, 2, 240, True, False, 3, False, False, 1), (64, 2, 240, True, False, 4, False, False, 1),
            (64, 2, 240, True, False, 5, False, False, 1), (64, 2, 240, True, False, 6, False, False, 1),
            (64, 2, 240, True, False, 6, True, False, 1), (64, 2, 240, True, False, 6, False, False, 1, True),
            (64, 2, 240, True, False, 3, False, False, 1, True)]
    if a.modes:
        cfgs = [(64, 2, 240, True, False, int(m), False, False, st) for m in a.modes.split(",") for st in stats]
    if a.head_major:
        cfgs = [(64, 2, 240, True, False, m, False, False, 2, False, hm) for m in (7, 4) for hm in (False, True)]
    if a.tiles:
        cfgs += [(64, 2, 240, False, False, 0, False), (32, 3, 240, False, False, 0, False)]
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):
        x @ x
    # Small odd shapes first: correctness at sizes that are not tile multiples, GQA.
    for shape in [(1, 4, 2, 1000, 128, False), (1, 4, 2, 1000, 128, True), (2, 4, 4, 333, 64, True)]:
        print(f"odd {shape}", flush=True)
        case(*shape, configs_=cfgs)
    if not cfgs:
        sys.exit(1)
    # Llama-3.2-1B's attention (D 64, GQA 32 / 8, causal) at the llama bench's two shapes first.
    shapes = [(4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True),
              (4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True), (2, 32, 8, 8192, 128, True)]
    if a.d128_first:
        shapes = shapes[2:4] + shapes[:2] + shapes[4:]
    if a.head_major:  # where attention_dq_reduce_floor.py put the adds' floor by order
        shapes = shapes[:2] + [(1, 32, 8, 16384, 128, False)]
    if a.shapes == "grid":
        shapes += [(16, 16, 16, 1024, 128, False), (8, 16, 16, 2048, 128, True), (4, 16, 16, 4096, 64, False),
                   (4, 16, 16, 4096, 64, True)]
    for shape in shapes:
        case(*shape, configs_=cfgs)
    print("ws_bwd tiles", configs.WS_BWD_DKDV_TILES)


if __name__ == "__main__":
    main()
