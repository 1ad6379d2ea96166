"""v6's dQ kernel with the pipe schedule at D 64 by ring depth (3, 4 stages) against the default (3 stages, no
pipe): the first A / B (attention_bwd_pipe_ab.py, H100) had pipe at 0.91-0.93x at D 64, where a key tile is short
and pipe hands K's stage back a tile later. Prediction: 4 stages recover it to 0.97-1.01x.
Run on the GPU: PYTHONPATH=src python3 research/attention_dq_pipe_stages.py [d64 | d128]
"""
import torch
import triton

from tilewise.ops.attention import gluon_bwd as gb

from _timing import abba_ms, v6_backward_inputs, warm_clocks


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=80, return_mode="median")


warm_clocks()
print(torch.cuda.get_device_name(), flush=True)
import sys
SETS = {"d64": [(4, 32, 8, 4096, 64, True), (4, 16, 16, 4096, 64, False), (4, 16, 16, 4096, 128, False)],
        "d128": [(4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True), (2, 32, 8, 8192, 128, True),
                 (8, 16, 16, 2048, 128, False), (1, 16, 16, 16384, 128, False), (16, 16, 16, 1024, 128, True)]}
for B, H, Hkv, S, D, causal in SETS[sys.argv[1] if len(sys.argv) > 1 else "d64"]:
    q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D)
    dq = torch.empty_like(q)
    cfgs = {"base": (64, 3, 240), "pipe3": (64, 3, 240, 0, 1), "pipe4": (64, 4, 240, 0, 1), "base4": (64, 4, 240)}
    t, _ = abba_ms({n: (lambda c=c: gb.dq(q, k, v, do, lse, delta, causal, scale, dq, config=c))
                    for n, c in cfgs.items()}, bench)
    print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | " + " ".join(f"{n} {x:.3f}" for n, x in t.items()), flush=True)
