"""Where do the small kernels' microseconds go on the host, and what does the cached launch path
(tilewise.runtime.triton_launch) take off? For each op: host us per call (back-to-back calls, no
sync: the host sets the pace when it is slower than the GPU) with the cache off (Triton's own
dispatch) and on, the device time of one call replayed from a CUDA graph, and the eager time
measured as the bench does (events around each call). Then a cProfile of gemm(auto) with the
cache on, to show what is left.
Run on the GPU: PYTHONPATH=src python3 research/host_overhead.py
"""

import cProfile
import pstats

import torch

from _timing import linear_step_case, median_event_ms, per_call_us
from tilewise.bench.harness import host_us_per_call, time_ms_graph
from tilewise.ops.gemm import api as g
from tilewise.ops.gemm import triton_kernels as tk
from tilewise.runtime import triton_launch as tl_launch


def graph_us(fn, calls=50):
    """Device time of one call, replayed from a CUDA graph of ``calls`` calls."""
    return time_ms_graph(fn, calls=calls, repeats=20) * 1000


def eager_us(fn, reps=200):
    """Events around each call, back to back, median (the bench's eager rows, through triton's
    do_bench, also clear L2 between calls, which gives the host that long to catch up)."""
    return 1000 * median_event_ms(fn, reps=reps, warmup=20, sync_each=False)


def row(label, fn, baseline=False, calls=300, graph=True):
    out = {}
    modes = [("-", True)] if baseline else [("off", False), ("on", True)]
    for mode, on in modes:
        tl_launch.set_enabled(on)
        fn()
        out[mode] = (host_us_per_call(fn, calls=calls, repeats=5), eager_us(fn))
    tl_launch.set_enabled(True)
    dev = graph_us(fn) if graph else float("nan")
    cells = "   ".join(f"{m:>3}: host {h:7.1f} us eager {e:7.1f} us" for m, (h, e) in out.items())
    print(f"{label:40s} {cells}   graph-replayed {dev:8.2f} us", flush=True)


for n in (512, 1000, 1536, 2048, 3072):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    row(f"{n}^3 torch.matmul", lambda: torch.matmul(a, b, out=out), baseline=True)
    row(f"{n}^3 gemm(auto)", lambda: g.gemm(a, b, out=out))
    for k in ("v1_tiled", "v3_tma_persistent"):
        row(f"{n}^3 {k}", lambda k=k: g.gemm(a, b, out=out, variant=k))

x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
bias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
row("linear 8192x4096x1024 torch relu(x@w.T+b)", lambda: torch.relu(x @ w.T + bias), baseline=True)
row("linear 8192x4096x1024 tilewise.linear relu", lambda: g.linear(x, w, bias, activation="relu"))

torch_step, tw_step = linear_step_case()


row("linear fwd+bwd 2048x512x512 torch", torch_step, baseline=True, calls=100)
row("linear fwd+bwd 2048x512x512 tilewise", tw_step, calls=100)

from tilewise.ops.attention.api import flash_attention  # noqa: E402
from tilewise.ops.rowwise.cross_entropy import cross_entropy  # noqa: E402
from tilewise.ops.rowwise.softmax import softmax  # noqa: E402

q, k, v = (torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
row("attention fwd B1 H8 S1024 D64 sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
    baseline=True)
row("attention fwd B1 H8 S1024 D64 tilewise", lambda: flash_attention(q, k, v))
xl = torch.randn(4096, 1000, device="cuda", dtype=torch.bfloat16)
tl_ = torch.randint(0, 1000, (4096,), device="cuda")
row("softmax 4096x1000 torch", lambda: torch.softmax(xl, -1), baseline=True)
row("softmax 4096x1000 tilewise", lambda: softmax(xl))
row("cross_entropy 4096x1000 torch", lambda: torch.nn.functional.cross_entropy(xl, tl_), baseline=True)
row("cross_entropy 4096x1000 tilewise", lambda: cross_entropy(xl, tl_), graph=False)  # counts on the host

# Pieces of one cached gemm launch (v1_tiled, 1000^3), us each.
a = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
o = torch.empty_like(a)
g.gemm(a, a, out=o, variant="v1_tiled")
args = tk._pointer_args(a, a, o, None, None, None, None)
print(f"pieces: _sig over the args {per_call_us(lambda: tuple(map(tl_launch._sig, args))):.2f} us, "
      f"current_device {per_call_us(torch.cuda.current_device):.2f} us, hooks check {per_call_us(tl_launch._hooks_set):.2f} us, "
      f"_check {per_call_us(lambda: g._check(a, a, None, None, None, None, None, 'tf32', o)):.2f} us, "
      f"TensorDescriptor.from_tensor {per_call_us(lambda: tk._b_desc(a, 128, 64, False)):.2f} us")
torch.cuda.synchronize()

g.gemm(a, a)
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    g.gemm(a, a)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
