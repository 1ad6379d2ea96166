"""Where do the small GEMMs' microseconds go? The quick bench timed gemm(auto) at 512^3 bf16 at
0.13 ms against cuBLAS's 6.9 us: host time, not the kernel. Prints host us per call for each
path, the device time of one call replayed from a CUDA graph, and the top of a cProfile of
gemm(auto). Run on the GPU: PYTHONPATH=src python3 scripts/experiments/host_overhead.py
"""

import cProfile
import pstats

import torch

from tilewise.bench.harness import host_us_per_call
from tilewise.ops import gemm_triton as g


def graph_us(fn, calls=50):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(calls):
            fn()
    gr.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        gr.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / calls)
    ts.sort()
    return ts[len(ts) // 2]


for n in (512, 1000, 2048):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    paths = {"torch.matmul": lambda: torch.matmul(a, b, out=out),
             "gemm(auto)": lambda: g.gemm(a, b, out=out),
             **{k: (lambda k=k: g.gemm(a, b, out=out, variant=k)) for k in g.VARIANTS}}
    for name, fn in paths.items():
        fn()
        print(f"{n}^3 {name:20s} host {host_us_per_call(fn, calls=300, repeats=5):8.1f} us/call   "
              f"graph-replayed device {graph_us(fn):8.2f} us")
a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
b = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    g.gemm(a, b)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("cumulative").print_stats(18)
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
bias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
for name, fn in {"tilewise.linear relu": lambda: g.linear(x, w, bias, activation="relu"),
                 "torch relu(x@w.T+b)": lambda: torch.relu(x @ w.T + bias),
                 "gemm(auto) relu+bias": lambda: g.gemm(x, w.t(), bias=bias, activation="relu")}.items():
    fn()
    print(f"linear 8192x4096x1024 {name:22s} host {host_us_per_call(fn, calls=200, repeats=5):8.1f} us/call   "
          f"graph-replayed device {graph_us(fn, calls=10):8.2f} us")
