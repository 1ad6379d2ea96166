"""The cluster barriers' release semantics, and B's cluster share by chunk, at the routed tiles.

Why: both cluster barriers of gemm_sm90 (after the ring's mbarriers are made, and before a CTA
leaves) arrive with release semantics, which compile to MEMBAR.ALL.GPU + ERRBAR in every thread
(nvdisasm). At the end that fence waits for the epilogue's global stores to be acknowledged before
the CTA may arrive; the barrier is there only so no CTA's shared memory goes away while a peer may
still write it. ncu's samples at 1024^3 (logs/gemm-sm90-ncu-sass-1024-b5cfac9) put ERRBAR and the
final cluster wait among the top stalls. -DTW_RELAXED_CLUSTER=1 / 2 / 3 (start / end / both; a
switch at 2eb2667, removed since) made the arrivals relaxed (the start ordered by
fence.mbarrier_init, the end by one cluster fence from the thread that made the last remote
arrivals, before the epilogue). Measured: the start relaxed 1.5-2.4 % faster at 1000^3, the end
1-2 % slower.
Prediction, written before the run: the end's fence costs about one store round trip (0.3-1 us)
per CTA on the one-tile-a-CTA shapes, so 1000^3 gains 0.1-0.5 us (1-5 %); the start's fence has
nothing outstanding to wait for (within noise). -DTW_B_BY_CHUNK (logs/gemm-sm90-feed-c4b2979:
-11 % at 1024 x 1024 x 16384, +1-2 % at 1000^3) at the larger tiles with CM = 2: unknown, measured.
Interleaved rounds, graph-replayed, each variant checked against float64 on NaN-poisoned outputs.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_relaxed.py
"""
import torch
from _timing import warm_clocks
from gemm_sm90_feed import _source, compare
from gemm_sm90_rounds import square_operands

from tilewise.ops.gemm import configs as gc

CASES = [(1000, torch.bfloat16, "64x128_c2x1"), (1000, torch.float16, "64x128_c2x1"),
         (1536, torch.bfloat16, "192x96_c1x2"), (3072, torch.bfloat16, "128x192_c2x1"),
         (4096, torch.bfloat16, "128x256_c2x1")]
# At 2eb2667 also "rel start" / "rel end" / "rel both" (-DTW_RELAXED_CLUSTER=1 / 2 / 3) and "rel
# both+chunk": measured there (logs/gemm-sm90-relaxed-2eb2667), the relaxed start made the default at
# 7319c44 and the switch removed, so at later commits only these two differ.
VARIANTS = {"default": ((), False), "chunk": (("-DTW_B_BY_CHUNK",), True)}


def main():
    warm_clocks()
    src = _source()
    for n, dtype, name in CASES:
        cfg = gc.SM90_CONFIGS[name]
        a, b, out, ref = square_operands(n, dtype)
        variants = {v: (cfg, opts, chunk) for v, (opts, chunk) in VARIANTS.items() if not (chunk and cfg.cm == 1)}
        compare(src, f"{str(dtype)[6:]:8s} {n}^3 {name:12s}", a, b, out, ref, variants, 14)


if __name__ == "__main__":
    main()
