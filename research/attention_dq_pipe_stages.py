"""v6's dQ kernel with the pipe schedule at D 64 by ring depth (3, 4 stages) against the default (3 stages, no
pipe): the first A / B (attention_bwd_pipe_ab.py, H100) had pipe at 0.91-0.93x at D 64, where a key tile is short
and pipe hands K's stage back a tile later. Prediction: 4 stages recover it to 0.97-1.01x.
Run on the GPU: PYTHONPATH=src python3 research/attention_dq_pipe_stages.py
"""
import torch
import triton

from tilewise.ops.attention import gluon_bwd as gb

from _timing import abba_ms, v6_backward_inputs, warm_clocks


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=80, return_mode="median")


warm_clocks()
print(torch.cuda.get_device_name(), flush=True)
for B, H, Hkv, S, D, causal in [(4, 32, 8, 4096, 64, True), (4, 16, 16, 4096, 64, False), (4, 16, 16, 4096, 128, False)]:
    q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D)
    dq = torch.empty_like(q)
    cfgs = {"base": (64, 3, 240), "pipe3": (64, 3, 240, 0, 1), "pipe4": (64, 4, 240, 0, 1), "base4": (64, 4, 240)}
    t, _ = abba_ms({n: (lambda c=c: gb.dq(q, k, v, do, lse, delta, causal, scale, dq, config=c))
                    for n, c in cfgs.items()}, bench)
    print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | " + " ".join(f"{n} {x:.3f}" for n, x in t.items()), flush=True)
