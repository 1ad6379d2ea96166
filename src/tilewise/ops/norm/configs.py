"""RMSNorm's launch table: rows a program handles at once and warps, by the row's padded length.
Rows stay in registers (one read of x forward, one of x and dy backward). Not yet tuned on the
H200: the first GPU run sets these (docs/tuning/norm.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

MAX_N = 32768  # longest row held in registers (64 fp32 values a thread at 16 warps)


@dataclass(frozen=True)
class NormLaunch:
    """BLOCK: the row padded to a power of two; ROWS: rows a program loads at once; warps."""

    BLOCK: int
    ROWS: int
    warps: int


def launch_for(N: int) -> NormLaunch:
    """Short rows: several a program, so a warp's loads stay 16 bytes wide; long rows: one a program,
    more warps, at most 64 fp32 values a thread."""
    block = triton.next_power_of_2(max(N, 1))
    if block <= 1024:
        return NormLaunch(block, max(1, 2048 // block), 4)
    if block <= 4096:
        return NormLaunch(block, 1, 8)
    return NormLaunch(block, 1, 16)


PROGRAMS_PER_SM = 4  # persistent programs a streaming multiprocessor (and rows of dW partial sums)
