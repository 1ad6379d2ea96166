"""Where gemm() should send the 1000-class products: shapes whose 64 x 128 tiles fill 90-100 % of
one wave, some with rows that are whole 128-byte multiples (960, 1024: Triton's gemm() 0.97x
cuBLAS at 1024^3, gemm_sm90 0.75x) and some without (1000: gemm() 0.74-0.81x, gemm_sm90
0.83-0.89x; logs/gemm-sm90-rounds-091de36). Timed in interleaved rounds (gemm_sm90_rounds'
graphs): cuBLAS, gemm() as routed at this commit, gemm_sm90 64 x 128 (2 x 1) with the kernel's
defaults; bf16 and fp16.

Prediction: gemm_sm90 ahead wherever A's rows are not 128-byte multiples, Triton ahead where they are.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_route1000.py
"""
import statistics

import torch
from _timing import warm_clocks
from gemm_sm90_rounds import graph_of, replay_us

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import api as gt

SHAPES = [(904, 904, 904), (936, 936, 936), (960, 960, 960), (968, 968, 968), (1000, 1000, 1000),
          (1016, 1016, 1016), (1024, 1024, 1024), (1000, 1000, 4000), (1000, 1000, 1024), (1024, 1024, 1000),
          (936, 1016, 2000)]
ROUNDS = 5


def main():
    warm_clocks()
    for dtype in (torch.bfloat16, torch.float16):
        for M, N, K in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(M + N + K)
            a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g)
            out = torch.empty(M, N, device="cuda", dtype=dtype)
            ref = a.double() @ b.double()
            out.fill_(float("nan"))
            gs.gemm_sm90(a, b, out=out, config="64x128_c2x1")
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert out.isfinite().all() and err < 1e-2, (M, N, K, err)
            graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out)),
                      "gemm()": graph_of(lambda: gt.gemm(a, b, out=out)),
                      "sm90": graph_of(lambda: gs.gemm_sm90(a, b, out=out, config="64x128_c2x1"))}
            samples = {k: [] for k in graphs}
            for _ in range(ROUNDS):
                for k, gr in graphs.items():
                    for _ in range(3):
                        samples[k].append(replay_us(gr))
            t = {k: statistics.median(v) for k, v in samples.items()}
            print(f"{str(dtype)[6:]:8s} {M:5d}x{N:5d}x{K:5d} (A rows {2 * K % 128:3d} B past 128) cublas {t['cublas']:6.2f} us"
                  f"  gemm() {t['cublas'] / t['gemm()']:.3f}x  sm90 64x128 {t['cublas'] / t['sm90']:.3f}x", flush=True)
            del graphs


if __name__ == "__main__":
    main()
