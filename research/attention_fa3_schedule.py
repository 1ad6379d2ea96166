"""v5 with FA3's consumer schedule: intra-warpgroup overlap and ping-pong together.

Why: v5 (ops/attention/gluon_fwd.py) runs 0.82-0.96x cuDNN at D = 128. Each of its two consumer
warpgroups issues S = Q K^T, waits, runs the softmax, issues O += P V and waits, so its tensor-core
work and its exponentials take turns, and the other consumer is the only thing that can fill the gap.
Two things were tried alone and both were slower (docs/tuning/attention.md, "v5 ping-pong";
research/notes/attention.md, "Eighth session"): the next tile's S issued before this tile's softmax
(0.80x against 0.87x cuDNN) and turn-taking between the consumers (0.875 against 0.889x at S 4096).
FA3's ablation has them as one design: a consumer issues S_j and P_{j-1} V_{j-1} together in its
turn, hands the turn over, and runs softmax(S_j) while its own P V and the other consumer's products
run; neither alone pays there either.

The schedule of one consumer (tiles j = 0 .. n - 1; ``turn`` = wait for this consumer's turn, ``pass``
= hand it to the other; PINGPONG=False drops both):

    turn; issue S_0; pass; wait S_0; release K_0; softmax(S_0) -> P_0
    for j in 1 .. n - 1:
        turn; issue S_j; issue O += P_{j-1} V_{j-1}; pass
        wait S_j (the older group); release K_j; softmax(S_j) -> P_j, alpha_j
        wait P V; release V_{j-1}; O *= alpha_j
    turn; issue O += P_{n-1} V_{n-1}; pass; wait; release V_{n-1}

Every consumer of a CTA has the same n (key tiles are the CTA's), so the turns alternate c0, c1, c0,
... for n + 1 turns each. P_{j-1} stays in registers until its product is waited on (the wgmma reads
them asynchronously); O is rescaled only after its product completed.

``attn_fwd_fa3_persistent_kernel`` runs the same consumers (no ping-pong) on v5's persistent grid (one CTA
an SM walking work items, gluon_fwd's persistent loader): written after the first measurement (2373afd),
compiled for sm_90 without spills, not yet run; the non-persistent kernel's SASS is the measured one's.
``THREE`` (``fa3_three`` at D = 64): three consumers as v5's D = 64 config, also compiled and not yet run.

Run on the GPU: PYTHONPATH=src python3 research/attention_fa3_schedule.py [--compile-only]
(the A/B against v5 and cuDNN at D = 128, B * S = 16384, H = 16, bf16, plain and causal, after a check
against the fp32 reference); --compile-only builds the sm_90 kernels here (Triton >= 3.5, no GPU) and
prints registers, spills and wgmma counts.
"""

from __future__ import annotations

import argparse
import json

import torch

from tilewise.ops.attention import gluon_fwd as G
from tilewise.ops.attention.layout import seq_mask, tma_view
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

_tma_load = G._tma_load
SEQ_Q, SEQ_K, SEQ_V, SEQ_O = G.SEQ_Q, G.SEQ_K, G.SEQ_V, G.SEQ_O


@gluon.jit
def _turn(turn, k, which: gl.constexpr, PINGPONG: gl.constexpr):
    # This consumer's k-th turn: consumer 0's first passes on the fresh barrier's completed phase 1.
    if PINGPONG:
        first: gl.constexpr = 1 if which == 0 else 0
        mbarrier.wait(turn.index(2 + which), (k & 1) ^ first)  # entries 2, 3: the turn barriers


@gluon.jit
def _pass(turn, which: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(3 - which), count=1)


@gluon.jit
def _softmax(t, j, m_i, l_i, m_lo, Sk, qk_scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
             CAUSAL: gl.constexpr, MASKED: gl.constexpr):
    """(p, alpha, m_new, l_new) of key tile j's scores ``t`` (v5's online softmax, log2 domain)."""
    if MASKED:
        offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = offs_n[None, :] < Sk
        if CAUSAL:
            offs_m = m_lo + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        t = gl.where(keep, t, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(t, 1) * qk_scale)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(t * qk_scale - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _step(j, r, acc, p_op, m_i, l_i, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, which: gl.constexpr,
          m_lo, Sk, qk_scale, zero, s_layout: gl.constexpr, o_layout: gl.constexpr, BLOCK_N: gl.constexpr,
          STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr, PINGPONG: gl.constexpr,
          dtype: gl.constexpr):
    """Loop body j >= 1: S_j and P_{j-1} V_{j-1} in one turn, softmax(S_j) beside them."""
    s = r % STAGES  # r: the ring fill of key tile j (j itself on v5's grid; more in a persistent CTA)
    sp = (r - 1) % STAGES
    mbarrier.wait(k_ready.index(s), (r // STAGES) & 1)
    mbarrier.wait(v_ready.index(sp), ((r - 1) // STAGES) & 1)
    _turn(turn, j, which, PINGPONG)
    t = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_op, v_smem.index(sp), acc, is_async=True)
    _pass(turn, which, PINGPONG)
    t = warpgroup_mma_wait(num_outstanding=1, deps=(t,))  # S_j (issued first) done; P V may still run
    mbarrier.arrive(k_empty.index(s), count=1)
    p, alpha, m_i, l_i = _softmax(t, j, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N, CAUSAL, MASKED)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))  # P stays live until read
    mbarrier.arrive(v_empty.index(sp), count=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    return acc, p_op, m_i, l_i


@gluon.jit
def _rows(q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, which: gl.constexpr, m_lo, n_tiles, n_full,
          slot, Sk, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr, HEAD_DIM: gl.constexpr,
          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
          dtype: gl.constexpr):
    """A consumer's 64 rows from ``m_lo`` over key tiles 0 .. n_tiles - 1 (the first n_full without a
    test), the ring's fills slot .. slot + n_tiles - 1: (acc, m_i, l_i). Turns (PINGPONG) are counted
    from 0: v5's grid only."""
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
    m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([64], gl.float32, layout=row_s)
    acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
    # Tile 0 (masked: cheap once, and right whether or not it needs the test)
    s0 = slot % STAGES
    mbarrier.wait(k_ready.index(s0), (slot // STAGES) & 1)
    _turn(turn, 0, which, PINGPONG)
    t = warpgroup_mma(q, k_smem.index(s0).permute((1, 0)), zero, use_acc=False, is_async=True)
    _pass(turn, which, PINGPONG)
    t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
    mbarrier.arrive(k_empty.index(s0), count=1)
    p, alpha, m_i, l_i = _softmax(t, 0, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N, CAUSAL, True)
    p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    for j in range(1, gl.maximum(n_full, 1)):
        acc, p_op, m_i, l_i = _step(j, slot + j, acc, p_op, m_i, l_i, q, k_smem, v_smem, k_ready, k_empty, v_ready,
                                    v_empty, turn, which, m_lo, Sk, qk_scale, zero, s_layout, o_layout, BLOCK_N,
                                    STAGES, CAUSAL, False, PINGPONG, dtype)
    for j in range(gl.maximum(n_full, 1), n_tiles):
        acc, p_op, m_i, l_i = _step(j, slot + j, acc, p_op, m_i, l_i, q, k_smem, v_smem, k_ready, k_empty, v_ready,
                                    v_empty, turn, which, m_lo, Sk, qk_scale, zero, s_layout, o_layout, BLOCK_N,
                                    STAGES, CAUSAL, True, PINGPONG, dtype)
    last = slot + n_tiles - 1
    sl = last % STAGES
    mbarrier.wait(v_ready.index(sl), (last // STAGES) & 1)
    _turn(turn, n_tiles, which, PINGPONG)
    acc = warpgroup_mma(p_op, v_smem.index(sl), acc, is_async=True)
    _pass(turn, which, PINGPONG)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))  # P stays live until read
    mbarrier.arrive(v_empty.index(sl), count=1)
    return acc, m_i, l_i


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty, v_ready,
              v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row, o_row, o_col,
              o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, HAS_BIAS: gl.constexpr,
              NUM_CONS: gl.constexpr, PINGPONG: gl.constexpr, which: gl.constexpr):
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    m_lo = start_m * (64 * NUM_CONS) + which * 64
    n_full = G.unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N, CAUSAL)
    mbarrier.wait(q_bar.index(which), 0)
    acc, m_i, l_i = _rows(q_smem.index(which), k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, q_bar, which, m_lo,
                          n_tiles, n_full, 0, Sk, qk_scale, s_layout, o_layout, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                          PINGPONG, q_desc.dtype)
    G._finish(acc, m_i, l_i, out_ptr, lse_ptr, lse_row, o_row, o_col, o_stride, m_lo, Sq, s_layout, o_layout,
              HEAD_DIM)


@gluon.jit
def _pconsumer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
               out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr,
               LAYOUT: gl.constexpr, which: gl.constexpr):
    """The persistent grid's consumer (gluon_fwd._pconsumer's walk over work items) with the overlap."""
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BM: gl.constexpr = 64 * NUM_CONS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    BH = total // n_m
    q = q_smem.index(which)
    slot = 0
    it = 0
    for tile in range(gl.program_id(0), total, gl.num_programs(0)):
        start_m, bh = G._ptile(tile, n_m, BH, CAUSAL)
        m_lo = start_m * BM + which * 64
        n_tiles = G.kv_tiles(start_m, Sk, BM, BLOCK_N, CAUSAL)
        n_full = G.unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N, CAUSAL)
        mbarrier.wait(q_bar.index(which), it & 1)
        acc, m_i, l_i = _rows(q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, q_bar, which, m_lo, n_tiles,
                              n_full, slot, Sk, qk_scale, s_layout, o_layout, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, False,
                              q_desc.dtype)
        mbarrier.arrive(q_empty.index(which), count=1)  # Q was last read by the final S (waited in _rows)
        o_row, o_col = G.head_rc(bh, bh // H, bh % H, Sq, HEAD_DIM, LAYOUT & SEQ_O)
        G._finish(acc, m_i, l_i, out_ptr, lse_ptr, bh * Sq, o_row, o_col, G.row_len(H, HEAD_DIM, LAYOUT & SEQ_O), m_lo,
                  Sq, s_layout, o_layout, HEAD_DIM)
        slot += n_tiles
        it += 1


@gluon.jit
def attn_fwd_fa3_persistent_kernel(q_desc, k_desc, v_desc, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, BH,
                                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                                   CONSUMER_REGS: gl.constexpr, LAYOUT: gl.constexpr = 0):
    """gluon_fwd.attn_fwd_ws_persistent_kernel with the overlapped consumers (no ping-pong)."""
    NUM_CONS: gl.constexpr = 2
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BM: gl.constexpr = 64 * NUM_CONS
    n_m = gl.cdiv(Sq, BM)
    total = n_m * BH
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONS, 64, HEAD_DIM], q_desc.layout)
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = G.kv_ring(k_desc, v_desc, STAGES, NUM_CONS)
    q_bar = gl.allocate_shared_memory(gl.int64, [NUM_CONS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_CONS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NUM_CONS):
        mbarrier.init(q_bar.index(c), count=1)
        mbarrier.init(q_empty.index(c), count=1)
    gl.warp_specialize([
        (_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                      v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N, STAGES, CAUSAL,
                      NUM_CONS, LAYOUT, 0)),
        (_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                      v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N, STAGES, CAUSAL,
                      NUM_CONS, LAYOUT, 1)),
        (G._ploader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                      v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N, STAGES, CAUSAL,
                      NUM_CONS, LAYOUT, 0)),
    ], [4, 1], [CONSUMER_REGS, 24])


@gluon.jit
def attn_fwd_fa3_kernel(q_desc, k_desc, v_desc, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, HEAD_GROUP,
                        BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr, LAYOUT: gl.constexpr = 0,
                        THREE: gl.constexpr = False):
    """v5's grid and loader (no bias; two consumers, or THREE as v5's D = 64 config, without ping-pong)
    with the schedule above."""
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    NUM_CONS: gl.constexpr = 3 if THREE else 2
    gl.static_assert(not (THREE and PINGPONG), "the turn barriers (q_bar 2, 3) are for two consumers")
    BM: gl.constexpr = 64 * NUM_CONS
    start_m = gl.program_id(0)
    bh = gl.program_id(1)
    if CAUSAL:
        start_m, bh = G._lpt(HEAD_GROUP)
        start_m = gl.num_programs(0) - 1 - start_m
    off_b = bh // H
    off_h = bh % H
    q_row, q_col = G.head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_Q)
    q_row += start_m * BM
    bhk = off_b * (H // GROUP) + off_h // GROUP
    k_row, k_col = G.head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_K)
    v_row, v_col = G.head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_V)
    o_row, o_col = G.head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_O)
    o_stride = G.row_len(H, HEAD_DIM, LAYOUT & SEQ_O)
    lse_row = bh * Sq
    n_tiles = G.kv_tiles(start_m, Sk, BM, BLOCK_N, CAUSAL)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONS, 64, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [2 * NUM_CONS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2 * NUM_CONS):
        mbarrier.init(q_bar.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=NUM_CONS)
        mbarrier.init(v_empty.index(s), count=NUM_CONS)
    if THREE:
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty,
                         v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row,
                         o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                         BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False, 0)),
            (_consumer, (q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty,
                         v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row,
                         o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                         BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False, 1)),
            (_consumer, (q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty,
                         v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row,
                         o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                         BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False, 2)),
            (G._loader, (q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty,
                         v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row,
                         o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                         BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False, 0)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty,
                         v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row,
                         o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                         BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, PINGPONG, 0)),
            (_consumer, (q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty,
                         v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row,
                         o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                         BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, PINGPONG, 1)),
            (G._loader, (q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty,
                         v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row,
                         o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                         BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, PINGPONG, 0)),
        ], [4, 1], [CONSUMER_REGS, 24])


def fwd_fa3(q, k, v, causal, scale=None, pingpong=True, block_n=128, stages=2, regs=232, persistent=False,
            three=False):
    """out, lse of the schedule above (bf16 / fp16, D 64 / 128, head-major or sequence-major); ``persistent``:
    on v5's persistent grid (one CTA an SM; no ping-pong); ``three``: three consumers (192 query rows a CTA,
    160 registers each, as v5 at D = 64; no ping-pong)."""
    from tilewise.ops.attention import configs
    from tilewise.runtime import cuda as rt

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    lse = torch.empty(B, H, Sq, device=q.device, dtype=torch.float32)
    (q2, _), (k2, _), (v2, _) = (tma_view(t) for t in (q, k, v))
    qd, kd, vd = G._desc(q2, (64, D)), G._desc(k2, (block_n, D)), G._desc(v2, (block_n, D))
    layout = seq_mask(q=q, k=k, v=v, o=out)
    if persistent:
        grid = (min(rt.sm_count(q.get_device()), -(-Sq // 128) * B * H),)
        meta = dict(BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal), CONSUMER_REGS=regs, num_warps=4)
        if layout:
            meta["LAYOUT"] = layout
        attn_fwd_fa3_persistent_kernel[grid](qd, kd, vd, out, lse, H, H // Hkv, Sq, Sk, scale * G.LOG2E, B * H, **meta)
        return out, lse
    grid = (-(-Sq // (192 if three else 128)), B * H)
    group = configs.causal_head_group(grid[1], grid[0], rt.sm_count(q.get_device())) if causal else 1
    meta = dict(BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal), CONSUMER_REGS=160 if three else regs,
                PINGPONG=bool(pingpong) and not three, num_warps=4)
    if three:
        meta["THREE"] = True
    if layout:
        meta["LAYOUT"] = layout
    attn_fwd_fa3_kernel[grid](qd, kd, vd, out, lse, H, H // Hkv, Sq, Sk, scale * G.LOG2E, group, **meta)
    return out, lse


def compile_only():
    """sm_90 builds (no GPU): registers, spills, wgmma per variant."""
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

    def td(block):
        layout = gl.NVMMASharedLayout.get_default_for(list(block), gl.bfloat16)
        return f"tensordesc<bf16[{block[0]},{block[1]}],{layout!r}>"

    def build(kernel, sig, consts):
        k = triton.compile(GluonASTSource(kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
        return {"shared": k.metadata.shared, "hgmma": len(re.findall(r"\bHGMMA", sass)),
                "spills": len(re.findall(r"\b(LDL|STL)\b", sass))}

    out = {}
    for D in (64, 128):
        for causal in (False, True):
            for pingpong in (False, True):
                sig = {"q_desc": td([64, D]), "k_desc": td([128, D]), "v_desc": td([128, D]), "out_ptr": "*bf16",
                       "lse_ptr": "*fp32", "H": "i32", "GROUP": "i32", "Sq": "i32", "Sk": "i32", "qk_scale": "fp32",
                       "HEAD_GROUP": "i32", "BLOCK_N": "constexpr", "STAGES": "constexpr", "CAUSAL": "constexpr",
                       "CONSUMER_REGS": "constexpr", "PINGPONG": "constexpr", "LAYOUT": "constexpr",
                       "THREE": "constexpr"}
                consts = {"BLOCK_N": 128, "STAGES": 2, "CAUSAL": causal, "CONSUMER_REGS": 232, "PINGPONG": pingpong,
                          "LAYOUT": 0, "THREE": False}
                out[f"D{D}-causal{causal}-pingpong{pingpong}"] = build(attn_fwd_fa3_kernel, sig, consts)
            if D == 64:
                consts = {**consts, "CONSUMER_REGS": 160, "PINGPONG": False, "THREE": True}
                out[f"D64-causal{causal}-three"] = build(attn_fwd_fa3_kernel, sig, consts)
    for D in (64, 128):
        for causal in (False, True):
            sig = {"q_desc": td([64, D]), "k_desc": td([128, D]), "v_desc": td([128, D]), "out_ptr": "*bf16",
                   "lse_ptr": "*fp32", "H": "i32", "GROUP": "i32", "Sq": "i32", "Sk": "i32", "qk_scale": "fp32",
                   "BH": "i32", "BLOCK_N": "constexpr", "STAGES": "constexpr", "CAUSAL": "constexpr",
                   "CONSUMER_REGS": "constexpr", "LAYOUT": "constexpr"}
            consts = {"BLOCK_N": 128, "STAGES": 2, "CAUSAL": causal, "CONSUMER_REGS": 232, "LAYOUT": 0}
            out[f"persistent-D{D}-causal{causal}"] = build(attn_fwd_fa3_persistent_kernel, sig, consts)
    print(json.dumps(out, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    if a.compile_only:
        compile_only()
        return
    import triton
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tilewise.ops.attention import api as A

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")

    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):
        x @ x
    g = torch.Generator(device="cuda").manual_seed(0)
    for D in (128, 64):
        for S in (1024, 4096, 8192):
            B, H = 16384 // S, 16
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for causal in (False, True):
                ref = A.reference(q[:1, :2].float(), k[:1, :2].float(), v[:1, :2].float(), causal=causal)
                fns = {"v5": lambda: A.v5_flash2_ws(q, k, v, causal=causal),
                       "fa3_overlap": lambda: fwd_fa3(q, k, v, causal, pingpong=False)[0],
                       "fa3_pingpong": lambda: fwd_fa3(q, k, v, causal, pingpong=True)[0],
                       "fa3_persistent": lambda: fwd_fa3(q, k, v, causal, persistent=True)[0]}
                if D == 64:  # v5's D = 64 config has three consumers
                    fns["fa3_three"] = lambda: fwd_fa3(q, k, v, causal, three=True)[0]
                for name, fn in fns.items():
                    err = ((fn()[:1, :2].float() - ref).norm() / ref.norm()).item()
                    assert err < 2e-2, f"{name} D{D} S{S} causal={causal}: rel err {err:.3g}"

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                times = {"cudnn": bench(cudnn), **{n: bench(f) for n, f in fns.items()}}
                print(f"D{D} S{S} B{B} {'causal' if causal else 'plain'}: "
                      + ", ".join(f"{n} {t:.3f} ms ({times['cudnn'] / t:.3f}x cuDNN)" for n, t in times.items()),
                      flush=True)


if __name__ == "__main__":
    main()
