"""RMSNorm's launch tables: rows a program handles at once, warps and whether programs are persistent,
by the row's padded length. Rows stay in registers (one read of x forward, one of x and dy backward).
The forward's rows of 2048-16384 are set from the H200 sweep; the rest from register budgets
(docs/tuning/norm.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

MAX_N = 32768  # longest row held in registers (64 fp32 values a thread at 16 warps)


@dataclass(frozen=True)
class NormLaunch:
    """BLOCK: the row padded to a power of two; ROWS: rows a program loads at once; warps; persistent:
    PROGRAMS_PER_SM programs a streaming multiprocessor loop over the row blocks (else one program a
    block)."""

    BLOCK: int
    ROWS: int
    warps: int
    persistent: bool = True


def launch_for(N: int) -> NormLaunch:
    """Short rows: several a program, so a warp's loads stay 16 bytes wide; long rows: one a program,
    more warps, at most 64 fp32 values a thread."""
    block = triton.next_power_of_2(max(N, 1))
    if block <= 1024:
        return NormLaunch(block, max(1, 2048 // block), 4)
    if block <= 4096:
        return NormLaunch(block, 1, 8)
    return NormLaunch(block, 1, 16)


def forward_launch_for(N: int) -> NormLaunch:
    """The forward's launch: with nothing carried from row to row (no dW sum), one program a row block
    keeps more loads in flight than persistent ones (H200 sweep, docs/tuning/norm.md)."""
    block = triton.next_power_of_2(max(N, 1))
    if block in (2048, 4096):
        return NormLaunch(block, 1, 4, persistent=False)  # 70.5 / 71.0 us against 79.0 / 95.3 us
    if block == 8192:
        return NormLaunch(block, 2, 8, persistent=False)  # 71.5 us against 84.0 us
    if block == 16384:
        return NormLaunch(block, 2, 16)  # 79.5 us against 100.6 us (one row)
    return launch_for(N)  # not swept


PROGRAMS_PER_SM = 4  # persistent programs a streaming multiprocessor (and rows of dW partial sums)
# dW's column sums (`_dw_sum_kernel`): elements a program's one load (all partial rows x a strip of columns).
# torch's `sum(0)` + cast took 13 + 1.6 us a call in the Llama step on an H100 (docs/tuning/norm.md, "dW's sum").
DW_SUM_TILE = 8192
DW_SUM_WARPS = 4  # 64 values a thread of the one load, no loop (the build measured in that section)


def dw_sum_tile(rows: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_N) of `_dw_sum_kernel` for ``rows`` partial rows: every row in one load, the columns
    that leaves of ``DW_SUM_TILE`` (at least one)."""
    block_r = triton.next_power_of_2(max(rows, 1))
    return block_r, max(1, DW_SUM_TILE // block_r)
