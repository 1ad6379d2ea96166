"""gemm_sm90 at the 1000-class sizes, the last the issue's sweep misses (0.75-0.83x cuBLAS graph-
replayed for both gemm() and gemm_sm90's 128 x 64 / 128 x 128 tiles): the 64 x 128 tile in 2 x 1
clusters with 8 stages (one consumer warpgroup, 256 threads, no setmaxnreg; cuBLAS's nvjet kernel at
1000^2 has this tile, cluster and depth) beside the other configs, gemm() and cuBLAS; bf16 and
fp16, graph-replayed; correctness first (NaN-poisoned output).

Status: compiled for sm_90a on the CPU (115 registers, no spills), not yet run on a GPU.
Prediction: 64 x 128 halves a CTA's share of each B block against 128 x 64 and keeps 128 tiles at
1000^2; if the fixed cost (~3.9 us: launch, first loads, epilogue) stays, 9.0-9.5 us (0.80-0.85x);
it would take the fixed cost down to cuBLAS's ~3 us to reach 0.9x.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_small.py
"""
import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import api as gt

SIZES = (768, 1000, 1024, 1280)
NAMES = ("64x128_c2x1", "128x64_c1x2", "128x128_c2x1")


def main():
    warm_clocks()
    for dtype in (torch.bfloat16, torch.float16):
        for n in SIZES:
            g = torch.Generator(device="cuda").manual_seed(n)
            a = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
            out = torch.empty(n, n, device="cuda", dtype=dtype)
            ref = a.float() @ b.float()
            tc = time_ms_graph(lambda: torch.matmul(a, b, out=out))
            tg = time_ms_graph(lambda: gt.gemm(a, b, out=out))
            line = f"{str(dtype)[6:]:8s} {n:5d}^3 cublas {tc * 1e3:6.2f} us  gemm() {tc / tg:.3f}x"
            for name in NAMES:
                out.fill_(float("nan"))
                gs.gemm_sm90(a, b, out=out, config=name)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2 and out.isfinite().all(), (name, n, err)
                t = time_ms_graph(lambda: gs.gemm_sm90(a, b, out=out, config=name))
                line += f"  {name} {tc / t:.3f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
