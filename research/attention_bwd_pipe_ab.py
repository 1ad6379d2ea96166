"""v6's backward kernels with each tile's last products deferred into the next tile ("pipe", the 5th config
field), against the default schedule; same run, same inputs, gradients compared bit for bit.

Why (issue 30, forward + backward >= 1.0x cuDNN): Nsight Compute put v6's tensor pipe at 58 % (dK / dV) and 63 %
(dQ) busy at D 64, 82 % / 85 % at D 128 (H100; docs/tuning/attention.md, "The backward under Nsight Compute").
Each consumer drains its products at every tile's end (``warpgroup_mma_wait(0)``), so while it computes a tile's
exponentials nothing of its own is queued on the tensor cores: only the other consumer's products fill the gap.
With pipe, tile j issues S_j and dP_j, then tile j-1's dV and dK (dQ kernel: dQ), and computes its exponentials
while those run; the stage of tile j-1 goes back after them (so pipe takes 3 stages). Nothing is in flight across
a loop's back edge (a first try that left dV / dK in flight made ptxas serialize every wgmma of the kernel). SASS
(Triton 3.6): spill-free at D 64 (both kernels) and D 128 (dQ); dK / dV at D 128 spills ~500 instructions, so it
is not timed there.

Prediction (2026-12-07, before a run; H100): dK / dV at D 64 1.04-1.10x, dQ 1.04-1.08x at D 64 and 1.02-1.05x at
D 128; the Llama 4 x 4096 backward 1.850 -> ~1.75 ms (cuDNN 1.873); gradients bitwise equal. "dkdv3" times the
default schedule with 3 stages, so a gain of pipe is not read as the third stage's.
Run on the GPU (~2 minutes): PYTHONPATH=src python3 research/attention_bwd_pipe_ab.py
"""

from __future__ import annotations

import torch
import triton

from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_bwd as gb

from _timing import abba_ms, cudnn_backward_ms, v6_backward_inputs, warm_clocks

# (B, H, Hkv, S, D, causal): the Llama-3.2-1B shapes first, then issue 30's grid points at D 64 / 128.
SHAPES = [(4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True), (4, 16, 16, 4096, 64, False),
          (8, 16, 16, 2048, 64, True), (4, 16, 16, 4096, 128, False), (2, 32, 8, 8192, 128, True),
          (8, 16, 16, 2048, 128, False)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=80, return_mode="median")


def grads(q, k, v, do, lse, delta, causal, scale, dkdv_cfg, dq_cfg):
    dk, dv, dq = (torch.full_like(t, float("nan")) for t in (k, v, q))
    gb.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv, config=dkdv_cfg)
    gb.dq(q, k, v, do, lse, delta, causal, scale, dq, config=dq_cfg)
    return dk, dv, dq


def main():
    warm_clocks()
    print(f"{torch.cuda.get_device_name()}: B H/Hkv S D causal | dK/dV base -> pipe ms (x) [3 stages] | "
          "dQ base -> pipe (x) | v6 backward base -> pipe | cuDNN backward (x pipe) | bitwise", flush=True)
    for B, H, Hkv, S, D, causal in SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D + causal)
        kv_base = C.ws_bwd_dkdv_config(D)
        q_base = C.ws_bwd_dq_config(D)
        kv_pipe = (kv_base[0], 3, kv_base[2], 0, 1) if D == 64 else kv_base
        q_pipe = (q_base[0], max(q_base[1], 3), q_base[2], 0, 1)
        a = grads(q, k, v, do, lse, delta, causal, scale, kv_base, q_base)
        b = grads(q, k, v, do, lse, delta, causal, scale, kv_pipe, q_pipe)
        same = all(torch.equal(x, y) for x, y in zip(a, b))
        assert all(torch.isfinite(t).all() for t in b), (B, H, S, D, causal)
        dk, dv, dq = b

        def kv(cfg):
            return lambda: gb.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv, config=cfg)

        def qq(cfg):
            return lambda: gb.dq(q, k, v, do, lse, delta, causal, scale, dq, config=cfg)

        fns = {"dkdv": kv(kv_base), "dkdv_pipe": kv(kv_pipe), "dq": qq(q_base), "dq_pipe": qq(q_pipe)}
        if D == 64:
            fns["dkdv3"] = kv((kv_base[0], 3, kv_base[2]))
        t, _ = abba_ms(fns, bench)
        t_c = cudnn_backward_ms(q, k, v, do, causal, bench)
        base, pipe = t["dkdv"] + t["dq"], t["dkdv_pipe"] + t["dq_pipe"]
        three = f" [{t['dkdv3']:.3f}]" if "dkdv3" in t else ""
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | {t['dkdv']:.3f} -> {t['dkdv_pipe']:.3f} "
              f"({t['dkdv'] / t['dkdv_pipe']:.3f}x){three} | {t['dq']:.3f} -> {t['dq_pipe']:.3f} "
              f"({t['dq'] / t['dq_pipe']:.3f}x) | {base:.3f} -> {pipe:.3f} | {t_c:.3f} ({t_c / pipe:.3f}x) | {same}",
              flush=True)


if __name__ == "__main__":
    main()
