"""Does sustained load (power and clocks) move our attention against cuDNN's where single profiled calls
disagree with the bench?

Why: `attention_cudnn_bwd_kernels.py --forward` (H100, d66fbda, 2026-12-07) profiled single forward calls at
D 128 without causal, where the grid (0d2c241) puts ours at 0.945-0.988x cuDNN: our one kernel took
414 / 801 / 3108 / 1578 us against cuDNN's 416 / 808 / 3175 / 1594 (1.00-1.02x). In the Llama step the
attention group is ~1 ms a layer over the same call timed alone (both libraries). Either the bench's
back-to-back calls run at a lower SM clock for ours (more power a FLOP), or something else in the call.

What it does: per shape, ours and cuDNN's in A B A B phases. A "short" phase: 0.5 s idle, then 6 calls
back to back, the median of the last 5 (event timed). A "sustained" phase: back-to-back calls for SECONDS,
the median of the last 40, beside `nvidia-smi` sampled every 50 ms (SM clock, power) over the phase.
Forward only at D 128 without causal; forward + backward at the Llama's D 64 causal.

Prediction (before a run): short-phase ratios 1.00-1.02x (as profiled); sustained 0.95-0.99x with our phases'
mean SM clock 2-4 % under cuDNN's at the same power cap (power-limited, ~700 W).
Run on the GPU (~60 s): PYTHONPATH=src python3 research/attention_sustained_clock.py [--llama]
(--llama, added after the first run: the Llama step's two attention shapes, ours / cuDNN / hybrid. Prediction:
at 1 x 16384 sustained, ours 0.2 ms a call under the hybrid, as ours 9.04 against cuDNN's 9.52 implies.)
"""

from __future__ import annotations

import datetime
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention.api import default_policy, flash_attention

SECONDS = 3.0
# (B, H, Hkv, S, D, causal, backward)
SHAPES = [(1, 16, 16, 16384, 128, False, False), (4, 32, 8, 4096, 128, False, False),
          (8, 16, 16, 2048, 128, False, False), (1, 32, 8, 16384, 64, True, True)]
# `--llama`: the Llama-3.2-1B step's attention calls, with the hybrid route (our forward, cuDNN's backward: what
# tilewise_auto runs at S 16384 by SDPA_RULES) as a third candidate.
LLAMA = [(1, 32, 8, 16384, 64, True, True), (4, 32, 8, 4096, 64, True, True)]


def calls(fn, n: int) -> list:
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in ev]


def sustained(fn) -> tuple:
    t0 = time.time()
    while time.time() - t0 < SECONDS - 0.3:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    ms = statistics.median(calls(fn, 40))
    return ms, t0, time.time()


def smi_samples(path: str) -> list:
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return out


def main():
    print(torch.cuda.get_device_name(), flush=True)
    log = "/tmp/attention_sustained_smi.csv"
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=open(log, "w"), stderr=subprocess.DEVNULL)
    windows = []
    try:
        llama = "--llama" in sys.argv
        for B, H, Hkv, S, D, causal, bwd in (LLAMA if llama else SHAPES):
            g = torch.Generator(device="cuda").manual_seed(S + D)
            q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=bwd)
            k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=bwd)
                    for _ in range(2))
            do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H)
                if bwd:
                    torch.autograd.grad(o, (q, k, v), do)

            def ours():
                o = flash_attention(q, k, v, causal=causal)
                if bwd:
                    torch.autograd.grad(o, (q, k, v), do)

            def hybrid():
                o = flash_attention(q, k, v, causal=causal, deterministic=False, policy=hybrid_policy)
                torch.autograd.grad(o, (q, k, v), do)

            fns = {"ours": ours, "cudnn": cudnn}
            if llama:
                hybrid_policy = default_policy(q, k, causal=causal, deterministic=False).replace(backward="cudnn")
                fns["hybrid"] = hybrid
            with torch.set_grad_enabled(bwd):
                for f in fns.values():
                    f()
                torch.cuda.synchronize()
                res = {n: {"short": [], "sustained": []} for n in fns}
                for n in list(fns) + list(fns)[::-1]:
                    time.sleep(0.5)
                    res[n]["short"].append(statistics.median(calls(fns[n], 6)[1:]))
                    ms, t0, t1 = sustained(fns[n])
                    res[n]["sustained"].append(ms)
                    windows.append((f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} bwd={bwd}", n, t0 + 1.0, t1))
            label = f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} {'fwd+bwd' if bwd else 'fwd'}"
            for phase in ("short", "sustained"):
                c = statistics.mean(res["cudnn"][phase])
                print(f"{label} {phase:9s}: " + ", ".join(
                    f"{n} {' '.join(f'{x:.3f}' for x in r[phase])} ms (x cuDNN {c / statistics.mean(r[phase]):.3f})"
                    for n, r in res.items()), flush=True)
    finally:
        time.sleep(0.2)
        smi.terminate()
        smi.wait()
    samples = smi_samples(log)
    print(f"\nnvidia-smi samples: {len(samples)} (SM clock MHz, power W: means over each sustained phase "
          "after its first second)")
    for label, n, t0, t1 in windows:
        s = [(c, p) for t, c, p in samples if t0 <= t <= t1]
        if s:
            print(f"  {label} {n:5s}: clock {statistics.mean(c for c, _ in s):7.1f} MHz  power "
                  f"{statistics.mean(p for _, p in s):6.1f} W  ({len(s)} samples)")
        else:
            print(f"  {label} {n:5s}: no samples")


if __name__ == "__main__":
    main()
