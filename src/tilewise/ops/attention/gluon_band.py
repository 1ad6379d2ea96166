"""v5 for a band (sliding windows, bottom-right causal), in Gluon: the forward's loader / consumer CTA of
``gluon_fwd.py`` over only the key tiles a query tile's band reaches (``band_tiles``), its tiles and epilogue
(``gluon_fwd._tile``, ``_finish``) and its K / V ring, on a grid of query tiles or a persistent one. v6's band
backward (``gluon_bwd.py``) walks the same tile ranges. Where it runs and how fast: docs/tuning/attention.md
("v5 on a band", "Sliding windows").
"""

from __future__ import annotations

from ...runtime import cuda as rt
from . import configs
from . import gluon_fwd as ag
from .gluon_fwd import LOG2E, ROWS, _desc, run

if ag.available():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    from .gluon_fwd import _finish, _tile, _tma_load, fill_kv, kv_head_row, kv_ring

    _barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # Triton 3.6's name, 3.9's

    @gluon.jit
    def band_tiles(m0, Sk, band_lo, band_hi, BM: gl.constexpr, BLOCK_N: gl.constexpr):
        """(first key tile, key tiles) the BM query rows from ``m0`` reach in a band."""
        t_lo = gl.maximum(m0 + band_lo, 0) // BLOCK_N
        t_hi = gl.cdiv(gl.maximum(gl.minimum(m0 + BM + band_hi, Sk), 0), BLOCK_N)
        return t_lo, gl.maximum(t_hi - t_lo, 0)

    @gluon.jit
    def _skip_tile(slot, k_ready, k_empty, v_ready, v_empty, STAGES: gl.constexpr):
        # A ring fill this consumer's rows do not reach (the other consumer's): take and release it unread.
        s = slot % STAGES
        ph = (slot // STAGES) & 1
        mbarrier.wait(k_ready.index(s), ph)
        mbarrier.arrive(k_empty.index(s), count=1)
        mbarrier.wait(v_ready.index(s), ph)
        mbarrier.arrive(v_empty.index(s), count=1)

    @gluon.jit
    def _band_rows(q, k_smem, v_smem, q_smem, k_ready, k_empty, v_ready, v_empty, which, m_lo, t_lo, n_tiles, slot,
                   Sk, qk_scale, band_lo, band_hi, s_layout: gl.constexpr, o_layout: gl.constexpr,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_CONS: gl.constexpr, HEAD_DIM: gl.constexpr):
        """A consumer's 64 rows from ``m_lo`` over the CTA's ring fills slot .. slot + n_tiles - 1 (key
        tiles [t_lo, t_lo + n_tiles)); returns (acc, m_i, l_i). Of those tiles [c_lo, c_hi) reach these
        rows (the others are only the other consumer's: released unread), and of those [a, b) are inside
        the band for all 64 rows and inside Sk (no test); the tiles between are masked."""
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        t_hi = t_lo + n_tiles
        c_lo = gl.minimum(gl.maximum(t_lo, gl.maximum(m_lo + band_lo, 0) // BLOCK_N), t_hi)
        c_hi = gl.maximum(c_lo, gl.minimum(t_hi, gl.cdiv(gl.maximum(gl.minimum(m_lo + 64 + band_hi, Sk), 0),
                                                          BLOCK_N)))
        a = gl.minimum(gl.maximum(c_lo, gl.cdiv(gl.maximum(m_lo + 63 + band_lo, 0), BLOCK_N)), c_hi)
        b = gl.minimum(gl.minimum(gl.maximum(m_lo + band_hi + 1, 0) // BLOCK_N, Sk // BLOCK_N), c_hi)
        b = gl.maximum(a, b)
        m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([64], gl.float32, layout=row_s)
        acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
        base = slot - t_lo
        for j in range(t_lo, c_lo):
            _skip_tile(base + j, k_ready, k_empty, v_ready, v_empty, STAGES)
        for j in range(c_lo, a):
            acc, m_i, l_i = _tile(j, base + j, acc, m_i, l_i, q, k_smem, v_smem, q_smem, k_ready, k_empty, v_ready,
                                  v_empty, which, m_lo, Sk, qk_scale, s_layout, o_layout, BLOCK_N, STAGES, False,
                                  False, True, NUM_CONS, False, q_smem, 0, True, band_lo, band_hi)
        for j in range(a, b):
            acc, m_i, l_i = _tile(j, base + j, acc, m_i, l_i, q, k_smem, v_smem, q_smem, k_ready, k_empty, v_ready,
                                  v_empty, which, m_lo, Sk, qk_scale, s_layout, o_layout, BLOCK_N, STAGES, False,
                                  False, False, NUM_CONS, False, q_smem, 0)
        for j in range(b, c_hi):
            acc, m_i, l_i = _tile(j, base + j, acc, m_i, l_i, q, k_smem, v_smem, q_smem, k_ready, k_empty, v_ready,
                                  v_empty, which, m_lo, Sk, qk_scale, s_layout, o_layout, BLOCK_N, STAGES, False,
                                  False, True, NUM_CONS, False, q_smem, 0, True, band_lo, band_hi)
        for j in range(c_hi, t_hi):
            _skip_tile(base + j, k_ready, k_empty, v_ready, v_empty, STAGES)
        return acc, m_i, l_i

    @gluon.jit
    def _band_items(total, PERSISTENT: gl.constexpr):
        """(first, end, step) of the work items a band CTA walks: persistent, every num_programs-th of
        ``total`` from its own; else one, itself."""
        if PERSISTENT:
            return gl.program_id(0), total, gl.num_programs(0)
        return 0, 1, 1

    @gluon.jit
    def _band_item(tile, n_m, PERSISTENT: gl.constexpr):
        """(query tile, batch x head) of a band CTA's work item ``tile`` (persistent: head-major, so
        neighbouring items share their K / V tiles in L2), else of this CTA."""
        if PERSISTENT:
            return tile % n_m, tile // n_m
        return gl.program_id(0), gl.program_id(1)

    @gluon.jit
    def _bloader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
                 out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, band_lo, band_hi, n_m, total,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_CONS: gl.constexpr, PERSISTENT: gl.constexpr,
                 which: gl.constexpr):
        BM: gl.constexpr = 64 * NUM_CONS
        slot = 0
        it = 0
        first, end, step = _band_items(total, PERSISTENT)
        for tile in range(first, end, step):
            start_m, bh = _band_item(tile, n_m, PERSISTENT)
            q_row = bh * Sq + start_m * BM
            t_lo, n_tiles = band_tiles(start_m * BM, Sk, band_lo, band_hi, BM, BLOCK_N)
            for c in gl.static_range(NUM_CONS):
                # A consumer frees its Q buffer after its last S = Q K^T of the previous work item.
                mbarrier.wait(q_empty.index(c), (it & 1) ^ 1)
                mbarrier.expect(q_bar.index(c), q_desc.block_type.nbytes)
                _tma_load(q_desc, [q_row + c * 64, 0], q_bar.index(c), q_smem.index(c))
            kv_row = kv_head_row(bh, H, GROUP, Sk) + t_lo * BLOCK_N
            fill_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row, 0, kv_row, 0,
                    n_tiles, slot, BLOCK_N, STAGES)
            slot += n_tiles
            it += 1

    @gluon.jit
    def _bconsumer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
                   out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, band_lo, band_hi, n_m, total, o_desc, o_smem,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_CONS: gl.constexpr, PERSISTENT: gl.constexpr,
                   TMA_O: gl.constexpr, which: gl.constexpr):
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        q = q_smem.index(which)
        slot = 0
        it = 0
        first, end, step = _band_items(total, PERSISTENT)
        for tile in range(first, end, step):
            start_m, bh = _band_item(tile, n_m, PERSISTENT)
            m_lo = start_m * BM + which * 64
            t_lo, n_tiles = band_tiles(start_m * BM, Sk, band_lo, band_hi, BM, BLOCK_N)
            mbarrier.wait(q_bar.index(which), it & 1)
            acc, m_i, l_i = _band_rows(q, k_smem, v_smem, q_smem, k_ready, k_empty, v_ready, v_empty, which, m_lo,
                                       t_lo, n_tiles, slot, Sk, qk_scale, band_lo, band_hi, s_layout, o_layout,
                                       BLOCK_N, STAGES, NUM_CONS, HEAD_DIM)
            # Q was last read by the final S = Q K^T (waited on): the next item's Q load overlaps the epilogue.
            mbarrier.arrive(q_empty.index(which), count=1)
            if TMA_O:  # O through its own buffer (Q's goes back above), once the last item's store has read it
                tma.store_wait(0)
                _barrier()
            _finish(acc, m_i, l_i, out_ptr, lse_ptr, bh * Sq, bh * Sq, 0, HEAD_DIM, m_lo, Sq, s_layout, o_layout,
                    HEAD_DIM, o_desc, o_smem.index(which), TMA_O)
            slot += n_tiles
            it += 1
        if TMA_O:
            tma.store_wait(0)

    @gluon.jit
    def attn_fwd_ws_band_kernel(q_desc, k_desc, v_desc, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, band_lo,
                                band_hi, BH, o_desc, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, NUM_CONS: gl.constexpr = 2,
                                PERSISTENT: gl.constexpr = False, TMA_O: gl.constexpr = False):
        """v5 for a band (sliding windows, bottom-right causal): query i keeps key j where band_lo <= j - i
        <= band_hi. A CTA's loader fills the ring with the key tiles its 128 rows reach (``band_tiles``),
        and each consumer masks only the tiles its band cuts. No bias, mask or score mods; two consumers.
        PERSISTENT: one CTA an SM walks work items (query tile x head, head-major; BH = B x H) round
        robin, the ring and the Q buffers running on across items as in ``attn_fwd_ws_persistent_kernel``;
        else one CTA a query tile (grid (query tiles, BH)). TMA_O: O stored by TMA (``o_desc``, 64-row blocks of
        out's 2-D view) through a buffer a consumer of its own, 16 KB at D 128."""
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BM: gl.constexpr = 64 * NUM_CONS
        gl.static_assert(NUM_CONS == 2, "two consumer warpgroups")
        n_m = gl.cdiv(Sq, BM)
        total = n_m * BH
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONS, 64, HEAD_DIM], q_desc.layout)
        o_smem = q_smem  # unused
        if TMA_O:
            o_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONS, 64, HEAD_DIM], q_desc.layout)
        k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = kv_ring(k_desc, v_desc, STAGES, NUM_CONS)
        q_bar = gl.allocate_shared_memory(gl.int64, [NUM_CONS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [NUM_CONS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(NUM_CONS):
            mbarrier.init(q_bar.index(c), count=1)
            mbarrier.init(q_empty.index(c), count=1)
        gl.warp_specialize([
            (_bconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                          v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, band_lo, band_hi, n_m, total,
                          o_desc, o_smem, BLOCK_N, STAGES, NUM_CONS, PERSISTENT, TMA_O, 0)),
            (_bconsumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                          v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, band_lo, band_hi, n_m, total,
                          o_desc, o_smem, BLOCK_N, STAGES, NUM_CONS, PERSISTENT, TMA_O, 1)),
            (_bloader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, k_empty, v_ready,
                        v_empty, out_ptr, lse_ptr, H, GROUP, Sq, Sk, qk_scale, band_lo, band_hi, n_m, total,
                        BLOCK_N, STAGES, NUM_CONS, PERSISTENT, 0)),
        ], [4, 1], [CONSUMER_REGS, 24])


def fwd_band(q, k, v, band, scale, out, lse, launch=None, persistent=False, config=None, tma_out=True):
    """The band forward (``attn_fwd_ws_band_kernel``) into ``out`` / ``lse``; ``band`` = (lo, hi) as
    ``reference.band``. Two consumers with ``config``'s tile (as ``fwd``'s) when it has two, else v5's
    default tile; q, k, v and out contiguous (no bias). ``persistent``: one CTA an SM walking the (query
    tile, head) items; else a CTA an item. ``tma_out``: O stored by TMA from a buffer a consumer (the epilogue
    region was 7.8 % of the band kernel's samples at window 1024; on an H100 1.03-1.06x the 4-byte stores at D 128
    on the grid, 1.00-1.03x elsewhere, bitwise equal; tuning: "TMA out by default, the band's TMA epilogue")."""
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    chosen = config if config is not None and config[4] == 2 and config[3] is None else None
    bn, stages, regs, _, _ = configs.ws_fwd_config(D, False, chosen)
    q2, k2, v2 = q.view(-1, D), k.view(-1, D), v.view(-1, D)
    n_m = -(-Sq // (ROWS * 2))
    args = (_desc(q2, (ROWS, D)), _desc(k2, (bn, D)), _desc(v2, (bn, D)), out, lse, H, H // Hkv, Sq, Sk,
            scale * LOG2E, int(band[0]), int(band[1]), B * H, _desc(out.view(-1, D), (ROWS, D)) if tma_out else None)
    meta = dict(BLOCK_N=bn, STAGES=stages, CONSUMER_REGS=regs, NUM_CONS=2, PERSISTENT=bool(persistent), num_warps=4)
    if tma_out:
        meta["TMA_O"] = True
    grid = (min(rt.sm_count(q.get_device()), n_m * B * H),) if persistent else (n_m, B * H)
    run(attn_fwd_ws_band_kernel, grid, args, meta, launch)
    return out, lse
