"""Should gemm() route large plain 16-bit products to gemm_sm90? cuBLAS, gemm() as routed now
(Triton above the 1000 / 1536 / 3072 classes) and gemm_sm90 with its own tile rule, in interleaved
rounds, graph-replayed, each checked against float64 on NaN-poisoned outputs.

Why: after the fourteenth session's barrier changes, the bench (logs/bench-gemm-triton-5340525)
had gemm_sm90 at 4096^3 1.07x / 0.94x (bf16 / fp16) and gemm() (Triton) at 0.84x / 0.88x in the
same run; gemm()'s 4096 bf16 row varied 0.84-0.94 over the session's three benches. The route rule
(route_for) came from a sweep before those changes (logs/gemm-sm90-sweep-*-e60fadc), where 4096 was
level.
Prediction, written before the run: gemm_sm90 >= gemm() by 3-10 % at 2048-4096 squares and on
4096 x 4096 x 1024; level (+-3 %) at 6144 / 8192, where both run near the tensor cores' peak.
Also (fifteenth session): which config gemm()'s autotuner picked (Triton's autotuner keeps no
disk cache: each process tunes again, so a bench's 4096 row may run a different tile than the
last one), and at 4096^3 each 16-bit TMA config fixed, to see the spread the autotuner chooses in.
Prediction: the autotuner's 0.84-0.94 spread at 4096 bf16 comes from picking different tiles in
different processes; the fixed configs span >= 10 %.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_route_big.py [n ...]
(n: squares only, e.g. 4096 in fresh processes to see the autotuner's choice vary)
"""
import sys

import torch
from _timing import warm_clocks
from gemm_sm90_feed import operands
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import api as gt
from tilewise.ops.gemm import triton_kernels as tk

SHAPES = [(2048, 2048, 2048), (2560, 2560, 2560), (3584, 3584, 3584), (4096, 4096, 4096),
          (4096, 4096, 1024), (2048, 8192, 2048), (6144, 6144, 6144), (8192, 8192, 8192)]


TMA16 = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], 64, c.num_stages, c.num_warps)
         for c in tk._CONFIGS if c.kwargs["BLOCK_K"] == 64]


def tuned_pick(m, n, k):
    """The autotuner's configs for this M, N, K (v3_tma_persistent's cache), as text."""
    picks = [f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}x{c.kwargs['BLOCK_K']} s{c.num_stages} w{c.num_warps}"
             for key, c in tk._tma.cache.items() if tuple(key[:3]) == (m, n, k)]
    return ", ".join(picks) or "(not the autotuned TMA path)"


def run_case(m, n, k, dtype):
    a, b, out, ref = operands(m, n, k, dtype, m + n + k)
    cfg = gc.sm90_config_for(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out)),
              "gemm()": checked_graph(lambda: gt.gemm(a, b, out=out), out, ref, "gemm()"),
              f"sm90 {cfg}": checked_graph(lambda: gs.gemm_sm90(a, b, out=out), out, ref, cfg)}
    print(f"{str(dtype)[6:]:8s} {m}x{n}x{k} gemm()'s autotuner: {tuned_pick(m, n, k)}", flush=True)
    if (m, n, k) == (4096, 4096, 4096):
        for fx in TMA16:
            fn = (lambda fx=fx: tk.run_tma(a, b, out, None, None, None, None, "tf32", None, fixed=gc.Tile(*fx)))
            graphs["tma %dx%dx%d s%d w%d" % fx] = checked_graph(fn, out, ref, fx)
    rounds_report(graphs, 5, f"{str(dtype)[6:]:8s} {m}x{n}x{k}", 22)


def main():
    warm_clocks()
    shapes = [(int(x),) * 3 for x in sys.argv[1:]] or SHAPES
    for m, n, k in shapes:
        for dtype in (torch.bfloat16, torch.float16):
            run_case(m, n, k, dtype)  # its operands and graphs go when it returns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
