"""The 64 x 128 tile with two consumer warpgroups on its 64-column halves (`64x128w2_c2x1`, 384
threads, each warpgroup m64 x n64 wgmma on the same A block and its own B chunk) beside the
one-warpgroup 64 x 128 (routed at 1000^2) and cuBLAS, in interleaved rounds (graph-replayed), at
1000^3 and 1024^3 in bf16 and fp16, and at M = N = 1024, K = 16384 for the K loop's rate.

Why: the one-warpgroup tile's K loop takes 0.24-0.26 us a 64-deep block against cuBLAS's 0.19-0.20
(logs/gemm-sm90-slope2-*); cuBLAS's kernels there split a 64-row tile between two consumer
warpgroups (ncu, logs/gemm-sm90-ncu-*-091de36). Prediction: if one warpgroup's issue and waits are
the limit, w2 moves the long-K time toward cuBLAS's (K = 16384: ~52 us against 70); if the shared-
memory reads are (A is read by both warpgroups: 32 KB a block against 24), it is slower.
Status: written, compiled for sm_90a (168 registers at launch, no spills); not yet run on a GPU.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_wn2.py
"""
import torch
from _timing import warm_clocks
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report, square_operands

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc

NAMES = ("64x128_c2x1", "64x128w2_c2x1")


def cfg(name):
    return gc.SM90_CONFIGS.get(name) or gc.SM90_EXTRA_CONFIGS[name]


def main():
    warm_clocks()
    for n in (1000, 1024):
        for dtype in (torch.bfloat16, torch.float16):
            a, b, out, ref = square_operands(n, dtype)
            graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out))}
            for name in NAMES:
                graphs[name] = checked_graph(lambda: gs.gemm_sm90(a, b, out=out, config=cfg(name)), out, ref, name)
            rounds_report(graphs, 7, f"{str(dtype)[6:]:8s} {n}^3", 16)
            del graphs
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(1024, 16384, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(16384, 1024, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.empty(1024, 1024, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out))}
    for name in NAMES:
        graphs[name] = checked_graph(lambda: gs.gemm_sm90(a, b, out=out, config=cfg(name)), out, ref, name)
    rounds_report(graphs, 5, "bfloat16 1024 x 1024 x 16384", 16)


if __name__ == "__main__":
    main()
