"""Does the attention grid's order (cuDNN, then Flex, then ours, each through `harness.time_ms`) cost the
candidate that runs after Flex?

Why: at D 128 without causal the H100 grid (0d2c241) put our forward at 0.945-0.988x cuDNN, but single profiled
calls (1.00-1.02x) and 3-s sustained phases (1.00-1.03x; `attention_sustained_clock.py`, d66fbda) did not. The
grid times each shape's candidates one after another with triton's `do_bench` (25 ms warm-up, 100 ms of calls,
a 256 MB fill before each call), so each candidate starts in the power state the one before left.

What it does: per shape, the three candidates in the grid's order and in two others, each order twice, every
time from `harness.time_ms`; prints each candidate's ms by its position.

Prediction (before a run): the candidate timed right after Flex (ours, in the grid's order) reads 2-4 % slower
than when it runs first; cuDNN's first-position reading is its best.
Run on the GPU (~60 s): PYTHONPATH=src python3 research/attention_grid_order.py
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.bench.harness import time_ms
from tilewise.ops.attention.api import flash_attention

SHAPES = [(1, 16, 16, 16384, 128), (4, 32, 8, 4096, 128), (8, 16, 16, 2048, 128)]
ORDERS = [("cudnn", "flex", "ours"), ("ours", "flex", "cudnn"), ("flex", "ours", "cudnn")]


def main():
    from torch.nn.attention.flex_attention import flex_attention

    print(torch.cuda.get_device_name(), flush=True)
    flex = torch.compile(flex_attention, dynamic=False)
    for B, H, Hkv, S, D in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(S)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        gqa = Hkv != H

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)

        fns = {"cudnn": cudnn, "flex": lambda: flex(q, k, v, enable_gqa=gqa), "ours": lambda: flash_attention(q, k, v)}
        with torch.no_grad():
            for f in fns.values():
                f()
            torch.cuda.synchronize()
            seen = {n: {} for n in fns}
            for rep in range(2):
                for order in ORDERS:
                    for pos, n in enumerate(order):
                        seen[n].setdefault((order, pos), []).append(time_ms(fns[n]))
        print(f"B{B} H{H}/{Hkv} S{S} D{D} forward, ms by order (two runs each):", flush=True)
        for order in ORDERS:
            cells = "  ".join(f"{n} {' '.join(f'{x:.3f}' for x in seen[n][(order, pos)])}"
                              for pos, n in enumerate(order))
            c = statistics.mean(seen["cudnn"][(order, order.index("cudnn"))])
            o = statistics.mean(seen["ours"][(order, order.index("ours"))])
            print(f"  {' -> '.join(order):22s} {cells}   ours x cuDNN {c / o:.3f}", flush=True)


if __name__ == "__main__":
    main()
