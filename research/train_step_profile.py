"""Where does one graph-replayed training step spend its device time? The quick bench measured
the tilewise graph step at 444 us against PyTorch's 374 us with fewer kernels (57 vs 88), so a
few kernels must be slow. Prints the profiler's kernel table (device time per step) for both.
Run on the GPU: PYTHONPATH=src python3 research/train_step_profile.py
"""

import torch
from torch.profiler import ProfilerActivity, profile

from tilewise.sst2 import step_bench

batches = step_bench.synthetic_batches(4, device="cuda")
for backend in ("torch", "tilewise"):
    model, opt = step_bench.step_model(backend, "graph", dropout=0.0)
    step = step_bench.build_step(model, opt, "graph", batch_size=64, seq_len=64, device="cuda")
    for b in batches:
        step(b)
    torch.cuda.synchronize()
    steps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(batches[i % 4])
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += e.time_range.elapsed_us()
    total = sum(v[1] for v in rows.values()) / steps
    print(f"== {backend} graph step: {total:.1f} us of kernels per step, {sum(v[0] for v in rows.values()) / steps:.0f} ops")
    for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:22]:
        print(f"  {us / steps:8.1f} us  x{n / steps:4.1f}  {name[:150]}")
