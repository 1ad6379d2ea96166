"""The warpgroup's accumulator as independent m64 x n64 chains (-DTW_SPLIT_N) against one m64 x BNW
chain, at the routed tiles.

Why: the clock stamps of logs/gemm-sm90-trace-d6bfc5c put the 64 x 128 tile's K loop at ~670 cycles
a block with the consumer waiting only ~140 of them for data, against 256 cycles of MMA at peak:
the four dependent HGMMA.64x128x16 of a block take ~530. If a dependent wgmma waits for its
predecessor's result (latency, ~130 cycles at n = 128, above its 64-cycle issue cost), splitting
the columns into two chains interleaved k16 step by k16 step lets each wgmma's latency overlap the
other chain's. Cost: A's 64 x 16 slice is read from shared memory once per chain (8 KB a k16 step
for 64 x 128 instead of 6).
Prediction, written before the run: if chain latency bounds the loop, the 64 x 128 tile's block
drops from ~670 toward ~450 cycles (shared-memory reads then bound it) and 1000^3 from 8.5 to
7.5-8.0 us; 1024 x 1024 x 3968 from ~25 to ~18-20 us; the larger tiles (two or three consumer
warpgroups already interleave chains across warpgroups) change little. If the bound is elsewhere,
no change.
Measured at df04c48 (logs/gemm-sm90-split-df04c48, and the stamps in
logs/gemm-sm90-trace-split-df04c48): slower everywhere, 1000^3 fp16 9.03 against 8.52 us, bf16 8.86
against 8.40, 1024 x 1024 x 3968 19.5 against 18.6, 2048-4096 1-3 % slower; a block's time from
its data to its release unchanged (~1,100 cycles). Chain latency is not the bound. The switch
(-DTW_SPLIT_N, a few lines in the consumer's k16 loop) was removed after the run; at later commits
both variants build the same kernel.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_split.py
"""
import torch
from _timing import warm_clocks
from gemm_sm90_feed import _source, compare, operands
from gemm_sm90_rounds import square_operands

from tilewise.ops.gemm import configs as gc

CASES = [("float16 1000^3", square_operands(1000, torch.float16), "64x128_c2x1"),
         ("bfloat16 1000^3", square_operands(1000, torch.bfloat16), "64x128_c2x1"),
         ("bfloat16 1024x1024x3968", operands(1024, 1024, 3968, torch.bfloat16, 4), "64x128_c2x1"),
         ("bfloat16 2048^3", square_operands(2048, torch.bfloat16), "128x128_c2x1"),
         ("bfloat16 3072^3", square_operands(3072, torch.bfloat16), "128x192_c2x1"),
         ("bfloat16 4096^3", square_operands(4096, torch.bfloat16), "128x256_c2x1")]


def main():
    warm_clocks()
    src = _source()
    for label, (a, b, out, ref), name in CASES:
        cfg = gc.SM90_CONFIGS[name]
        variants = {"one chain": (cfg, (), False), "split n64": (cfg, ("-DTW_SPLIT_N",), False)}
        compare(src, f"{label} {name:12s}", a, b, out, ref, variants, 10)
        del a, b, out, ref


if __name__ == "__main__":
    main()
