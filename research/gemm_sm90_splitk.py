"""Split-K in gemm_sm90 through the stream-K tail kernel: when an output has fewer cluster tiles than
resident clusters, cut every tile into s K ranges (cluster_tiles x s clusters), the partials added
in range order by the last unit. Interleaved graph-replayed rounds beside cuBLAS and gemm(), each
variant checked against float64 on a NaN-poisoned output.

Why: fp16 1000^3 is the one sweep point under 0.85x cuBLAS (0.83-0.87 over six benches). gemm()
sends it to 64 x 128 tiles (128 CTAs, one consumer warpgroup each), whose K loop runs the tensor
cores under half busy (the no-load stamps: 686 cycles a K block against 256 at peak); two
warpgroups on 128 x 128 reach 80 % but give only 64 tiles. Split in two, 128 x 128 fills 128 CTAs
with 8 K blocks each instead of 16.
Prediction, written before the run: 128 x 128 (2 x 1 clusters) split 2 at 1000^3 7.3-8.3 us against
64 x 128's 8.2-8.5 (the loop ~8 x 761 cycles instead of 16 x 686, less a 64 KB partial written and
two read back through L2, ~1-1.5 us); at 1024 x 1024 x 16384 (256 blocks a tile) split-K well ahead
of every unsplit tile (64 x 128: 73 us against cuBLAS's 52), 128 x 128 s2 or 128 x 256 s4 near
cuBLAS.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_splitk.py [m,n,k ...]
"""
import sys

import torch
from _timing import warm_clocks
from gemm_sm90_feed import operands
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import api as gt
from tilewise.runtime import cuda as rt

SHAPES = [(1000, 1000, 1000), (1024, 1024, 1024), (1000, 1000, 4000), (1024, 1024, 16384), (768, 768, 8192),
          (512, 2048, 4096), (1536, 1536, 1536)]
VARIANTS = [("64x128_c2x1", (1,)), ("128x128_c2x1", (1, 2, 3, 4)), ("128x128_c1x1", (1, 2, 4)),
            ("128x256_c2x1", (1, 2, 4, 8)), ("128x192_c2x1", (1, 2, 4)), ("192x96_c1x2", (1, 2))]


def effective(cfg, m, n, k, s, cap):
    """The splits _launch takes for forced s (None where the shape has whole waves)."""
    nct = cfg.cluster_tiles(m, n)
    if nct > cap:
        return None if s > 1 else 1
    return max(1, min(s, -(-k // 64), cap // nct))


def shape(m, n, k, dtype):
    a, b, out, ref = operands(m, n, k, dtype, m + 7 * k)
    graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out)),
              "gemm()": checked_graph(lambda: gt.gemm(a, b, out=out), out, ref, "gemm()")}
    for name, splits in VARIANTS:
        cfg = gc.SM90_CONFIGS[name]
        cap = gs._loaded(cfg.name(dtype), a.get_device(), cfg.cluster, cfg.threads, cfg.shmem,
                         gs.DEFAULT_COMPILE_OPTIONS).clusters
        seen = set()
        for s in splits:
            e = effective(cfg, m, n, k, s, cap)
            if e is None or e in seen:
                continue
            seen.add(e)
            label = f"{name.split('_')[0]}{'' if cfg.cluster == 1 else '_' + name.split('_')[1]} s{e}"
            graphs[label] = checked_graph(lambda: gs.gemm_sm90(a, b, out=out, config=name, tail_splits=e), out, ref,
                                          label)
    print(f"{m}x{n}x{k} route {gc.sm90_route_for(m, n, k)}", flush=True)
    rounds_report(graphs, 7, f"{str(dtype)[6:]:8s} {m}x{n}x{k}", 18)
    torch.cuda.empty_cache()


def main():
    shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[1:]] or SHAPES
    print(torch.cuda.get_device_name(), "SMs", rt.sm_count(0), flush=True)
    warm_clocks()
    for m, n, k in shapes:
        for dtype in (torch.float16, torch.bfloat16):
            shape(m, n, k, dtype)


if __name__ == "__main__":
    main()
