"""Which part of the session-13 gemm_sm90 changes cost the 192 x 96 tile ~1 us at 1536^3 (13.8 us
at 0ddc4c3, 14.8 at 43ca3b2 with the same pipeline choices, -DTW_LATE_LOCAL -DTW_TMA_STORE=0;
logs/gemm-sm90-ab-old-*), and whether the fix holds on the device.

Found on the CPU (NVRTC + nvdisasm, sm_90a, registers and labels normalized): putting back the
0ddc4c3 consumer K loop or epilogue leaves the SASS unchanged; putting back the 0ddc4c3 producer
makes it identical to 0ddc4c3's. The producer's per-iteration `pre` test (the early copies) had
changed the whole kernel's schedule (64 more instructions, the consumer's set-up reordered). Fix:
the early blocks' multicast copies in a loop of their own before the ring loop, which is again
the 0ddc4c3 loop (late mode: SASS identical to 0ddc4c3's).

Measured at 021c38c (logs/gemm-sm90-bisect-021c38c.log): late+thread 13.93 us against 0ddc4c3's
13.88; the bulk stores help the 2-3 warpgroup tiles (1536: 13.60, 3072: 90.2 against 91.9), the
early copies only the one-warpgroup tile (1000: 8.71 against 9.16; 1536: 14.12 against 13.60).
The defaults now follow that (early with one consumer warpgroup, bulk stores with more).

Here, interleaved rounds (graph-replayed, bf16, 1536^3, 192 x 96 in 1 x 2 clusters): the 0ddc4c3
build beside this commit's with each pipeline choice. Prediction: late+thread = 0ddc4c3 (13.8 us);
early and the bulk-store epilogue 0.2-0.5 us less each (as at 1000 / 3072).
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_bisect.py OLD.cu
"""
import sys
from pathlib import Path

import torch
from _timing import warm_clocks
from gemm_sm90_ab_old import old_launcher
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report, square_operands

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc

# (at 021c38c the defaults were early copies everywhere and bulk stores with 2-3 consumer
# warpgroups; the labels of that run's log name the choices, as here)
VARIANTS = {"default": (), "late+thread": ("-DTW_EARLY_LOCAL=0", "-DTW_TMA_STORE=0"),
            "early+thread": ("-DTW_EARLY_LOCAL=1", "-DTW_TMA_STORE=0"),
            "late+bulk": ("-DTW_EARLY_LOCAL=0", "-DTW_TMA_STORE=1"), "early+bulk": ("-DTW_EARLY_LOCAL=1", "-DTW_TMA_STORE=1")}
CASES = {1536: "192x96_c1x2", 1000: "64x128_c2x1", 3072: "128x192_c2x1"}


def main():
    old_path = Path(sys.argv[1])
    warm_clocks()
    dtype = torch.bfloat16
    for n, name in CASES.items():
        cfg = gc.SM90_CONFIGS[name]
        a, b, out, ref = square_operands(n, dtype)
        fns = {"old 0ddc4c3": old_launcher(old_path, cfg, dtype)}
        for k, opts in VARIANTS.items():
            fns[k] = old_launcher(gs.SRC, cfg, dtype, maps=3, options=("-std=c++17",) + opts)
        graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out))}
        for k, fn in fns.items():
            graphs[k] = checked_graph(lambda: fn(a, b, out), out, ref, k)
        rounds_report(graphs, 7, f"bf16 {n}^3 {name:13s}", 22)
        del graphs


if __name__ == "__main__":
    main()
