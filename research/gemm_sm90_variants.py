"""gemm_sm90 compiled with the pipeline's -D switches, each against cuBLAS and gemm() in one run,
graph-replayed, bf16: TW_INFLIGHT=2 (two K blocks of wgmma in flight before a consumer waits, so
the tensor cores keep a queue while the consumer releases a stage and waits for the next) and
TW_WAIT_SPIN (mbarrier try_wait without a suspend-time hint).

Why: ncu on 1536^3 (192 x 96, 1 x 2) showed the tensor pipe 41 % busy, L2 52 %, 0.27 issued
warps a cycle: latency-bound, ~1,340 cycles a K block against ~560 of tensor work; at 4096^3
(128 x 256, 2 x 1) 79 % tensor. Prediction: INFLIGHT=2 moves 1536 / 1000 by 5-15 % if the gap is
the consumer's turn-around, nothing if it is the loads' latency; WAIT_SPIN within noise.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_variants.py
"""
import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import api as gt

CASES = {1000: ("128x64_c1x2", "128x128_c1x1"), 1536: ("192x96_c1x2", "128x192_c1x2"), 3072: ("128x192_c2x1",),
         4096: ("128x256_c2x1",)}
OPTIONS = {"default": (), "inflight2": ("-DTW_INFLIGHT=2",), "spin": ("-DTW_WAIT_SPIN",),
           "inflight2+spin": ("-DTW_INFLIGHT=2", "-DTW_WAIT_SPIN")}


def main():
    warm_clocks()
    for n, names in CASES.items():
        g = torch.Generator(device="cuda").manual_seed(n)
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        tc = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        tg = time_ms_graph(lambda: gt.gemm(a, b, out=out))
        print(f"{n}^3 cublas {tc * 1e3:.1f} us; gemm() {tg * 1e3:.1f} us {tc / tg:.3f}x", flush=True)
        for label, opts in OPTIONS.items():
            options = gs.DEFAULT_COMPILE_OPTIONS + opts
            for name in names:
                out.fill_(float("nan"))
                gs.gemm_sm90(a, b, out=out, config=name, compile_options=options)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                t = time_ms_graph(lambda: gs.gemm_sm90(a, b, out=out, config=name, compile_options=options))
                print(f"{n}^3 {name:14s} {label:15s} {t * 1e3:8.1f} us {tc / t:.3f}x cublas  err {err:.1e}", flush=True)
        tc2 = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        print(f"{n}^3 cublas again {tc2 * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    main()
