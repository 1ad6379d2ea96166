"""gemm_sm90's stream-K tail: the last, partial wave's tiles cut into K ranges over all clusters.
Interleaved graph-replayed rounds beside cuBLAS, each variant checked against float64 on a
NaN-poisoned output.

Why: 5000^3 ran 0.82-0.83x cuBLAS graph-replayed (logs/bench-gemm-triton-b8aaf9a): 400 cluster
tiles of 128 x 256 on 66 clusters run as 7 waves where the work is 6.06; per wave the kernel is as
fast as at 4096 (logs/gemm-sm90-align-94c210b).
Prediction, written before the run: the rule's 6 ranges take 5000^3 from ~455 to 405-420 us
(0.90-0.95x cuBLAS), 5120^3 alike; forced 3-12 ranges within 5 % of the rule's; and the shapes
without a tail (1000, 1536, 3072, 4096) within +-1 % of the kernel before the change (OLD.cu, the
same build without the tail's arguments), which runs beside it.
First run (c2d6ebb, the tail's code inside the whole tiles' loop): the tail as predicted at 5000 /
5120, but the shapes without a tail 4-18 % slower than before (1536^3 12.84 -> 15.17 us); the tail
is now a TAIL = 1 instantiation of its own, and TAIL = 0 compiles to the old kernel's instructions
(register names and code motion aside).
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_tail.py OLD.cu
"""
import sys

import torch
from _timing import warm_clocks
from gemm_sm90_ab_old import old_launcher
from gemm_sm90_feed import operands
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc

NO_TAIL = {1000: "64x128_c2x1", 1536: "192x96_c1x2", 3072: "128x192_c2x1", 4096: "128x256_c2x1"}
TAIL = [(5000, 5000, 5000), (5120, 5120, 5120), (5000, 5000, 4096)]


def no_tail(old_path, n, name, dtype):
    a, b, out, ref = operands(n, n, n, dtype, n)
    cfg = gc.SM90_CONFIGS[name]
    old = old_launcher(old_path, cfg, dtype, maps=3)  # the kernel before the tail: three maps, eight arguments
    graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out)),
              "before": checked_graph(lambda: old(a, b, out), out, ref, "before"),
              "now": checked_graph(lambda: gs.gemm_sm90(a, b, out=out, config=name), out, ref, "now")}
    rounds_report(graphs, 7, f"{str(dtype)[6:]:8s} {n}^3 {name}", 8)


def tail(m, n, k, dtype):
    a, b, out, ref = operands(m, n, k, dtype, m + k)
    name = gc.sm90_route_for(m, n, k)
    graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out))}
    for label, splits in (("off", 1), ("rule", None), ("3", 3), ("4", 4), ("8", 8), ("12", 12)):
        graphs[label] = checked_graph(lambda: gs.gemm_sm90(a, b, out=out, config=name, tail_splits=splits), out, ref,
                                      label)
    cfg = gc.SM90_CONFIGS[name]
    nct = cfg.cluster_tiles(m, n)
    splits = gc.sm90_tail_splits(nct, 66, -(-k // 64))
    print(f"{m}x{n}x{k} {name}: {nct} cluster tiles, rule's splits {splits}", flush=True)
    rounds_report(graphs, 7, f"{str(dtype)[6:]:8s} {m}x{n}x{k}", 6)


def main():
    old_path = sys.argv[1]
    warm_clocks()
    for dtype in (torch.bfloat16, torch.float16):
        for m, n, k in TAIL:
            tail(m, n, k, dtype)
            torch.cuda.empty_cache()
    for n, name in NO_TAIL.items():
        no_tail(old_path, n, name, torch.bfloat16)


if __name__ == "__main__":
    main()
