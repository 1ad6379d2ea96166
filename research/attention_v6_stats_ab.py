"""v6's dK / dV kernel with each query tile's LSE and Delta staged in shared memory by the loader warp, against
the kernel that loads them in each consumer (``query_stats``: a blocked load, then a layout conversion through
shared memory); and v6's dQ kernel releasing its K and V stages together (one warpgroup barrier a tile fewer)
against releasing V first; same run, same inputs.

Why (issue 30's profile, `bench/results/logs/attention-bwd-ncu-11b6ded/`, H100): the largest stall of both v6
kernels is "barrier" (5.0 cycles an issued instruction in dK / dV at D 128, cuDNN's 1.56). The sm_90 SASS (Triton
3.6) has five warpgroup BAR.SYNCs a query tile in dK / dV: two around each of the two conversions' shared-memory
round trips, one before the stage's release (Triton's mbarrier arrive is preceded by a partition barrier). With
the loader writing LSE and Delta next to Q and dO, the consumers read them after the stage's ready wait: two
BAR.SYNCs a tile (46 -> 28 in the kernel), spill instructions at D 128 200 -> 85, at D 64 none before or after.

Prediction (before the GPU run): dK / dV 3-8 % faster at D 128, 2-5 % at D 64; dQ 1-3 %; gradients bitwise equal
(the same values reach the same arithmetic).

The kernel before the change is loaded from BASE (default .ab/gluon_bwd_base.py: `git show
<commit>:src/tilewise/ops/attention/gluon_bwd.py > .ab/gluon_bwd_base.py`; .ab/ is git-ignored, carry it) as a
module of the attention package. Each variant twice, in the order A B B A, the median of its two medians.
Run on the GPU: PYTHONPATH=src python3 research/attention_v6_stats_ab.py [BASE]
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton

from tilewise.ops.attention import gluon_bwd as gb

from _timing import cudnn_backward_ms, load_attention_module, v6_backward_inputs, v6_grads, warm_clocks

# (B, H, Hkv, S, D, causal): the Llama-3.2-1B shapes, then issue 30's grid points at D 64 / 128.
SHAPES = [(4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True), (4, 16, 16, 4096, 64, False),
          (4, 16, 16, 4096, 64, True), (4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True),
          (2, 32, 8, 8192, 128, True), (8, 16, 16, 2048, 128, False), (1, 16, 16, 16384, 128, False)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    base = load_attention_module(sys.argv[1] if len(sys.argv) > 1 else ".ab/gluon_bwd_base.py", "gluon_bwd_base")
    warm_clocks()
    print(f"{torch.cuda.get_device_name()}: B H/Hkv S D causal | dK/dV base -> staged ms (x) | "
          "dQ base -> new ms (x) | v6 backward base -> new | cuDNN backward (x new) | bitwise", flush=True)
    for B, H, Hkv, S, D, causal in SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D + causal)
        mods = {"base": base, "staged": gb}
        grads = v6_grads(mods, q, k, v, do, lse, delta, causal, scale)
        same = all(torch.equal(a, b) for a, b in zip(grads["base"], grads["staged"]))
        err = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                  for a, b in zip(grads["staged"], grads["base"]))
        assert err < 1e-2 and all(torch.isfinite(t).all() for t in grads["staged"]), (B, H, S, D, causal, err)
        times = {n: ([], []) for n in mods}
        for r in range(2):  # A B B A: a drift within a round (clocks, heat) falls on both
            for n, m in (list(mods.items()) if r == 0 else list(mods.items())[::-1]):
                dk, dv, dq = grads[n]
                times[n][0].append(bench(lambda m=m, dk=dk, dv=dv: m.dkdv(q, k, v, do, lse, delta, causal, scale,
                                                                          dk, dv)))
                times[n][1].append(bench(lambda m=m, dq=dq: m.dq(q, k, v, do, lse, delta, causal, scale, dq)))
        t_c = cudnn_backward_ms(q, k, v, do, causal, bench)
        (a, a_q), (b, b_q) = ((statistics.median(x) for x in times[n]) for n in mods)
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | {a:.3f} -> {b:.3f} ({a / b:.3f}x) | "
              f"{a_q:.3f} -> {b_q:.3f} ({a_q / b_q:.3f}x) | {a + a_q:.3f} -> {b + b_q:.3f} | "
              f"{t_c:.3f} ({t_c / (b + b_q):.3f}x) | {same} (err {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
