"""RoPE's launch rule. Not yet tuned on the H200: the first GPU run sets it (docs/tuning/rope.md)."""

from __future__ import annotations

import triton

TILE = 2048  # elements of a (heads x half) tile a program rotates at once (16 fp32 a thread at 4 warps)


def heads_per_step(Hq: int, Hk: int, half: int) -> tuple[int, int]:
    """(heads a step, half the head dim padded): as many heads as fit TILE, so a position's rows of q
    and k go in few wide steps."""
    db = triton.next_power_of_2(half)
    return max(1, min(triton.next_power_of_2(max(Hq, Hk)), TILE // db)), db
