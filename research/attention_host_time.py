"""Host time against device time of one forward + backward (bf16, H = 16, B * S = 16384), for the
short causal shapes where the grid (e79d096) timed v6's backward well above its kernels alone
(D = 128 S = 1024 causal: fwd + bwd 1.1-1.37 ms; dK / dV 0.375 ms + dQ 0.24 ms alone, forward
~0.22): is the call host-bound? Host: wall time to enqueue 50 calls (no sync inside; the launch
queue holds them); device: CUDA events around the same 50, after a sync. Paths: flash_attention's
default, v3's forward and backward (policy forward "pointer", backward "two_kernel"), v5's forward
with v3's backward, v5 with v6.
Run on the GPU: PYTHONPATH=src python3 research/attention_host_time.py
"""

import time

import torch

from tilewise.ops.attention import api as A

# Each path's changes to the call's default policy (None: no policy passed, flash_attention's default).
PATHS = {"default": None,
         "v3+v3": dict(forward="pointer", backward="two_kernel"),
         "v5+v3": dict(forward="ws", backward="two_kernel"),
         "v5+v6": dict(forward="ws", backward="ws")}


def main():
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for D, S, causal in ((128, 1024, True), (128, 1024, False), (64, 2048, True), (64, 1024, True), (128, 4096, True)):
        B = 16384 // S
        q, k, v = (torch.randn(B, 16, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
                   for _ in range(3))
        go = torch.randn(B, 16, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        parts = []
        for name, changes in PATHS.items():
            # The policy is built once, outside the timed calls.
            policy = None if changes is None else A.default_policy(q, k, causal=causal).replace(**changes)

            def step():
                return torch.autograd.grad(A.flash_attention(q, k, v, causal=causal, policy=policy), (q, k, v), go)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            best = None
            for _ in range(3):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                t0 = time.perf_counter()
                for _ in range(50):
                    step()
                host = (time.perf_counter() - t0) / 50 * 1e3
                e1.record()
                torch.cuda.synchronize()
                dev = e0.elapsed_time(e1) / 50
                best = min(best or (1e9, 1e9), (dev, host))
            parts.append(f"{name} device {best[0]:6.3f} host {best[1]:6.3f} ms")
        print(f"D={D:3d} S={S:5d} {'causal' if causal else 'plain ':6s}: " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
