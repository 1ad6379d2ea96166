"""Where the attention time goes, kernel by kernel, beside cuDNN's: bf16, B=4 H=16 S=4096, D 128 and
64, non-causal, for the forward (v5 and cuDNN) and the backward alone (our two-kernel deterministic
backward, the fused atomic one, cuDNN's), from torch.profiler's CUDA kernel times (median of 10
calls per kernel). With --ncu: one call a case, no profiler of its own, for Nsight Compute with a
kernel-name filter (NVTX ranges would miss the backward: autograd runs it on its own thread), e.g.
ncu --clock-control none --kernel-name regex:"attn_fwd_ws|fprop|attn_bwd|bprop" --section ... python3 <this> --ncu
Run on the GPU: PYTHONPATH=src python3 research/attention_kernel_profile.py [--ncu]
"""

import statistics
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from tilewise.ops.attention import api as A


def cases(D):
    B, H, S = 4, 16, 4096
    g = torch.Generator(device="cuda").manual_seed(D)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
               for _ in range(3))
    go = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    def ours(q, k, v):
        return A.flash_attention(q, k, v)  # v5 forward where the rules say (here: yes)

    def ours_atomic(q, k, v):
        return A.flash_attention(q, k, v, deterministic=False)

    outs = {name: fn(q, k, v) for name, fn in (("ours", ours), ("atomic", ours_atomic), ("cudnn", cudnn))}
    flops = 4 * B * H * S * S * D
    return {
        f"D{D} fwd ours (v5)": (lambda: ours(q, k, v), flops),
        f"D{D} fwd cudnn": (lambda: cudnn(q, k, v), flops),
        f"D{D} bwd ours (two-kernel)": (lambda: torch.autograd.grad(outs["ours"], (q, k, v), go, retain_graph=True),
                                        2.5 * flops),
        f"D{D} bwd ours (atomic)": (lambda: torch.autograd.grad(outs["atomic"], (q, k, v), go, retain_graph=True),
                                    2.5 * flops),
        f"D{D} bwd cudnn": (lambda: torch.autograd.grad(outs["cudnn"], (q, k, v), go, retain_graph=True),
                            2.5 * flops),
    }


def kernel_table(name, fn, flops):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    times = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name].append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
    rows = sorted(((statistics.median(ts), len(ts) // 10, n) for n, ts in times.items()), reverse=True)
    total = sum(t * c for t, c, _ in rows)
    print(f"{name}: {total:8.1f} us a call ({flops / total / 1e6:6.1f} TFLOP/s counted)", flush=True)
    for t, c, n in rows:
        print(f"    {t:8.1f} us x{c}  {n[:110]}")


def main():
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):  # clocks up
        x @ x
    ncu = "--ncu" in sys.argv
    for D in (128, 64):
        for name, (fn, flops) in cases(D).items():
            if ncu:  # one call a case, its kernels in this order (the name printed first)
                print(f"ncu case: {name}", flush=True)
                fn()
                torch.cuda.synchronize()
            else:
                kernel_table(name, fn, flops)


if __name__ == "__main__":
    main()
