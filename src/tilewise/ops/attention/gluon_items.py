"""Which query block and head a Gluon CTA, or a persistent CTA's work item, computes.

Scalar arithmetic shared by the forward kernels (``gluon_fwd``, ``gluon_overlap``) and the backward ones
(``gluon_bwd``). The order matters twice: load balance (a causal item's work grows with its query block)
and L2 (items of one K / V head that run at the same time read its tiles once from memory).
"""

from __future__ import annotations

try:  # Gluon ships with Triton >= 3.5; the module imports without it (callers check gluon_fwd.available)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    _GLUON = True
except Exception:  # noqa: BLE001 - an older Triton
    _GLUON = False

if _GLUON:

    @gluon.jit
    def lpt_block_head(head_group):
        """(block, head) of this CTA for a causal grid (blocks, heads): launch order (x fastest) taken
        block-major within groups of ``head_group`` heads (``configs.causal_head_group``; 1 is head by
        head, the grid's own order). A block's work grows or falls with its index; launched head by
        head, a head's longest CTAs were left for the tail (a model of the schedule: the busiest SM
        1.07-1.15x the mean at B * S = 16384, ~1.00-1.03x this way), and a group keeps the heads read
        at a time (L2) to about two groups'. v5's causal forward and v6's kernels."""
        n_blocks = gl.num_programs(0)
        pid = gl.program_id(0) + gl.program_id(1) * n_blocks
        per = n_blocks * head_group
        r = pid % per
        return r // head_group, (pid // per) * head_group + r % head_group

    @gluon.jit
    def persistent_item(tile, n_m, BH, CAUSAL: gl.constexpr):
        """(query tile, batch x head) of a persistent CTA's ``tile``-th work item (CTAs take items round robin,
        n_m query tiles x BH heads). Without causal head-major: a head's query tiles run side by side and share
        its K / V in L2. Causal: a head's tiles paired longest with shortest (n_m - 1 with 0, n_m - 2 with 1,
        ...; an odd n_m's middle tiles after all pairs), the pairs head-major, and every block of two rounds
        gives a CTA both items of one pair, so every CTA's work is about equal and about n_m / 2 CTAs read one
        head's K / V at a time. The items sorted longest first instead ran all heads' same tile at once, each
        CTA reading its own K / V from memory (tuning: "Causal work items in pairs")."""
        if CAUSAL:  # branch-free, divisions by nprog and the pair length only (the consumers' registers are full)
            nprog = gl.num_programs(0)
            r = tile // nprog  # the round
            p = tile - r * nprog  # this CTA
            odd = r % 2
            base = (r - odd) * nprog  # this block of two rounds' first item
            two = gl.maximum(n_m * BH - base - nprog, 0)  # CTAs with a pair in this block (all but in the last)
            single = ((1 - odd) * (p >= two)).to(gl.int32)  # the last block's CTAs past `two`: one item each
            g = base + 2 * p + odd + single * (two - p - odd)
            even = n_m - n_m % 2  # a head's tiles in pairs
            pair = gl.maximum(even, 1)
            tail = (g >= even * BH).to(gl.int32)  # an odd n_m's middle tiles, after all pairs
            bh = g // pair
            j = g - bh * pair
            m = j // 2 + (1 - j % 2) * (n_m - 1 - 2 * (j // 2))
            bh = bh + tail * (g - even * BH - bh)
            m = m + tail * (n_m // 2 - m)
            return m, bh
        return tile % n_m, tile // n_m
