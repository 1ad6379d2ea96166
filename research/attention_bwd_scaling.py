"""v6's backward kernels (dK / dV, dQ; the default configs) and cuDNN's backward at equal work along issue 30's grid
(B x S = 16384), each in TFLOP/s, to find which kernel loses where our forward + backward falls behind cuDNN.

Why: the bench rows at d7b1998 (H100) put B 1 H 32 / 8 S 16384 D 128 without causal at 0.883x cuDNN forward +
backward (30.98 ms against 27.34), while B 2 H 32 / 8 S 8192 read 0.991x: our forward kept up (1.04x) there, so
our backward took ~2.26x its S 8192 time for twice the work, where cuDNN's took ~1.93x. Spills are not it: the
D 128 dK / dV kernel's 85 spill instructions sit between its query-tile loops, none inside (Triton 3.6 SASS).

Prediction (2026-12-07, before a run; H100): the dK / dV kernel loses its rate from S 8192 to 16384 (GQA 4: each CTA
streams four query heads of 16384 rows), dQ keeps it; cuDNN's rate flat within 3 %. At the Llama D 64 causal shapes
(added in the fortieth session) v6 ~0.95x cuDNN's backward (the bench rows: 6.6 ms against 6.24 at S 16384).
Run on the GPU (~1 minute): PYTHONPATH=src python3 research/attention_bwd_scaling.py
"""

from __future__ import annotations

import torch
import triton

from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_bwd as gb

from _timing import abba_ms, cudnn_backward_ms, v6_backward_inputs, warm_clocks

# (B, H, Hkv, S, D, causal): D 128 without causal along S at B x S = 16384, GQA and not, then causal.
SHAPES = [(8, 32, 8, 2048, 128, False), (4, 32, 8, 4096, 128, False), (2, 32, 8, 8192, 128, False),
          (1, 32, 8, 16384, 128, False), (2, 16, 16, 8192, 128, False), (1, 16, 16, 16384, 128, False),
          (2, 32, 8, 8192, 128, True), (1, 32, 8, 16384, 128, True),
          # The Llama-3.2-1B bench's attention (D 64, causal): ~40 % of its 1 x 16384 step.
          (4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=80, return_mode="median")


def main():
    warm_clocks()
    print(f"{torch.cuda.get_device_name()}: B H/Hkv S D causal | dK/dV ms (TFLOP/s) | dQ ms (TFLOP/s) | "
          "v6 ms | cuDNN backward ms (TFLOP/s) | cuDNN x v6", flush=True)
    for B, H, Hkv, S, D, causal in SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D + causal)
        dk, dv, dq = (torch.full_like(t, float("nan")) for t in (k, v, q))
        # The configs a default call runs (D 64's three-consumer dQ comes from the policy, not the tables).
        pol = C.choose_policy(D, S, S, causal=causal)
        kv_cfg, q_cfg = C.ws_bwd_dkdv_config(D, pol.ws_bwd_config), C.ws_bwd_dq_config(D, pol.ws_bwd_dq_config)
        fns = {"dkdv": lambda: gb.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv, config=kv_cfg),
               "dq": lambda: gb.dq(q, k, v, do, lse, delta, causal, scale, dq, config=q_cfg)}
        for fn in fns.values():
            fn()
        assert all(torch.isfinite(t).all() for t in (dk, dv, dq)), (B, H, S, D, causal)
        t, _ = abba_ms(fns, bench)
        t_c = cudnn_backward_ms(q, k, v, do, causal, bench)
        # One S x S x D product is 2 S^2 D FLOPs a head, halved under causal: dK / dV runs 4 (S^T, dP^T, dV, dK),
        # dQ 3 (S, dP, dQ), cuDNN 5 (its own count: the fused backward).
        unit = 2 * B * H * S * S * D * (0.5 if causal else 1.0) / 1e9
        v6 = t["dkdv"] + t["dq"]
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | {t['dkdv']:.3f} ({4 * unit / t['dkdv']:.0f}) | "
              f"{t['dq']:.3f} ({3 * unit / t['dq']:.0f}) | {v6:.3f} | {t_c:.3f} ({5 * unit / t_c:.0f}) | "
              f"{t_c / v6:.3f}", flush=True)


if __name__ == "__main__":
    main()
