"""Where does the GPU wait in a Llama training step, tilewise against Liger-Kernel (issue 31)?

The llama bench's profile (`bench/results/logs/bench-llama-profile-699a416.log`, H200) gave, at 4 x 4096,
hf_tilewise 239.6 ms of kernels in a 250.1 ms step and hf_liger 257.7 in 264.5: 10.5 ms of idle stream a step
against Liger's 6.8 (at 1 x 16384: 6.0 against 7.4). The step is timed between two events on the stream with
nothing else running, so whatever the kernels do not fill is the GPU waiting: for the host to launch (a
synchronizing call, Python or launch overhead outrunning short kernels) or for a copy. 3.7 ms is 1.5 % of the
step, most of what 1.05x lacks there (250.1 -> 247.7 ms against Liger's 260.1 at 58b9c21).

Per candidate: the bench's model, batches and optimizer (``bench.suites.llama``), warm-up steps, then STEPS
steps under torch.profiler (CPU and CUDA); from its trace: the stream's idle time a step, and each gap of at
least --min-gap-us between kernels, classified by when the next kernel was launched (``launch-late``: its
cudaLaunchKernel / cuLaunchKernel came after the previous kernel ended, the host was behind; else ``queued``)
and named by the innermost CPU op around that launch and the synchronizing runtime calls inside the gap.
Prints the idle by cause and the largest gaps.
Prediction (2026-12-05, before any run): the extra idle is host-side, launch-late gaps in the forward of each
layer's short kernels (RMSNorm, RoPE, SwiGLU through Triton's launcher) or a synchronizing call of the fused
loss; fewer than 10 gaps over 100 us a step.
Run on the GPU (~2 minutes; Liger needs its wheel: `. scripts/_wheels.sh`):
    PYTHONPATH=src:$PYTHONPATH python3 research/llama_step_gaps.py [--shape 4x4096] [--candidates hf_tilewise,hf_liger]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import tempfile
from collections import Counter

import torch

from tilewise.bench.suites import llama as L

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync",
         "cudaFree", "cudaMalloc", "cudaHostAlloc", "cudaStreamWaitEvent", "cuMemFree", "cuMemAlloc")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaMemsetAsync",
            "cudaMemcpyAsync")


def trace_of(name, config, state, batches, warmup, steps):
    """The chrome trace (dict) of ``steps`` steps of candidate ``name``, after ``warmup`` steps."""
    from torch.profiler import ProfilerActivity, profile

    snap = L._snapshot()
    try:
        _, step_model, opt = L._build(name, config, state)
        for i in range(warmup):
            L._step(step_model, opt, batches[i % 2])
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(steps):
                L._step(step_model, opt, batches[i % 2])
            torch.cuda.synchronize()
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
        os.remove(path)
        return trace
    finally:
        L._restore(snap)
        torch.cuda.empty_cache()


def innermost(ops, starts, t):
    """The innermost CPU op whose range holds time t (ops sorted by start: the latest-starting one that holds
    it, looking back at most 400 ops), or None."""
    i = bisect.bisect_right(starts, t)
    for o in reversed(ops[max(0, i - 400):i]):
        if t <= o["ts"] + o.get("dur", 0):
            return o
    return None


def gaps(trace, steps, min_gap_us, top):
    ev = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    runtime = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launch_of = {e["args"].get("correlation"): e for e in runtime if e.get("name") in LAUNCHES and "args" in e}
    syncs = sorted((e for e in runtime if e.get("name") in SYNCS), key=lambda e: e["ts"])
    sync_ts = [e["ts"] for e in syncs]
    ops = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")),
                 key=lambda e: e["ts"])
    starts = [o["ts"] for o in ops]
    if not kernels:
        raise SystemExit("no kernels in the trace")
    busy, end = 0.0, kernels[0]["ts"]
    found, by_cause = [], Counter()
    prev = None
    for k in kernels:
        kend = k["ts"] + k.get("dur", 0)
        if prev is not None and k["ts"] - end >= min_gap_us:
            gap = k["ts"] - end
            launch = launch_of.get(k.get("args", {}).get("correlation"))
            late = launch is not None and launch["ts"] >= end - 1.0
            op = innermost(ops, starts, launch["ts"]) if launch is not None else None
            lo, hi = bisect.bisect_left(sync_ts, prev["ts"]), bisect.bisect_right(sync_ts, k["ts"])
            sync_names = sorted({s["name"] for s in syncs[lo:hi]})
            cause = ("launch-late" if late else "queued") + (" after " + "/".join(sync_names) if sync_names else "")
            where = op["name"] if op is not None else "?"
            by_cause[(cause, where)] += gap
            found.append((gap, cause, where, prev["name"], k["name"]))
        busy += max(0.0, kend - max(k["ts"], end))  # the union of the kernels' intervals
        end = max(end, kend)
        prev = k
    span = end - kernels[0]["ts"]
    print(f"   {len(kernels) / steps:.0f} kernels a step; span {span / steps / 1e3:.2f} ms a step, busy "
          f"{busy / steps / 1e3:.2f}, idle {(span - busy) / steps / 1e3:.2f} ms a step; gaps >= {min_gap_us} us: "
          f"{len(found) / steps:.1f} a step, {sum(g[0] for g in found) / steps / 1e3:.2f} ms a step")
    print("   idle in those gaps by cause and the CPU op that launched the next kernel (ms a step):")
    for (cause, where), us in by_cause.most_common(12):
        print(f"     {us / steps / 1e3:7.3f}  {cause:40s} {where[:80]}")
    print(f"   the {top} largest gaps (us; cause; launching op; kernel before -> kernel after):")
    for gap, cause, where, before, after in sorted(found, reverse=True)[:top]:
        print(f"     {gap:8.1f}  {cause:28s} {where[:40]:40s} {before[:40]} -> {after[:40]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4x4096", help="B x S (4x4096 or 1x16384 in the bench)")
    p.add_argument("--candidates", default="hf_tilewise,hf_liger")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--min-gap-us", type=float, default=20.0)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    B, S = (int(x) for x in a.shape.lower().split("x"))
    config, state, batches = L.inputs(B, S)
    print(f"{torch.cuda.get_device_name()}; llama {B} x {S}; torch {torch.__version__}", flush=True)
    for name in a.candidates.split(","):
        print(f"== {name}", flush=True)
        gaps(trace_of(name, config, state, batches, a.warmup, a.steps), a.steps, a.min_gap_us, a.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
