"""v5: a warp-specialized FlashAttention forward for Hopper, in Gluon (Triton's lower-level language).

The Triton forwards (v3, v4) run one instruction stream per warpgroup: a key tile's softmax and
its tensor-core products take turns, and Triton 3.6 does not warp-specialize on sm_90. Here each
CTA of 128 query rows is three partitions (``gl.warp_specialize``):

    loader     1 warp: TMA loads of Q (once), and of K, V (and the bias) tile by tile into a ring of
               STAGES shared-memory stages; a stage is refilled when both consumers released it.
    consumer 0 4 warps (the default partition): query rows 0-63 of the CTA.
    consumer 1 4 warps: rows 64-127.

A consumer runs S = Q K^T (wgmma, both operands in shared memory), adds the bias tile (read from shared memory), the
online softmax in registers (log2 domain, the scale folded into the exponent's FMA), then O += P V (wgmma, P from
registers), and releases the stage (mbarriers: ``k_empty`` after S and the bias are read, ``v_empty`` after P V).
The two consumers share nothing else, so they drift apart and the warp scheduler runs one's softmax beside the
other's products; register budgets move to the consumers (setmaxnreg: 24 for the loader).

Layouts: q, k, v and the output each head-major (B, H, S, D) or sequence-major (a (B, H, S, D) view of (B, S, H, D)
storage, as transformers passes them), read and written in place (``layout.py``; the LAYOUT constexpr, ``head_rc``).
The band kernel (``gluon_band.py``) runs this CTA over a window's tiles, head-major only.

Bounds as in v4: K / V rows past Sk (the next head's or, sequence-major, the next batch's rows, or TMA zero fill:
finite either way) are masked to -inf in the last key tile, so P V adds 0 x a finite value; Q rows past Sq compute
on those rows and are never stored (masked stores; O by TMA only for tiles inside Sq, ``_finish``). Causal: key tiles
up to the CTA's last row; each consumer masks keys after its rows (top-left aligned, key n <= query m, as the other
versions). GQA through the K / V head h // (H / Hkv).

The device functions the kernels share with the overlap, the band and v6 are in ``gluon_blocks.py`` (re-exported here).
Where it runs and how fast: docs/tuning/attention.md ("v5 forward routes", "v5 ping-pong", "v5 persistent grid").
"""

from __future__ import annotations

import torch

from ...runtime import cuda as rt
from . import configs
from .layout import SEQ_BITS, seq_mask, tma_view

try:  # Gluon ships with Triton >= 3.5; the module imports without it (callers check ``available``)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    # Triton 3.6 names the TMA load async_copy_global_to_shared; later versions async_load.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    from .gluon_items import lpt_block_head, persistent_item
    # the shared device functions, also read from here by the other kernels (``ag.head_rc``, ...)
    from .gluon_blocks import (fill_kv, head_rc, kv_head_row, kv_ring, kv_tiles, online_softmax,  # noqa: F401
                               release_stored_q, row_len, seq_span, unmasked_tiles)
    # LAYOUT's bits (layout.SEQ_BITS), visible inside the kernels
    SEQ_Q, SEQ_K, SEQ_V, SEQ_O, SEQ_DO, SEQ_DQ, SEQ_DK, SEQ_DV = (
        gl.constexpr(SEQ_BITS[n]) for n in ("q", "k", "v", "o", "do", "dq", "dk", "dv"))
    _GLUON = True
except Exception:  # noqa: BLE001 - an older Triton: v5 unavailable
    _GLUON = False

LOG2E = 1.4426950408889634
ROWS = 64  # query rows per consumer warpgroup (wgmma M is 64 a warpgroup)


def available() -> bool:
    return _GLUON


if _GLUON:

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty, v_ready,
                v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row, o_row, o_col,
                o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, HAS_BIAS: gl.constexpr,
                NUM_CONS: gl.constexpr, PINGPONG: gl.constexpr, which: gl.constexpr):
        for c in gl.static_range(NUM_CONS):
            mbarrier.expect(q_bar.index(c), q_desc.block_type.nbytes)
            _tma_load(q_desc, [q_row + c * 64, q_col], q_bar.index(c), q_smem.index(c))
        for j in range(n_tiles):
            s = j % STAGES
            ph = (j // STAGES) & 1
            # Empty barriers start with their previous phase complete: the first wait passes.
            mbarrier.wait(k_empty.index(s), ph ^ 1)
            if HAS_BIAS:
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes + NUM_CONS * b_desc.block_type.nbytes)
                for c in gl.static_range(NUM_CONS):
                    _tma_load(b_desc, [b_row + c * 64, j * BLOCK_N], k_ready.index(s),
                              b_smem.index(s * NUM_CONS + c))
            else:
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            _tma_load(k_desc, [k_row + j * BLOCK_N, k_col], k_ready.index(s), k_smem.index(s))
            mbarrier.wait(v_empty.index(s), ph ^ 1)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            _tma_load(v_desc, [v_row + j * BLOCK_N, v_col], v_ready.index(s), v_smem.index(s))

    @gluon.jit
    def _tile(j, slot, acc, m_i, l_i, q, k_smem, v_smem, b_smem, k_ready, k_empty, v_ready, v_empty, which, m_lo,
              Sk, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, HAS_BIAS: gl.constexpr, MASKED: gl.constexpr,
              NUM_CONS: gl.constexpr, PINGPONG: gl.constexpr, turn, FIRST: gl.constexpr,
              BAND: gl.constexpr = False, band_lo=0, band_hi=0, n_full=0):
        # Key tile j of the query tile; ``slot`` counts the ring's fills (j, or more in a persistent CTA).
        # BAND (with MASKED): keep key n for query m where band_lo <= n - m <= band_hi. MASKED 2: the
        # mask from tile n_full on, tested at run time (online_softmax).
        s = slot % STAGES
        ph = (slot // STAGES) & 1
        k_buf = k_smem.index(s)
        v_buf = v_smem.index(s)
        zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
        mbarrier.wait(k_ready.index(s), ph)
        if PINGPONG:  # the consumers take turns issuing their products (round robin)
            mbarrier.wait(turn.index(NUM_CONS + which), 0 ^ FIRST)
        t = warpgroup_mma(q, k_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(NUM_CONS + (which + 1) % NUM_CONS), count=1)
        t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
        if HAS_BIAS:
            b = b_smem.index(s * NUM_CONS + which).load(s_layout)
            fence_async_shared()  # the shared-memory read, ordered before the stage's next TMA fill
            t = gl.fma(b.to(gl.float32), 1.4426950408889634 / qk_scale, t)
        mbarrier.arrive(k_empty.index(s), count=1)
        p, alpha, m_new, l_i = online_softmax(t, j, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N, CAUSAL, MASKED,
                                              BAND, band_lo, band_hi, n_full)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_op = gl.convert_layout(p.to(v_buf.dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        mbarrier.wait(v_ready.index(s), ph)
        if PINGPONG:
            mbarrier.wait(turn.index(NUM_CONS + which), 1 ^ FIRST)
        acc = warpgroup_mma(p_op, v_buf, acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(NUM_CONS + (which + 1) % NUM_CONS), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(v_empty.index(s), count=1)
        return acc, m_new, l_i

    @gluon.jit
    def _consume(which: gl.constexpr, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                 out_ptr, lse_ptr, lse_row, o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                 HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                 HAS_BIAS: gl.constexpr, NUM_CONS: gl.constexpr, PINGPONG: gl.constexpr):
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        m_lo = start_m * (64 * NUM_CONS) + which * 64  # this consumer's first query row (within the head)
        # Key tiles [0, n_full) need no test; [n_full, n_tiles) the bounds (and causal) test.
        n_full = unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N, CAUSAL)
        q = q_smem.index(which)
        turn = q_bar  # with PINGPONG, entries NUM_CONS.. are the consumers' turn barriers
        FIRST: gl.constexpr = 1 if which == 0 else 0  # consumer 0's first wait passes (phase 1 starts complete)
        m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([64], gl.float32, layout=row_s)
        acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
        mbarrier.wait(q_bar.index(which), 0)
        for j in range(n_full):
            acc, m_i, l_i = _tile(j, j, acc, m_i, l_i, q, k_smem, v_smem, b_smem, k_ready, k_empty, v_ready,
                                  v_empty, which, m_lo, Sk, qk_scale, s_layout, o_layout, BLOCK_N, STAGES, CAUSAL,
                                  HAS_BIAS, False, NUM_CONS, PINGPONG, turn, FIRST)
        for j in range(n_full, n_tiles):
            acc, m_i, l_i = _tile(j, j, acc, m_i, l_i, q, k_smem, v_smem, b_smem, k_ready, k_empty, v_ready,
                                  v_empty, which, m_lo, Sk, qk_scale, s_layout, o_layout, BLOCK_N, STAGES, CAUSAL,
                                  HAS_BIAS, True, NUM_CONS, PINGPONG, turn, FIRST)
        _finish(acc, m_i, l_i, out_ptr, lse_ptr, lse_row, o_row, o_col, o_stride, m_lo, Sq, s_layout, o_layout,
                HEAD_DIM)

    @gluon.jit
    def _finish(acc, m_i, l_i, out_ptr, lse_ptr, lse_row, o_row, o_col, o_stride, m_lo, Sq, s_layout: gl.constexpr,
                o_layout: gl.constexpr, HEAD_DIM: gl.constexpr, o_desc=0, o_smem=0, TMA_O: gl.constexpr = False):
        """O = acc / l and the log-sum-exp of a consumer's 64 rows, stored where the row < Sq: the log-sum-exp from
        row ``lse_row`` of the (B * H * Sq) rows, O from row ``o_row``, column ``o_col`` of its 2-D view, rows
        ``o_stride`` apart (``head_rc``, ``row_len``). TMA_O: O through ``o_smem`` and one TMA store (``o_desc``,
        64-row blocks) where all 64 rows are in bounds, then the log-sum-exp; ``release_stored_q`` frees o_smem."""
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        empty = l_i == 0.0  # every key masked: output 0, log-sum-exp -inf
        l_div = gl.where(empty, 1.0, l_i)
        out = acc / gl.convert_layout(l_div, row_o)[:, None]
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_div)) * 0.6931471805599453)
        rows = m_lo + gl.arange(0, 64, layout=row_s)
        if not TMA_O:  # else after O's TMA store: the fence before it would wait for these stores
            gl.store(lse_ptr + lse_row + rows, lse, mask=rows < Sq)
        rows_o = m_lo + gl.arange(0, 64, layout=row_o)
        cols = o_col + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        ptrs = out_ptr + ((o_row + rows_o).to(gl.int64) * o_stride)[:, None] + cols[None, :]
        if TMA_O:  # 32 4-byte stores a thread stalled the next item's softmax (their registers, the LSU queue)
            if m_lo + 64 <= Sq:
                o_smem.store(out.to(out_ptr.dtype.element_ty))
                fence_async_shared()
                _tma_store(o_desc, [o_row + m_lo, o_col], o_smem)
            else:
                gl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=(rows_o < Sq)[:, None])
            gl.store(lse_ptr + lse_row + rows, lse, mask=rows < Sq)
        else:
            gl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=(rows_o < Sq)[:, None])

    @gluon.jit
    def _consumer(q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty, v_ready,
                  v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row, o_row, o_col,
                  o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, HAS_BIAS: gl.constexpr,
                  NUM_CONS: gl.constexpr, PINGPONG: gl.constexpr, which: gl.constexpr):
        _consume(which, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty, v_ready, v_empty, out_ptr, lse_ptr,
                 lse_row, o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale, q_desc.block_type.shape[1],
                 BLOCK_N, STAGES, CAUSAL, HAS_BIAS, NUM_CONS, PINGPONG)

    @gluon.jit
    def attn_fwd_ws_kernel(q_desc, k_desc, v_desc, b_desc, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale,
                           bias_rows_b, bias_rows_h, HEAD_GROUP,
                           BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                           HAS_BIAS: gl.constexpr, CONSUMER_REGS: gl.constexpr, NUM_CONS: gl.constexpr = 2,
                           BATCH_FASTEST: gl.constexpr = False, PINGPONG: gl.constexpr = False,
                           LAYOUT: gl.constexpr = 0):
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        start_m = gl.program_id(0)
        bh = gl.program_id(1)
        if CAUSAL:  # the longest rows first: a head group's last rows, then the ones before, ...
            start_m, bh = lpt_block_head(HEAD_GROUP)
            start_m = gl.num_programs(0) - 1 - start_m
        if BATCH_FASTEST:  # a bias shared by the batch: the B programs reading one bias tile run together
            nb = gl.num_programs(1) // H
            off_b = bh % nb
            off_h = bh // nb
            bh = off_b * H + off_h
        else:
            off_b = bh // H
            off_h = bh % H
        # Rows and columns in each tensor's 2-D view (head_rc; head-major as before). The log-sum-exp is head-major.
        q_row, q_col = head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_Q)
        q_row += start_m * BM
        bhk = off_b * (H // GROUP) + off_h // GROUP  # the K / V head (GQA)
        k_row, k_col = head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_K)
        v_row, v_col = head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_V)
        o_row, o_col = head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_O)
        o_stride = row_len(H, HEAD_DIM, LAYOUT & SEQ_O)
        lse_row = bh * Sq
        b_row = off_b * bias_rows_b + off_h * bias_rows_h + start_m * BM
        n_tiles = kv_tiles(start_m, Sk, BM, BLOCK_N, CAUSAL)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONS, 64, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        if HAS_BIAS:
            b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES * NUM_CONS, 64, BLOCK_N], b_desc.layout)
        else:
            b_smem = q_smem  # unused
        # Q barriers, then (PINGPONG) one turn barrier per consumer.
        NBAR: gl.constexpr = 2 * NUM_CONS if PINGPONG else NUM_CONS
        q_bar = gl.allocate_shared_memory(gl.int64, [NBAR, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(NBAR):
            mbarrier.init(q_bar.index(c), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(s), count=1)
            mbarrier.init(v_ready.index(s), count=1)
            mbarrier.init(k_empty.index(s), count=NUM_CONS)  # every consumer releases a stage
            mbarrier.init(v_empty.index(s), count=NUM_CONS)
        # The argument tuples are spelled out in the call (a tuple bound to a name first would turn its
        # constexprs into values); the last one is the consumer's index (the loader ignores it).
        if NUM_CONS == 2:
            gl.warp_specialize([
                (_consumer, (q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty,
                  v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row,
                  o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                  BLOCK_N, STAGES, CAUSAL, HAS_BIAS, NUM_CONS, PINGPONG, 0)),
                (_consumer, (q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty,
                  v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row,
                  o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                  BLOCK_N, STAGES, CAUSAL, HAS_BIAS, NUM_CONS, PINGPONG, 1)),
                (_loader, (q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty,
                  v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row,
                  o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                  BLOCK_N, STAGES, CAUSAL, HAS_BIAS, NUM_CONS, PINGPONG, 0)),
            ], [4, 1], [CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([
                (_consumer, (q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty,
                  v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row,
                  o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                  BLOCK_N, STAGES, CAUSAL, HAS_BIAS, NUM_CONS, PINGPONG, 0)),
                (_consumer, (q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty,
                  v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row,
                  o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                  BLOCK_N, STAGES, CAUSAL, HAS_BIAS, NUM_CONS, PINGPONG, 1)),
                (_consumer, (q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty,
                  v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row,
                  o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                  BLOCK_N, STAGES, CAUSAL, HAS_BIAS, NUM_CONS, PINGPONG, 2)),
                (_loader, (q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready, k_empty,
                  v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, b_row, lse_row,
                  o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                  BLOCK_N, STAGES, CAUSAL, HAS_BIAS, NUM_CONS, PINGPONG, 0)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


if _GLUON:

    @gluon.jit
    def _pload_item(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                    v_empty, q_row, q_col, k_row, k_col, v_row, v_col, n_tiles, slot, it, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, NUM_CONS: gl.constexpr, QB: gl.constexpr):
        """One work item's loads: its Q tiles (a buffer a consumer, freed by the item QB items back), then its
        key tiles into the ring's fills slot .. slot + n_tiles - 1."""
        for c in gl.static_range(NUM_CONS):  # Q buffer b was freed by the work item QB items back
            b = (it % QB) * NUM_CONS + c
            mbarrier.wait(q_empty.index(b), ((it // QB) & 1) ^ 1)
            mbarrier.expect(q_bar.index(b), q_desc.block_type.nbytes)
            _tma_load(q_desc, [q_row + c * 64, q_col], q_bar.index(b), q_smem.index(b))
        fill_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, k_row, k_col, v_row, v_col,
                n_tiles, slot, BLOCK_N, STAGES)

    @gluon.jit
    def _ploader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                 v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr,
                 LAYOUT: gl.constexpr, which: gl.constexpr, cu_q=None, cu_k=None, VARLEN: gl.constexpr = False):
        """The persistent loader. VARLEN: packed sequences (``seq_span``), an item past its sequence's queries
        skipped (as by the consumers, so both count the same ring fills and Q buffers)."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        QB: gl.constexpr = q_smem.shape[0] // NUM_CONS  # Q buffers a consumer (the kernel's Q_BUFS)
        BH = total // n_m
        slot = 0
        it = 0
        for tile in range(gl.program_id(0), total, gl.num_programs(0)):
            start_m, bh = persistent_item(tile, n_m, BH, CAUSAL)
            off_b = bh // H
            off_h = bh % H
            if VARLEN:  # rows of the (total, heads x D) views; the lengths bound the item
                q0, sq, k0, sk = seq_span(cu_q, cu_k, off_b)
                if start_m * BM < sq:
                    n_tiles = kv_tiles(start_m, sk, BM, BLOCK_N, CAUSAL)
                    kv_col = (off_h // GROUP) * HEAD_DIM
                    _pload_item(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                                v_ready, v_empty, q0 + start_m * BM, off_h * HEAD_DIM, k0, kv_col, k0, kv_col,
                                n_tiles, slot, it, BLOCK_N, STAGES, NUM_CONS, QB)
                    slot += n_tiles
                    it += 1
            else:
                q_row, q_col = head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_Q)
                q_row += start_m * BM
                bhk = off_b * (H // GROUP) + off_h // GROUP  # the K / V head (GQA)
                k_row, k_col = head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_K)
                v_row, v_col = head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_V)
                n_tiles = kv_tiles(start_m, Sk, BM, BLOCK_N, CAUSAL)
                _pload_item(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                            v_ready, v_empty, q_row, q_col, k_row, k_col, v_row, v_col, n_tiles, slot, it, BLOCK_N,
                            STAGES, NUM_CONS, QB)
                slot += n_tiles
                it += 1
        return slot  # the ring's fills (``_chain_ploader``'s spare goes next)

    @gluon.jit
    def _pconsume_item(q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, out_ptr, lse_ptr,
                       H, Sq, Sk, qk_scale, start_m, bh, slot, it, s_layout: gl.constexpr, o_layout: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr,
                       LAYOUT: gl.constexpr, which: gl.constexpr, o_desc, TMA_O: gl.constexpr, QB: gl.constexpr,
                       HEAD_DIM: gl.constexpr, q0=0, TQ=0, VARLEN: gl.constexpr = False):
        """A consumer's work item ``it`` (query tile ``start_m`` of ``bh``, Sq / Sk its lengths); returns its key
        tiles. VARLEN: a packed sequence's item, from row ``q0`` of the (total, heads x D) views, its log-sum-exp in
        the (heads, TQ) rows."""
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        BM: gl.constexpr = 64 * NUM_CONS
        b = (it % QB) * NUM_CONS + which
        q = q_smem.index(b)
        m_lo = start_m * BM + which * 64
        if TMA_O:  # O by TMA through the item's Q buffer: the item before's goes back at this one's start
            gl.static_assert(QB == 2, "TMA_O: two Q buffers")
            if it > 0:
                release_stored_q(q_empty, ((it - 1) % QB) * NUM_CONS + which)
        n_tiles = kv_tiles(start_m, Sk, BM, BLOCK_N, CAUSAL)
        n_full = unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N, CAUSAL)
        m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([64], gl.float32, layout=row_s)
        acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
        mbarrier.wait(q_bar.index(b), (it // QB) & 1)
        if QB == 1:
            for j in range(n_full):
                acc, m_i, l_i = _tile(j, slot + j, acc, m_i, l_i, q, k_smem, v_smem, q_smem, k_ready, k_empty,
                                      v_ready, v_empty, which, m_lo, Sk, qk_scale, s_layout, o_layout, BLOCK_N,
                                      STAGES, CAUSAL, False, False, NUM_CONS, False, q_bar, 0)
            for j in range(n_full, n_tiles):
                acc, m_i, l_i = _tile(j, slot + j, acc, m_i, l_i, q, k_smem, v_smem, q_smem, k_ready, k_empty,
                                      v_ready, v_empty, which, m_lo, Sk, qk_scale, s_layout, o_layout, BLOCK_N,
                                      STAGES, CAUSAL, False, True, NUM_CONS, False, q_bar, 0)
        else:
            # One loop and one copy of the tile's products, the mask a branch inside (MASKED 2): with two
            # copies (two loops, or a branch around two _tile calls) ptxas (Triton 3.6) computed a
            # descriptor in one copy only and the other read it stale (Q's, then V's; compute-sanitizer:
            # shared reads out of bounds), which the one buffer's constant Q address had hidden.
            for j in range(n_tiles):
                acc, m_i, l_i = _tile(j, slot + j, acc, m_i, l_i, q, k_smem, v_smem, q_smem, k_ready, k_empty,
                                      v_ready, v_empty, which, m_lo, Sk, qk_scale, s_layout, o_layout, BLOCK_N,
                                      STAGES, CAUSAL, False, 2, NUM_CONS, False, q_bar, 0, n_full=n_full)
        if not TMA_O:  # Q was last read by the final S = Q K^T, waited on inside _tile: the loader may refill it
            mbarrier.arrive(q_empty.index(b), count=1)
        if VARLEN:
            h = bh % H
            _finish(acc, m_i, l_i, out_ptr, lse_ptr, h * TQ + q0, q0, h * HEAD_DIM, H * HEAD_DIM, m_lo, Sq, s_layout,
                    o_layout, HEAD_DIM, o_desc, q, TMA_O)
        else:
            o_row, o_col = head_rc(bh, bh // H, bh % H, Sq, HEAD_DIM, LAYOUT & SEQ_O)
            _finish(acc, m_i, l_i, out_ptr, lse_ptr, bh * Sq, o_row, o_col, row_len(H, HEAD_DIM, LAYOUT & SEQ_O), m_lo,
                    Sq, s_layout, o_layout, HEAD_DIM, o_desc, q, TMA_O)
        return n_tiles

    @gluon.jit
    def _pconsumer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                   v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr,
                   LAYOUT: gl.constexpr, which: gl.constexpr, o_desc=None, TMA_O: gl.constexpr = False, cu_q=None,
                   cu_k=None, TQ=None, VARLEN: gl.constexpr = False):
        """A persistent consumer: its 64 rows of each work item (``_pconsume_item``). VARLEN: packed sequences, an
        item past its sequence's queries skipped (as by ``_ploader``)."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        QB: gl.constexpr = q_smem.shape[0] // NUM_CONS
        BH = total // n_m
        slot = 0
        it = 0
        for tile in range(gl.program_id(0), total, gl.num_programs(0)):
            start_m, bh = persistent_item(tile, n_m, BH, CAUSAL)
            if VARLEN:
                q0, sq, k0, sk = seq_span(cu_q, cu_k, bh // H)
                if start_m * BM < sq:
                    slot += _pconsume_item(q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                                           v_empty, out_ptr, lse_ptr, H, sq, sk, qk_scale, start_m, bh, slot, it,
                                           s_layout, o_layout, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, which,
                                           o_desc, TMA_O, QB, HEAD_DIM, q0, TQ, True)
                    it += 1
            else:
                slot += _pconsume_item(q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
                                       out_ptr, lse_ptr, H, Sq, Sk, qk_scale, start_m, bh, slot, it, s_layout,
                                       o_layout, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, which, o_desc, TMA_O, QB,
                                       HEAD_DIM)
                it += 1
        if TMA_O:  # the last store reads shared memory the CTA gives up at exit
            tma.store_wait(0)

    @gluon.jit
    def chain_item_end(acc, p_op, m_i, l_i, last, slot, it, tile, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                       v_empty, out_ptr, lse_ptr, H, Sq, n_m, BH, bh, m_lo, zero, s_layout: gl.constexpr,
                       o_layout: gl.constexpr, STAGES: gl.constexpr, NUM_CONS: gl.constexpr, LAYOUT: gl.constexpr,
                       which: gl.constexpr, CAUSAL: gl.constexpr = False, o_desc=0, b_done=0,
                       TMA_O: gl.constexpr = False):
        """A chained consumer's item end: the last key tile's P V (ring fill ``last``) issued with the next
        item's S_0 (fill ``slot``, item ``it``'s Q buffer: past the last item, the loader's spare), the item's
        epilogue while S_0 runs. Returns (S_0, waited; its Q buffer; the next item's batch x head and first
        row). TMA_O: O stored through the finished item's Q buffer ``b_done`` (``_finish``)."""
        HEAD_DIM: gl.constexpr = q_smem.shape[2]
        QB: gl.constexpr = q_smem.shape[0] // NUM_CONS
        sl = last % STAGES
        mbarrier.wait(v_ready.index(sl), (last // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(sl), acc, is_async=True)
        b = (it % QB) * NUM_CONS + which
        s0 = slot % STAGES
        mbarrier.wait(q_bar.index(b), (it // QB) & 1)
        mbarrier.wait(k_ready.index(s0), (slot // STAGES) & 1)
        t = warpgroup_mma(q_smem.index(b), k_smem.index(s0).permute((1, 0)), zero, use_acc=False, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=1, deps=(acc, p_op))  # P V (issued first) done
        mbarrier.arrive(v_empty.index(sl), count=1)
        o_row, o_col = head_rc(bh, bh // H, bh % H, Sq, HEAD_DIM, LAYOUT & SEQ_O)
        _finish(acc, m_i, l_i, out_ptr, lse_ptr, bh * Sq, o_row, o_col, row_len(H, HEAD_DIM, LAYOUT & SEQ_O), m_lo, Sq,
                s_layout, o_layout, HEAD_DIM, o_desc, q_smem.index(b_done), TMA_O)
        start_m, bh = persistent_item(tile + gl.num_programs(0), n_m, BH, CAUSAL)  # past the last: rows no one stores
        t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
        return t, b, bh, start_m * (64 * NUM_CONS) + which * 64

    @gluon.jit
    def _chain_pconsumer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                         v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr,
                         LAYOUT: gl.constexpr, which: gl.constexpr):
        """``_pconsumer`` with its items chained (no causal, two Q buffers): tile j's P V issued with tile j + 1's
        S (an item's last with the next item's S_0: ``chain_item_end``), both waited before the softmax; bitwise
        ``_tile``'s. Past the last item, the loader's spare tiles (``_chain_ploader``): no branch around products."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        BH = total // n_m
        nprog = gl.num_programs(0)
        zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
        n_tiles = kv_tiles(0, Sk, BM, BLOCK_N, False)  # every item's, without causal
        start_m, bh = persistent_item(gl.program_id(0), n_m, BH, False)
        m_lo = start_m * BM + which * 64
        b = which  # item 0's Q buffer
        mbarrier.wait(q_bar.index(b), 0)
        mbarrier.wait(k_ready.index(0), 0)
        t = warpgroup_mma(q_smem.index(b), k_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
        t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
        slot = 0
        it = 0
        for tile in range(gl.program_id(0), total, nprog):
            n_full = unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N, False)
            m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
            l_i = gl.zeros([64], gl.float32, layout=row_s)
            acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
            for j in range(n_tiles - 1):  # tile j's S is in t, waited
                r = slot + j
                s = r % STAGES
                mbarrier.arrive(k_empty.index(s), count=1)
                p, alpha, m_i, l_i = online_softmax(t, j, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N, False,
                                                    2, n_full=n_full)
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
                mbarrier.wait(v_ready.index(s), (r // STAGES) & 1)
                acc = warpgroup_mma(p_op, v_smem.index(s), acc, is_async=True)
                s1 = (r + 1) % STAGES
                mbarrier.wait(k_ready.index(s1), ((r + 1) // STAGES) & 1)
                t = warpgroup_mma(q_smem.index(b), k_smem.index(s1).permute((1, 0)), zero, use_acc=False,
                                  is_async=True)
                acc, p_op = warpgroup_mma_wait(num_outstanding=1, deps=(acc, p_op))  # P V (issued first) done
                mbarrier.arrive(v_empty.index(s), count=1)
                t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
            mbarrier.arrive(q_empty.index(b), count=1)  # Q's last S was waited on
            last = slot + n_tiles - 1
            sl = last % STAGES
            mbarrier.arrive(k_empty.index(sl), count=1)
            p, alpha, m_i, l_i = online_softmax(t, n_tiles - 1, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N,
                                                False, 2, n_full=n_full)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
            it += 1
            slot += n_tiles
            t, b, bh, m_lo = chain_item_end(acc, p_op, m_i, l_i, last, slot, it, tile, q_smem, k_smem, v_smem, q_bar,
                                            k_ready, v_ready, v_empty, out_ptr, lse_ptr, H, Sq, n_m, BH, bh, m_lo,
                                            zero, s_layout, o_layout, STAGES, NUM_CONS, LAYOUT, which)

    @gluon.jit
    def _chain_ploader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                       v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr,
                       LAYOUT: gl.constexpr, which: gl.constexpr):
        """``_ploader``'s walk, then a spare Q tile a consumer and one K tile (rows 0, in bounds) in the next
        buffer and ring fill, read by a chained consumer's S_0 after its last item (``_chain_pconsumer``s)."""
        slot = _ploader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                        v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N, STAGES, CAUSAL,
                        NUM_CONS, LAYOUT, which)  # the ring's fills so far
        QB: gl.constexpr = q_smem.shape[0] // NUM_CONS
        it = gl.cdiv(total - gl.program_id(0), gl.num_programs(0))  # items this CTA walked
        slot = slot if CAUSAL else it * kv_tiles(0, Sk, 64 * NUM_CONS, BLOCK_N, False)  # (the measured build's)
        for c in gl.static_range(NUM_CONS):
            b = (it % QB) * NUM_CONS + c
            mbarrier.wait(q_empty.index(b), ((it // QB) & 1) ^ 1)
            mbarrier.expect(q_bar.index(b), q_desc.block_type.nbytes)
            _tma_load(q_desc, [0, 0], q_bar.index(b), q_smem.index(b))
        s = slot % STAGES
        mbarrier.wait(k_empty.index(s), ((slot // STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        _tma_load(k_desc, [0, 0], k_ready.index(s), k_smem.index(s))

    @gluon.jit
    def attn_fwd_ws_persistent_kernel(q_desc, k_desc, v_desc, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, BH,
                                      o_desc, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                                      CONSUMER_REGS: gl.constexpr, NUM_CONS: gl.constexpr = 2,
                                      LAYOUT: gl.constexpr = 0, Q_BUFS: gl.constexpr = 1, CHAIN: gl.constexpr = False,
                                      TMA_O: gl.constexpr = False, cu_q=None, cu_k=None, TQ=None,
                                      VARLEN: gl.constexpr = False):
        """v5 with a persistent grid (one CTA an SM, work items of 64 x NUM_CONS query rows handed out
        round robin; BH = B x H): the K / V ring runs on across work items, so the next item's K / V loads
        overlap this item's last products and epilogue. No bias; two or three consumers (D = 64's v5
        config). Q_BUFS 2: the next item's Q loads early too (a second Q buffer). CHAIN (two buffers, no causal):
        the items chained (``_chain_pconsumer``). Work items: ``persistent_item``. TMA_O (two buffers, not
        chained): O stored by TMA (``o_desc``, else None; positional, so a call plan rebuilds it for each output).
        VARLEN (not chained): packed sequences, q / out (total_q, H, D) and k / v (total_k, Hkv, D) as sequence-major
        views of one batch, B = ``BH`` / H sequences of at most Sq queries (``cu_q`` / ``cu_k``: their int32
        offsets), the log-sum-exp (H, ``TQ``); items past a sequence's queries are skipped."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        gl.static_assert(NUM_CONS == 2 or NUM_CONS == 3, "two or three consumer warpgroups")
        n_m = gl.cdiv(Sq, BM)
        total = n_m * BH  # work items: query tiles x (batch x head)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [Q_BUFS * NUM_CONS, 64, HEAD_DIM], q_desc.layout)
        k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = kv_ring(k_desc, v_desc, STAGES, NUM_CONS)
        q_bar = gl.allocate_shared_memory(gl.int64, [Q_BUFS * NUM_CONS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFS * NUM_CONS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(Q_BUFS * NUM_CONS):
            mbarrier.init(q_bar.index(c), count=1)
            mbarrier.init(q_empty.index(c), count=1)
        if CHAIN:
            gl.static_assert(Q_BUFS == 2 and not CAUSAL and not TMA_O and not VARLEN,
                             "CHAIN: two Q buffers, no causal, TMA_O or VARLEN")
            if NUM_CONS == 2:
                gl.warp_specialize([
                    (_chain_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                        k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                        total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, 0)),
                    (_chain_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                        k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                        total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, 1)),
                    (_chain_ploader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                      k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                      total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, 0)),
                ], [4, 1], [CONSUMER_REGS, 24])
            else:
                gl.warp_specialize([
                    (_chain_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                        k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                        total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, 0)),
                    (_chain_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                        k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                        total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, 1)),
                    (_chain_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                        k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                        total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, 2)),
                    (_chain_ploader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                      k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                      total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, 0)),
                ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
        elif NUM_CONS == 2:
            gl.warp_specialize([
                (_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                              v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N,
                              STAGES, CAUSAL, NUM_CONS, LAYOUT, 0, o_desc, TMA_O, cu_q, cu_k, TQ, VARLEN)),
                (_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                              v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N,
                              STAGES, CAUSAL, NUM_CONS, LAYOUT, 1, o_desc, TMA_O, cu_q, cu_k, TQ, VARLEN)),
                (_ploader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                            v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N,
                            STAGES, CAUSAL, NUM_CONS, LAYOUT, 0, cu_q, cu_k, VARLEN)),
            ], [4, 1], [CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([
                (_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                              v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N,
                              STAGES, CAUSAL, NUM_CONS, LAYOUT, 0, o_desc, TMA_O, cu_q, cu_k, TQ, VARLEN)),
                (_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                              v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N,
                              STAGES, CAUSAL, NUM_CONS, LAYOUT, 1, o_desc, TMA_O, cu_q, cu_k, TQ, VARLEN)),
                (_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                              v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N,
                              STAGES, CAUSAL, NUM_CONS, LAYOUT, 2, o_desc, TMA_O, cu_q, cu_k, TQ, VARLEN)),
                (_ploader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                            v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N,
                            STAGES, CAUSAL, NUM_CONS, LAYOUT, 0, cu_q, cu_k, VARLEN)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


def _gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


_LAYOUTS: dict = {}


def _desc(t2: torch.Tensor, block, memo: dict | None = None):
    """Gluon's host TMA descriptor of the 2-D ``t2`` with ``block``. The shared-memory layout is
    built once per (block, dtype) (``get_default_for`` was ~6 of a descriptor's ~10 us of host
    time); ``memo`` (one call's dict) hands back the descriptor already built for the same tensor
    and block, so the backward's two kernels share their Q / dO / K / V descriptors."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    shape, strides, blk = tuple(t2.shape), tuple(t2.stride()), tuple(block)
    key = (t2.data_ptr(), shape, strides, t2.dtype, blk)
    if memo is not None and key in memo:
        return memo[key]
    layout = _LAYOUTS.get((blk, t2.dtype))
    if layout is None:
        layout = _LAYOUTS[(blk, t2.dtype)] = gl.NVMMASharedLayout.get_default_for(list(blk), _gl_dtype(t2.dtype))
    d = TensorDescriptor(t2, list(shape), list(strides), list(blk), layout)
    if memo is not None:
        memo[key] = d
    return d


def run(kernel, grid, args, meta, launch=None):
    """``kernel[grid](*args, **meta)`` through ``launch`` (the project's Triton launcher) when
    given, else through Triton's own dispatch."""
    if launch is None:
        kernel[grid](*args, **meta)
    else:
        launch(kernel, grid, *args, **meta)


def fwd(q, k, v, causal, scale, out, lse, bias=None, bias_strides=None, launch=None, config=None,
        persistent=False, pingpong=False, head_group=None, q_buffers=1, chain=None, tma_out=None):
    """The forward into ``out`` (q's shape) and ``lse`` (B, H, Sq) fp32. q, k, v and out each head-major or
    sequence-major (``layout.rows``: read and written in place); the caller checks the layouts
    (``api._ws_applies``). ``launch``: the project's Triton launcher (runtime.triton_launch.launch); default
    Triton's own dispatch. ``config``: (BLOCK_N, STAGES, consumer registers, maxnreg or None, consumers: 2 or 3),
    default ``configs.ws_fwd_config``'s. ``persistent``: the persistent grid where it applies (no bias, no maxnreg,
    no ping-pong; two or three consumers), with ``q_buffers`` Q buffers a consumer (2: the next item's Q loads
    during this one); ``chain``: its work items chained (``_chain_pconsumer``: two buffers, no causal), by default
    wherever that holds with ``configs.WS_CHAIN_CONSUMERS`` (bitwise equal to the unchained kernel); ``False``:
    apart. ``tma_out``: O stored by TMA through the item's Q buffer, by default wherever it holds (two buffers,
    not chained; 1.01-1.15x its 4-byte stores on an H100, tuning: "O by TMA on every persistent kernel").
    ``pingpong``: the consumers take turns issuing their products. ``head_group``: the causal grid's launch order
    (``lpt_block_head``: heads a group, a divisor of B x H; 1 is head by head), default
    ``configs.causal_head_group``'s."""
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    bn, stages, regs, maxnreg, ncons = configs.ws_fwd_config(D, bias is not None, config)
    (q2, _), (k2, _), (v2, _) = (tma_view(t) for t in (q, k, v))
    qd, kd, vd = _desc(q2, (ROWS, D)), _desc(k2, (bn, D)), _desc(v2, (bn, D))
    layout = seq_mask(q=q, k=k, v=v, o=out)
    rows_b = rows_h = 0
    batch_fastest = False
    if bias is not None:
        b2 = bias.reshape(-1, Sk)
        bd = _desc(b2, (ROWS, bn))
        rows_b, rows_h = bias_strides[0] // Sk, bias_strides[1] // Sk
        batch_fastest = B > 1 and rows_b == 0
    else:
        bd = qd  # unused
    on_persistent = bias is None and maxnreg is None and not pingpong and persistent
    if chain and not (on_persistent and q_buffers == 2 and not causal):
        raise ValueError("chain: needs persistent=True (no bias, maxnreg or ping-pong), q_buffers=2, no causal")
    if tma_out and not (on_persistent and q_buffers == 2 and not chain):
        raise ValueError("tma_out: needs persistent=True (no bias, maxnreg or ping-pong), q_buffers=2, chain=False")
    if on_persistent:
        if chain is None:
            chain = q_buffers == 2 and not causal and ncons in configs.WS_CHAIN_CONSUMERS and not tma_out
        tma_out = q_buffers == 2 and not chain if tma_out is None else tma_out
        total = -(-Sq // (ROWS * ncons)) * B * H
        grid = (min(rt.sm_count(q.get_device()), total),)
        od = _desc(tma_view(out)[0], (ROWS, D)) if tma_out else None
        args = (qd, kd, vd, out, lse, H, H // Hkv, Sq, Sk, scale * LOG2E, B * H, od)
        meta = dict(BLOCK_N=bn, STAGES=stages, CAUSAL=bool(causal), CONSUMER_REGS=regs, NUM_CONS=ncons, num_warps=4,
                    **({"TMA_O": True} if tma_out else {}), **({"CHAIN": True} if chain else {}))
        if layout:
            meta["LAYOUT"] = layout
        if q_buffers != 1:  # the default build's launch stays as it was
            meta["Q_BUFS"] = q_buffers
        run(attn_fwd_ws_persistent_kernel, grid, args, meta, launch)
        return out, lse
    grid = (-(-Sq // (ROWS * ncons)), B * H)
    group = head_group or (configs.causal_head_group(grid[1], grid[0], rt.sm_count(q.get_device())) if causal else 1)
    if grid[1] % group:
        raise ValueError(f"gluon_fwd.fwd: head_group {group} must divide B x H = {grid[1]}")
    args = (qd, kd, vd, bd, out, lse, H, H // Hkv, Sq, Sk, scale * LOG2E, rows_b, rows_h, group)
    meta = dict(BLOCK_N=bn, STAGES=stages, CAUSAL=bool(causal), HAS_BIAS=bias is not None,
                CONSUMER_REGS=regs, NUM_CONS=ncons, BATCH_FASTEST=batch_fastest, PINGPONG=bool(pingpong), num_warps=4)
    if layout:
        meta["LAYOUT"] = layout
    if maxnreg is not None:
        meta["maxnreg"] = maxnreg
    run(attn_fwd_ws_kernel, grid, args, meta, launch)
    return out, lse


def fwd_varlen(q, k, v, cu_q, cu_k, max_q, causal, scale, out, lse, config=None, tma_out=True):
    """v5's persistent forward over packed sequences (``varlen``): q / out (total_q, H, D) and k / v (total_k, Hkv,
    D), each of them what ``layout.rows`` reads as its (1, H, total, D) view; ``cu_q`` / ``cu_k`` the B + 1 int32
    offsets; into ``out`` and ``lse`` (H, total_q) fp32. Two Q buffers a consumer, O by TMA (``tma_out``); a
    config with maxnreg (the grid kernel's) is refused. Items: ceil(max_q / rows an item) a sequence and head, those
    past a sequence's queries skipped in the kernel. Triton's own dispatch (the project's launcher keys tensor
    keyword arguments by identity)."""
    TQ, H, D = q.shape
    Hkv = k.shape[1]
    bn, stages, regs, maxnreg, ncons = configs.ws_fwd_config(D, False, config)
    if maxnreg is not None:
        raise ValueError(f"gluon_fwd.fwd_varlen: config {config} has a maxnreg: the persistent kernel takes none")
    views = [tma_view(t.unsqueeze(0).transpose(1, 2)) for t in (q, k, v, out)]
    if any(x is None for x in views):
        raise ValueError("gluon_fwd.fwd_varlen: q, k, v and out need unit stride in D, rows (total, heads x D) "
                         "with 16-byte aligned starts")
    qd, kd, vd = _desc(views[0][0], (ROWS, D)), _desc(views[1][0], (bn, D)), _desc(views[2][0], (bn, D))
    od = _desc(views[3][0], (ROWS, D)) if tma_out else None
    nseq = cu_q.numel() - 1
    total = -(-max_q // (ROWS * ncons)) * nseq * H
    grid = (min(rt.sm_count(q.get_device()), total),)
    args = (qd, kd, vd, out, lse, H, H // Hkv, max_q, 0, scale * LOG2E, nseq * H, od)
    # (LAYOUT stays 0: with VARLEN the rows come from the offsets, heads x D elements apart)
    meta = dict(BLOCK_N=bn, STAGES=stages, CAUSAL=bool(causal), CONSUMER_REGS=regs, NUM_CONS=ncons, num_warps=4,
                Q_BUFS=2, VARLEN=True, cu_q=cu_q, cu_k=cu_k, TQ=TQ,
                **({"TMA_O": True} if tma_out else {}))
    run(attn_fwd_ws_persistent_kernel, grid, args, meta)
    return out, lse
