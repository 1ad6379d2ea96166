"""Is the 64 x 128 tile's K loop bound by the bytes each CTA reads from L2?

Why: at 1000^3 fp16 cuBLAS's kernel (nvjet hsh_128x72_64x8_4x2: 128 x 72 tiles, 8-CTA clusters,
112 CTAs) moves a 64-deep K block through each SM in ~0.25 us against our 64 x 128 tile's ~0.33, with
1.125x our math a block; a CTA of it reads ~10 KB of L2 a block (A shared by 2, B by 4) against our
16 KB (2 x 1 clusters: A 8 KB, half of B 8 KB), while both land ~24 KB a block in shared memory.
At 1000^3 a 4 x 1 cluster of 64 x 128 tiles cannot be tested (32 clusters, 30 resident: two waves,
logs/gemm-sm90-rounds-091de36), so here N = 896: 16 x 7 = 112 tiles, 28 four-CTA clusters (one
wave) or 56 two-CTA clusters, the same 112 CTAs. 4 x 1 cuts a CTA's L2 bytes a block to 12 KB (B in
quarters), the shared-memory bytes stay 24 KB.
Prediction, written before the run: if L2 bytes a CTA bound the loop, 4 x 1 is up to 25 % faster at
K = 8192; if the SM's inbound bytes, the copy engine or the consumer do, within +-3 %.
Variants: 2 x 1 (the library's config), 4 x 1 (B's K rows in quarters: 16-row boxes), 4 x 1 with B
by chunk (-DTW_B_BY_CHUNK: two CTAs load one 64-row chunk each, all four receive).
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_l2.py
"""
import dataclasses

import torch
from _timing import warm_clocks
from gemm_sm90_feed import _source, compare, operands

from tilewise.ops.gemm import configs as gc

BASE = gc.SM90_CONFIGS["64x128_c2x1"]
C4 = dataclasses.replace(BASE, cm=4)
VARIANTS = {"c2x1": (BASE, (), False), "c4x1": (C4, (), False), "c4x1 chunk": (C4, ("-DTW_B_BY_CHUNK",), True)}
SHAPES = [(1024, 896, 8192), (1024, 896, 1024), (1000, 896, 1000)]


def main():
    warm_clocks()
    src = _source()
    for m, n, k in SHAPES:
        for dtype in (torch.bfloat16, torch.float16):
            a, b, out, ref = operands(m, n, k, dtype, m + n + k)
            compare(src, f"{str(dtype)[6:]:8s} {m}x{n}x{k}", a, b, out, ref, VARIANTS, 10)


if __name__ == "__main__":
    main()
