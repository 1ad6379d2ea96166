"""Question: how much of an eager flash_attention forward + backward's host time is tilewise's own
Python (checks, policy, layouts, descriptors, autograd), without the kernel launches? Runs on a CPU
host, no GPU: CPU bf16 tensors stand in for CUDA ones, the routes are forced to the H200's (v5 forward;
at S 256 causal D 128 v3's two backward kernels), and the launcher is a stub that records the kernel's
name. The bench's `attention_host_fwd_bwd` shape (B 1, H 16, S 256, D 128, causal).

    TRITON_INTERPRET=1 PYTHONPATH=src python research/attention_host_python.py [-p cumtime|tottime]

RESULT (2026-12-04, CPU host, 2 cores, code 33f1837): 159-187 us a forward + backward (medians of 7 x
200 calls, two runs), 4 launches stubbed (attn_fwd_ws_kernel, _attn_bwd_preprocess_kernel, _attn_bwd_dkdv_kernel,
_attn_bwd_dq_kernel). Under cProfile: the forward's autograd.Function ~45 %, of which v5's three TMA
descriptors (Gluon's TensorDescriptor validation) ~a third; the backward ~40 %; layout.rows runs 10
times a call. The H200's rows (0.49-0.89 ms with the launches, cuDNN 0.19-0.24 ms) put its host at
~1.5-2x this one: the Python path, not the launches, is most of the gap to cuDNN.
"""
import time, statistics, cProfile, pstats, sys
import torch
import tilewise.ops.attention.api as A
from tilewise.ops.attention import gluon_fwd, routes

A.runs_reference = lambda *a, **k: False
calls = []
A._launch = lambda kernel, grid, *args, **kw: calls.append(getattr(kernel, "__name__", str(kernel)))
for mod in (A, routes):
    for n in ("_ws_applies", "ws_applies", "_ws_bwd_applies", "ws_bwd_applies"):
        if hasattr(mod, n):
            setattr(mod, n, lambda *a, **k: True)
gluon_fwd.rt = type("rt", (), {"sm_count": staticmethod(lambda *a: 132)})
B, H, S, D = 1, 16, 256, 128
q, k, v, go = (torch.randn(B, H, S, D, dtype=torch.bfloat16) for _ in range(4))
ins = [t.requires_grad_(True) for t in (q, k, v)]
pol = A.default_policy(q, k, causal=True)
print(pol)
def step():
    return torch.autograd.grad(A.flash_attention(*ins, causal=True), ins, go)
step(); print("launches a call:", calls); calls.clear()
ts = []
for _ in range(7):
    t0 = time.perf_counter()
    for _ in range(200): step()
    ts.append((time.perf_counter() - t0) / 200 * 1e6)
print(f"host us a fwd+bwd (launches stubbed): median {statistics.median(ts):.1f}  all {[round(t) for t in ts]}")
if "-p" in sys.argv:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(300): step()
    pr.disable()
    order = sys.argv[-1] if sys.argv[-1] in ("cumtime", "tottime") else "tottime"
    pstats.Stats(pr).sort_stats(order).print_stats(40)
