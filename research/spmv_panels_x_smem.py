"""Panels on the uniform matrix (2M x 2M, 32 random columns a row), attacks on what is left
(research/notes/spmv.md, "Fourth pass, continued": 180.6-181.2 us = 69.8-70.0 % of copy; L2 throughput
68.5 %; x costs ~21M L2 sectors beside the 16M of the key / value stream; 64 registers x 1024
threads; the loop without any shared-memory accumulation takes 174 us).

(A) kv8 (panels_kv8 in spmv_panels_x_smem.cu): the library's kernel, same layout, same launch
    (66 panels x 2 CTAs, U = 4, rounds of 64 chunks), but key and value interleaved in one
    8-byte word (built on the GPU from Panels.key / Panels.val) and read with one 8-byte load
    instead of two 4-byte loads: a third fewer load instructions a chunk, the same bytes.

(B) xsmem (panels_xsmem<C, T, S, RW, G>): x staged through shared memory, shared by a cluster.
    * Every SM runs one CTA of its own panel of R = ceil(M / CTAs) rows (y in shared memory):
      clusters of C = 4 or 8 CTAs, as many clusters as Kernel.max_active_clusters says fit.
    * x in tiles of T floats through a ring of S tile buffers in each CTA's shared memory (W = S T
      floats: 128 KiB; + 4 R bytes of y: ~195 KiB a CTA for R = 16667). CTA rank q issues one TMA
      bulk copy of 1/C of each tile, multicast to all C CTAs (.multicast::cluster): the L2 serves
      each x byte once per cluster (8 MB per cluster, ~15-30 clusters) instead of once per panel
      and chunk edge (21M sectors = 672 MB now). Full / empty mbarriers per buffer (protocol in the
      .cu's header): a buffer is refilled only after all C CTAs released it.
      Lead: a round touches <= 3 tiles of 4096 (mean 2.9), so an 8-buffer ring lets the producer
      run ~5 tiles (~2.6 rounds, ~1.4 us) ahead, i.e. it tolerates ~1.4 us of x latency (Little:
      5 x 16 KiB in flight against 8 MB / 145 us a CTA); the first cluster to reach a tile would
      wait for DRAM, so each CTA also prefetches its slices pf = S tiles further into the L2
      (cp.async.bulk.prefetch.L2; timed once without), and S = 10 (160 KiB ring, fits beside
      R <= ~16.9k rows) is a variant.
      TMA rather than DSMEM stores: one instruction per tile slice from one thread, no registers,
      completion counted in bytes on each receiver's own mbarrier (no extra handshake), and the
      copies do not go through the SM-to-SM network (DSMEM stores would push (C - 1) / C x 8 MB
      into every SM over it, and take 1024 threads' loads and stores).
    * Layout (``build_xsmem`` below, torch ops): a panel's nonzeros in column order, cut into
      rounds of RW x 1024 entries (one per thread and sub-round), a round never spanning more than
      S - 2 tiles (so the producer can run >= 2 tiles ahead); meta[round] = first | last tile.
      Entry = 8 bytes (key = ring position << 16 | atomic << 15 | row in panel; value), one 8-byte
      load; no column-block base (the ring position is the column mod W), no chunk padding at
      column blocks. Race-free adds without barriers inside a round: a row that occurs 2..RW
      times in a round has all its entries in one thread (its sub-rounds: program order); a row
      occurring more often (rare: statistics below) is added with shared-memory atomics for all
      its entries of that round. Singles are dealt so that a chunk's 32 lanes tend to hit different y banks (and,
      inside a row bank, different x banks).
    * Layout statistics from --cpu-check on a uniform-like 33334 x 200003 matrix with the same rows
      a panel (16667) and 32 columns a row (a round sees the same row multiplicities as on 2M x 2M):
      RW = 2: padding 0.23 %, 10.6 % of entries grouped in a thread, 0.64 % atomic; RW = 4:
      padding 0.61 %, 21 % grouped, 0.01 % atomic. Shared-memory wavefronts of one access of a
      chunk: y 2.15 (RW 2) / 2.49 (RW 4), x 3.35 / 3.32 (32 random addresses: ~3.5; the deal helps
      y only: the group threads' banks are random).

PREDICTION (written before any GPU run; H200, copy 4.24 TB/s, floor 536.0 MB = 126.4 us at 100 %,
70 % = 180.6 us):
  (A) kv8: the same L2 sectors (16M stream + 21M x) and DRAM bytes, a third fewer load
      instructions a chunk: a few us at most, 176-180 us (70-72 %).
  (B) xsmem, bytes:
      DRAM: key / value stream 64M x 8 B x 1.002-1.006 (padding) = 513-515 MB; x once (the
      clusters walk x in step, a window of a few MB stays in L2) 8 MB; y 8 MB; meta 0.1 MB:
      ~530 MB -> 125 us at the copy rate.
      L2 -> SM: 514 MB stream + 8 MB x a cluster (30 x 8 = 240 MB at C = 4, ~16 x 8 = 128 MB at
      C = 8) = 640-750 MB, against the library's 512 + 672 = 1,184 MB at 68.5 % L2 throughput:
      the L2 no longer limits. But each SM now takes in 8 MB of x + 4.3 MB of stream = 12.3 MB
      (library: ~9 MB): ~46 B/clk at 145 us and 1.85 GHz, a risk if an SM's port from the
      L2 / GPC is ~64 B/clk.
      Shared memory a CTA: the TMA writes 8 MB (at 128 B/clk: 65k clk) + 16.7k chunk steps x
      (y load 2.15 + y store 2.15 + x gather 3.35 wavefronts) = 128k clk: ~193k clk = 104 us at
      1.85 GHz, under the DRAM time (random banks: 240k clk = 130 us).
      Time: bound by the 530 MB from DRAM at a streaming read's ~90 % of copy: 139 us, plus the
      round barriers (~130-260 rounds a CTA) and the pipeline start: ~145 us (range 135-160),
      i.e. ~87 % of copy at the floor (536.0 MB / 145 us = 3.70 TB/s). C = 4 and C = 8 within a
      few % (C = 8 halves x's L2 traffic, but 8 CTAs must keep in step); RW = 4 (half the
      barriers) a few % faster than RW = 2; S = 10 no faster than S = 8 with the L2 prefetch on;
      without the prefetch, slower by up to ~10 % if the x latency passes ~1.4 us.

RESULT (H200, bench/results/logs/spmv-x-smem-26125e0.log; copy 4224 GB/s, 70 % = 181.3 us): all
  correct, xsmem 7x off the prediction.
      library panels 66x2                  180.2 us  70.4 % of copy
      kv8 66x2 U 4                         187.2 us  67.8 %   (a third fewer loads did not help)
      xsmem C 4 T 4096 S 8  RW 2 G 6      1246.4 us           (1244.6 without the L2 prefetch)
      xsmem C 8 T 4096 S 8  RW 2 G 6      1570.3 us
      xsmem C 4 T 4096 S 8  RW 4 G 3       945.7 us           (best old row; kept as the reference)
      xsmem C 8 T 4096 S 8  RW 4 G 3      1271.5 us
      xsmem C 4 T 4096 S 10 RW 2 G 6      1250.2 us
  Per CTA: 489 tiles, 261 rounds (RW 2) / 131 (RW 4). A fit: time = 2.3 us a round + (0.17 C +
  0.65) us a tile (RW 2 -> 4 halves the rounds and saves 300 us; C 4 -> 8 adds 325 us at both RW,
  i.e. 0.17 us per extra arrive and tile); S, the L2 prefetch: no effect. Nothing overlapped.

CAUSE (from the .cu and its SASS, read with nvdisasm; details in the .cu's header):
  * Each release, mbarrier.arrive.release.cluster on a peer's empty[s], compiles to MEMBAR.ALL.CTA;
    MEMBAR.ALL.GPU; ERRBAR; CGAERRBAR; SYNCS.ARRIVE. Thread 0, the producer, is also a consumer: it
    has just issued its key / value loads of round r + G, and its first fence waits for them (a
    loaded DRAM round trip, ~1-2 us: the G-deep load pipeline is waited for every round); each
    further arrive waits for the last one's acknowledgement (~0.17 us: the C term of the fit),
    1.9 tiles x C = ~8 arrives a round. Warp 0 stalls, and the next __syncthreads holds all 32 warps
    behind it. The empty test (acquire.cluster) adds a CCTL.IVALL (L1 invalidated) per tile issued.
  * Thread 0 issues only at a round's end or in its own wait loops (a tile freed just after it
    looked waits a whole round) and spins in a branch divergent from its warp's 31 other lanes.
  Old timeline of one round (C 4, RW 2; ~4.8 us measured): all warps gather and add (~0.3 us of
  shared-memory work), issue round r + G's loads, __syncthreads; thread 0: first fenced arrive
  waits for those loads (~1-2 us), ~7 more at ~0.17 us (~1.2 us), pump: test (+ L1 invalidate),
  expect_tx, copy, prefetches; the other 31 warps finish round r + 1 and wait for warp 0 at its
  barrier. Old timeline of one tile: released by each CTA ~1.5-3 us after the round end (behind
  the fences), issued by each CTA at its next pump after the last release (0 .. 1 round = up to
  ~4.8 us), copied in ~1 us; the ~2.6 rounds of ring lead hid that: the fences, not the tile
  waits, set the pace (hence no effect of S or the prefetch).

(C) xsmem2 (panels_xsmem2<C, T, S, RW, G>, protocol in the .cu's header): the same staging and
    layout, dealt over 31 consumer warps (rounds of RW x 992 entries; the builder's nw = 31); warp 31
    is a producer warp that never joins a round barrier (the consumers' is named barrier 1 of 992
    threads), loads nothing through the generic proxy and sleeps in try_wait. No fence in the
    loop: every arrive and wait has the default .cta semantics (a plain SYNCS.ARRIVE /
    SYNCS.PHASECHK in SASS, as CUTLASS's PipelineTmaAsync; checked with nvdisasm). Each consumer
    warp releases a tile (local consumed[s], count 31) right after its own adds of the last round
    reading it; the producer forwards consumed[s] to the C CTAs' empty[s] (lanes 0 .. C - 1 in
    parallel), waits empty[s] and issues tile t + S at once (lane 0: expect_tx + 16 KiB / C slice
    multicast + L2 prefetch of tile t + pf). The CPU check runs this protocol's model
    (simulate_protocol2: 1-3 consumer warps a CTA, slices and remote arrives landing late in random
    order; it catches a missing empty wait, a release before the wait, a lost forward, a too small
    ring) on every case.
    Timed: the library, the best old row, and xsmem2 C 4 S 8 RW 2, C 4 S 10 RW 2 (and without the
    L2 prefetch), C 8 S 10 RW 2, C 4 S 8 RW 4 (all T 4096; kv8 is checked, not timed).

PREDICTION 2 (written before running xsmem2):
  New timeline of one tile (release to landed, L): the last consumer warp of the slowest CTA ends
  the last round reading t and arrives (~0.02 us); its producer wakes (~0.1) and forwards over
  DSMEM (~0.2-0.3); each producer wakes on empty (~0.1) and issues its 4 KiB (C 4) slice of t + S:
  TMA from L2 (~0.6-0.8 us; ~1.2 from DRAM), multicast to the C SMs, complete_tx, consumers wake
  (~0.05): L ~ 1.1-1.5 us, plus the C CTAs' skew (~0.3 us, half a round): L + skew ~ 1.4-1.8 us.
  New timeline of one round (RW 2, 992 x 2 entries): gathers and adds (~0.3-0.5 us of shared-memory
  work with G = 6 rounds of loads in flight), ~1.8 local arrives a warp, a 992-thread barrier;
  nothing serial on any warp: ~0.54 us a round at the target (145 us / 269 rounds a CTA).
  Ring lead: a round advances 1984 / 1092 = 1.82 tiles of x (a panel: 533k entries over 489 tiles;
  RW 4: 3.64) and reads lo .. hi; tile t is released at the end of the first round with lo(r + 1)
  > t, and t + S is needed at the start of the first round with hi >= t + S. Counted over random
  round boundaries (pipeline_model, printed by --cpu-check): S - 2.8 tiles of consumption between
  the two on average at RW 2, at least 2 rounds (S 8: 5.2 tiles = 1.55 us at the target's 0.30 us
  a tile; S 10: 7.2 = 2.15 us); RW 4: S - 4.6 tiles, at least 0 rounds at S 8 (3.4 tiles = 1.0 us;
  S 10: 5.4 = 1.6 us). pipeline_model times 489 tiles with rounds of fixed work (0.54 us at RW 2,
  1.08 at RW 4: the DRAM-bound pace) that start only once their tiles landed, tile t + S landing
  L + skew after the release of t:
                 L + skew = 1.0    1.4    1.8    2.2 us
      RW 2 S 8           146    162    183    205 us
      RW 2 S 10          146    147    152    164
      RW 4 S 8           184    214    249    283
  * xsmem2 C 4 S 10 RW 2: the lead covers L: bound by the DRAM stream (530 MB at ~90 % of copy:
    139 us) + start / end: ~150 us (143-165), 78-88 % of copy at the floor.
  * xsmem2 C 4 S 8 RW 2: ~170 us (150-205).
  * xsmem2 C 4 S 10 RW 2 without the L2 prefetch: the first cluster on a tile reads DRAM (L + ~0.5):
    0-10 % slower than with it.
  * xsmem2 C 8 S 10 RW 2: same lead a CTA, half the L2 reads of x (120 MB), more skew among 8 CTAs:
    within 10 % of C 4.
  * xsmem2 C 4 S 8 RW 4: lead-starved, ~230 us (185-285); RW no longer matters by its barriers.
  * Reference rows as in the first run (library ~180 us, xsmem C 4 S 8 RW 4 ~946 us).
  If xsmem2 C 4 S 10 RW 2 comes out > 250 us, something still serializes (look at the named
  barrier's wait, the consumers' try_wait wake-up, or the producer's wake-up); if S 8 and S 10,
  RW 2 and RW 4 are all ~150, L + skew is below ~1 us.
  Registers (ptxas, sm_90): xsmem2 58 (RW 2) / 63 (RW 4), no spills; the old xsmem 63.

Run on the GPU (< 3 minutes on an H200): PYTHONPATH=src python3 research/spmv_panels_x_smem.py
CPU check of the layout builder (no GPU): PYTHONPATH=src python3 research/spmv_panels_x_smem.py --cpu-check
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

SRC = Path(__file__).with_suffix(".cu")
NT, NW = 1024, 32            # threads, warps of panels_xsmem (all consume)
NW2 = 31                     # consumer warps of panels_xsmem2 (warp 31 is its producer)
PAD = 0x7FFF                 # padding key (row field 0x7FFF, ring position 0)
BAR_BYTES = 512              # the .cu's xs::kBarBytes
SMEM_MAX = 227 * 1024        # dynamic shared memory a CTA may opt into on sm_90
KV8 = [(1024, 2, 4, 64)]                                                    # panels_kv8<NT, CL, U, rounds>: checked, not timed
XSMEM = [(4, 4096, 8, 4, 3)]                                                # panels_xsmem<C, T, S, RW, G>: the best old row
XSMEM2 = [(4, 4096, 8, 2, 6), (4, 4096, 10, 2, 6), (8, 4096, 10, 2, 6), (4, 4096, 8, 4, 3)]  # panels_xsmem2<C, T, S, RW, G>


def smem_bytes(R: int, T: int, S: int) -> int:
    """barriers + ring (+ 32 floats: x's tail and alignment) + y, as the .cu lays them out."""
    return BAR_BYTES + (S * T + 32) * 4 + R * 4


def _i32(k: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the same bits as int32."""
    return torch.where(k >= 2**31, k - 2**32, k).to(torch.int32)


# --------------------------------------------------------------------------- (B) layout builder


@dataclass
class XLayout:
    kv: torch.Tensor           # (rounds * RW * 32 * 32,) int64: entry = key (low 32 bits) | value bits << 32
    meta: torch.Tensor         # (rounds,) int32: first tile | last tile << 16
    panel_round: torch.Tensor  # (n_cta + 1,) int32: panel p's rounds
    R: int
    n_cta: int
    T: int
    S: int
    RW: int
    shape: tuple
    nnz: int
    nw: int = NW               # consumer warps the layout is dealt over (chunk s nw + warp of a round)
    stats: dict = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return self.meta.numel()


def build_xsmem(row_ptr, col, val, shape, n_cta: int, R: int, T: int, S: int, RW: int, nw: int = NW) -> XLayout:
    """The layout panels_xsmem (nw = 32 consumer warps) or panels_xsmem2 (nw = 31) reads, with torch
    ops on the arrays' device (CPU or GPU). A round holds RW x nw x 32 entries.

    Panel p = rows [p R, (p + 1) R) = CTA p. Its nonzeros sorted by column, cut greedily into rounds
    of at most RW x 1024 entries whose columns lie in tiles [t0, t0 + S - 3] (t0: the first
    entry's tile); inside a round each entry gets a cell (thread, sub-round): rows occurring 2..RW
    times take one thread each (entry o in sub-round o; holes left by groups smaller than RW filled
    by single entries), rows occurring more often are flagged atomic; if a round has fewer single
    entries than holes, all its rows that repeat are flagged atomic instead. Single / atomic entries
    fill the holes, then the free threads, dealt lane-major with the entries sorted by (row bank,
    x bank - row bank) so a chunk's lanes see different banks."""
    dev = col.device
    M, N = int(shape[0]), int(shape[1])
    nnz = col.numel()
    W, N4, n_tiles = S * T, N & ~3, -(-N // T)
    if not (R <= 32766 and n_tiles <= 65535 and W + 4 <= 65536 and n_cta * R >= M and RW in (2, 4) and S >= 3):
        raise ValueError(f"build_xsmem: unsupported shape R={R} tiles={n_tiles} W={W} n_cta={n_cta} RW={RW} S={S}")
    span = S - 2                 # tiles a round may touch
    NW = nw                      # consumer warps
    B, RC = RW * NW * 32, RW * NW  # entries, chunks a round
    L = torch.long
    lengths = (row_ptr[1:] - row_ptr[:-1]).to(L)
    r = torch.repeat_interleave(torch.arange(M, device=dev), lengths, output_size=nnz)
    c = col.to(L)
    panel = r // R
    key1, order = torch.sort(panel * N + c, stable=True)
    panel, c = panel[order], c[order]
    rl = r[order] - panel * R
    v = val[order].float()
    del r, order
    tile = c // T
    counts = torch.bincount(panel, minlength=n_cta)
    pe = torch.cumsum(counts, 0)
    ps = pe - counts
    # Greedy rounds, all panels at once: a round from entry i ends after B entries, at the panel's
    # end, or before the first entry past its tile window.
    pid = torch.arange(n_cta, device=dev)
    cur, starts = ps.clone(), []
    while True:
        act = torch.nonzero(cur < pe).flatten()
        if act.numel() == 0:
            break
        ca = cur[act]
        lim = act * N + torch.clamp((tile[ca] + span) * T, max=N)
        nxt = torch.minimum(torch.minimum(ca + B, pe[act]), torch.searchsorted(key1, lim))
        starts.append(ca)
        cur[act] = nxt
    del key1, pid
    rs = torch.sort(torch.cat(starts))[0] if starts else torch.zeros(0, dtype=L, device=dev)
    n_rounds = rs.numel()
    round_panel = panel[rs]
    panel_round = torch.zeros(n_cta + 1, dtype=L, device=dev)
    panel_round[1:] = torch.cumsum(torch.bincount(round_panel, minlength=n_cta), 0)
    rend = torch.cat([rs[1:], rs.new_tensor([nnz])]) if n_rounds else rs
    lo, hi = tile[rs], tile[rend - 1]
    meta = _i32(lo | (hi << 16))
    rid = torch.searchsorted(rs, torch.arange(nnz, device=dev), right=True) - 1
    del panel, rend

    # Rows' multiplicity inside their round: runs of equal (round, row).
    key2, o2 = torch.sort(rid * R + rl, stable=True)
    newrun = torch.ones(nnz, dtype=torch.bool, device=dev)
    newrun[1:] = key2[1:] != key2[:-1]
    run = torch.cumsum(newrun, 0) - 1
    del key2, newrun
    nrun = int(run[-1]) + 1 if nnz else 0
    g_run = torch.bincount(run, minlength=nrun)
    run_first = torch.cumsum(g_run, 0) - g_run
    occ = torch.arange(nnz, device=dev) - run_first[run]
    c, rl, v, rid = c[o2], rl[o2], v[o2], rid[o2]   # from here on: entries in (round, row) order
    run_round = rid[run_first]
    zero_r = lambda: torch.zeros(n_rounds, dtype=L, device=dev)  # noqa: E731

    def classify(grouped):
        holes_run = torch.where(grouped, RW - g_run, 0)
        fill = zero_r().index_add_(0, run_round, torch.where(grouped, 0, g_run))
        return holes_run, zero_r().index_add_(0, run_round, holes_run), fill

    grouped = (g_run >= 2) & (g_run <= RW)
    holes_run, holes_r, fill_r = classify(grouped)
    bad = fill_r < holes_r
    grouped &= ~bad[run_round]
    holes_run, holes_r, fill_r = classify(grouped)
    atomic_run = (g_run >= 2) & ~grouped
    gr = grouped.to(L)
    gex = torch.cumsum(gr, 0) - gr
    round_first_run = torch.searchsorted(run_round, torch.arange(n_rounds, device=dev))
    grank = gex - gex[round_first_run][run_round]      # a grouped run's thread (lane-major rank)
    ngroups_r = zero_r().index_add_(0, run_round, gr)
    hole_run = torch.repeat_interleave(torch.arange(nrun, device=dev), holes_run)
    hole_sub = g_run[hole_run] + (torch.arange(hole_run.numel(), device=dev) - (torch.cumsum(holes_run, 0) - holes_run)[hole_run])
    hole_rank = grank[hole_run]
    hole_off_r = torch.cumsum(holes_r, 0) - holes_r

    is_grp = grouped[run]
    rank = torch.where(is_grp, grank[run], 0)
    sub = torch.where(is_grp, occ, 0)
    pos = torch.where(c < N4, c % W, W + c - N4)        # ring position
    # Singles and atomic entries: sorted by (round, row bank, x bank - row bank), then the first
    # holes_r of a round fill its holes, the rest go lane-major over the threads above its groups.
    fidx = torch.nonzero(~is_grp).flatten()
    rb, cb = rl[fidx] % 32, pos[fidx] % 32
    key3 = rid[fidx] * 1024 + rb * 32 + (cb - rb) % 32
    fidx = fidx[torch.sort(key3, stable=True)[1]]
    del key3, rb, cb
    f_rid = rid[fidx]
    k = torch.arange(fidx.numel(), device=dev) - (torch.cumsum(fill_r, 0) - fill_r)[f_rid]
    h = holes_r[f_rid]
    in_hole = k < h
    hsel = torch.clamp(hole_off_r[f_rid] + k, max=max(hole_run.numel() - 1, 0))
    f = k - h
    j0 = ngroups_r[f_rid]
    l0, w0 = j0 // NW, j0 % NW
    wid = NW - w0
    cnt0 = RW * wid
    first = f < cnt0
    f2 = torch.clamp(f - cnt0, min=0)
    lane_d = torch.where(first, l0, l0 + 1 + f2 // (RW * NW))
    sub_d = torch.where(first, torch.div(f, wid, rounding_mode="floor"), (f2 % (RW * NW)) // NW)
    warp_d = torch.where(first, w0 + f % wid, f2 % NW)
    if hole_run.numel():
        rank[fidx] = torch.where(in_hole, hole_rank[hsel], lane_d * NW + warp_d)
        sub[fidx] = torch.where(in_hole, hole_sub[hsel], sub_d)
    else:
        rank[fidx] = lane_d * NW + warp_d
        sub[fidx] = sub_d
    lane, warp = rank // NW, rank % NW
    if nnz and int(lane.max()) >= 32:
        raise AssertionError("build_xsmem: a round overflowed its cells")
    slot = (rid * RC + sub * NW + warp) * 32 + lane
    atomic = atomic_run[run]
    total = n_rounds * RC * 32
    kk = torch.full((total,), PAD, dtype=torch.int32, device=dev)
    kk[slot] = _i32((pos << 16) | (atomic.to(L) << 15) | rl)
    vv = torch.zeros(total, dtype=torch.float32, device=dev)
    vv[slot] = v
    kv = torch.stack([kk, vv.view(torch.int32)], 1).contiguous().view(torch.int64).view(-1)
    stats = dict(rounds=n_rounds, slots=total, pad=1 - nnz / max(total, 1), atomic=float(atomic.float().mean()) if nnz else 0.0,
                 grouped=float(is_grp.float().mean()) if nnz else 0.0, bad_rounds=int(bad.sum()),
                 max_span=int((hi - lo).max()) + 1 if n_rounds else 0)
    return XLayout(kv, meta, _i32(panel_round), R, n_cta, T, S, RW, (M, N), nnz, nw, stats)


def decode(Lx: XLayout):
    """Per slot: (key as uint32 in int64, value, round, sub-round, warp, lane)."""
    kv = Lx.kv.view(torch.int32).view(-1, 2)
    key = kv[:, 0].long() & 0xFFFFFFFF
    val = kv[:, 1].contiguous().view(torch.float32)
    slot = torch.arange(key.numel(), device=key.device)
    RC = Lx.RW * Lx.nw
    chunk = slot // 32
    return key, val, chunk // RC, (chunk % RC) // Lx.nw, chunk % Lx.nw, slot % 32


def bank_wavefronts(Lx: XLayout) -> tuple[float, float]:
    """Mean over chunks with work of the shared-memory wavefronts of one access (the most distinct
    addresses any bank sees among the chunk's 32 lanes): (y by row, x gathers by ring position)."""
    key, _, _, _, _, _ = decode(Lx)
    n_chunks = key.numel() // 32
    chunk = torch.arange(key.numel(), device=key.device) // 32
    ok = (key & PAD) != PAD
    out = []
    for addr in ((key & PAD), key >> 16):
        ids = torch.unique(chunk[ok] * 65536 + addr[ok])
        cnt = torch.bincount((ids // 65536) * 32 + (ids % 65536) % 32, minlength=n_chunks * 32).view(n_chunks, 32)
        mx = cnt.max(1)[0]
        out.append(float(mx[mx > 0].float().mean()) if bool((mx > 0).any()) else 0.0)
    return out[0], out[1]


# --------------------------------------------------------------------------- CPU check


def tile_slices(t: int, q: int, N: int, T: int, C: int):
    """What CTA rank q copies of tile t, as the kernel's pump computes it: (expected bytes of the
    tile, first float, floats) of its slice."""
    N4 = N & ~3
    c0, c1 = t * T, min(t * T + T, N4)
    q0 = c0 + q * (T // C)
    q1 = min(q0 + T // C, c1)
    return (max(c1 - c0, 0) * 4, q0, max(q1 - q0, 0))


def emulate(Lx: XLayout, row_ptr, col, val, x, C: int) -> torch.Tensor:
    """Walk the layout as panels_xsmem does (CPU, float64) and check its invariants; returns y."""
    M, N = Lx.shape
    T, S, W, R = Lx.T, Lx.S, Lx.S * Lx.T, Lx.R
    N4, n_tiles = N & ~3, -(-N // T)
    key, v, rnd, sub, warp, lane = decode(Lx)
    meta = Lx.meta.long() & 0xFFFFFFFF
    lo, hi = meta & 0xFFFF, meta >> 16
    pr = Lx.panel_round.long()
    assert pr[0] == 0 and pr[-1] == Lx.rounds and bool((pr[1:] >= pr[:-1]).all())
    rpanel = torch.searchsorted(pr, torch.arange(Lx.rounds), right=True) - 1
    # rounds: a window that fits the ring with >= 2 tiles to spare; lo never decreases in a panel
    assert bool((hi >= lo).all()) and bool((hi - lo <= S - 3).all()), "round spans too many tiles"
    same = rpanel[1:] == rpanel[:-1]
    assert bool((lo[1:][same] >= lo[:-1][same]).all()), "lo decreases inside a panel"
    ok = (key & PAD) != PAD
    assert bool((v[~ok] == 0).all()) and bool(((key[~ok]) == PAD).all()), "padding is not key 0x7FFF, value 0"
    key, v, rnd, sub, thread = key[ok], v[ok], rnd[ok], sub[ok], (warp * 32 + lane)[ok]
    posr, atomic, rl = key >> 16, (key >> 15) & 1, key & PAD
    p = rpanel[rnd]
    row = p * R + rl
    assert bool((rl < R).all()) and bool((row < M).all()), "row outside its panel or the matrix"
    # column back from the ring position: the unique column of the round's window with that position
    base = lo[rnd] * T
    colr = torch.where(posr < W, base + (posr - base) % W, N4 + posr - W)
    assert bool((posr < W + max(N - N4, 0)).all()) and bool((colr < N).all()) and bool((colr >= 0).all())
    tl = colr // T
    assert bool((tl >= lo[rnd]).all()) and bool((tl <= hi[rnd]).all()), "an entry outside its round's tiles"
    # every nonzero exactly once
    lengths = (row_ptr[1:] - row_ptr[:-1]).long()
    r0 = torch.repeat_interleave(torch.arange(M), lengths)
    got = torch.sort(row * N + colr)[0]
    want = torch.sort(r0 * N + col.long())[0]
    assert got.numel() == want.numel() and bool((got == want).all()), "entries lost or duplicated"
    og, ow = torch.argsort(row * N + colr), torch.argsort(r0 * N + col.long())
    assert bool((v[og] == val.float()[ow]).all()), "values moved between entries"  # (row, col) are distinct here
    # race freedom: inside a round a row is either in one thread only (plain adds) or atomic only
    kr = rnd * R + rl
    o = torch.argsort(kr * 2048 + thread * 2 + atomic)
    kr_s, th_s, at_s = kr[o], thread[o], atomic[o]
    dup = kr_s[1:] == kr_s[:-1]
    assert bool((at_s[1:][dup] == at_s[:-1][dup]).all()), "a row mixes atomic and plain adds in a round"
    plain = dup & (at_s[1:] == 0)
    assert bool((th_s[1:][plain] == th_s[:-1][plain]).all()), "a row in two threads of a round"
    # a thread's two entries of one row are in different sub-rounds (program order), trivially: a cell is one entry
    # TMA slices: inside x, 16-byte multiples, covering [t T, min(t T + T, N4)) once
    for t in range(n_tiles):
        cover = []
        for q in range(C):
            nbytes, q0, n = tile_slices(t, q, N, T, C)
            if n:
                assert q0 >= 0 and q0 + n <= N4 and (n * 4) % 16 == 0 and (q0 * 4) % 16 == 0
                assert ((t % S) * T + q * (T // C)) * 4 % 16 == 0
                cover.append((q0, q0 + n))
        cover.sort()
        want_lo, want_hi = t * T, min(t * T + T, N4)
        if want_hi > want_lo:
            assert cover[0][0] == want_lo and cover[-1][1] == want_hi and all(a[1] == b[0] for a, b in zip(cover, cover[1:]))
            assert sum(b - a for a, b in cover) * 4 == nbytes
        else:
            assert not cover and nbytes == 0
    y = torch.zeros(M, dtype=torch.float64).index_add_(0, row, v.double() * x.double()[colr])
    return y


def simulate_protocol(Lx: XLayout, C: int, seed: int, landing_delay: float = 0.5) -> int:
    """Run the kernel's barrier protocol (thread 0 and the other threads of each CTA, mbarrier
    phases with parity waits, multicast slices landing late and in random order) for every cluster
    of the layout under a random schedule. Checks: no deadlock; a consumer reads a round only when
    its tiles sit complete in its ring; no slice lands in a buffer a CTA of the cluster has not
    released; every parity wait is unambiguous. Returns the scheduler steps taken."""
    rng = random.Random(seed)
    N = Lx.shape[1]
    T, S = Lx.T, Lx.S
    n_tiles = -(-N // T)
    meta = (Lx.meta.long() & 0xFFFFFFFF).tolist()
    pr = Lx.panel_round.tolist()
    assert Lx.n_cta % C == 0
    steps = 0
    for cl in range(Lx.n_cta // C):
        ctas = list(range(cl * C, (cl + 1) * C))
        # mbarriers: [completed phases, pending arrivals, tx]
        full = {(q, s): [0, 1, 0] for q in range(C) for s in range(S)}
        empty = {(q, s): [0, C, 0] for q in range(C) for s in range(S)}
        ring = {(q, s, j): None for q in range(C) for s in range(S) for j in range(C)}  # tile of each slice
        released = [0] * C   # tiles each CTA released
        inflight = []        # (dest, buffer, slice j, tile, bytes)
        ver = [0]

        def full_tx(b, nbytes):
            b[2] -= nbytes
            if b[1] == 0 and b[2] == 0:
                b[0] += 1
                b[1], b[2] = 1, 0
            ver[0] += 1

        def test(b, parity, t=None):
            if t is not None:  # unambiguous: the barrier is at the waited phase or one past it
                assert b[0] in (t // S, t // S + 1), f"ambiguous parity wait: phase {b[0]}, tile {t}"
            return (b[0] & 1) != parity

        def cta(q):
            st = {"issued": 0, "have0": 0, "have": 0}

            def pump():
                while st["issued"] < n_tiles:
                    t = st["issued"]
                    s = t % S
                    if t >= S:
                        assert empty[(q, s)][0] in (t // S - 1, t // S), "ambiguous parity wait (empty)"
                        if not test(empty[(q, s)], (t // S - 1) & 1):
                            return
                    nbytes = tile_slices(t, q, N, T, C)[0]
                    b = full[(q, s)]
                    b[1] -= 1
                    b[2] += nbytes
                    if b[1] == 0 and b[2] == 0:
                        b[0] += 1
                        b[1], b[2] = 1, 0
                    _, _, n = tile_slices(t, q, N, T, C)
                    for d in range(C):
                        # WAR check: every CTA of the cluster released the tile this buffer held
                        assert t < S or released[d] > t - S, "multicast into a buffer still in use"
                        if n:  # the kernel issues no empty slice
                            inflight.append((d, s, q, t, n * 4))
                    st["issued"] += 1
                    ver[0] += 1

            def wait_tile0(t):
                while not test(full[(q, t % S)], (t // S) & 1, t):
                    pump()
                    yield

            def wait_tile(t):
                while not test(full[(q, t % S)], (t // S) & 1, t):
                    yield

            def release_upto(lim):
                while released[q] < lim:
                    t = released[q]
                    while st["have0"] <= t:
                        yield from wait_tile0(st["have0"])
                        st["have0"] += 1
                    for d in range(C):
                        b = empty[(d, t % S)]
                        b[1] -= 1
                        if b[1] == 0:
                            b[0] += 1
                            b[1] = C
                    released[q] += 1
                    ver[0] += 1

            pump()
            p = ctas[q]
            for r in range(pr[p], pr[p + 1]):
                lo, hi = meta[r] & 0xFFFF, meta[r] >> 16
                yield from release_upto(lo)                   # thread 0
                while st["have0"] <= hi:
                    yield from wait_tile0(st["have0"])
                    st["have0"] += 1
                st["have"] = max(st["have"], lo)              # the other threads
                while st["have"] <= hi:
                    yield from wait_tile(st["have"])
                    st["have"] += 1
                for t in range(lo, hi + 1):                   # the round reads tiles lo..hi
                    for j in range(C):
                        if tile_slices(t, j, N, T, C)[2]:
                            assert ring[(q, t % S, j)] == t, f"round {r} reads tile {t} not in the ring"
                nxt = meta[r + 1] & 0xFFFF if r + 1 < pr[p + 1] else n_tiles
                yield from release_upto(nxt)
                pump()
            yield from release_upto(n_tiles)
            while st["issued"] < n_tiles:
                pump()
                yield
            done[q] = True
            while not all(done):                              # final cluster barrier
                yield

        done = [False] * C
        gens = [cta(q) for q in range(C)]
        live = set(range(C))
        idle = 0
        while live:
            steps += 1
            before = ver[0]
            if inflight and rng.random() < landing_delay:
                d, s, j, t, nbytes = inflight.pop(rng.randrange(len(inflight)))
                ring[(d, s, j)] = t
                full_tx(full[(d, s)], nbytes)
            else:
                q = rng.choice(sorted(live))
                try:
                    next(gens[q])
                except StopIteration:
                    live.discard(q)
                    ver[0] += 1
            idle = 0 if ver[0] != before else idle + 1
            if idle > 50 * C + 100 and not inflight:
                raise AssertionError(f"deadlock in cluster {cl}: CTAs {sorted(live)} stuck")
        assert not inflight
    return steps



def simulate_protocol2(Lx: XLayout, C: int, seed: int, warps: int = 3, landing_delay: float = 0.5) -> int:
    """Run panels_xsmem2's protocol for every cluster of the layout under a random schedule: per CTA
    one producer warp and `warps` consumer warps (the kernel has 31; every consumer warp walks the
    same rounds, so a few show every interleaving that matters; consumed[] counts `warps`), the
    consumers' named barrier per round, the CTA barrier with the producer at the end, the cluster
    barrier; multicast slices AND remote arrives in flight, landing late and in random order.
    Checks: no deadlock; a warp reads a round only when its tiles sit complete in its ring; a slice
    is issued only into buffers every warp of every CTA released; every parity wait is unambiguous
    (the barrier is at the waited phase or one past it); every slice and remote arrive counts
    toward the phase it belongs to; nothing is in flight to a CTA once its CTA barrier completed.
    Returns the scheduler steps taken."""
    rng = random.Random(seed)
    N = Lx.shape[1]
    T, S = Lx.T, Lx.S
    n_tiles = -(-N // T)
    meta = (Lx.meta.long() & 0xFFFFFFFF).tolist()
    pr = Lx.panel_round.tolist()
    assert Lx.n_cta % C == 0
    steps = 0
    for cl in range(Lx.n_cta // C):
        ctas = list(range(cl * C, (cl + 1) * C))
        # mbarriers: [completed phases, pending arrivals(, tx)]
        full = {(q, s): [0, 1, 0] for q in range(C) for s in range(S)}
        empty = {(q, s): [0, C] for q in range(C) for s in range(S)}
        cons = {(q, s): [0, warps] for q in range(C) for s in range(S)}
        ring = {(q, s, j): None for q in range(C) for s in range(S) for j in range(C)}  # tile of each slice
        rel = {(q, w): 0 for q in range(C) for w in range(warps)}  # tiles each consumer warp released
        inflight = []        # ("copy", dest, buffer, slice j, tile, bytes) / ("arrive", dest, buffer, tile)
        nbar = {q: [0, 0] for q in range(C)}   # named barrier 1: [generation, arrived]
        bar0 = {q: [0, 0] for q in range(C)}   # __syncthreads: consumers + producer
        cbar = [0, 0]                           # cluster barrier: one arrival a CTA
        ver = [0]

        def phase_done(b, k, what):
            """parity wait for phase k of b: unambiguous only if b completed k or k + 1 phases"""
            assert b[0] in (k, k + 1), f"ambiguous parity wait ({what}): {b[0]} phases done, waiting for phase {k}"
            return b[0] == k + 1

        def arrive(b, count):
            b[1] -= 1
            if b[1] == 0:
                b[0] += 1
                b[1] = count
            ver[0] += 1

        def full_update(b):
            if b[1] == 0 and b[2] == 0:
                b[0] += 1
                b[1], b[2] = 1, 0
            ver[0] += 1

        def barrier(b, n):
            g = b[0]
            b[1] += 1
            if b[1] == n:
                b[0] += 1
                b[1] = 0
                ver[0] += 1
            while b[0] == g:
                yield

        def end(q):
            yield from barrier(bar0[q], warps + 1)
            assert not [e for e in inflight if e[1] == q], f"CTA {q}: something still in flight to it at its end"
            if not done_end[q]:
                done_end[q] = True
                yield from barrier(cbar, C)

        def producer(q):
            for t in range(n_tiles):
                s = t % S
                if t >= S:
                    u = t - S
                    while not phase_done(cons[(q, s)], u // S, "consumed"):
                        yield
                    for d in range(C):                         # lane d -> CTA d
                        inflight.append(("arrive", d, s, u))
                    ver[0] += 1
                    yield
                    while not phase_done(empty[(q, s)], u // S, "empty"):
                        yield
                    for d in range(C):                         # WAR: every warp of every CTA released t - S
                        for w in range(warps):
                            assert rel[(d, w)] > u, "multicast into a buffer a warp still reads"
                nbytes, _, n = tile_slices(t, q, N, T, C)
                b = full[(q, s)]
                b[1] -= 1
                b[2] += nbytes
                full_update(b)
                if n:  # the kernel issues no empty slice
                    for d in range(C):
                        inflight.append(("copy", d, s, q, t, n * 4))
                yield
            yield from end(q)

        def consumer(q, w):
            st = {"have": 0}

            def wait_tile(t):
                while not phase_done(full[(q, t % S)], t // S, "full"):
                    yield

            def release_upto(lim):
                while rel[(q, w)] < lim:
                    t = rel[(q, w)]
                    while st["have"] <= t:
                        yield from wait_tile(st["have"])
                        st["have"] += 1
                    arrive(cons[(q, t % S)], warps)
                    rel[(q, w)] += 1
                    yield

            p = ctas[q]
            for r in range(pr[p], pr[p + 1]):
                lo, hi = meta[r] & 0xFFFF, meta[r] >> 16
                yield from release_upto(lo)
                while st["have"] <= hi:
                    yield from wait_tile(st["have"])
                    st["have"] += 1
                for t in range(lo, hi + 1):                    # the round reads tiles lo..hi
                    for j in range(C):
                        if tile_slices(t, j, N, T, C)[2]:
                            assert ring[(q, t % S, j)] == t, f"round {r} reads tile {t} not in the ring"
                yield
                if r + 1 < pr[p + 1]:
                    yield from release_upto(meta[r + 1] & 0xFFFF)
                yield from barrier(nbar[q], warps)
            yield from release_upto(n_tiles)
            yield from end(q)

        done_end = [False] * C
        gens = {}
        for q in range(C):
            gens[(q, -1)] = producer(q)
            for w in range(warps):
                gens[(q, w)] = consumer(q, w)
        live = set(gens)
        idle = 0
        while live:
            steps += 1
            before = ver[0]
            if inflight and rng.random() < landing_delay:
                ev = inflight.pop(rng.randrange(len(inflight)))
                if ev[0] == "copy":
                    _, d, s, j, t, nbytes = ev
                    b = full[(d, s)]
                    assert b[0] == t // S, "a slice lands in the wrong phase of its full barrier"
                    ring[(d, s, j)] = t
                    b[2] -= nbytes
                    full_update(b)
                else:
                    _, d, s, u = ev
                    assert empty[(d, s)][0] == u // S, "a release lands in the wrong phase of its empty barrier"
                    arrive(empty[(d, s)], C)
            else:
                g = rng.choice(sorted(live))
                try:
                    next(gens[g])
                except StopIteration:
                    live.discard(g)
                    ver[0] += 1
            idle = 0 if ver[0] != before else idle + 1
            if idle > 50 * C * (warps + 1) + 100 and not inflight:
                raise AssertionError(f"deadlock in cluster {cl}: {sorted(live)} stuck")
        assert not inflight
    return steps


def pipeline_model(S: int, adv: float, tau: float, L: float, n_tiles: int = 489, seed: int = 1) -> float:
    """PREDICTION 2's timing model of one CTA (us): rounds advancing `adv` tiles of x each take `tau`
    of work and start only once their tiles lo..hi landed; tiles < S land at L; tile t + S lands
    L (release to landed, skew included) after the round that releases tile t ends."""
    rng = random.Random(seed)
    n = int(n_tiles / adv) + 1
    off = rng.random() * adv
    b = [off + k * adv for k in range(n + 1)]
    lo = [min(int(b[k]), n_tiles - 1) for k in range(n)]
    hi = [min(int(b[k + 1] - 1e-9), n_tiles - 1) for k in range(n)]
    landed = {t: L for t in range(min(S, n_tiles))}
    now, released = 0.0, 0
    for k in range(n):
        for t in range(lo[k], hi[k] + 1):
            now = max(now, landed[t])
        now += tau
        nxt = lo[k + 1] if k + 1 < n else n_tiles
        for t in range(released, nxt):
            if t + S < n_tiles:
                landed[t + S] = now + L
        released = max(released, nxt)
    return now

def _random_csr(M, N, lengths, g, hot_rows=(), hot_len=0, hot_span=None):
    """CSR arrays with the given row lengths (columns distinct and sorted in a row); hot rows get
    hot_len columns inside a window of hot_span columns."""
    rows = []
    for i in range(M):
        n = int(lengths[i])
        if i in hot_rows:
            span = hot_span or N
            start = int(torch.randint(0, max(1, N - span + 1), (1,), generator=g))
            cols = start + torch.randperm(span, generator=g)[:min(hot_len, span)]
        else:
            cols = torch.randperm(N, generator=g)[:min(n, N)]
        rows.append(torch.sort(cols)[0])
    lens = torch.tensor([r.numel() for r in rows])
    row_ptr = torch.zeros(M + 1, dtype=torch.long)
    row_ptr[1:] = torch.cumsum(lens, 0)
    col = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    val = torch.randn(col.numel(), generator=g)
    return row_ptr, col, val


def _uniform_csr(M, N, k, g):
    """M x N with k random columns a row (as the suite's uniform, duplicates merged)."""
    r = torch.arange(M).repeat_interleave(k)
    c = torch.randint(0, N, (M * k,), generator=g)
    key = torch.unique(r * N + c)
    r, c = key // N, key % N
    row_ptr = torch.zeros(M + 1, dtype=torch.long)
    row_ptr[1:] = torch.cumsum(torch.bincount(r, minlength=M), 0)
    return row_ptr, c, torch.randn(c.numel(), generator=g)


def cpu_check():
    g = torch.Generator().manual_seed(0)
    t_start = time.time()
    cases = []
    # 1) the uniform matrix's statistics in small: R = 16667 rows a panel with 32 random columns a
    #    row (a round sees the same row multiplicities as on 2M x 2M), tiles scaled so that a round
    #    spans about as many tiles as there (2048 entries ~ 1.9 tiles of 4096 of 2M columns).
    M, N = 2 * 16667, 200003
    cases.append(("uniform-like", _uniform_csr(M, N, 32, g), (M, N), 4, 16667, 416, 8))
    # 2) awkward: N % 4 = 3 and not a multiple of T, ~10 % empty rows, hot rows (atomics), a short
    #    last panel and a CTA with no rows, small tiles (rounds cut by the tile window).
    M, N = 10007, 4099
    lengths = torch.randint(0, 25, (M,), generator=g)
    lengths[torch.rand(M, generator=g) < 0.1] = 0
    cases.append(("awkward", _random_csr(M, N, lengths, g, hot_rows={5, 3000, 9999}, hot_len=1500, hot_span=1600),
                  (M, N), 4, -(-M // 11), 64, 10))  # S = 10: a ring of W = 640, not a power of two
    # 3) dense-ish rows in narrow columns: most rows repeat inside a round (groups, holes, rounds
    #    with too few singles: the all-atomic fallback).
    M, N = 4096, 1024
    cases.append(("repeats", _random_csr(M, N, torch.full((M,), 64), g), (M, N), 8, 512, 64, 8))
    # 4) panels whose first column lies far past tile S (the producer must release tiles no round
    #    reads before it waits for any): rows of panel 0 only in the last fifth of x
    M, N = 2000, 5001
    rp, cl, vl = _random_csr(M, 1000, torch.randint(0, 30, (M,), generator=g), g)
    cl = torch.where(torch.arange(cl.numel()) < int(rp[500]), cl + 4000, cl * 5)
    cases.append(("late-start", (rp, cl, vl), (M, N), 4, 500, 64, 8))
    # 5) tiny x: N < 4 (every column in the tail floats), N = 5, and a matrix with no nonzeros
    cases.append(("N=3", _random_csr(50, 3, torch.randint(0, 4, (50,), generator=g), g), (50, 3), 4, 13, 32, 4))
    cases.append(("N=5", _random_csr(70, 5, torch.randint(0, 6, (70,), generator=g), g), (70, 5), 8, 9, 32, 3))
    cases.append(("empty", (torch.zeros(9, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0)), (8, 100), 4, 2, 32, 8))
    for name, (row_ptr, col, val), (M, N), C, R, T, S in cases:
        panels = -(-M // R)
        n_cta = -(-panels // C) * C  # whole clusters; CTAs past the last panel own no rows
        x = torch.randn(N, generator=g, dtype=torch.float32)
        ref = torch.zeros(M, dtype=torch.float64).index_add_(
            0, torch.repeat_interleave(torch.arange(M), row_ptr[1:] - row_ptr[:-1]), val.double() * x.double()[col])
        for RW in (2, 4):
            for nw, kernel in ((NW, "xsmem"), (NW2, "xsmem2")):
                t0 = time.time()
                Lx = build_xsmem(row_ptr, col, val, (M, N), n_cta, R, T, S, RW, nw=nw)
                tb = time.time() - t0
                y = emulate(Lx, row_ptr, col, val, x, C)
                err = float((y - ref).norm() / ref.norm()) if float(ref.norm()) else float(y.abs().max())
                assert err < 1e-12, f"{name}: emulated y off by {err}"
                if Lx.rounds >= 3000:
                    steps = 0
                elif kernel == "xsmem":
                    steps = simulate_protocol(Lx, C, seed=RW)
                else:
                    steps = sum(simulate_protocol2(Lx, C, seed=RW + 10 * sd, warps=w) for sd, w in ((0, 3), (1, 1), (2, 2)))
                wy, wx = bank_wavefronts(Lx) if Lx.nnz else (0.0, 0.0)
                s = Lx.stats
                print(f"{name:12s} {kernel:6s} RW {RW} C {C} M {M} N {N} R {R} T {T} S {S}: nnz {Lx.nnz} rounds {s['rounds']} "
                      f"padding {100 * s['pad']:.2f} % grouped {100 * s['grouped']:.2f} % atomic {100 * s['atomic']:.2f} % "
                      f"all-atomic rounds {s['bad_rounds']} max tiles a round {s['max_span']}; wavefronts y {wy:.2f} x {wx:.2f}; "
                      f"err {err:.1e}; protocol {'%d steps' % steps if steps else 'skipped'}; build {tb:.2f} s", flush=True)
    for RW, adv, tau in ((2, 1.82, 0.54), (4, 3.64, 1.08)):  # PREDICTION 2's table
        for S in (8, 10):
            print(f"pipeline_model RW {RW} S {S}: " + "  ".join(
                f"L {L}: {pipeline_model(S, adv, tau, L):4.0f} us" for L in (1.0, 1.4, 1.8, 2.2)))
    print(f"CPU check passed ({time.time() - t_start:.0f} s): every nonzero exactly once, no row in two threads "
          f"of a round (or mixed plain / atomic), rounds inside the ring, slices inside x, both protocols (xsmem: "
          f"thread 0 producer; xsmem2: producer warp) without deadlock, overwrite or ambiguous parity")


# --------------------------------------------------------------------------- GPU


def bench(fn):
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=40, return_mode="median")


def gpu():
    from tilewise.bench.suites import spmv as suite
    from tilewise.ops.spmv import api as op
    from tilewise.ops.spmv import configs as cf
    from tilewise.runtime import cuda as rt
    from tilewise.runtime.device import measure_copy_gbps

    t_start = time.time()
    names = rt.name_expressions_for(SRC)
    mod = rt.load(SRC, names)
    for r in mod.compiled.resources:
        print(f"{r.name}: {r.registers} registers, spill stores {r.spill_store_bytes} B, loads {r.spill_load_bytes} B")
    I32, F32, I64 = (torch.int32,), (torch.float32,), (torch.int64,)
    kv8_params = [rt.Tensor("kv", I64), rt.Tensor("chunk_col0", I32), rt.Tensor("panel_chunk", I32),
                  rt.Tensor("panel_tail", I32), rt.Tensor("x", F32), rt.Tensor("y", F32), rt.Scalar("M", "i32"),
                  rt.Scalar("R", "i32"), rt.Scalar("alpha", "f32"), rt.Scalar("beta", "f32")]
    xs_params = [rt.Tensor("kv", I64), rt.Tensor("meta", I32), rt.Tensor("panel_round", I32), rt.Tensor("x", F32),
                 rt.Tensor("y", F32), rt.Scalar("M", "i32"), rt.Scalar("N", "i32"), rt.Scalar("R", "i32"),
                 rt.Scalar("alpha", "f32"), rt.Scalar("beta", "f32"), rt.Scalar("pf", "i32")]

    def shape_for(k, C, T, S, M):
        """(clusters, R, shared bytes) for an xsmem kernel: as many clusters as fit at once."""
        k.set_max_dynamic_shared(SMEM_MAX)
        fit = k.max_active_clusters(C, NT, SMEM_MAX)
        R = max(1, -(-M // (fit * C)))
        smem = smem_bytes(R, T, S)
        if smem > SMEM_MAX or R > 32766:
            return fit, None, smem
        assert k.max_active_clusters(C, NT, smem) >= fit
        return fit, R, smem

    def run_xsmem(k, Lx, x, y, M, N, smem, pf=None):
        pf = Lx.S if pf is None else pf  # L2 prefetch distance in tiles past the TMA (0: none)
        return lambda: k(Lx.n_cta, NT, Lx.kv, Lx.meta, Lx.panel_round, x, y, M, N, Lx.R, 1.0, 0.0, pf, shmem=smem)

    def relerr(y, ref):
        return float((y.double() - ref).norm() / ref.norm())

    # Correctness first, on small awkward matrices (every xsmem kernel at its real launch shape):
    # N % 4 != 0, N not a multiple of T, empty rows, hot rows (atomics), short and empty panels,
    # NaN in x wherever no nonzero points (padding must read no x).
    g = torch.Generator(device="cuda").manual_seed(3)
    smalls = []
    for (M, N, kmax) in ((100003, 50001, 40), (70001, 300007, 8), (5000, 3, 3)):
        lengths = torch.randint(0, kmax + 1, (M,), device="cuda", generator=g)
        lengths[torch.rand(M, device="cuda", generator=g) < 0.1] = 0
        A = suite._random_rows(lengths, N, g)
        xs_ = torch.randn(N, device="cuda", generator=g)
        used = torch.zeros(N, dtype=torch.bool, device="cuda")
        used[A.col.long()] = True
        xs_[~used] = float("nan")
        smalls.append((A, xs_, op.reference(A.row_ptr, A.col, A.val, torch.nan_to_num(xs_))))
    variants = [("panels_xsmem", NW, cfg) for cfg in XSMEM] + [("panels_xsmem2", NW2, cfg) for cfg in XSMEM2]
    for kname, nw, (C, T, S, RW, G) in variants:
        name = f"{kname}<{C},{T},{S},{RW},{G}>"
        k = mod.kernel(name, xs_params)
        for A, xs_, ref in smalls:
            M, N = A.shape
            fit, R, smem = shape_for(k, C, T, S, M)
            Lx = build_xsmem(A.row_ptr, A.col, A.val, A.shape, fit * C, R, T, S, RW, nw=nw)
            ys_ = torch.full((M,), float("nan"), device="cuda")
            run_xsmem(k, Lx, xs_, ys_, M, N, smem)()
            torch.cuda.synchronize()
            err = relerr(ys_, ref)
            status = "ok" if err < 1e-5 else "WRONG"
            print(f"check {name} M {M} N {N}: {fit} clusters, R {R}: err {err:.1e} {status}", flush=True)
    for A, xs_, ref in smalls:
        P = op.Panels.from_csr(A)
        M = A.shape[0]
        kv = torch.stack([P.key, P.val.view(torch.int32)], 1).contiguous().view(torch.int64).view(-1)
        for nt, cl, u, rc in KV8:
            if cl != P.cluster or rc != P.round_chunks:
                continue
            k = mod.kernel(f"panels_kv8<{nt},{cl},{u},{rc}>", kv8_params)
            k.set_max_dynamic_shared(cf.PANEL_MAX_ROWS * 4)
            ys_ = torch.full((M,), float("nan"), device="cuda")
            k(P.panels * cl, nt, kv, P.chunk_col0, P.panel_chunk, P.panel_tail, xs_, ys_, M, P.rows, 1.0, 0.0,
              shmem=min(P.rows, M) * 4)
            torch.cuda.synchronize()
            err = relerr(ys_, ref)
            print(f"check panels_kv8<{nt},{cl},{u},{rc}> M {M} N {A.shape[1]}: err {err:.1e} "
                  f"{'ok' if err < 1e-5 else 'WRONG'}", flush=True)
    del smalls

    copy = measure_copy_gbps(1 << 30)
    A = suite.make_matrix("uniform", seed=0)
    M, N = A.shape
    x = torch.randn(N, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    assert x.data_ptr() % 16 == 0
    ref = op.reference(A.row_ptr, A.col, A.val, x)
    floor = op.cost(M, N, A.nnz).bytes
    pct = lambda ms: 100 * floor / ms / 1e6 / copy  # noqa: E731
    y = torch.empty(M, device="cuda")

    def timed(label, fn, extra=""):
        y.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        err = relerr(y, ref)
        t = bench(fn)
        print(f"{label:34s} {t * 1e3:7.1f} us {pct(t):5.1f} % of copy  err {err:.1e}{extra}", flush=True)
        return t

    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s; uniform {M} x {N}, nnz {A.nnz}, floor {floor / 1e6:.1f} MB "
          f"(70 % = {floor / 1e6 / (0.7 * copy) * 1e3:.1f} us)", flush=True)
    P = op.Panels.from_csr(A)
    timed(f"library panels {P.panels}x{P.cluster}", lambda: op.panels(P, x, y))
    # kv8 (187.2 us = 67.8 % of copy in spmv-x-smem-26125e0.log, slower than the library): checked above, not timed
    P = None  # free it before the xsmem layouts
    layouts = {}
    for kname, nw, (C, T, S, RW, G) in variants:
        name = f"{kname}<{C},{T},{S},{RW},{G}>"
        k = mod.kernel(name, xs_params)
        fit, R, smem = shape_for(k, C, T, S, M)
        if R is None:
            print(f"{name}: {fit} clusters -> {smem} B of shared memory: does not fit")
            continue
        key = (fit * C, R, T, S, RW, nw)
        if key not in layouts:
            layouts.clear()
            torch.cuda.synchronize()
            t0 = time.time()
            layouts[key] = build_xsmem(A.row_ptr, A.col, A.val, A.shape, fit * C, R, T, S, RW, nw=nw)
            torch.cuda.synchronize()
            Lx = layouts[key]
            wy, wx = bank_wavefronts(Lx)
            s = Lx.stats
            print(f"  layout {fit * C} CTAs x {R} rows, T {T} S {S} RW {RW}, {nw} consumer warps: {s['rounds']} rounds, "
                  f"padding {100 * s['pad']:.2f} %, grouped {100 * s['grouped']:.1f} %, atomic {100 * s['atomic']:.2f} %, "
                  f"max tiles a round {s['max_span']}, wavefronts y {wy:.2f} x {wx:.2f}, {Lx.kv.numel() * 8 / 1e6:.0f} MB, "
                  f"built in {time.time() - t0:.1f} s", flush=True)
        Lx = layouts[key]
        label = f"{kname[7:]} C {C} T {T} S {S} RW {RW} G {G}"
        timed(label, run_xsmem(k, Lx, x, y, M, N, smem),
              f"  ({fit} clusters x {C}, R {R}, {smem // 1024} KiB, L2 prefetch {S} tiles ahead)")
        if kname == "panels_xsmem2" and (C, T, S, RW) == (4, 4096, 10, 2):  # the L2 prefetch's share, once
            timed(label, run_xsmem(k, Lx, x, y, M, N, smem, pf=0), "  (no L2 prefetch)")
    print(f"done in {time.time() - t_start:.0f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-check", action="store_true", help="check the layout builder on the CPU (no GPU needed)")
    args = ap.parse_args()
    if args.cpu_check:
        cpu_check()
    else:
        gpu()


if __name__ == "__main__":
    sys.exit(main())
