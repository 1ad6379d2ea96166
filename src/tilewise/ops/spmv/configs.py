"""spmv's tuning tables and the rules that pick a kernel and its configuration.

Every table here is read-only (tuples, or mappings behind ``MappingProxyType``); the kernels of
``spmv.cu`` are built for exactly the configurations listed. The measurements behind each value
are in docs/tuning/spmv.md, under the section named in the comment.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .formats import RowStats

# --------------------------------------------------------------------------- kernel geometry (spmv.cu)

SUBS = (2, 4, 8, 16, 32)  # csr_vector's lanes a row, as instantiated in spmv.cu
CHUNK = 512          # nonzeros per warp in csr_split's chunk kernel (the .cu's CHUNK)
STREAM_NNZ = 1024    # csr_stream: nonzeros per block (its shared buffer holds 2048, the .cu's CAP)
STREAM_ROWS = 256    # csr_stream: rows per block when rows are shorter than STREAM_NNZ / 256
PANEL_COLS = 65536   # columns of a Panels chunk's column block (16 bits of the key)
# A panel's y lives in shared memory: 224 KiB of the 227 KiB a CTA may take (and below 0xFFFF,
# the padding key).
PANEL_MAX_ROWS = 57344
PANEL_ROUNDS = (64, 128)  # the round sizes the panels kernel is built for (its kRoundChunks)

# --------------------------------------------------------------------------- built configurations

# spmv_csr_merge<NT, IPT> instantiations (threads a block, path items a thread).
MERGE_CONFIGS = tuple((nt, ipt) for nt in (128, 256) for ipt in (5, 7, 8, 9, 11, 15))
MERGE_DEFAULT = (256, 7)  # odd IPT: the walk's shared-memory reads avoid a common bank
# spmv_jds<NT, R> instantiations (threads a block, rows a thread); 256 x 2, 256 x 4 and 128 x 4
# are not built: ptxas spills 4 bytes in two of them (docs/tuning/spmv.md, "JDS_CONFIGS and JDS_DEFAULT").
JDS_CONFIGS = ((256, 1), (128, 1), (512, 1), (128, 2))
# 128 x 2 ran banded5 in 70.4 us against 73.5 us for the lecture's 256 x 1 (same section).
JDS_DEFAULT = (128, 2)
# spmv_panels<NT, CL, U> instantiations (threads a block, CTAs a cluster, chunks a warp loads
# before its gathers), each built for every size of PANEL_ROUNDS.
PANEL_CONFIGS = ((1024, 1, 3), (1024, 1, 4), (1024, 2, 3), (1024, 2, 4), (1024, 2, 5), (1024, 3, 4), (1024, 4, 4))
# By cluster size: U = 4 ran the uniform matrix in 182 us against 207 (U = 3) and 192 (U = 5);
# U = 7 spills (docs/tuning/spmv.md, "PANEL_DEFAULT").
PANEL_DEFAULT = MappingProxyType({1: (1024, 1, 4), 2: (1024, 2, 4), 3: (1024, 3, 4), 4: (1024, 4, 4)})
# Rounds of 64 chunks (two a warp of the 1024-thread kernel): 181 us on the uniform matrix
# against 198 for 128 and 226 without rounds (docs/tuning/spmv.md, "Panels rounds").
PANEL_ROUND = 64

# --------------------------------------------------------------------------- choose's thresholds

LONG_LEN = 4096      # csr_split's cap on rows left whole (the sub = 32 case of split_len)
# csr_split cuts rows longer than 128 x SUB: the slowest whole row stays near 15 us
# (docs/tuning/spmv.md, "split_len").
SPLIT_PER_LANE = 128
PANEL_SPREAD = 0.25       # panels when a row's columns span at least this share of x ...
PANEL_MIN_COLS = 1 << 18  # ... and x is at least 1 MiB (a guard: below it x stays in L1; not measured)
PANEL_ONE_WAVE_ROWS = PANEL_MAX_ROWS * 132  # ... and the panels fit one wave of the H200 (7.57M rows)


def sub_width(mean_len: float) -> int:
    """csr_vector's lanes per row: the power of two nearest a quarter of the mean row length, in 2..32.

    Not the mean itself: a warp's chain row_ptr -> col -> x is three memory latencies long, so a
    warp must have several loads per lane in flight (4 with the kernel's unrolling) to cover them;
    one row per warp with one element per lane leaves the GPU latency-bound."""
    if mean_len <= 8:
        return 2
    return int(min(32, 2 ** round(math.log2(mean_len / 4))))


def split_len(mean_len: float) -> int:
    """csr_split's default threshold: rows longer than SPLIT_PER_LANE x ``sub_width(mean_len)``
    (at most LONG_LEN) go to the chunk kernel. A row left whole costs its sub-warp about
    len / SUB x 0.12 us (measured: csr_vector/sub=2 on the powerlaw matrix's 100k row, 5.98 ms), so
    128 x SUB keeps the slowest whole row near 15 us, a chunk's 2 us times a few waves."""
    return min(LONG_LEN, SPLIT_PER_LANE * sub_width(mean_len))


def choose(stats: RowStats, convert: bool = True) -> str:
    """The kernel for a matrix with these row lengths, from the H200 tables in docs/tuning/spmv.md,
    "choose rules" (speed-ups over cuSPARSE in brackets):
      * a row longer than ``split_len(mean)``, or rows of very uneven length (std > mean):
        csr_merge (powerlaw 1.07, wide 1.16). Every kernel that gives a row to one thread or
        sub-warp is as slow as its longest row (3x to 1000x slower there); csr_split cut the long
        rows but left rows up to its threshold on 2-lane sub-warps (powerlaw 0.33, wide 1.10);
        merge path gives every block the same number of rows + nonzeros, so no row length can
        make a straggler;
      * columns spread over a wide x (``col_spread`` >= PANEL_SPREAD, at least PANEL_MIN_COLS
        columns, at most PANEL_ONE_WAVE_ROWS rows): panels (2M x 2M with 32 / 16 / 8 / 4 random
        columns a row: 2.66 / 2.42 / 2.03 / 1.79, against 1.07 / 1.09 / 1.17 / 1.32 for the best
        of ell and jds): every other kernel pays a 32-byte L2 sector per gathered x, panels walk x
        in column order;
      * mean >= 0.9 x max (nearly every row as long as the longest): jds (banded5 1.43, banded27
        1.35, against 1.26 / 0.82 for the best CSR kernel and 0.99 / 0.53 for panels): a thread per
        row with coalesced diagonals, and the stable length sort leaves perm close to the identity,
        so y is still written in order;
      * max <= 16 and max <= 2 x mean (short rows of uneven length, padding at most 2x): ell (short
        1.17; jds 0.96 there, as its sort scatters the y writes; csr_stream 1.09);
      * mean <= 12: csr_stream (short rows of any spread: short 1.09, best CSR kernel);
      * else csr_vector with SUB from the mean (``sub_width``: uniform sub=8 0.95 vs best 0.97;
        banded27 sub=8 0.82, best of the SUBs).
    ``convert=False`` keeps to the CSR kernels (the ELL, JDS and panels picks become csr_stream /
    csr_vector by the last two rules)."""
    if stats.rows == 0 or stats.nnz == 0:
        return "csr_vector"
    if stats.max > split_len(stats.mean) or stats.std > stats.mean:
        return "csr_merge"
    if (convert and stats.col_spread >= PANEL_SPREAD and stats.cols >= PANEL_MIN_COLS
            and stats.rows <= PANEL_ONE_WAVE_ROWS):
        return "panels"
    if convert and stats.mean >= 0.9 * stats.max:
        return "jds"
    if convert and stats.max <= 16 and stats.max <= 2.0 * stats.mean:
        return "ell"
    if stats.mean <= 12.0:
        return "csr_stream"
    return "csr_vector"


def panel_shape(M: int, clusters_fit: Callable[[int], int], sms: int | None = None) -> tuple[int, int]:
    """(rows, cluster) for ``Panels``: one wave of clusters, as many panels as clusters of CL CTAs
    fit at once (``clusters_fit(CL)``: clusters stay inside a GPC, so the H200's 132 SMs hold 66
    clusters of 2 but 39 of 3 and 30 of 4), rows = ceil(M / panels) at most PANEL_MAX_ROWS. Among
    the cluster sizes whose panels fit, the one that leaves the fewest of the ``sms`` SMs idle, then
    the fewest panels (each panel reads x once), then the most CTAs a panel. On the H200 (uniform):
    66 x 2 227 us, 132 x 1 230, 39 x 3 279 (117 SMs busy) (docs/tuning/spmv.md, "panel_shape").
    ``formats.device_panel_shape`` asks the GPU for ``clusters_fit`` and ``sms``."""
    best = None
    for cl in sorted(PANEL_DEFAULT):
        fit = max(1, int(clusters_fit(cl)))
        rows = max(1, -(-M // fit))
        if rows > PANEL_MAX_ROWS:
            continue
        panels = -(-M // rows)
        idle = (sms - fit * cl) if sms else 0
        if best is None or (idle, panels, -cl) < best[0]:
            best = ((idle, panels, -cl), rows, cl)
    if best is None:
        return PANEL_MAX_ROWS, min(PANEL_DEFAULT)  # more panels than one wave holds
    return best[1], best[2]
