"""Where gemm_sm90's time goes at 1536^2 outputs: M = N = 1536 with K from 64 to 6144, so the time
splits into a per-K-block slope (the main loop) and an intercept (launch, prologue, first loads,
epilogue), for gemm_sm90 (192 x 96 in 1 x 2 clusters, and 128 x 128 without a cluster), each with B
N-major (B (K, N) with unit-stride rows: wgmma's transposed B) and K-major (B = w.T), beside cuBLAS
on the same operands; graph-replayed, bf16.

Prediction: the tensor work of a 192 x 96 x 64 block is ~576 cycles (~0.31 us at 1.85 GHz); if the
slope is near that, the gap to cuBLAS (16.6 against 11.7 us at K = 1536) is in the intercept.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_slope.py
"""
import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc

M = N = 1536
KS = (64, 768, 1536, 3072, 6144)
CASES = (("192x96_c1x2", gc.SM90_CONFIGS["192x96_c1x2"]), ("128x128_c1x1", gc.SM90_CONFIGS["128x128_c1x1"]))


def main():
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = {}
    for K in KS:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        bn = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
        bk = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g).t()
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        for lay, b in (("Nmaj", bn), ("Kmaj", bk)):
            ref = a.float() @ b.float()
            rows.setdefault(("cublas", lay), {})[K] = time_ms_graph(lambda: torch.matmul(a, b, out=out))
            for name, cfg in CASES:
                c = gc.Sm90Config(cfg.bm, cfg.bn, cfg.cm, cfg.cn, cfg.stages, 1 if lay == "Nmaj" else 0)
                out.fill_(float("nan"))
                gs.gemm_sm90(a, b, out=out, config=c)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2 and out.isfinite().all(), (name, lay, K, err)
                rows.setdefault((name, lay), {})[K] = time_ms_graph(lambda: gs.gemm_sm90(a, b, out=out, config=c))
    print(f"M = N = {M}, graph-replayed us; slope = us a 64-deep K block between K = 1536 and 6144; "
          "intercept = the K -> 0 extrapolation", flush=True)
    print(f"{'':24s}" + "".join(f"{k:>9d}" for k in KS) + "    slope  intercept")
    for (name, lay), t in rows.items():
        slope = (t[6144] - t[1536]) * 1e3 / ((6144 - 1536) / 64)
        icpt = t[1536] * 1e3 - slope * 1536 / 64
        print(f"{name + ' ' + lay:24s}" + "".join(f"{t[k] * 1e3:9.1f}" for k in KS) + f"  {slope:7.3f}  {icpt:8.2f}",
              flush=True)


if __name__ == "__main__":
    main()
