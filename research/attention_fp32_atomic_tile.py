"""The fp32 atomic backward's tile at D = 128: build time and run time, 64 x 128 x 8 warps (today's
table entry) against 32 x 64 x 8 warps.

Why: the quick GPU tier's longest test is `test_gpu_tile_table_routes[atomic[128] fp32]`, 156 s
(tests/gpu_durations.json), almost all of it one Triton build: fp32 inputs take ``PREC="ieee"``, so
the kernel's dots are FMAs, whose code grows with a thread's share of the tile. Compiled for sm_90
under Triton 3.6 on the CI host with an empty cache (2026-12-04): 64 x 128 x 8 warps 109 s,
64 x 64 x 4 107 s, 32 x 64 x 4 40 s, 32 x 128 x 8 37.5 s, 64 x 64 x 8 37 s, 32 x 64 x 8 14.4 s,
16 x 128 x 8 15.2 s. The tier waits on that one test, so a smaller tile would take ~1 minute off each
tier run; only fp32 inputs at D = 128 use the entry (2-byte inputs take ATOMIC_2BYTE).

Prediction: 32 x 64 x 8 builds in ~20 s on the H200's host (156 s now) and runs the fp32 backward
within 15 % of 64 x 128 (both FMA-bound; the smaller key tile doubles dQ's atomics, a small part).

The forward and preprocess kernels are built first (with a tiny tile); then each tile, causal and
not, is built in a fresh Triton cache (the first call's time is its build), checked against the
float64 reference, and timed (median of 20 events after warm-up), B 2 H 16 S 2048, not causal
(``--causal``: causal too).
Run on the GPU (~3 minutes, most of it the old tile's build):
    PYTHONPATH=src python3 research/attention_fp32_atomic_tile.py [--causal]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from tilewise.ops.attention import api as A

TILES = {"64x128x8 (table)": (64, 128, 8, 2), "32x64x8": (32, 64, 8, 2)}


def _call(tile, q, k, v, causal, grad):
    base = A.default_policy(q, k, causal=causal, deterministic=False)
    pol = base.replace(backward="atomic", tiles={"atomic": tile})
    out = A.flash_attention(q, k, v, causal=causal, deterministic=False, policy=pol)
    return torch.autograd.grad(out, (q, k, v), grad)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--causal", action="store_true", help="causal too (another build of each tile, ~2.5 min more)")
    modes = (False, True) if ap.parse_args(argv).causal else (False,)
    B, H, S, D = 2, 16, 2048, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, grad = (torch.randn(B, H, S, D, device="cuda", generator=g) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    for causal in modes:  # the forward and preprocess builds, out of the timed first calls
        _call((16, 32, 4, 1), q, k, v, causal, grad)
    for causal in modes:
        qr, kr, vr = (t.detach().double().requires_grad_(True) for t in (q, k, v))
        ref = torch.autograd.grad(A.reference(qr, kr, vr, causal=causal), (qr, kr, vr), grad.double())
        for name, tile in TILES.items():
            # a fresh Triton cache for each tile and mode: the first call's time is that build's
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-fp32-atomic-")
            t0 = time.perf_counter()
            got = _call(tile, q, k, v, causal, grad)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            err = max(float((a.double() - b).norm() / b.norm()) for a, b in zip(got, ref))
            for _ in range(3):
                _call(tile, q, k, v, causal, grad)
            times = []
            for _ in range(20):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                _call(tile, q, k, v, causal, grad)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            print(f"causal={causal!s:5} {name:18} first call {first:6.1f} s (build included)  "
                  f"fwd+bwd {statistics.median(times):7.3f} ms  worst grad rel. err. {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
