"""v5 with overlapped consumers: a consumer's tensor-core products run beside its own softmax (sm_90, Gluon).

v5 (``gluon_fwd.py``): each consumer warpgroup issues S = Q K^T, waits, runs the softmax, issues
O += P V and waits, so its exponentials and its products take turns and only the other consumer
can fill the tensor cores meanwhile. Here (FA3's intra-warpgroup overlap) a consumer issues S_j
and P_{j-1} V_{j-1} together, waits only for S_j (wgmma groups complete in issue order), runs
softmax(S_j) while its own P V still runs, then waits for it and rescales O:

    S_0; softmax(S_0) -> P_0
    for j in 1 .. n - 1: issue S_j, O += P_{j-1} V_{j-1}; wait S_j; softmax(S_j) -> P_j, alpha_j;
                         wait P V; O *= alpha_j
    O += P_{n-1} V_{n-1}

P_{j-1} stays in registers until its product is waited on (a register operand the wgmma reads
asynchronously); O is rescaled only after its product completed. Same grid, loader, ring,
bounds, causal masking, GQA and layouts as v5; no bias, two consumers (or three: D 64's v5 tile). Where it runs:
``configs.WS_OVERLAP_RULES`` (docs/tuning/attention.md, "FA3's consumer schedule").
"""

from __future__ import annotations

from . import configs
from . import gluon_fwd as ag
from . import gluon_items as gi
from ...runtime import cuda as rt
from .layout import seq_mask, tma_view

if ag.available():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    SEQ_Q, SEQ_K, SEQ_V, SEQ_O = ag.SEQ_Q, ag.SEQ_K, ag.SEQ_V, ag.SEQ_O

    @gluon.jit
    def _step(j, r, acc, p_op, m_i, l_i, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, which: gl.constexpr,
              m_lo, Sk, qk_scale, zero, s_layout: gl.constexpr, o_layout: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr, dtype: gl.constexpr, n_full=0):
        """Key tile j >= 1, the ring's fill r: S_j and P_{j-1} V_{j-1} issued together, softmax(S_j) while
        they run. MASKED 2: the mask from tile n_full on, tested at run time (``gluon_fwd.online_softmax``)."""
        s = r % STAGES
        sp = (r - 1) % STAGES
        mbarrier.wait(k_ready.index(s), (r // STAGES) & 1)
        mbarrier.wait(v_ready.index(sp), ((r - 1) // STAGES) & 1)
        t = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_smem.index(sp), acc, is_async=True)
        t = warpgroup_mma_wait(num_outstanding=1, deps=(t,))  # S_j (issued first) done; P V may still run
        mbarrier.arrive(k_empty.index(s), count=1)
        p, alpha, m_i, l_i = ag.online_softmax(t, j, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N, CAUSAL, MASKED,
                                               n_full=n_full)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))  # P stays live until read
        mbarrier.arrive(v_empty.index(sp), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        return acc, p_op, m_i, l_i

    @gluon.jit
    def _rows(q, q_bar, q_phase, q_empty, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, which: gl.constexpr,
              m_lo, n_tiles, slot, Sk, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              Q_REGS: gl.constexpr, RELEASE_Q: gl.constexpr, dtype: gl.constexpr, qb, ONE_LOOP: gl.constexpr = False):
        """A consumer's 64 query rows from ``m_lo`` (its Q tile ``q`` in shared memory, ready at
        ``q_bar``'s phase ``q_phase``) over key tiles 0 .. n_tiles - 1, the ring's fills slot .. slot +
        n_tiles - 1 (v5's grid: 0 ..): (acc, m_i, l_i). Q_REGS: Q read into registers first; with
        RELEASE_Q its buffer is then handed back at once (``q_empty``: a persistent CTA's next Q). ``qb``:
        Q's buffer, its barriers' index (``which`` with one buffer). ONE_LOOP: one copy of the key
        tile's products, the mask tested at run time (two Q buffers: ``gluon_fwd._pconsumer`` says why)."""
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        n_full = ag.unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N, CAUSAL)
        zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
        m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([64], gl.float32, layout=row_s)
        acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
        mbarrier.wait(q_bar.index(qb), q_phase)
        if Q_REGS:  # Q as the register A operand of S's products: they read only K from shared memory
            q = q.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
            if RELEASE_Q:  # the loader's next TMA write (async proxy) must follow these generic-proxy reads
                fence_async_shared()
                mbarrier.arrive(q_empty.index(qb), count=1)
        # Tile 0 (masked: cheap once, and right whether or not it needs the test)
        s0 = slot % STAGES
        mbarrier.wait(k_ready.index(s0), (slot // STAGES) & 1)
        t = warpgroup_mma(q, k_smem.index(s0).permute((1, 0)), zero, use_acc=False, is_async=True)
        t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
        mbarrier.arrive(k_empty.index(s0), count=1)
        p, alpha, m_i, l_i = ag.online_softmax(t, 0, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N, CAUSAL, True)
        p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        if ONE_LOOP:
            for j in range(1, n_tiles):
                acc, p_op, m_i, l_i = _step(j, slot + j, acc, p_op, m_i, l_i, q, k_smem, v_smem, k_ready, k_empty,
                                            v_ready, v_empty, which, m_lo, Sk, qk_scale, zero, s_layout, o_layout,
                                            BLOCK_N, STAGES, CAUSAL, 2, dtype, n_full)
        else:
            for j in range(1, gl.maximum(n_full, 1)):
                acc, p_op, m_i, l_i = _step(j, slot + j, acc, p_op, m_i, l_i, q, k_smem, v_smem, k_ready, k_empty,
                                            v_ready, v_empty, which, m_lo, Sk, qk_scale, zero, s_layout, o_layout,
                                            BLOCK_N, STAGES, CAUSAL, False, dtype)
            for j in range(gl.maximum(n_full, 1), n_tiles):
                acc, p_op, m_i, l_i = _step(j, slot + j, acc, p_op, m_i, l_i, q, k_smem, v_smem, k_ready, k_empty,
                                            v_ready, v_empty, which, m_lo, Sk, qk_scale, zero, s_layout, o_layout,
                                            BLOCK_N, STAGES, CAUSAL, True, dtype)
        last = slot + n_tiles - 1
        sl = last % STAGES
        mbarrier.wait(v_ready.index(sl), (last // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(sl), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))  # P stays live until read
        mbarrier.arrive(v_empty.index(sl), count=1)
        return acc, m_i, l_i

    @gluon.jit
    def _overlap_consumer(q_desc, k_desc, v_desc, b_desc, q_smem, k_smem, v_smem, b_smem, q_bar, k_ready,
                          k_empty, v_ready, v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col,
                          b_row, lse_row, o_row, o_col, o_stride, start_m, n_tiles, Sq, Sk, qk_scale,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, HAS_BIAS: gl.constexpr,
                          NUM_CONS: gl.constexpr, PINGPONG: gl.constexpr, Q_REGS: gl.constexpr,
                          which: gl.constexpr):
        # gluon_fwd._loader's argument list (the partitions share one); b_*, HAS_BIAS, PINGPONG unused.
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        m_lo = start_m * (64 * NUM_CONS) + which * 64
        acc, m_i, l_i = _rows(q_smem.index(which), q_bar, 0, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                              which, m_lo, n_tiles, 0, Sk, qk_scale, s_layout, o_layout, HEAD_DIM, BLOCK_N, STAGES,
                              CAUSAL, Q_REGS, False, q_desc.dtype, which)
        ag._finish(acc, m_i, l_i, out_ptr, lse_ptr, lse_row, o_row, o_col, o_stride, m_lo, Sq, s_layout, o_layout,
                   HEAD_DIM)

    @gluon.jit
    def _overlap_pconsumer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                           v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total,
                           BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                           NUM_CONS: gl.constexpr, LAYOUT: gl.constexpr, Q_REGS: gl.constexpr,
                           which: gl.constexpr, o_desc=None, TMA_O: gl.constexpr = False):
        """The persistent grid's consumer (gluon_fwd._pconsumer's walk over work items, its loader's ring
        running on across items, its Q buffers: ``q_smem.shape``) with the overlapped schedule. TMA_O (two Q
        buffers, Q in shared memory): O stored by TMA through the item's Q buffer, handed back to the loader at
        the next item's start once the store has read it (the loader needs it for the item after)."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        QB: gl.constexpr = q_smem.shape[0] // NUM_CONS  # Q buffers a consumer (the kernel's Q_BUFS)
        BH = total // n_m
        slot = 0
        it = 0
        for tile in range(gl.program_id(0), total, gl.num_programs(0)):
            start_m, bh = gi.persistent_item(tile, n_m, BH, CAUSAL)
            m_lo = start_m * BM + which * 64
            n_tiles = ag.kv_tiles(start_m, Sk, BM, BLOCK_N, CAUSAL)
            b = (it % QB) * NUM_CONS + which
            if TMA_O:
                gl.static_assert(QB == 2 and not Q_REGS, "TMA_O: two Q buffers, Q in shared memory")
                if it > 0:
                    ag.release_stored_q(q_empty, ((it - 1) % QB) * NUM_CONS + which)
            # With Q_REGS the Q buffer goes back as soon as Q is in registers (the next item's load overlaps
            # this one), else after the final S (waited in _rows).
            acc, m_i, l_i = _rows(q_smem.index(b), q_bar, (it // QB) & 1, q_empty, k_smem, v_smem, k_ready, k_empty,
                                  v_ready, v_empty, which, m_lo, n_tiles, slot, Sk, qk_scale, s_layout, o_layout,
                                  HEAD_DIM, BLOCK_N, STAGES, CAUSAL, Q_REGS, True, q_desc.dtype, b, QB > 1)
            if not Q_REGS and not TMA_O:
                mbarrier.arrive(q_empty.index(b), count=1)
            o_row, o_col = ag.head_rc(bh, bh // H, bh % H, Sq, HEAD_DIM, LAYOUT & SEQ_O)
            o_stride = ag.row_len(H, HEAD_DIM, LAYOUT & SEQ_O)
            ag._finish(acc, m_i, l_i, out_ptr, lse_ptr, bh * Sq, o_row, o_col, o_stride, m_lo, Sq, s_layout, o_layout,
                       HEAD_DIM, o_desc, q_smem.index(b), TMA_O)
            slot += n_tiles
            it += 1
        if TMA_O:  # the last store reads shared memory the CTA gives up at exit
            tma.store_wait(0)

    @gluon.jit
    def _chain_pconsumer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                         v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                         NUM_CONS: gl.constexpr, LAYOUT: gl.constexpr, Q_REGS: gl.constexpr,
                         which: gl.constexpr, o_desc=None, TMA_O: gl.constexpr = False):
        """``_overlap_pconsumer`` with its work items chained (two Q buffers; causal too): an item's last
        P V and the next item's S_0 are issued together, and the item's epilogue (normalize, store O and
        the log-sum-exp) runs while S_0 does, so the tensor cores are not idle between items. After the
        last item the loader supplies a Q and a K tile that nobody needs (``gluon_fwd._chain_ploader``): its S_0 is
        computed and dropped, which keeps the loop free of branches around the products (the ptxas fault of
        ``gluon_fwd._pconsumer``). TMA_O: O goes out by TMA (``o_desc``) through the finished item's Q buffer,
        handed back to the loader once the store has read it (``gluon_fwd._finish``)."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        dtype: gl.constexpr = q_desc.dtype
        BH = total // n_m
        nprog = gl.num_programs(0)
        zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
        n_tiles = ag.kv_tiles(0, Sk, BM, BLOCK_N, False)  # every item's, without causal
        start_m, bh = gi.persistent_item(gl.program_id(0), n_m, BH, CAUSAL)
        m_lo = start_m * BM + which * 64
        b = which  # item 0's Q buffer
        mbarrier.wait(q_bar.index(b), 0)
        mbarrier.wait(k_ready.index(0), 0)
        t = warpgroup_mma(q_smem.index(b), k_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
        t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
        mbarrier.arrive(k_empty.index(0), count=1)
        m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([64], gl.float32, layout=row_s)
        p, alpha, m_i, l_i = ag.online_softmax(t, 0, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N, CAUSAL, True)
        p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        slot = 0
        it = 0
        for tile in range(gl.program_id(0), total, nprog):
            if CAUSAL:  # this item's length (its query tile)
                n_tiles = ag.kv_tiles(gi.persistent_item(tile, n_m, BH, True)[0], Sk, BM, BLOCK_N, True)
            n_full = ag.unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N, CAUSAL)
            acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
            for j in range(1, n_tiles):
                acc, p_op, m_i, l_i = _step(j, slot + j, acc, p_op, m_i, l_i, q_smem.index(b), k_smem, v_smem,
                                            k_ready, k_empty, v_ready, v_empty, which, m_lo, Sk, qk_scale, zero,
                                            s_layout, o_layout, BLOCK_N, STAGES, CAUSAL, 2, dtype, n_full)
            if not TMA_O:  # else the buffer holds O until its TMA store has read it
                mbarrier.arrive(q_empty.index(b), count=1)  # Q's last S was waited on (tile 0's or the loop's)
            last = slot + n_tiles - 1
            it += 1
            slot += n_tiles
            b_done = b
            t, b, bh, m_lo = ag.chain_item_end(acc, p_op, m_i, l_i, last, slot, it, tile, q_smem, k_smem, v_smem,
                                               q_bar, k_ready, v_ready, v_empty, out_ptr, lse_ptr, H, Sq, n_m, BH, bh,
                                               m_lo, zero, s_layout, o_layout, STAGES, NUM_CONS, LAYOUT, which, CAUSAL,
                                               o_desc, b_done, TMA_O)
            mbarrier.arrive(k_empty.index(slot % STAGES), count=1)
            m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
            l_i = gl.zeros([64], gl.float32, layout=row_s)
            p, alpha, m_i, l_i = ag.online_softmax(t, 0, m_i, l_i, m_lo, Sk, qk_scale, s_layout, BLOCK_N, CAUSAL,
                                                   True)
            p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
            if TMA_O:
                ag.release_stored_q(q_empty, b_done)

    @gluon.jit
    def attn_fwd_overlap_kernel(q_desc, k_desc, v_desc, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, HEAD_GROUP,
                                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, LAYOUT: gl.constexpr = 0,
                                Q_REGS: gl.constexpr = False, NUM_CONS: gl.constexpr = 2):
        """v5's grid and loader (no bias, two or three consumers) with the overlapped consumers."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        start_m = gl.program_id(0)
        bh = gl.program_id(1)
        if CAUSAL:
            start_m, bh = gi.lpt_block_head(HEAD_GROUP)
            start_m = gl.num_programs(0) - 1 - start_m
        off_b = bh // H
        off_h = bh % H
        q_row, q_col = ag.head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_Q)
        q_row += start_m * BM
        bhk = off_b * (H // GROUP) + off_h // GROUP
        k_row, k_col = ag.head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_K)
        v_row, v_col = ag.head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_V)
        o_row, o_col = ag.head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_O)
        o_stride = ag.row_len(H, HEAD_DIM, LAYOUT & SEQ_O)
        lse_row = bh * Sq
        n_tiles = ag.kv_tiles(start_m, Sk, BM, BLOCK_N, CAUSAL)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONS, 64, HEAD_DIM], q_desc.layout)
        k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ag.kv_ring(k_desc, v_desc, STAGES, NUM_CONS)
        q_bar = gl.allocate_shared_memory(gl.int64, [NUM_CONS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(NUM_CONS):
            mbarrier.init(q_bar.index(c), count=1)
        if NUM_CONS == 3:  # D 64's v5 tile: 192 query rows a CTA
            gl.warp_specialize([
                (_overlap_consumer, (
                    q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty, v_ready,
                    v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row, o_row, o_col,
                    o_stride, start_m, n_tiles, Sq, Sk, qk_scale, BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False,
                    Q_REGS, 0)),
                (_overlap_consumer, (
                    q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty, v_ready,
                    v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row, o_row, o_col,
                    o_stride, start_m, n_tiles, Sq, Sk, qk_scale, BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False,
                    Q_REGS, 1)),
                (_overlap_consumer, (
                    q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty, v_ready,
                    v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row, o_row, o_col,
                    o_stride, start_m, n_tiles, Sq, Sk, qk_scale, BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False,
                    Q_REGS, 2)),
                (ag._loader, (
                    q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty, v_ready,
                    v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row, o_row, o_col,
                    o_stride, start_m, n_tiles, Sq, Sk, qk_scale, BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False, 0)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([
                (_overlap_consumer, (
                    q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty, v_ready,
                    v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row, o_row, o_col,
                    o_stride, start_m, n_tiles, Sq, Sk, qk_scale, BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False,
                    Q_REGS, 0)),
                (_overlap_consumer, (
                    q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty, v_ready,
                    v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row, o_row, o_col,
                    o_stride, start_m, n_tiles, Sq, Sk, qk_scale, BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False,
                    Q_REGS, 1)),
                (ag._loader, (
                    q_desc, k_desc, v_desc, q_desc, q_smem, k_smem, v_smem, q_smem, q_bar, k_ready, k_empty, v_ready,
                    v_empty, out_ptr, lse_ptr, q_row, q_col, k_row, k_col, v_row, v_col, 0, lse_row, o_row, o_col,
                    o_stride, start_m, n_tiles, Sq, Sk, qk_scale, BLOCK_N, STAGES, CAUSAL, False, NUM_CONS, False, 0)),
            ], [4, 1], [CONSUMER_REGS, 24])

    @gluon.jit
    def attn_fwd_overlap_persistent_kernel(q_desc, k_desc, v_desc, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, BH,
                                           o_desc, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                                           CONSUMER_REGS: gl.constexpr, LAYOUT: gl.constexpr = 0,
                                           Q_REGS: gl.constexpr = False, Q_BUFS: gl.constexpr = 1,
                                           CHAIN: gl.constexpr = False, TMA_O: gl.constexpr = False):
        """gluon_fwd.attn_fwd_ws_persistent_kernel (one CTA an SM walking work items; its loader) with the
        overlapped consumers; two consumers, no bias; Q_BUFS Q buffers a consumer (2: the next item's Q loads
        during this one). CHAIN (two buffers, Q in shared memory): items chained, the epilogue
        beside the next item's first product (``_chain_pconsumer``); TMA_O: O stored by TMA (``o_desc``, else None:
        positional, so a call plan rebuilds it over each call's output)."""
        NUM_CONS: gl.constexpr = 2
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        n_m = gl.cdiv(Sq, 64 * NUM_CONS)
        total = n_m * BH
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [Q_BUFS * NUM_CONS, 64, HEAD_DIM], q_desc.layout)
        k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ag.kv_ring(k_desc, v_desc, STAGES, NUM_CONS)
        q_bar = gl.allocate_shared_memory(gl.int64, [Q_BUFS * NUM_CONS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFS * NUM_CONS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(Q_BUFS * NUM_CONS):
            mbarrier.init(q_bar.index(c), count=1)
            mbarrier.init(q_empty.index(c), count=1)
        if CHAIN:
            gl.static_assert(Q_BUFS == 2 and not Q_REGS, "CHAIN: two Q buffers, Q in shared memory")
            gl.warp_specialize([
                (_chain_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                    k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                    total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, Q_REGS, 0, o_desc, TMA_O)),
                (_chain_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                    k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                    total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, Q_REGS, 1, o_desc, TMA_O)),
                (ag._chain_ploader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                     k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                     total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, 0)),
            ], [4, 1], [CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([
                (_overlap_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                      k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                      total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, Q_REGS, 0, o_desc, TMA_O)),
                (_overlap_pconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                                      k_empty, v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m,
                                      total, BLOCK_N, STAGES, CAUSAL, NUM_CONS, LAYOUT, Q_REGS, 1, o_desc, TMA_O)),
                (ag._ploader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty,
                               v_ready, v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, n_m, total, BLOCK_N,
                               STAGES, CAUSAL, NUM_CONS, LAYOUT, 0)),
            ], [4, 1], [CONSUMER_REGS, 24])


def applies(bias, config) -> bool:
    """Whether the overlapped kernel takes this v5 call: no bias, two or three consumers, no maxnreg."""
    return bias is None and config[4] in (2, 3) and config[3] is None


def fwd(q, k, v, causal, scale, out, lse, launch=None, config=None, head_group=None, q_regs=False,
        persistent=False, q_buffers=1, chain=None, tma_out=None):
    """As ``gluon_fwd.fwd`` for a call ``applies`` accepts: into ``out`` and ``lse``; ``config`` v5's
    (BLOCK_N, STAGES, consumer registers, None, consumers 2 or 3). ``q_regs``: Q as the register A operand of
    S's products, two consumers only, with at least 240 registers a consumer (Triton 3.6, D 128: 232 spilled
    34 instructions). ``persistent``: on v5's persistent grid (one CTA an SM; two consumers), with ``q_buffers``
    Q buffers a consumer; ``chain``: its work items chained (``_chain_pconsumer``: persistent, two buffers, Q in
    shared memory), by default wherever that holds without causal (bitwise equal to the unchained kernel,
    1.01-1.04x it on an H100); with causal only when asked (``chain=True``); ``chain=False`` keeps them apart.
    ``tma_out`` (persistent, two consumers and Q buffers, no ``q_regs``; by default wherever that holds): O stored by
    TMA through the finished item's Q buffer (its 32 4-byte stores a thread stalled the next item's softmax: 1.00-1.14x
    them on an H100; tuning: "An item's end under Nsight Compute", "O by TMA on every persistent kernel")."""
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    bn, stages, regs, _, ncons = configs.ws_fwd_config(D, False, config)
    (q2, _), (k2, _), (v2, _) = (tma_view(t) for t in (q, k, v))
    qd, kd, vd = ag._desc(q2, (ag.ROWS, D)), ag._desc(k2, (bn, D)), ag._desc(v2, (bn, D))
    if q_regs and ncons == 3:  # Triton 3.6 at D 64: 85-118 spill instructions at 160 or 168 registers
        raise ValueError("ws_q_regs: Q in registers needs two consumers (ws_config's 5th field), got three")
    meta = dict(BLOCK_N=bn, STAGES=stages, CAUSAL=bool(causal), CONSUMER_REGS=regs, num_warps=4)
    if q_regs:
        meta.update(Q_REGS=True, CONSUMER_REGS=max(regs, 240))
    layout = seq_mask(q=q, k=k, v=v, o=out)
    if layout:
        meta["LAYOUT"] = layout
    chainable = persistent and ncons == 2 and q_buffers == 2 and not q_regs
    if chain is None:  # causal chained is opt-in: 0.96-0.99x unchained (tuning: "Causal work items in pairs")
        chain = chainable and not causal
    if chain and not chainable:
        raise ValueError("chain: needs persistent=True with two consumers, q_buffers=2, no q_regs")
    if tma_out is None:
        tma_out = chainable
    if tma_out and not chainable:
        raise ValueError("tma_out: needs the persistent grid with two consumers, q_buffers=2 and no q_regs")
    if persistent and ncons == 2:
        if q_buffers != 1:  # the one-buffer build's launch stays as it was
            meta["Q_BUFS"] = q_buffers
        if chain:
            meta["CHAIN"] = True
        od = None
        if tma_out:
            od = ag._desc(tma_view(out)[0], (ag.ROWS, D))
            meta["TMA_O"] = True
        total = -(-Sq // (ag.ROWS * 2)) * B * H
        args = (qd, kd, vd, out, lse, H, H // Hkv, Sq, Sk, scale * ag.LOG2E, B * H, od)
        ag.run(attn_fwd_overlap_persistent_kernel, (min(rt.sm_count(q.get_device()), total),), args, meta, launch)
        return out, lse
    grid = (-(-Sq // (ag.ROWS * ncons)), B * H)
    group = head_group or (configs.causal_head_group(grid[1], grid[0], rt.sm_count(q.get_device())) if causal else 1)
    args = (qd, kd, vd, out, lse, H, H // Hkv, Sq, Sk, scale * ag.LOG2E, group)
    if ncons == 3:
        meta["NUM_CONS"] = 3
    ag.run(attn_fwd_overlap_kernel, grid, args, meta, launch)
    return out, lse
