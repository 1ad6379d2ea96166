"""v6's stationary tiles as register A operands, against shared-memory operands, same run, same kernels.

Why: a CTA of v6's dK / dV kernel keeps K and V for its whole life and a dQ CTA keeps Q and dO, yet S^T = K Q^T
and dP^T = V dO^T (dQ's kernel: S = Q K^T, dP = dO V^T) read both operands from shared memory every tile. An
m64 n64 k16 wgmma with both operands in shared memory reads 4 KB in the 32 cycles it takes at full rate, 128 B a
cycle: the whole of an SM's shared-memory bandwidth, before the TMA fills, dS stores and the other products' B
operands. With the stationary tile in registers the product reads 2 KB. Per consumer and tile, bytes read from
shared memory by the products: dQ kernel 80 -> 48 KB at D 128 (40 -> 24 KB at D 64); dK / dV kernel at D 64
48 -> 32 KB. At D 128, K and V in registers spill (Triton 3.6: 529-650 spill instructions against 200-345), so
there K alone (364-432; 96 -> 80 KB); the dQ kernel builds without spills at both head dims.

Prediction (before any GPU run): dQ kernel 5-10 % faster at D 64 and 128; dK / dV 3-8 % at D 64, 0-4 % at
D 128 (its extra spills may eat it); the Llama-shape backward (B 4 H 32 / 8 S 4096 D 64 causal) 1.955 -> ~1.85
ms against cuDNN's ~1.84. Results bitwise equal to the shared-memory operands' (the same products).

Needs research/patches/bwd-register-operands.patch applied. Each variant runs twice, alternating (A B A B), and
reports the median of its two do_bench medians.
Run on the GPU (~1-2 minutes): PYTHONPATH=src python3 research/attention_bwd_operands.py
"""

from __future__ import annotations

import statistics

import torch
import triton

from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_bwd as gb

from _timing import cudnn_backward_ms, v6_backward_inputs

# (B, H, Hkv, S, D, causal): the Llama-3.2-1B shapes first, then issue 30's D 128 grid points.
SHAPES = [(4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True), (4, 16, 16, 4096, 64, False),
          (4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True), (2, 32, 8, 8192, 128, True),
          (8, 16, 16, 2048, 128, True)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def configs_for(D):
    """(dK / dV config, dQ config) of each variant: the tables', register operands, and at D 64 register
    operands with dQ's key tiles of 128 (S and dP 64 registers each: spill-free with Q and dO in registers)."""
    bm, st = C.WS_BWD_DKDV_TILES[D]
    bn, st_q = C.WS_BWD_DQ_TILES[D]
    regs = C.WS_BWD_CONSUMER_REGS
    out = {"smem": ((bm, st, regs, 0), (bn, st_q, regs, 0)),
           "regs": ((bm, st, regs, 2 if D == 64 else 1), (bn, st_q, regs, 2))}
    if D == 64:
        out["regs_bn128"] = ((bm, st, regs, 2), (128, 2, regs, 2))
    return out


def main():
    print("B H/Hkv S D causal variant | dK/dV smem -> variant | dQ smem -> variant | sum | cuDNN backward | check",
          flush=True)
    for B, H, Hkv, S, D, causal in SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D + causal)
        variants = configs_for(D)
        grads, times = {}, {n: ([], []) for n in variants}
        for n, (ckv, cq) in variants.items():
            dk, dv, dq = (torch.full_like(t, float("nan")) for t in (k, v, q))
            gb.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv, config=ckv)
            gb.dq(q, k, v, do, lse, delta, causal, scale, dq, config=cq)
            grads[n] = (dq, dk, dv)
        for _ in range(2):  # A B A B
            for n, (ckv, cq) in variants.items():
                dq, dk, dv = grads[n]
                times[n][0].append(bench(lambda dk=dk, dv=dv, ckv=ckv: gb.dkdv(q, k, v, do, lse, delta, causal, scale,
                                                                             dk, dv, config=ckv)))
                times[n][1].append(bench(lambda dq=dq, cq=cq: gb.dq(q, k, v, do, lse, delta, causal, scale, dq,
                                                                    config=cq)))
        t_c = cudnn_backward_ms(q, k, v, do, causal, bench)
        a1, b1 = (statistics.median(x) for x in times["smem"])
        for n in list(variants)[1:]:
            same = all(torch.equal(a, b) for a, b in zip(grads["smem"], grads[n]))
            err = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                      for a, b in zip(grads[n], grads["smem"]))
            finite = all(torch.isfinite(t).all().item() for t in grads[n])
            a2, b2 = (statistics.median(x) for x in times[n])
            print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} {n} | {a1:.3f} -> {a2:.3f} ms ({a1 / a2:.3f}x) | "
                  f"{b1:.3f} -> {b2:.3f} ({b1 / b2:.3f}x) | {a1 + b1:.3f} -> {a2 + b2:.3f} | cuDNN {t_c:.3f} "
                  f"({t_c / (a2 + b2):.3f}x cuDNN) | {'bitwise equal' if same else f'differ: rel max {err:.1e}'}"
                  f"{'' if finite else ', NOT FINITE'}", flush=True)


if __name__ == "__main__":
    main()
