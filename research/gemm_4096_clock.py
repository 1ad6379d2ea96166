"""4096^3 bf16, gemm() against cuBLAS, graph-replayed in interleaved rounds, on a cool GPU (the first
thing the process times) and again after ~20 s of sustained load; every sample printed, cuBLAS's
kernel names from the profiler in both phases. Run beside `nvidia-smi -lms 100` for the SM clock.

Why: the bench's 4096^2 bf16 graph row (its squares section, the first it times) measured 0.938 and
0.943 in two of six runs, 1.01 in the others; in the run with 0.938 ours took 195 us in both the
squares and the sweep section, cuBLAS 183 us in the squares section and 214 us in the sweep.
Prediction, written before the run: either cuBLAS runs a different kernel in the cool phase (the
profiler names differ), or the same kernel gains more than ours from the higher clock of a cool GPU
(names equal, the cool phase's ratio under 0.95 and the warm phase's near 1.0).
Run on the GPU: PYTHONPATH=src python3 research/gemm_4096_clock.py
"""
import statistics
import time

import torch

from tilewise.bench.harness import graph_of, replay_ms
from tilewise.ops.gemm import api as gt

CALLS = 20


def phase(label, fns):
    graphs = {k: graph_of(f, CALLS) for k, f in fns.items()}
    samples = {k: [] for k in graphs}
    t0 = time.time()
    for _ in range(7):
        for k, g in graphs.items():
            samples[k].extend(replay_ms(g, CALLS) * 1e3 for _ in range(3))
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{label} ({time.time() - t0:.1f} s): " + ", ".join(f"{k} {m:.1f} us" for k, m in med.items())
          + f"; ratio cublas/ours {med['cublas'] / med['gemm']:.3f}", flush=True)
    for k, v in samples.items():
        print(f"  {k}: " + " ".join(f"{x:.0f}" for x in v), flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for f in fns.values():
            f()
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print("  kernels: " + " | ".join(n[:90] for n in names), flush=True)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 4096, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", generator=g).to(torch.bfloat16)
    out = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    gt.gemm(a, b, out=out)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    fns = {"cublas": lambda: torch.matmul(a, b, out=out), "gemm": lambda: gt.gemm(a, b, out=out)}
    phase("cool", fns)
    phase("cool, ours first", {"gemm": fns["gemm"], "cublas": fns["cublas"]})
    t0 = time.time()
    while time.time() - t0 < 20:
        for _ in range(50):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize()
    phase("warm", fns)
    phase("warm, ours first", {"gemm": fns["gemm"], "cublas": fns["cublas"]})


if __name__ == "__main__":
    main()
