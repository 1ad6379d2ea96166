"""RoPE's launch rule: heads a step and warps, from the H200 sweep (docs/tuning/rope.md)."""

from __future__ import annotations

from dataclasses import dataclass

import triton

TILE = 512  # elements of a (heads x half) tile a program rotates at once: small steps keep more in flight


@dataclass(frozen=True)
class RopeLaunch:
    """HB: heads a step; DB: half the head dim padded to a power of two; warps."""

    HB: int
    DB: int
    warps: int


def launch_for(Hq: int, Hk: int, half: int) -> RopeLaunch:
    """As many heads as fit TILE; 2 warps when half the head dim is at most 32 (D = 64), else 4."""
    db = triton.next_power_of_2(half)
    hb = max(1, min(triton.next_power_of_2(max(Hq, Hk)), TILE // db))
    return RopeLaunch(hb, db, 2 if db <= 32 else 4)
