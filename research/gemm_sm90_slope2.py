"""The K-loop's cost a 64-deep block at the 1000-class outputs: M = N (default 1024) with K from 64
to 16384, graph-replayed, gemm_sm90's one-warpgroup 64 x 128 tile (2 x 1) and two-warpgroup
128 x 64 (1 x 2) with B N-major (B (K, N) rows) and K-major (B = w.T), with the switches
TW_WAIT_SPIN / TW_INFLIGHT=2 on the first, beside cuBLAS on the same operands.

Why: at 1024^3 cuBLAS takes 5.7 us and gemm_sm90 (64 x 128) 7.5 (logs/gemm-sm90-rounds-091de36):
with intercepts of ~3.3-3.8 us that is ~0.16 us a K block for cuBLAS (near the 256 tensor cycles
of a 64 x 128 x 64 block, 0.14 us) against ~0.25 for gemm_sm90. Prediction: at K = 16384 gemm_sm90
~64 us against cuBLAS ~41 if the main loop is the gap; equal slopes would put it in the intercept.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_slope2.py [MN]
"""
import sys

import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc

KS = (64, 1024, 4096, 16384)
EARLY = ("-DTW_EARLY_LOCAL",)
VARIANTS = [  # (label, config, trans_b, options)
    ("64x128_c2x1 N", (64, 128, 2, 1, 8), 1, EARLY),
    ("64x128_c2x1 K", (64, 128, 2, 1, 8), 0, EARLY),
    ("128x64_c1x2 N", (128, 64, 1, 2, 8), 1, EARLY),
    ("128x64_c1x2 K", (128, 64, 1, 2, 8), 0, EARLY),
    ("64x128_c2x1 N spin", (64, 128, 2, 1, 8), 1, EARLY + ("-DTW_WAIT_SPIN",)),
    ("64x128_c2x1 N inflight2", (64, 128, 2, 1, 8), 1, EARLY + ("-DTW_INFLIGHT=2",)),
]
# (A `dual` set timed even and odd K blocks into two accumulator sets through a -DTW_DUAL_ACC switch,
# since removed: no change to the slope, logs/gemm-sm90-slope2-dual-*-9777292.log.)
_names = frozenset(gs._instantiated() | {gc.Sm90Config(*c, t).name(d) for _, c, t, _ in VARIANTS
                                         for d in (torch.bfloat16,)})
gs._instantiated = lambda: _names


def main():
    mn = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = {}
    for K in KS:
        a = torch.randn(mn, K, device="cuda", dtype=torch.bfloat16, generator=g)
        bn = torch.randn(K, mn, device="cuda", dtype=torch.bfloat16, generator=g)
        bk = torch.randn(mn, K, device="cuda", dtype=torch.bfloat16, generator=g).t()
        out = torch.empty(mn, mn, device="cuda", dtype=torch.bfloat16)
        for lay, b in (("N", bn), ("K", bk)):
            rows.setdefault(f"cublas {lay}", {})[K] = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        for label, c, t, opts in VARIANTS:
            b = bn if t else bk
            cfg = gc.Sm90Config(*c, t)
            options = gs.DEFAULT_COMPILE_OPTIONS + opts
            out.fill_(float("nan"))
            gs.gemm_sm90(a, b, out=out, config=cfg, compile_options=options)
            ref = a.float() @ b.float()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2 and out.isfinite().all(), (label, K, err)
            rows.setdefault(label, {})[K] = time_ms_graph(lambda: gs.gemm_sm90(a, b, out=out, config=cfg,
                                                                               compile_options=options))
    k1, k2 = KS[-2], KS[-1]
    print(f"M = N = {mn}, bf16, graph-replayed us; slope = us a 64-deep K block between K = {k1} and {k2}; "
          f"intercept = the K -> 0 extrapolation", flush=True)
    print(f"{'':26s}" + "".join(f"{k:>9d}" for k in KS) + "    slope  intercept")
    for label, t in rows.items():
        slope = (t[k2] - t[k1]) * 1e3 / ((k2 - k1) / 64)
        icpt = t[k1] * 1e3 - slope * k1 / 64
        print(f"{label:26s}" + "".join(f"{t[k] * 1e3:9.2f}" for k in KS) + f"  {slope:7.3f}  {icpt:8.2f}", flush=True)


if __name__ == "__main__":
    main()
