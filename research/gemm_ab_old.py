"""gemm(auto) of an older checkout (OLD_SRC=<checkout>/src) against the current one and cuBLAS,
graph-replayed, interleaved rounds in one process: 1536^3, 3072^3, 4096^3 bf16.

Why: this session's bench runs (5a125fe, 78ee084) timed 3072^3 graph-replayed at 94-96 us against
85.5 us in the last session's (333be9b), cuBLAS level (74-76 us) in both; the host-side changes
since (descriptor helpers, cached launches, host cdiv) should not touch device time.
Prediction: old and new within 2 % of each other at every size (the spread is the machine's).
Measured (10f5239 against 333be9b, logs/gemm-ab-old.log): 1536^3 16.14 / 16.11 us (0.727x /
0.729x cuBLAS), 3072^3 92.90 / 92.73 (0.832x / 0.834x), 4096^3 193.4 / 194.0 (1.016x / 1.013x): no
change; the 85.5 us of 333be9b was that machine's.

Run on the GPU (~1 minute): OLD_SRC=<dir> PYTHONPATH=src python3 research/gemm_ab_old.py
"""
import importlib.util
import os
import statistics

import torch

from _timing import square_gemm_case
from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import api as new

spec = importlib.util.spec_from_file_location(
    "tilewise.ops._gemm_triton_old", os.path.join(os.environ["OLD_SRC"], "tilewise", "ops", "gemm_triton.py"))
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

for n in (1536, 3072, 4096):
    a, b, out, ref = square_gemm_case(n, torch.bfloat16)
    cands = {"cublas": lambda: torch.matmul(a, b, out=out), "old gemm(auto)": lambda: old.gemm(a, b, out=out),
             "new gemm(auto)": lambda: new.gemm(a, b, out=out)}
    for name, fn in cands.items():
        out.fill_(float("nan"))
        fn()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (name, err)
    times = {k: [] for k in cands}
    for _ in range(5):
        for name, fn in cands.items():
            times[name].append(time_ms_graph(fn) * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"== {n}^3 bf16, graph-replayed us (median of 5 rounds)", flush=True)
    for name, t in med.items():
        print(f"  {name:16s} {t:8.2f} us  {med['cublas'] / t:.3f}x cuBLAS  rounds "
              f"{' '.join(f'{x:.2f}' for x in times[name])}", flush=True)
