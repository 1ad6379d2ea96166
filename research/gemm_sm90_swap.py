"""C's transposed tile (cuBLAS's fp16 structure at 1000^3) beside the routed 64 x 128 tile.

Why: at 1000^3 fp16 cuBLAS runs nvjet `hsh_128x72_64x8_4x2` in 7.1-7.3 us against our 8.6-8.9:
HGMMA.64x72x16 with B's N-major chunks in wgmma's A slot (`tnspA`) and A, K-major, in the B slot,
so a tile is 128 columns (two consumer warpgroups) by 72 rows and 1000^2 takes 8 x 14 = 112 CTAs
(logs/gemm-sm90-ncu-cublas-1000-fp16-fec28ee.log). gemm_sm90's SWAP path builds that tile
(`72x128t_c2x1`: 2 x 1 clusters sharing B, since 72 rows do not split into 8-row halves for A's
multicast; cuBLAS's 4 x 2 clusters would need 30+ resident 4-CTA clusters here).
Prediction, written before the run: if the structure (wgmma N = 72 on A, M = 64 on B's chunks,
112 CTAs) is what makes cuBLAS's fp16 kernel fast, 72x128t runs 7.4-8.0 us at 1000^3 (0.9-0.97x); if
our pipeline's per-copy cost dominates as with the 64 x 128 tile, it lands at 8.5-9.0 like the
routed tile (the two-warpgroup 64 x 128 copy of cuBLAS's bf16 structure was slower than ours,
logs/gemm-sm90-wn2-3a2d9ea).
Interleaved rounds, graph-replayed, each variant checked against float64 on NaN-poisoned outputs.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_swap.py
"""
import torch
from _timing import warm_clocks
from gemm_sm90_feed import _source, compare, operands
from gemm_sm90_rounds import square_operands

from tilewise.ops.gemm import configs as gc

ROUTED = gc.SM90_CONFIGS["64x128_c2x1"]
SWAP = gc.SM90_EXTRA_CONFIGS["72x128t_c2x1"]
VARIANTS = {"64x128 (routed)": (ROUTED, (), False), "72x128t": (SWAP, (), False),
            "72x128t chunk": (SWAP, ("-DTW_B_BY_CHUNK",), True)}


def main():
    warm_clocks()
    src = _source()
    cases = [("float16 1000^3", *square_operands(1000, torch.float16)),
             ("bfloat16 1000^3", *square_operands(1000, torch.bfloat16)),
             ("float16 1000x1000x4000", *operands(1000, 1000, 4000, torch.float16, 5)),
             ("bfloat16 1024^3", *square_operands(1024, torch.bfloat16))]
    for label, a, b, out, ref in cases:
        compare(src, label, a, b, out, ref, VARIANTS, 16)


if __name__ == "__main__":
    main()
