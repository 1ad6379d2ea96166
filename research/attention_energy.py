"""Energy a call of the Llama step's attention (ours, the hybrid, cuDNN's), and what each does to the GEMMs
around it.

Why: `attention_sustained_clock.py --llama` (H100, d66fbda) ran our whole D 64 causal call 40-80 MHz under
cuDNN's at the 700 W cap and still 5-6 % faster a call, but in the Llama step our own backward left the attention
group even (-0.4 ms a step) and the GEMMs 3.8 ms slower (`llama-step-profile-16k-own-attn-d66fbda*.log`). If the
step is power-bound throughout, what a kernel costs the step is its energy, not its time.

What it does, at the Llama's two attention shapes (B 1 H 32 / 8 S 16384 and B 4 H 32 / 8 S 4096, D 64, causal):
A. each route alone for SECONDS of back-to-back forward + backward calls, A B C C B A: ms a call (events, the last
   40) and joules a call from NVML's energy counter over those calls (pynvml: carry the nvidia-ml-py wheel in
   .whl/; without it, nvidia-smi's power sampled every 50 ms times the time).
B. the same with a step's neighbours: each iteration three bf16 GEMMs of the MLP's shapes (16384 x 2048 x 8192 and
   back) then one attention call, events around the GEMMs and around the attention apart: the GEMMs' ms next to
   each route, and the iteration's.

Prediction (before a run): A: ours 5-7 % less energy a call than cuDNN's at 1 x 16384 (6.29 against 6.69 J by the
sampled power); B: the GEMMs 1-3 % slower next to our backward than next to cuDNN's, the iteration within 1 %
between ours and the hybrid (as in the step).
Run on the GPU (~70 s): PYTHONPATH=src:/tmp/site python3 research/attention_energy.py (after `. scripts/_wheels.sh`)
"""

from __future__ import annotations

import statistics
import subprocess
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention.api import default_policy, flash_attention

SECONDS = 2.5
SHAPES = [(1, 32, 8, 16384, 64), (4, 32, 8, 4096, 64)]


class Energy:
    """Joules between two reads: NVML's counter where pynvml imports, else nvidia-smi's power x wall time."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self.nvml = pynvml
            self.how = "NVML energy counter"
        except Exception:  # noqa: BLE001 - no pynvml, or no counter: the sampled fallback says so
            self.nvml = None
            self.how = "nvidia-smi power x time"

    def _power(self) -> float:
        out = subprocess.run(["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits", "-i",
                              str(torch.cuda.current_device())], capture_output=True, text=True).stdout
        return float(out.strip().splitlines()[0])

    def begin(self) -> None:
        self.t0 = time.time()
        self.e0 = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.h) / 1e3 if self.nvml else self._power()

    def end(self) -> float:
        """Joules since ``begin`` (the fallback: the mean of two power reads times the wall time)."""
        dt = time.time() - self.t0
        if self.nvml is not None:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.h) / 1e3 - self.e0
        return (self.e0 + self._power()) / 2 * dt


def routes(q, k, v, do):
    hybrid = default_policy(q, k, causal=True, deterministic=False).replace(backward="cudnn")

    def ours():
        torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)

    def hyb():
        torch.autograd.grad(flash_attention(q, k, v, causal=True, deterministic=False, policy=hybrid), (q, k, v), do)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.autograd.grad(o, (q, k, v), do)

    return {"ours": ours, "hybrid": hyb, "cudnn": cudnn}


def alone(fn, energy):
    t0 = time.time()
    while time.time() - t0 < SECONDS - 0.5:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(40)]
    energy.begin()
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    joules = energy.end() / len(ev)
    return statistics.median(a.elapsed_time(b) for a, b in ev), joules


def with_gemms(fn, x, w_up, w_down):
    def gemms():
        h = x @ w_up
        return h @ w_down, x @ w_up

    t0 = time.time()
    while time.time() - t0 < SECONDS - 0.5:
        gemms()
        fn()
        torch.cuda.synchronize()
    marks = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(20)]
    for a, b, c in marks:
        a.record()
        gemms()
        b.record()
        fn()
        c.record()
    torch.cuda.synchronize()
    g = statistics.median(a.elapsed_time(b) for a, b, _ in marks)
    t = statistics.median(b.elapsed_time(c) for _, b, c in marks)
    return g, t


def main():
    print(torch.cuda.get_device_name(), flush=True)
    energy = Energy()
    print(f"energy from: {energy.how}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)
    w_up = torch.randn(2048, 8192, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    w_down = torch.randn(8192, 2048, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    for B, H, Hkv, S, D in SHAPES:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
                for _ in range(2))
        do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        fns = routes(q, k, v, do)
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        order = list(fns) + list(fns)[::-1]
        a_res = {n: [] for n in fns}
        for n in order:
            a_res[n].append(alone(fns[n], energy))
        b_res = {n: [] for n in fns}
        for n in order:
            b_res[n].append(with_gemms(fns[n], x, w_up, w_down))
        label = f"B{B} H{H}/{Hkv} S{S} D{D} causal fwd+bwd"
        for n in fns:
            ms = statistics.mean(m for m, _ in a_res[n])
            j = statistics.mean(e for _, e in a_res[n])
            gm = statistics.mean(g for g, _ in b_res[n])
            tm = statistics.mean(t for _, t in b_res[n])
            print(f"{label} {n:6s}: alone {ms:.3f} ms, {j:.3f} J a call ({j / ms * 1e3:.0f} W); beside GEMMs: GEMMs "
                  f"{gm:.3f} ms, attention {tm:.3f} ms, iteration {gm + tm:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
