"""Where the host time of one eager tilewise training step goes (the bench's train_step model and
sizes, tilewise backend, eager mode): ms per step issued by the host against the device time, and
a cProfile of 30 steps sorted by own time.
Run on the GPU: PYTHONPATH=src python3 research/eager_step_profile.py [hidden]
"""

import cProfile
import pstats
import sys
import time

import torch

from tilewise.sst2 import step_bench
from tilewise.bench.suites import train_step as ts

hidden = int(sys.argv[1]) if len(sys.argv) > 1 else ts.H
dev = torch.device("cuda")
sizes = dict(vocab_size=ts.V, embed_dim=ts.E, hidden=hidden, num_classes=ts.C)
batches = step_bench.synthetic_batches(ts.N_BATCHES, ts.B, ts.T, ts.V, ts.C, device=dev)
for backend in ("torch", "tilewise"):
    model, opt = step_bench.step_model(backend, "eager", dropout=0.0, device=dev, **sizes)
    step = step_bench.build_step(model, opt, "eager", batch_size=ts.B, seq_len=ts.T, device=dev, keep_graph=True)
    for i in range(10):
        step(batches[i % len(batches)])
    torch.cuda.synchronize()
    ms, host = ts._time_steps(step, batches, 50, 5, dev)
    print(f"{backend:9s} eager step B={ts.B} T={ts.T} E={ts.E} H={hidden}: {ms:.3f} ms a step, host issues one "
          f"in {host:.3f} ms", flush=True)
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
for i in range(30):
    step(batches[i % len(batches)])
pr.disable()
torch.cuda.synchronize()
print(f"tilewise, 30 steps under cProfile: {(time.perf_counter() - t0) * 1e3 / 30:.2f} ms a step")
pstats.Stats(pr).sort_stats("tottime").print_stats(40)
