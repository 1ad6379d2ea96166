"""Counters in global memory that order the CTAs of the ordered-dQ backward
(``triton_kernels._attn_bwd_atomic_kernel``): a wait with acquire semantics, an add with release
semantics, per thread or per warp, as PTX."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _wait_count(ptr, value):
    """Spin until the int32 count at ``ptr`` reaches ``value``; each thread reads it with acquire
    semantics, so its later loads see what the threads that counted stored before their release
    (``_count_release``). One PTX loop in an asm block: a Triton ``while`` around an atomic, or a
    CTA barrier, in the loop this runs in stops Triton's pipelining of that loop's loads."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; WAIT_COUNT: ld.acquire.gpu.global.b32 $0, [$1]; setp.lt.s32 p, $0, $2; "
        "@p bra WAIT_COUNT; }", "=r,l,r,~{memory}", [ptr, value], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _count_release(ptr):
    """Each thread adds 1 to the count at ``ptr`` with release semantics, after its own stores."""
    return tl.inline_asm_elementwise(
        "red.release.gpu.global.add.s32 [$1], 1; mov.b32 $0, 0;", "=r,l,~{memory}", [ptr],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_count_warp(ptr, value):
    """As ``_wait_count``, lane 0 of each warp reading the count, the warp's other lanes ordered
    after it by the warp barrier."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 lane; mov.b32 $0, 0; mov.u32 lane, %laneid; setp.ne.u32 p, lane, 0; "
        "@p bra WAIT_DONE; WAIT_WARP: ld.acquire.gpu.global.b32 $0, [$1]; setp.lt.s32 p, $0, $2; "
        "@p bra WAIT_WARP; WAIT_DONE: bar.warp.sync -1; }",
        "=r,l,r,~{memory}", [ptr, value], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _count_release_warp(ptr):
    """Lane 0 of each warp adds 1 to the count with release semantics, after the warp barrier
    that orders the warp's stores before it."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 lane; bar.warp.sync -1; mov.u32 lane, %laneid; setp.eq.u32 p, lane, 0; "
        "@p red.release.gpu.global.add.s32 [$1], 1; mov.b32 $0, 0; }",
        "=r,l,~{memory}", [ptr], dtype=tl.int32, is_pure=False, pack=1)
