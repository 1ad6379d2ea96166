"""The forward kernels' shared device functions (Gluon): key-tile counts and masks, the online softmax, the K / V
ring and its loads, rows and columns of a head in a tensor's 2-D view, packed sequences' offsets. v5's kernels
(``gluon_fwd``), the overlapped consumers (``gluon_overlap``), the band (``gluon_band``) and v6 (``gluon_bwd``) build
on them; ``gluon_fwd`` re-exports them.
"""

from __future__ import annotations

try:  # Gluon ships with Triton >= 3.5; the module imports without it (callers check ``gluon_fwd.available``)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    # Triton 3.6 names the TMA load async_copy_global_to_shared; later versions async_load.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _GLUON = True
except Exception:  # noqa: BLE001 - an older Triton
    _GLUON = False

if _GLUON:

    @gluon.jit
    def kv_tiles(start_m, Sk, BM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """Key tiles query tile ``start_m`` (of BM rows) reads: all of Sk; causal, up to its last row."""
        hi = Sk
        if CAUSAL:
            hi = gl.minimum(Sk, (start_m + 1) * BM)
        return gl.cdiv(hi, BLOCK_N)

    @gluon.jit
    def unmasked_tiles(m_lo, Sk, n_tiles, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """Key tiles [0, result) of 64 query rows from ``m_lo`` need no bounds or causal test."""
        n_full = Sk // BLOCK_N
        if CAUSAL:
            n_full = gl.minimum(n_full, (m_lo + 1) // BLOCK_N)
        return gl.minimum(n_full, n_tiles)

    @gluon.jit
    def _mask(t, j, m_lo, Sk, s_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
              BAND: gl.constexpr, band_lo, band_hi):
        offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = offs_n[None, :] < Sk
        if CAUSAL:
            offs_m = m_lo + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        if BAND:
            rows = m_lo + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
            rel = offs_n[None, :] - rows[:, None]
            keep = keep & (rel >= band_lo) & (rel <= band_hi)
        return gl.where(keep, t, float("-inf"))

    @gluon.jit
    def online_softmax(t, j, m_i, l_i, m_lo, Sk, qk_scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                       CAUSAL: gl.constexpr, MASKED: gl.constexpr, BAND: gl.constexpr = False, band_lo=0, band_hi=0,
                       n_full=0):
        """Key tile j's scores ``t`` for 64 query rows from ``m_lo``: with MASKED, keys past Sk (and, causal,
        after the row; BAND, outside band_lo <= n - m <= band_hi) to -inf (MASKED 2: only from tile n_full on,
        tested at run time); then the online softmax in the log2 domain, the scale in the exponent's FMA.
        Returns (p, alpha, m_new, l_new)."""
        if MASKED == 2:
            if j >= n_full:
                t = _mask(t, j, m_lo, Sk, s_layout, BLOCK_N, CAUSAL, BAND, band_lo, band_hi)
        elif MASKED:
            t = _mask(t, j, m_lo, Sk, s_layout, BLOCK_N, CAUSAL, BAND, band_lo, band_hi)
        m_new = gl.maximum(m_i, gl.max(t, 1) * qk_scale)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(t * qk_scale - m_safe[:, None])
        alpha = gl.exp2(m_i - m_safe)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)

    @gluon.jit
    def release_stored_q(q_empty, b):
        """Q buffer ``b``, which held O for a TMA store (``_finish``'s TMA_O), back to the loader once read."""
        tma.store_wait(0)
        mbarrier.arrive(q_empty.index(b), count=1)

    @gluon.jit
    def kv_ring(k_desc, v_desc, STAGES: gl.constexpr, NUM_CONS: gl.constexpr):
        """A ring of STAGES K and V tiles in shared memory with its mbarriers: ready (one TMA load's
        bytes) and empty (one arrival per consumer). Returns (k, v, k_ready, k_empty, v_ready, v_empty)."""
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(s), count=1)
            mbarrier.init(v_ready.index(s), count=1)
            mbarrier.init(k_empty.index(s), count=NUM_CONS)
            mbarrier.init(v_empty.index(s), count=NUM_CONS)
        return k_smem, v_smem, k_ready, k_empty, v_ready, v_empty

    @gluon.jit
    def fill_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, k_row, k_col, v_row, v_col,
                n_tiles, slot, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """The loader's side of a ``kv_ring``: key tiles 0 .. n_tiles - 1 from row ``k_row`` / ``v_row``
        (column ``k_col`` / ``v_col``, ``head_rc``) of the K / V views into the ring's fills slot,
        slot + 1, ... (each stage refilled once every consumer released it)."""
        for j in range(n_tiles):
            s = (slot + j) % STAGES
            ph = ((slot + j) // STAGES) & 1
            mbarrier.wait(k_empty.index(s), ph ^ 1)  # starts complete: the first pass does not wait
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            _tma_load(k_desc, [k_row + j * BLOCK_N, k_col], k_ready.index(s), k_smem.index(s))
            mbarrier.wait(v_empty.index(s), ph ^ 1)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            _tma_load(v_desc, [v_row + j * BLOCK_N, v_col], v_ready.index(s), v_smem.index(s))

    @gluon.jit
    def kv_head_row(bh, H, GROUP, Sk):
        """First row, in the (B * Hkv * Sk, D) K / V view, of query head ``bh``'s K / V head (GQA)."""
        return ((bh // H) * (H // GROUP) + (bh % H) // GROUP) * Sk

    @gluon.jit
    def head_rc(bh, b, h, S, D: gl.constexpr, SEQ: gl.constexpr):
        """(row, column) of head ``h`` of batch ``b`` (``bh`` = b x heads + h)'s first element in a tensor's 2-D
        view: head-major (SEQ 0; (B * heads * S, D)) row bh * S, column 0, as the kernels had it; sequence-major ((B
        * S, heads * D)) row b * S, column h * D. Rows past S belong to the next head or the next batch."""
        if SEQ:
            return b * S, h * D
        return bh * S, 0

    @gluon.jit
    def row_len(NH, D: gl.constexpr, SEQ: gl.constexpr):
        """Elements between a tensor's rows in its 2-D view (``head_rc``): D, or NH * D sequence-major."""
        if SEQ:
            return NH * D
        return D

    @gluon.jit
    def seq_span(cu_q, cu_k, b):
        """(first query row, queries, first key row, keys) of packed sequence ``b`` (varlen: ``cu_q`` / ``cu_k``
        its B + 1 int32 offsets into the (total, heads x D) views)."""
        q0 = gl.load(cu_q + b)
        k0 = gl.load(cu_k + b)
        return q0, gl.load(cu_q + b + 1) - q0, k0, gl.load(cu_k + b + 1) - k0
