"""The 64 x 128 tile with its K blocks split between two consumer warpgroups (`64x128k2_c2x1`)
beside the routed one-warpgroup tile, at the 1000 class.

Why: with no copies in flight, one warpgroup issues a block's four HGMMA.64x128x16 in ~557 cycles
(256 at the tensor cores' peak), two warpgroups on a 128 x 128 tile keep them 80 % busy and on
128 x 256 95 % (logs/gemm-sm90-trace-noload-be9bf36); two independent accumulator chains inside one
warpgroup did not help (logs/gemm-sm90-split-df04c48). So a lone warpgroup's wgmma stream cannot
fill the tensor cores, and the 1000-class tile (64 x 128, 128 CTAs, one warpgroup) runs its K loop
at ~690 cycles a block. Here warpgroup w takes the blocks kb % 2 == w with its own accumulators
(full wait and release each block; the other warpgroup's block runs meanwhile), and the two sums
meet in shared memory before the epilogue.
Prediction, written before the run: the K loop falls from ~690 toward 400-550 cycles a block (then
bounded by the copies into shared memory), 1000^3 from ~8.5 to 7.3-7.9 us (fp16 >= 0.9x cuBLAS),
1024 x 1024 x 3968 from ~18.6 to 12-15 us.
Run on the GPU: PYTHONPATH=src python3 scripts/experiments/gemm_sm90_ksplit.py
"""
import torch
from _timing import warm_clocks
from gemm_sm90_feed import _source, compare, operands
from gemm_sm90_rounds import square_operands

from tilewise.ops import gemm_sm90 as gs

VARIANTS = {"64x128 (routed)": (gs.CONFIGS["64x128_c2x1"], (), False),
            "64x128k2": (gs.EXTRA_CONFIGS["64x128k2_c2x1"], (), False)}


def main():
    warm_clocks()
    src = _source()
    cases = [("float16 1000^3", *square_operands(1000, torch.float16)),
             ("bfloat16 1000^3", *square_operands(1000, torch.bfloat16)),
             ("float16 1000x1000x4000", *operands(1000, 1000, 4000, torch.float16, 5)),
             ("bfloat16 1024^3", *square_operands(1024, torch.bfloat16)),
             ("bfloat16 1024x1024x3968", *operands(1024, 1024, 3968, torch.bfloat16, 4)),
             ("float16 960x1000x1000", *operands(960, 1000, 1000, torch.float16, 6))]
    for label, a, b, out, ref in cases:
        compare(src, label, a, b, out, ref, VARIANTS, 16)


if __name__ == "__main__":
    main()
