"""v6's dQ kernel at head dim 64 with three consumer warpgroups (192 query rows a CTA, the 6th field of
``ws_bwd_dq_config``), with and without the pipe schedule, against the default's two; same run, same inputs, dQ
compared bit for bit.

Why: the dQ kernel's tensor pipe was 63 % busy at D 64 (H100, docs/tuning/attention.md, "The backward under Nsight
Compute"), and each key tile there is small (three 64 x 64 x 64 products a consumer), so the per-tile waits and
barriers weigh most. Three consumers put a third instruction stream on the SM beside the loader, and each K / V
tile loaded serves 192 query rows instead of 128. The forward's D 64 route gained from the same move (v5's three
consumers, `configs.WS_THREE`). At D 64 a dQ consumer needs ~130 registers, so 160 fit: the sm_90 builds are
spill-free under Triton 3.6 and 3.9 (plain, causal, band; with pipe too); at D 128 they spill, so D 64 only.

Prediction (2026-12-07, before a run; H100): three consumers 1.03-1.08x two at D 64 (dQ alone), bitwise equal; with
pipe and the fp32 carry (research/patches/dq-pipe-fp32-carry.patch) and 4 stages, within 2 % of three without it.
Run on the GPU (~1 minute): PYTHONPATH=src python3 research/attention_dq_three_ab.py
"""

from __future__ import annotations

import torch
import triton

from tilewise.ops.attention import gluon_bwd as gb

from _timing import abba_ms, v6_backward_inputs, warm_clocks

# (B, H, Hkv, S, D, causal): the Llama-3.2-1B shapes, then issue 30's D 64 grid points.
SHAPES = [(4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True), (4, 16, 16, 4096, 64, False),
          (8, 16, 16, 2048, 64, True), (16, 16, 16, 1024, 64, False), (2, 16, 16, 8192, 64, False)]
CONFIGS = {"two": (64, 3, 240), "three": (64, 3, 160, 0, 0, 3), "three168": (64, 3, 168, 0, 0, 3),
           "three_pipe": (64, 4, 160, 0, 1, 3)}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=80, return_mode="median")


def main():
    warm_clocks()
    print(f"{torch.cuda.get_device_name()}: B H/Hkv S D causal | dQ ms: " + " / ".join(CONFIGS)
          + " | x two | bitwise", flush=True)
    for B, H, Hkv, S, D, causal in SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D + causal)
        outs = {n: torch.full_like(q, float("nan")) for n in CONFIGS}
        calls = {n: (lambda n=n, c=c: gb.dq(q, k, v, do, lse, delta, causal, scale, outs[n], config=c))
                 for n, c in CONFIGS.items()}
        for fn in calls.values():
            fn()
        same = all(torch.equal(outs["two"], o) for o in outs.values())
        t, _ = abba_ms(calls, bench)
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | " + " / ".join(f"{t[n]:.3f}" for n in CONFIGS)
              + " | " + " / ".join(f"{t['two'] / t[n]:.3f}" for n in CONFIGS) + f" | {same}", flush=True)


if __name__ == "__main__":
    main()
