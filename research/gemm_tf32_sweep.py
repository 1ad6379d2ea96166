"""tf32 with row-major B over shapes: gemm() (now gemm_sm90.gemm_tf32 where it applies), the route it
replaced (tilewise's transpose of B, then the Triton kernels on K-major B), and gemm_tf32 at each BM,
beside cuBLAS TF32; interleaved graph-replayed rounds (harness.time_ms_graphs), each checked against
float64 first. Question: does the new route lose anywhere, and does tf32_bm_for pick the best BM?
Second run (BM = 64 added, CTA pairs along N sharing A's blocks by multicast), prediction written
before it: BM = 64 lifts the outputs of under a wave of BM = 128 tiles (4096 x 256 x 4096: 0.75 ->
~0.95; 512^3 and 1024^3 a few %); the pairs gain 0-5 % at 4096-8192 (a third less L2 -> SM traffic
a K block: 32 + 16 KiB -> 16 + 16) and lose where a pair leaves SMs idle.
First run's prediction, written before it: gemm_tf32 ahead of the old route at every shape (it saves the
transpose's read and write of B and runs ~1.0x cuBLAS where the Triton kernel ran 0.94-1.0x); BM by
the model within 3 % of the best BM, except at the smallest shapes (512-1024), where launch and
fill times dominate.
Run on the GPU: PYTHONPATH=src python3 research/gemm_tf32_sweep.py
"""
import sys

import torch
from _timing import warm_clocks

from tilewise.bench import harness
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import api as gt
from tilewise.ops.transpose import api as tr

# First run (43fb8eb): the old route too. Second: BM = 64 and CTA pairs sharing A (cluster 2), and
# not the old route (OLD_ROUTE = False; --old puts it back).
# Third (--gemm-only): gemm() with the rules that came of the second, beside cuBLAS only.
OLD_ROUTE = "--old" in sys.argv
GEMM_ONLY = "--gemm-only" in sys.argv
CLUSTERS = not GEMM_ONLY
SHAPES = [(512, 512, 512), (1000, 1000, 1000), (1024, 1024, 1024), (1536, 1536, 1536), (2048, 2048, 2048),
          (3000, 3000, 3000), (4096, 4096, 4096), (5000, 5000, 5000), (6144, 6144, 6144), (8192, 8192, 8192),
          (8192, 1024, 4096), (1024, 8192, 4096), (4096, 4096, 512), (256, 4096, 4096), (4096, 256, 4096)]


def main():
    torch.backends.cuda.matmul.allow_tf32 = True
    warm_clocks()
    for M, N, K in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(M + N + K)
        a = torch.randn(M, K, device="cuda", generator=g)
        b = torch.randn(K, N, device="cuda", generator=g)
        out = torch.empty(M, N, device="cuda")
        ref = a.double() @ b.double()
        fns = {"cublas": lambda: torch.matmul(a, b, out=out),
               "gemm()": lambda: gt.gemm(a, b, out=out)}
        if OLD_ROUTE:
            fns["old route"] = lambda: gt.gemm(a, tr.transpose(b).t(), out=out)
        for bm in () if GEMM_ONLY else gs.TF32_CONFIGS:
            fns[f"BM={bm}"] = lambda bm=bm: gs.gemm_tf32(a, b, out=out, bm=bm, cluster=1)
        if CLUSTERS:
            for bm in (256, 192, 128):
                fns[f"BM={bm}c2"] = lambda bm=bm: gs.gemm_tf32(a, b, out=out, bm=bm, cluster=2)
        for k, fn in fns.items():
            out.fill_(float("nan"))
            fn()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert out.isfinite().all() and err < 2e-3, (M, N, K, k, err)
        t = harness.time_ms_graphs(fns)
        pick = gs.tf32_bm_for(M, N, torch.cuda.get_device_properties(0).multi_processor_count)
        line = "  ".join(f"{k} {t['cublas'] / v:.3f}" for k, v in t.items() if k != "cublas")
        if GEMM_ONLY:
            print(f"tf32 {M}x{N}x{K}: cublas {t['cublas'] * 1e3:8.1f} us | {line} | BM={pick}, cluster "
                  f"{gs.tf32_cluster_for(M, N, pick)}", flush=True)
            continue
        best = min((k for k in fns if k.startswith("BM=") and not k.endswith("c2")), key=t.get)
        print(f"tf32 {M}x{N}x{K}: cublas {t['cublas'] * 1e3:8.1f} us | {line} | model BM={pick}, best {best} "
              f"({t[best] / t[f'BM={pick}']:.3f})", flush=True)


if __name__ == "__main__":
    main()
