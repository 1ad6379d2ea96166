"""Where does cross_entropy's peak extra memory come from? (tests/test_cross_entropy.py's
test_gpu_peak_memory_is_the_gradient measured 2x the gradient.) Prints allocated memory after each
stage of one forward + backward and whether x.grad is the buffer the forward wrote.
Run on the GPU: PYTHONPATH=src python3 research/ce_memory.py
"""

import torch

from tilewise.ops.rowwise import cross_entropy as ce

N, C = 1024, 131072
MB = 1 << 20
made = []
launch = ce._launch


def spy(*a, **k):
    loss, grad = launch(*a, **k)
    made.append(grad.data_ptr())
    return loss, grad


ce._launch = spy
for variant in ("v3_online", "v2_fused"):
    c = C if variant == "v3_online" else 8192
    x = torch.randn(N, c, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, c, (N,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    g = N * c * 2
    loss = ce.cross_entropy(x, t, variant=variant)
    torch.cuda.synchronize()
    fwd = torch.cuda.memory_allocated() - base
    fwd_peak = torch.cuda.max_memory_allocated() - base
    loss.backward()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    print(f"{variant} C={c}: gradient {g / MB:.1f} MiB | after fwd {fwd / MB:.1f} (peak {fwd_peak / MB:.1f}) | "
          f"after bwd {after / MB:.1f} | peak {peak / MB:.1f} MiB = {peak / g:.2f}x | x.grad is the forward's "
          f"buffer: {x.grad.data_ptr() == made[-1]}")
    del x, t, loss
    torch.cuda.empty_cache()
