"""gemm_sm90's fixed cost: at M = N = 1536 the K-block slope of 192 x 96 (1 x 2) equals cuBLAS's
(0.40 us) but the K -> 0 intercept is 7.4 us against 2.5 (logs/gemm-sm90-slope-32b8cfd.log). Here:
K = 64 and 1536 with and without the epilogue's stores (-DTW_NO_STORE), graph-replayed, beside
cuBLAS, bf16; the Nsight Compute durations of the same kernels come from the batch's ncu lines.
Prediction: the stores (4.7 MB written as 16-byte halves of sectors) are ~2 us of the 5 us gap.
Measured (32ec70f): K = 64 8.26 us with the stores, 3.36 without (cuBLAS 4.38); K = 1536 16.66 /
12.34 (cuBLAS 11.73): the stores were ~4.5-5 us. Next run (the staged epilogue, default now; the
first epilogue behind -DTW_DIRECT_STORE): predicted K = 1536 ~13 us (~0.9x cuBLAS).
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_intercept.py
[--mn 1536] [--ks 64,1536] [--configs 192x96_c1x2,128x128_c1x1,128x64_c1x2]
"""
import argparse

import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import sm90 as gs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mn", type=int, default=1536)
    p.add_argument("--ks", default="64,1536")
    p.add_argument("--configs", default="192x96_c1x2,128x128_c1x1,128x64_c1x2")
    args = p.parse_args()
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(0)
    M = N = args.mn
    for K in map(int, args.ks.split(",")):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        tc = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        print(f"K {K:5d} cublas {tc * 1e3:6.2f} us", flush=True)
        for opts in ((), ("-DTW_DIRECT_STORE",), ("-DTW_NO_STORE",)):
            options = gs.DEFAULT_COMPILE_OPTIONS + opts
            for name in args.configs.split(","):
                t = time_ms_graph(lambda: gs.gemm_sm90(a, b, out=out, config=name, compile_options=options))
                print(f"K {K:5d} {name:14s} {' '.join(opts) or 'default':15s} {t * 1e3:6.2f} us", flush=True)
    # the empty kernel's floor: a graph of one-element copies, for the launch cost of a graph node
    z = torch.zeros(1, device="cuda")
    print(f"graph node floor (1-element add_) {time_ms_graph(lambda: z.add_(1)) * 1e3:.2f} us", flush=True)


if __name__ == "__main__":
    main()
