"""v6 backward: the deterministic backward's two kernels warp-specialized in Gluon.

The Triton dK / dV kernel keeps the tensor pipe 38% busy at D = 128 on the H200, the dQ kernel 54%,
cuDNN's fused backward 63% (Nsight Compute; docs/tuning/attention.md, "v6 backward"): one
instruction stream per warpgroup, so each tile's loads, exponentials and products take turns, and
a third of the dK / dV kernel's stall cycles are the software pipeline's barriers. Here both
kernels are split (``gl.warp_specialize``) into a TMA loader warp and two consumer warpgroups:

``attn_bwd_dkdv_ws_kernel``: a CTA owns 64 x 2 keys of one K/V head.
    loader     K and V rows (once), then Q and dO tiles of BLOCK_M query rows, query head after
               query head of the GQA group, into a ring of STAGES stages, each refilled when both
               consumers released it.
    consumer c keys 64c .. 64c + 63; per query tile (wgmma; P^T and dS^T from registers):
                   S^T  = K Q^T, dP^T = V dO^T        (64 x BLOCK_M, both issued before waiting)
                   P^T  = exp2(S^T * scale log2e - LSE log2e)
                   dV  += P^T dO,  dS^T = P^T (dP^T - Delta),  dK += dS^T Q   (64 x D, fp32)
               then releases the stage; at the end dK * scale and dV go out by masked stores.

``attn_bwd_dq_ws_kernel``: a CTA owns 64 x 2 query rows of one head (v5's layout).
    loader     Q and dO (once), then K and V tiles of BLOCK_N keys into the ring.
    consumer c rows 64c .. 64c + 63; per key tile S = Q K^T, dP = dO V^T, P, dS = P (dP - Delta),
               dQ += dS K; at the end dQ * scale by masked stores.

No atomics: deterministic, as v3's two kernels. Layouts as v5's: q, k, v, dO and dQ, dK, dV each
head-major or sequence-major, in place (``layout.py``, the LAYOUT constexpr; LSE and Delta are
head-major buffers). Bounds: rows past Sq (the next head's or, sequence-major, the next batch's
rows, or TMA zero fill: finite) and keys past Sk get P = 0 through masks (LSE and Delta loaded as 0
there), so dS = 0 there and their finite Q / dO rows add nothing; they are never stored. Causal
(top-left, key n <= query m): dK / dV from the CTA's first key's query tile on, dQ up to the CTA's
last row; tiles that cross the diagonal are masked. No mask or bias (those keep the Triton kernels).

Speed (H200, the backward alone at B * S = 16384, H = 16, bf16): 1.38-1.61x v3's two kernels at
D = 128 (S 1024-16384) and 1.05-1.24x at D = 64 from S = 4096 (0.85x at S = 1024), so it is
``flash_attention``'s backward where ``configs.WS_BWD_RULES`` say (docs/tuning/attention.md,
"v6 backward").
"""

from __future__ import annotations

from . import configs
from ...runtime.cuda import sm_count
from .layout import seq_mask, tma_view

LOG2E = 1.4426950408889634
KEYS = 64  # keys (dK / dV) or query rows (dQ) per consumer warpgroup (wgmma M)

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

    from .gluon_band import band_tiles
    from .gluon_fwd import (SEQ_DK, SEQ_DO, SEQ_DQ, SEQ_DV, SEQ_K, SEQ_Q, SEQ_V, fill_kv, head_rc, kv_ring, kv_tiles,
                            row_len, seq_span, unmasked_tiles)
    from .gluon_items import lpt_block_head

    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _KEYS = gl.constexpr(KEYS)  # KEYS, visible inside the kernels
    _GLUON = True
except Exception:  # noqa: BLE001 - an older Triton: v6 unavailable
    _GLUON = False


def available() -> bool:
    return _GLUON


if _GLUON:

    @gluon.jit
    def _loader(k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty, stats,
                lse_ptr, delta_ptr, dk_ptr, dv_ptr, k_row, k_col, v_row, v_col, q_head0, off_b, h0, H, HK, m_first,
                n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr, LAYOUT: gl.constexpr, REG_OPS: gl.constexpr,
                band_lo, band_hi, BAND: gl.constexpr, PIPE: gl.constexpr, which: gl.constexpr, q0=0, TQ=0,
                VARLEN: gl.constexpr = False):
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        mbarrier.expect(kv_bar, NUM_CONS * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
        for c in gl.static_range(NUM_CONS):
            _tma_load(k_desc, [k_row + c * _KEYS, k_col], kv_bar, k_smem.index(c))
            _tma_load(v_desc, [v_row + c * _KEYS, v_col], kv_bar, v_smem.index(c))
        n_tiles = n_m - m_first
        stat_layout: gl.constexpr = gl.BlockedLayout([2], [32], [1], [0])
        offs = gl.arange(0, BLOCK_M, layout=stat_layout)
        for t in range(GROUP * n_tiles):
            g = t // n_tiles
            i = m_first + t % n_tiles
            s = t % STAGES
            ph = (t // STAGES) & 1
            # The tile's LSE (log2 units, 0 where -inf or past Sq) and Delta go to the stage's shared memory
            # with Q and dO: loaded before the wait, published by the expect's arrive.
            rows = i * BLOCK_M + offs
            head_row = (q_head0 + g) * Sq
            if VARLEN:  # LSE and Delta (H, TQ): query head h0 + g's rows of the sequence from q0
                head_row = (h0 + g) * TQ + q0
            lse = gl.load(lse_ptr + head_row + rows, mask=rows < Sq, other=0.0)
            delta = gl.load(delta_ptr + head_row + rows, mask=rows < Sq, other=0.0)
            lse = gl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
            mbarrier.wait(empty.index(s), ph ^ 1)  # starts complete: the first pass does not wait
            stats.index(2 * s).store(lse)
            stats.index(2 * s + 1).store(delta)
            mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            q_row, q_col = head_rc(q_head0 + g, off_b, h0 + g, Sq, HEAD_DIM, LAYOUT & SEQ_Q)
            do_row, do_col = head_rc(q_head0 + g, off_b, h0 + g, Sq, HEAD_DIM, LAYOUT & SEQ_DO)
            if VARLEN:
                q_row, q_col = q0, (h0 + g) * HEAD_DIM
                do_row, do_col = q_row, q_col
            _tma_load(q_desc, [q_row + i * BLOCK_M, q_col], ready.index(s), q_smem.index(s))
            _tma_load(do_desc, [do_row + i * BLOCK_M, do_col], ready.index(s), do_smem.index(s))

    @gluon.jit
    def _tile(t, dk, dv, k_buf, v_buf, q_smem, do_smem, ready, empty, stats, i, key_lo,
              Sq, Sk, qk_scale, st_layout: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr, BAND: gl.constexpr = False,
              band_lo=0, band_hi=0, PIPE: gl.constexpr = 0, pt_prev=0, dst_prev=0):
        # BAND (with MASKED): keep key n for query m where band_lo <= n - m <= band_hi. PIPE 1 (a consumer's
        # first tile) and 2 (the others): dV and dK are deferred a tile. This tile's P^T and dS^T are
        # returned as operands, and the last tile's products (pt_prev, dst_prev, its stage) issued behind
        # S^T and dP^T, so they run while this tile's exponentials do; its stage goes back after them.
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
        mbarrier.wait(ready.index(s), ph)
        lse = stats.index(2 * s).load(col)
        delta = stats.index(2 * s + 1).load(col)
        st = warpgroup_mma(k_buf, q_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        if PIPE == 2:
            sp = (t + STAGES - 1) % STAGES
            dv = warpgroup_mma(pt_prev, do_smem.index(sp), dv, is_async=True)
            dk = warpgroup_mma(dst_prev, q_smem.index(sp), dk, is_async=True)
            st = warpgroup_mma_wait(num_outstanding=3, deps=(st,))
        else:
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        pt = gl.exp2(st * qk_scale - lse[None, :])
        if MASKED:
            offs_n = key_lo + gl.arange(0, _KEYS, layout=gl.SliceLayout(1, st_layout))
            keep = (offs_m[None, :] < Sq) & (offs_n[:, None] < Sk)
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :])
            if BAND:
                rel = offs_n[:, None] - offs_m[None, :]
                keep = keep & (rel >= band_lo) & (rel <= band_hi)
            pt = gl.where(keep, pt, 0.0)
        pt_op = gl.convert_layout(pt.to(do_buf.dtype), a_layout)
        if PIPE:
            dpt = warpgroup_mma_wait(num_outstanding=2 if PIPE == 2 else 0, deps=(dpt,))
            dst_op = gl.convert_layout((pt * (dpt - delta[None, :])).to(q_buf.dtype), a_layout)
            if PIPE == 2:
                dv, dk, pt_prev, dst_prev = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt_prev, dst_prev))
                mbarrier.arrive(empty.index(sp), count=1)
            return dk, dv, pt_op, dst_op
        dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
        # Register operands of a product in flight go through the waits as deps: their registers
        # stay live (unreused) until the product has read them.
        dpt, pt_op = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt_op))
        dst = pt * (dpt - delta[None, :])
        dst_op = gl.convert_layout(dst.to(q_buf.dtype), a_layout)
        dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
        dv, dk, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt_op, dst_op))
        mbarrier.arrive(empty.index(s), count=1)
        return dk, dv, pt_prev, dst_prev

    @gluon.jit
    def _consumer(k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty, stats,
                  lse_ptr, delta_ptr, dk_ptr, dv_ptr, k_row, k_col, v_row, v_col, q_head0, off_b, h0, H, HK, m_first,
                  n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr, LAYOUT: gl.constexpr, REG_OPS: gl.constexpr,
                  band_lo, band_hi, BAND: gl.constexpr, PIPE: gl.constexpr, which: gl.constexpr, q0=0, TQ=0,
                  VARLEN: gl.constexpr = False):
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, HEAD_DIM, 16])
        key_lo = n0 + which * _KEYS
        k_buf = k_smem.index(which)
        v_buf = v_smem.index(which)
        dk = gl.zeros([_KEYS, HEAD_DIM], gl.float32, layout=acc_layout)
        dv = gl.zeros([_KEYS, HEAD_DIM], gl.float32, layout=acc_layout)
        # Query tiles [m_first, m_clean) cross the causal diagonal of this CTA's keys, [m_clean, m_full)
        # need no test, [m_full, n_m) is the partial last tile; a CTA whose keys pass Sk tests all.
        # m_first <= m_clean <= m_full <= n_m always (e.g. causal with Sk > Sq: no tile at all). With
        # BAND, n_m is the end of the band's tiles, and [m_clean, m_full) the tiles inside the band for
        # every row and every key of the CTA: rows m >= n0 + 127 - band_hi and m <= n0 - band_lo.
        if CAUSAL:
            m_clean = gl.minimum(gl.maximum(gl.cdiv(n0 + NUM_CONS * _KEYS - 1, BLOCK_M), m_first), n_m)
        elif BAND:
            m_clean = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(n0 + NUM_CONS * _KEYS - 1 - band_hi, 0), BLOCK_M),
                                            m_first), n_m)
        else:
            m_clean = m_first
        m_full = gl.minimum(gl.maximum(Sq // BLOCK_M, m_clean), n_m)
        if BAND:
            m_full = gl.maximum(gl.minimum(m_full, gl.maximum(n0 - band_lo + 1, 0) // BLOCK_M), m_clean)
        if n0 + NUM_CONS * _KEYS > Sk:
            m_clean = n_m
            m_full = n_m
        n_tiles = n_m - m_first
        mbarrier.wait(kv_bar, 0)
        # REG_OPS 1: K, 2: K and V as register A operands (S^T's, dP^T's products then read only Q / dO from
        # shared memory)
        if REG_OPS >= 1:
            k_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=2)
            k_buf = k_buf.load(k_op)
            if REG_OPS >= 2:
                v_buf = v_buf.load(k_op)
        # PIPE: each tile's dV and dK products run in the next tile (``_tile``), from its P^T and dS^T carried
        # here; the first tile runs before the loops, the last one's products after them.
        pt_c = 0
        dst_c = 0
        TILE_PIPE: gl.constexpr = 2 * PIPE
        if PIPE:
            a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
            pt_c = gl.zeros([_KEYS, BLOCK_M], q_desc.dtype, layout=a_layout)
            dst_c = gl.zeros([_KEYS, BLOCK_M], q_desc.dtype, layout=a_layout)
            if n_tiles > 0:
                dk, dv, pt_c, dst_c = _tile(0, dk, dv, k_buf, v_buf, q_smem, do_smem, ready, empty, stats, m_first,
                                            key_lo, Sq, Sk, qk_scale, st_layout, BLOCK_M, HEAD_DIM, STAGES, CAUSAL,
                                            True, BAND, band_lo, band_hi, 1, pt_c, dst_c)
        for g in range(GROUP):
            t0 = g * n_tiles - m_first
            lo1 = m_first
            lo2 = m_clean
            lo3 = m_full
            if PIPE:
                if g == 0:  # its first tile ran above
                    lo1 = m_first + 1
                    lo2 = gl.maximum(m_clean, lo1)
                    lo3 = gl.maximum(m_full, lo1)
            for i in range(lo1, m_clean):
                dk, dv, pt_c, dst_c = _tile(t0 + i, dk, dv, k_buf, v_buf, q_smem, do_smem, ready, empty, stats, i,
                                            key_lo, Sq, Sk, qk_scale, st_layout, BLOCK_M, HEAD_DIM, STAGES, CAUSAL,
                                            True, BAND, band_lo, band_hi, TILE_PIPE, pt_c, dst_c)
            for i in range(lo2, m_full):
                dk, dv, pt_c, dst_c = _tile(t0 + i, dk, dv, k_buf, v_buf, q_smem, do_smem, ready, empty, stats, i,
                                            key_lo, Sq, Sk, qk_scale, st_layout, BLOCK_M, HEAD_DIM, STAGES, CAUSAL,
                                            False, False, 0, 0, TILE_PIPE, pt_c, dst_c)
            for i in range(lo3, n_m):
                dk, dv, pt_c, dst_c = _tile(t0 + i, dk, dv, k_buf, v_buf, q_smem, do_smem, ready, empty, stats, i,
                                            key_lo, Sq, Sk, qk_scale, st_layout, BLOCK_M, HEAD_DIM, STAGES, CAUSAL,
                                            True, BAND, band_lo, band_hi, TILE_PIPE, pt_c, dst_c)
        if PIPE:
            if n_tiles > 0:  # the last tile's products
                sp = (GROUP * n_tiles - 1) % STAGES
                dv = warpgroup_mma(pt_c, do_smem.index(sp), dv, is_async=True)
                dk = warpgroup_mma(dst_c, q_smem.index(sp), dk, is_async=True)
                dv, dk, pt_c, dst_c = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt_c, dst_c))
        rows = key_lo + gl.arange(0, _KEYS, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
        keep = (rows < Sk)[:, None]
        # dK's rows as K's when both are head-major (the kernel as it was: one offset tensor for dK and
        # dV), else from head_rc; dV's own offsets only where its layout differs from dK's.
        if VARLEN:  # the sequence's key rows of the packed (total_k, Hkv x D) dK and dV, from k_row - n0
            cols = k_col + cols
            offs = ((k_row - n0 + rows).to(gl.int64) * (HK * HEAD_DIM))[:, None] + cols[None, :]
            gl.store(dk_ptr + offs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=keep)
            gl.store(dv_ptr + offs, dv.to(dv_ptr.dtype.element_ty), mask=keep)
        else:
            HEAD_DK: gl.constexpr = (LAYOUT & (SEQ_K | SEQ_DK)) == 0
            if HEAD_DK:
                dk_row = k_row - n0
            else:
                dk_row, dk_col = head_rc(off_b * HK + h0 // GROUP, off_b, h0 // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_DK)
                cols = dk_col + cols
            offs = ((dk_row + rows).to(gl.int64) * row_len(HK, HEAD_DIM, LAYOUT & SEQ_DK))[:, None] + cols[None, :]
            gl.store(dk_ptr + offs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=keep)
            SAME: gl.constexpr = ((LAYOUT & SEQ_DK) == 0) == ((LAYOUT & SEQ_DV) == 0)
            if not SAME:
                dv_row, dv_col = head_rc(off_b * HK + h0 // GROUP, off_b, h0 // GROUP, Sk, HEAD_DIM,
                                         LAYOUT & SEQ_DV)
                cols = dv_col + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
                offs = ((dv_row + rows).to(gl.int64) * row_len(HK, HEAD_DIM, LAYOUT & SEQ_DV))[:, None] + cols[None, :]
            gl.store(dv_ptr + offs, dv.to(dv_ptr.dtype.element_ty), mask=keep)

    @gluon.jit
    def attn_bwd_dkdv_ws_kernel(k_desc, v_desc, q_desc, do_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                                H, GROUP, Sq, Sk, qk_scale, sm_scale, HEAD_GROUP, band_lo, band_hi,
                                BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, NUM_CONS: gl.constexpr = 2, LAYOUT: gl.constexpr = 0,
                                REG_OPS: gl.constexpr = 0, BAND: gl.constexpr = False, PIPE: gl.constexpr = False,
                                cu_q=None, cu_k=None, TQ=None, VARLEN: gl.constexpr = False):
        """dK, dV of 64 x NUM_CONS keys of one K / V head over its query heads (GQA). BAND (not with
        CAUSAL): only the query tiles the band reaches from these keys, rows n0 - band_hi ..
        n0 + 127 - band_lo. PIPE: a query tile's dV and dK products are issued behind the next tile's S^T
        and dP^T (its stage goes back a tile later: take 3 stages). VARLEN (no BAND): packed sequences as
        ``attn_bwd_dq_ws_kernel``'s, the grid's second axis sequence x K / V head; a CTA past its sequence's
        keys reads no query tile and stores nothing."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        start_n = gl.program_id(0)
        bhk = gl.program_id(1)
        if CAUSAL:  # longest first: a head group's first key blocks, then their second, ...
            start_n, bhk = lpt_block_head(HEAD_GROUP)
        HK = H // GROUP
        off_b = bhk // HK
        off_hk = bhk % HK
        n0 = start_n * (NUM_CONS * _KEYS)
        # Rows and columns in each tensor's 2-D view (gluon_fwd.head_rc; head-major as before). LSE and
        # Delta are head-major.
        k_row, k_col = head_rc(bhk, off_b, off_hk, Sk, HEAD_DIM, LAYOUT & SEQ_K)
        v_row, v_col = head_rc(bhk, off_b, off_hk, Sk, HEAD_DIM, LAYOUT & SEQ_V)
        k_row += n0
        v_row += n0
        h0 = off_hk * GROUP  # the group's first query head
        q_head0 = off_b * H + h0  # the same, in B * H
        q0 = 0
        if VARLEN:  # sequence off_b's rows; Sq and Sk become its lengths
            gl.static_assert(not BAND, "VARLEN: no band")
            q0, Sq, k0, Sk = seq_span(cu_q, cu_k, off_b)
            k_row, k_col = k0 + n0, off_hk * HEAD_DIM
            v_row, v_col = k_row, k_col
        m_first = 0
        if CAUSAL:
            m_first = n0 // BLOCK_M
        n_m = gl.cdiv(Sq, BLOCK_M)
        if VARLEN:
            n_m = n_m * (n0 < Sk).to(gl.int32)  # past the sequence's keys: nothing to do
        if BAND:  # n_m becomes the end of the band's query tiles
            m_first = gl.maximum(n0 - band_hi, 0) // BLOCK_M
            n_m = gl.minimum(gl.cdiv(gl.maximum(n0 + NUM_CONS * _KEYS - band_lo, 0), BLOCK_M), n_m)
        m_first = gl.minimum(m_first, n_m)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_CONS, _KEYS, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [NUM_CONS, _KEYS, HEAD_DIM], v_desc.layout)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
        # per stage: the query tile's LSE and Delta (rows 2s, 2s + 1)
        stats = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M],
                                          gl.SwizzledSharedLayout(1, 1, 1, [0]))
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=NUM_CONS)  # every consumer releases a stage
        # The argument tuples are spelled out in the call (constexprs stay constexprs); the last
        # one is the consumer's index (the loader ignores it).
        gl.warp_specialize([
            (_consumer, (k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                         stats, lse_ptr, delta_ptr, dk_ptr, dv_ptr, k_row, k_col, v_row, v_col, q_head0, off_b, h0, H,
                         HK, m_first, n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M, STAGES, CAUSAL, NUM_CONS,
                         LAYOUT, REG_OPS, band_lo, band_hi, BAND, PIPE, 0, q0, TQ, VARLEN)),
            (_consumer, (k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                         stats, lse_ptr, delta_ptr, dk_ptr, dv_ptr, k_row, k_col, v_row, v_col, q_head0, off_b, h0, H,
                         HK, m_first, n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M, STAGES, CAUSAL, NUM_CONS,
                         LAYOUT, REG_OPS, band_lo, band_hi, BAND, PIPE, 1, q0, TQ, VARLEN)),
            (_loader, (k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                       stats, lse_ptr, delta_ptr, dk_ptr, dv_ptr, k_row, k_col, v_row, v_col, q_head0, off_b, h0, H, HK,
                       m_first, n_m, GROUP, Sq, Sk, n0, qk_scale, sm_scale, BLOCK_M, STAGES, CAUSAL, NUM_CONS, LAYOUT,
                       REG_OPS, band_lo, band_hi, BAND, PIPE, 0, q0, TQ, VARLEN)),
        ], [4, 1], [CONSUMER_REGS, 24])


if _GLUON:

    @gluon.jit
    def _dq_loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready, k_empty,
                   v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col, k_row, k_col, v_row,
                   v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk, qk_scale, sm_scale,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                   NUM_CONS: gl.constexpr, REG_OPS: gl.constexpr, t_lo, band_lo, band_hi, BAND: gl.constexpr,
                   PIPE: gl.constexpr, which: gl.constexpr):
        for c in gl.static_range(NUM_CONS):
            mbarrier.expect(qd_bar.index(c), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            _tma_load(q_desc, [q_row + c * _KEYS, q_col], qd_bar.index(c), q_smem.index(c))
            _tma_load(do_desc, [do_row + c * _KEYS, do_col], qd_bar.index(c), do_smem.index(c))
        fill_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, k_row, k_col, v_row, v_col,
                n_tiles, 0, BLOCK_N, STAGES)

    @gluon.jit
    def _dq_tile(j, dq, q, do, lse, delta, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, m_lo, Sq, Sk,
                 qk_scale, s_layout: gl.constexpr, a_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr, BAND: gl.constexpr = False,
                 band_lo=0, band_hi=0, t_lo=0, PIPE: gl.constexpr = 0, ds_prev=0):
        # BAND (with MASKED): ring fill j is key tile t_lo + j; keep key n for query m where
        # band_lo <= n - m <= band_hi. PIPE 1 (a consumer's first tile) and 2 (the others): dQ's product is
        # deferred a tile, as dK / dV's in ``_tile``: the last tile's (ds_prev, fp32, its K stage) runs behind
        # S and dP, this tile's dS is returned.
        s = j % STAGES
        ph = (j // STAGES) & 1
        k_buf = k_smem.index(s)
        v_buf = v_smem.index(s)
        zero = gl.zeros([_KEYS, BLOCK_N], gl.float32, layout=s_layout)
        mbarrier.wait(k_ready.index(s), ph)
        st = warpgroup_mma(q, k_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(s), ph)
        dp = warpgroup_mma(do, v_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        if PIPE == 2:  # ds_prev in fp32: carried as bf16 pairs it took 32 PRMTs a tile (halves swapped, Triton 3.6)
            sp = (j + STAGES - 1) % STAGES
            dsp_op = gl.convert_layout(ds_prev.to(k_buf.dtype), a_layout)
            dq = warpgroup_mma(dsp_op, k_smem.index(sp), dq, is_async=True)
            st = warpgroup_mma_wait(num_outstanding=2, deps=(st,))
        else:
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        p = gl.exp2(st * qk_scale - lse[:, None])
        if MASKED:
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            if BAND:
                offs_n += t_lo * BLOCK_N
            offs_m = m_lo + gl.arange(0, _KEYS, layout=gl.SliceLayout(1, s_layout))
            keep = (offs_n[None, :] < Sk) & (offs_m[:, None] < Sq)
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            if BAND:
                rel = offs_n[None, :] - offs_m[:, None]
                keep = keep & (rel >= band_lo) & (rel <= band_hi)
            p = gl.where(keep, p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=1 if PIPE == 2 else 0, deps=(dp,))
        mbarrier.arrive(v_empty.index(s), count=1)  # V read by its product
        ds = p * (dp - delta[:, None])
        ds_op = gl.convert_layout(ds.to(k_buf.dtype), a_layout)
        if PIPE:
            if PIPE == 2:
                dq, dsp_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, dsp_op))
                mbarrier.arrive(k_empty.index(sp), count=1)
            return dq, ds
        dq = warpgroup_mma(ds_op, k_buf, dq, is_async=True)
        dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))
        mbarrier.arrive(k_empty.index(s), count=1)  # K read by both of its products
        return dq, ds_prev

    @gluon.jit
    def _dq_consumer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready, k_empty,
                     v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col, k_row, k_col, v_row,
                     v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk, qk_scale, sm_scale,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                     NUM_CONS: gl.constexpr, REG_OPS: gl.constexpr, t_lo, band_lo, band_hi, BAND: gl.constexpr,
                     PIPE: gl.constexpr, which: gl.constexpr):
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, HEAD_DIM, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        row: gl.constexpr = gl.SliceLayout(1, s_layout)
        m_lo = m0 + which * _KEYS  # this consumer's first query row (within the head)
        offs_m = m_lo + gl.arange(0, _KEYS, layout=row)
        lse = gl.load(lse_ptr + lse_row + offs_m, mask=offs_m < Sq, other=0.0)
        lse = gl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
        delta = gl.load(delta_ptr + lse_row + offs_m, mask=offs_m < Sq, other=0.0)
        # Key tiles [0, n_full) need no test; [n_full, n_tiles) the bounds (and causal) test; every
        # tile is tested when this consumer's rows pass Sq.
        n_full = unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N, CAUSAL)
        if BAND:
            # Fills [0, a) and [n_full, n_tiles) test the band (and bounds); [a, n_full) are key tiles inside
            # the band for all 64 rows (keys n >= m_lo + 63 + band_lo and n <= m_lo + band_hi) and inside Sk.
            a = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(m_lo + _KEYS - 1 + band_lo, 0), BLOCK_N) - t_lo, 0), n_tiles)
            n_full = gl.minimum(gl.maximum(m_lo + band_hi + 1, 0) // BLOCK_N, Sk // BLOCK_N) - t_lo
            n_full = gl.maximum(gl.minimum(n_full, n_tiles), a)
            if m_lo + _KEYS > Sq:
                a = 0
        if m_lo + _KEYS > Sq:
            n_full = 0
        q = q_smem.index(which)
        do = do_smem.index(which)
        dq = gl.zeros([_KEYS, HEAD_DIM], gl.float32, layout=acc_layout)
        mbarrier.wait(qd_bar.index(which), 0)
        # REG_OPS 1: Q, 2: Q and dO as register A operands (S's, dP's products then read only K / V from
        # shared memory)
        if REG_OPS >= 1:
            qd_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
            q = q.load(qd_op)
            if REG_OPS >= 2:
                do = do.load(qd_op)
        # PIPE: each tile's dQ product runs in the next tile (``_dq_tile``), from its dS carried here; the
        # first tile runs before the loops, the last one's product after them.
        ds_c = 0
        TILE_PIPE: gl.constexpr = 2 * PIPE
        lo = 0  # the loops' first tiles
        lo2 = n_full
        if BAND:
            lo2 = a
        lo3 = n_full
        if PIPE:
            ds_c = gl.zeros([_KEYS, BLOCK_N], gl.float32, layout=s_layout)
            if n_tiles > 0:
                dq, ds_c = _dq_tile(0, dq, q, do, lse, delta, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                    m_lo, Sq, Sk, qk_scale, s_layout, a_layout, BLOCK_N, STAGES, CAUSAL, True, BAND,
                                    band_lo, band_hi, t_lo, 1, ds_c)
            lo = 1
            lo2 = gl.maximum(lo2, 1)
            lo3 = gl.maximum(lo3, 1)
        if BAND:
            for j in range(lo, a):
                dq, ds_c = _dq_tile(j, dq, q, do, lse, delta, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                    m_lo, Sq, Sk, qk_scale, s_layout, a_layout, BLOCK_N, STAGES, False, True, True,
                                    band_lo, band_hi, t_lo, TILE_PIPE, ds_c)
            for j in range(lo2, n_full):
                dq, ds_c = _dq_tile(j, dq, q, do, lse, delta, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                    m_lo, Sq, Sk, qk_scale, s_layout, a_layout, BLOCK_N, STAGES, False, False, False,
                                    0, 0, 0, TILE_PIPE, ds_c)
            for j in range(lo3, n_tiles):
                dq, ds_c = _dq_tile(j, dq, q, do, lse, delta, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                    m_lo, Sq, Sk, qk_scale, s_layout, a_layout, BLOCK_N, STAGES, False, True, True,
                                    band_lo, band_hi, t_lo, TILE_PIPE, ds_c)
        else:
            for j in range(lo, n_full):
                dq, ds_c = _dq_tile(j, dq, q, do, lse, delta, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                    m_lo, Sq, Sk, qk_scale, s_layout, a_layout, BLOCK_N, STAGES, CAUSAL, False, False,
                                    0, 0, 0, TILE_PIPE, ds_c)
            for j in range(lo3, n_tiles):
                dq, ds_c = _dq_tile(j, dq, q, do, lse, delta, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                    m_lo, Sq, Sk, qk_scale, s_layout, a_layout, BLOCK_N, STAGES, CAUSAL, True, False,
                                    0, 0, 0, TILE_PIPE, ds_c)
        if PIPE:
            if n_tiles > 0:  # the last tile's product
                ds_op = gl.convert_layout(ds_c.to(q_desc.dtype), a_layout)
                dq = warpgroup_mma(ds_op, k_smem.index((n_tiles - 1) % STAGES), dq, is_async=True)
                dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))
        rows = m_lo + gl.arange(0, _KEYS, layout=gl.SliceLayout(1, acc_layout))
        cols = dq_col + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
        ptrs = dq_ptr + ((dq_row + rows).to(gl.int64) * dq_stride)[:, None] + cols[None, :]
        gl.store(ptrs, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=(rows < Sq)[:, None])

    @gluon.jit
    def attn_bwd_dq_ws_kernel(q_desc, do_desc, k_desc, v_desc, lse_ptr, delta_ptr, dq_ptr, H, GROUP, Sq, Sk,
                              qk_scale, sm_scale, HEAD_GROUP, band_lo, band_hi, BLOCK_N: gl.constexpr,
                              STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                              NUM_CONS: gl.constexpr = 2, LAYOUT: gl.constexpr = 0, REG_OPS: gl.constexpr = 0,
                              BAND: gl.constexpr = False, PIPE: gl.constexpr = False, cu_q=None, cu_k=None, TQ=None,
                              VARLEN: gl.constexpr = False):
        """dQ of a tile of 64 x NUM_CONS query rows of one head: Q and dO stay in shared memory, K
        and V stream through a ring (v5's loader); per key tile S = Q K^T and dP = dO V^T, then
        P, dS = P (dP - Delta) and dQ += dS K, as v3's dQ kernel, one consumer warpgroup per 64 rows.
        BAND (not with CAUSAL): only the key tiles the band reaches from these rows (``band_tiles``).
        PIPE: a key tile's dQ product is issued behind the next tile's S and dP (its K stage goes back a
        tile later). VARLEN (no BAND): packed sequences, the grid's second axis sequence x head (``cu_q`` /
        ``cu_k`` the offsets into the (total, heads x D) views, LSE and Delta (H, ``TQ``)); a CTA past its
        sequence's queries loads no key tile and stores nothing."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = _KEYS * NUM_CONS
        start_m = gl.program_id(0)
        bh = gl.program_id(1)
        if CAUSAL:  # longest first: a head group's last rows, then the ones before, ...
            start_m, bh = lpt_block_head(HEAD_GROUP)
            start_m = gl.num_programs(0) - 1 - start_m
        m0 = start_m * BM
        off_b = bh // H
        off_h = bh % H
        # Rows and columns in each tensor's 2-D view (gluon_fwd.head_rc); LSE and Delta are head-major.
        q_row, q_col = head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_Q)
        do_row, do_col = head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_DO)
        q_row += m0
        do_row += m0
        bhk = off_b * (H // GROUP) + off_h // GROUP  # the K / V head (GQA)
        k_row, k_col = head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_K)
        v_row, v_col = head_rc(bhk, off_b, off_h // GROUP, Sk, HEAD_DIM, LAYOUT & SEQ_V)
        dq_row, dq_col = head_rc(bh, off_b, off_h, Sq, HEAD_DIM, LAYOUT & SEQ_DQ)
        dq_stride = row_len(H, HEAD_DIM, LAYOUT & SEQ_DQ)
        lse_row = bh * Sq
        if VARLEN:  # sequence off_b's rows; Sq and Sk become its lengths
            gl.static_assert(not BAND, "VARLEN: no band")
            q0, Sq, k0, Sk = seq_span(cu_q, cu_k, off_b)
            q_row, q_col = q0 + m0, off_h * HEAD_DIM
            do_row, do_col = q_row, q_col
            k_row, k_col = k0, (off_h // GROUP) * HEAD_DIM
            v_row, v_col = k_row, k_col
            dq_row, dq_col, dq_stride = q0, q_col, H * HEAD_DIM
            lse_row = off_h * TQ + q0
        if BAND:  # the ring starts at the band's first key tile
            t_lo, n_tiles = band_tiles(m0, Sk, band_lo, band_hi, BM, BLOCK_N)
            k_row += t_lo * BLOCK_N
            v_row += t_lo * BLOCK_N
        else:
            t_lo = 0
            n_tiles = kv_tiles(start_m, Sk, BM, BLOCK_N, CAUSAL)
            if VARLEN:
                n_tiles = n_tiles * (m0 < Sq).to(gl.int32)  # past the sequence's queries: nothing to do
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONS, _KEYS, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [NUM_CONS, _KEYS, HEAD_DIM], do_desc.layout)
        k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = kv_ring(k_desc, v_desc, STAGES, NUM_CONS)
        qd_bar = gl.allocate_shared_memory(gl.int64, [NUM_CONS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(NUM_CONS):
            mbarrier.init(qd_bar.index(c), count=1)
        gl.static_assert(NUM_CONS == 2 or NUM_CONS == 3, "two or three consumer warpgroups")
        if NUM_CONS == 2:
            gl.warp_specialize([
                (_dq_consumer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready,
                                k_empty, v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col,
                                k_row, k_col, v_row, v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk,
                                qk_scale, sm_scale, BLOCK_N, STAGES, CAUSAL, NUM_CONS, REG_OPS, t_lo, band_lo, band_hi,
                                BAND, PIPE, 0)),
                (_dq_consumer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready,
                                k_empty, v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col,
                                k_row, k_col, v_row, v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk,
                                qk_scale, sm_scale, BLOCK_N, STAGES, CAUSAL, NUM_CONS, REG_OPS, t_lo, band_lo, band_hi,
                                BAND, PIPE, 1)),
                (_dq_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready,
                              k_empty, v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col,
                              k_row, k_col, v_row, v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk,
                              qk_scale, sm_scale, BLOCK_N, STAGES, CAUSAL, NUM_CONS, REG_OPS, t_lo, band_lo, band_hi,
                              BAND, PIPE, 0)),
            ], [4, 1], [CONSUMER_REGS, 24])
        else:  # three (D 64: 192 query rows share each K / V tile)
            gl.warp_specialize([
                (_dq_consumer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready,
                                k_empty, v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col,
                                k_row, k_col, v_row, v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk,
                                qk_scale, sm_scale, BLOCK_N, STAGES, CAUSAL, NUM_CONS, REG_OPS, t_lo, band_lo, band_hi,
                                BAND, PIPE, 0)),
                (_dq_consumer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready,
                                k_empty, v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col,
                                k_row, k_col, v_row, v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk,
                                qk_scale, sm_scale, BLOCK_N, STAGES, CAUSAL, NUM_CONS, REG_OPS, t_lo, band_lo, band_hi,
                                BAND, PIPE, 1)),
                (_dq_consumer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready,
                                k_empty, v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col,
                                k_row, k_col, v_row, v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk,
                                qk_scale, sm_scale, BLOCK_N, STAGES, CAUSAL, NUM_CONS, REG_OPS, t_lo, band_lo, band_hi,
                                BAND, PIPE, 2)),
                (_dq_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_bar, k_ready,
                              k_empty, v_ready, v_empty, lse_ptr, delta_ptr, dq_ptr, q_row, q_col, do_row, do_col,
                              k_row, k_col, v_row, v_col, lse_row, dq_row, dq_col, dq_stride, m0, n_tiles, Sq, Sk,
                              qk_scale, sm_scale, BLOCK_N, STAGES, CAUSAL, NUM_CONS, REG_OPS, t_lo, band_lo, band_hi,
                              BAND, PIPE, 0)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


def _extra_meta(meta: dict, extra, three: bool = False) -> None:
    """A config's optional 4th to 6th fields into launch meta: register operands, PIPE, consumer warpgroups (dQ's
    kernel: 2 or 3; only when not the default, so a default launch keeps its key)."""
    if len(extra) > 0 and extra[0]:
        meta["REG_OPS"] = int(extra[0])
    if len(extra) > 1 and extra[1]:
        meta["PIPE"] = True
    if len(extra) > 2 and extra[2] != 2:
        if not three or extra[2] != 3:
            raise ValueError(f"v6 config: consumer warpgroups must be 2{' or 3' if three else ''}, got {extra[2]!r}")
        meta["NUM_CONS"] = 3


def dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv, launch=None, memo=None, config=None, head_group=None,
         band=None, varlen=None):
    """dK, dV into ``dk``, ``dv`` (k's shape) from 16-bit q, k, v, do (B, H or Hkv, S, D), the
    forward's ``lse`` and the preprocess kernel's ``delta`` (B, H, Sq) fp32. q, k, v, do, dk and dv
    each head-major or sequence-major (``layout.rows``: read and written in place); the caller
    checks the layouts (``api._ws_bwd_applies``). ``launch``: the project's Triton
    launcher; default Triton's own dispatch. ``memo``: a dict shared with ``dq`` in the same
    backward (the descriptors both kernels use are built once). ``config``: (BLOCK_M, STAGES,
    consumer registers[, register operands: 0, 1 (K) or 2 (K and V)[, pipe: each query tile's dV and dK products
    behind the next tile's S^T and dP^T]]), default ``configs.ws_bwd_dkdv_config``'s.
    ``head_group``: causal launch order's heads a group (``gluon_items.lpt_block_head``; 1 is head by head), default
    ``configs.causal_head_group``'s. ``band``: (lo, hi) as ``reference.band`` (causal False): only the
    (query, key) pairs with lo <= key - query <= hi. ``varlen``: (cu_q, cu_k, max_q, max_k) for packed sequences,
    every tensor the (1, heads, total, D) view of a contiguous (total, heads, D) one, lse and delta (H, total_q);
    no band; Triton's own dispatch (the offsets are keyword arguments)."""
    from .gluon_fwd import _desc, run

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    bm, stages, regs, *extra = configs.ws_bwd_dkdv_config(D, config)
    (q2, _), (k2, _), (v2, _), (do2, _) = (tma_view(t) for t in (q, k, v, do))
    kd, vd = _desc(k2, (KEYS, D), memo), _desc(v2, (KEYS, D), memo)
    qd, dod = _desc(q2, (bm, D), memo), _desc(do2, (bm, D), memo)
    rows_b = B
    if varlen is not None:  # the grid by sequence, max_k keys each
        cu_q, cu_k, Sq, Sk = varlen
        rows_b = cu_q.numel() - 1
    grid = (-(-Sk // (2 * KEYS)), rows_b * Hkv)
    group = head_group or (configs.causal_head_group(grid[1], grid[0], sm_count(q.get_device())) if causal else 1)
    args = (kd, vd, qd, dod, lse, delta, dk, dv, H, H // Hkv, Sq, Sk, scale * LOG2E, scale, group, *(band or (0, 0)))
    meta = dict(BLOCK_M=bm, STAGES=stages, CAUSAL=bool(causal), CONSUMER_REGS=regs, NUM_CONS=2, num_warps=4)
    if band is not None:
        meta["BAND"] = True
    _extra_meta(meta, extra)
    if varlen is not None:
        meta.update(VARLEN=True, cu_q=cu_q, cu_k=cu_k, TQ=q.shape[2])
        launch = None
    else:
        layout = seq_mask(q=q, k=k, v=v, do=do, dk=dk, dv=dv)
        if layout:
            meta["LAYOUT"] = layout
    run(attn_bwd_dkdv_ws_kernel, grid, args, meta, launch)
    return dk, dv


def dq(q, k, v, do, lse, delta, causal, scale, dq_out, launch=None, memo=None, config=None, head_group=None,
       band=None, varlen=None):
    """dQ into ``dq_out`` (q's shape, head-major or sequence-major) from the same inputs as ``dkdv``. ``config``:
    (BLOCK_N, STAGES, consumer registers[, register operands: 0, 1 (Q) or 2 (Q and dO)[, pipe: each key tile's dQ
    product behind the next tile's S and dP[, consumer warpgroups: 2 or 3 (64 query rows each)]]]), default
    ``configs.ws_bwd_dq_config``'s; ``head_group``, ``band`` and ``varlen`` as ``dkdv``'s."""
    from .gluon_fwd import _desc, run

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    bn, stages, regs, *extra = configs.ws_bwd_dq_config(D, config)
    (q2, _), (k2, _), (v2, _), (do2, _) = (tma_view(t) for t in (q, k, v, do))
    qd, dod = _desc(q2, (KEYS, D), memo), _desc(do2, (KEYS, D), memo)
    kd, vd = _desc(k2, (bn, D), memo), _desc(v2, (bn, D), memo)
    meta = dict(BLOCK_N=bn, STAGES=stages, CAUSAL=bool(causal), CONSUMER_REGS=regs, NUM_CONS=2, num_warps=4)
    if band is not None:
        meta["BAND"] = True
    _extra_meta(meta, extra, three=True)  # checks the consumer count the grid is cut by
    rows_b = B
    if varlen is not None:  # the grid by sequence, max_q query rows each
        cu_q, cu_k, Sq, Sk = varlen
        rows_b = cu_q.numel() - 1
    grid = (-(-Sq // (meta["NUM_CONS"] * KEYS)), rows_b * H)
    group = head_group or (configs.causal_head_group(grid[1], grid[0], sm_count(q.get_device())) if causal else 1)
    args = (qd, dod, kd, vd, lse, delta, dq_out, H, H // Hkv, Sq, Sk, scale * LOG2E, scale, group, *(band or (0, 0)))
    if varlen is not None:
        meta.update(VARLEN=True, cu_q=cu_q, cu_k=cu_k, TQ=q.shape[2])
        launch = None
    else:
        layout = seq_mask(q=q, k=k, v=v, do=do, dq=dq_out)
        if layout:
            meta["LAYOUT"] = layout
    run(attn_bwd_dq_ws_kernel, grid, args, meta, launch)
    return dq_out
