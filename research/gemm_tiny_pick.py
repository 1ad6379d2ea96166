"""Question: does a tiny GEMM (2 M N K <= TINY_FLOPS) lose device time by taking the smallest kept tile
without an autotune, and how much first-call time does skipping the autotune save?

Runs each shape in two child processes with empty kernel and Triton caches: ``tiny`` (the package as it
is) and ``tuned`` (``TINY_FLOPS = 0`` set on the kernel module before any call, so every shape is
autotuned over its pruned list), alternating over ``--rounds``. Per shape: the first call's wall time
(compile + autotune + run), the steady device time (``time_ms_graph``), the config each one ran, and,
from the tuned child's stored pick files, Triton's timing of every config it tried.

    PYTHONPATH=src python research/gemm_tiny_pick.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (M, N, K): the SST-2 classifier's forward and backward products (batch 64, embed 50, hidden 256,
# 2 classes), then odd sizes up to 2**29 FLOPs (2048 x 128 x 1024 is exactly the limit).
SHAPES = [(64, 256, 50), (64, 50, 256), (50, 256, 64), (64, 2, 256), (256, 2, 64), (64, 256, 2),
          (128, 128, 128), (333, 777, 1000), (1000, 300, 700), (96, 4096, 512), (2048, 128, 1024),
          (512, 512, 1024)]


def _child(mode: str) -> None:
    import torch

    from tilewise.bench.harness import time_ms_graph
    from tilewise.ops.gemm import api
    from tilewise.ops.gemm import triton_kernels as tk

    if mode == "tuned":
        tk.TINY_FLOPS = 0
    g = torch.Generator(device="cuda").manual_seed(0)
    tuners = {"tiled": tk._tiled, "persistent": tk._persistent, "tma": tk._tma}
    for dtype in (torch.bfloat16, torch.float32):
        for M, N, K in SHAPES:
            a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g)
            before = {n: set(t.cache) for n, t in tuners.items()}
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = api.gemm(a, b)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ref = (a.double() @ b.double())
            err = ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            ran = [f"{n}:{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}x{c.kwargs['BLOCK_K']}/{c.num_stages}/{c.num_warps}"
                   for n, t in tuners.items() for k, c in t.cache.items() if k not in before[n]]
            dev = time_ms_graph(lambda: api.gemm(a, b), calls=20, repeats=15)
            print(json.dumps({"mode": mode, "dtype": str(dtype)[6:], "shape": [M, N, K], "first_s": first,
                              "device_us": dev * 1e3, "ran": ran or ["not autotuned (another route)"],
                              "rel_err": err}), flush=True)


def _picks(cache: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cache / "autotune").glob("*.json"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=("tiny", "tuned"))
    args = ap.parse_args()
    if args.child:
        return _child(args.child)
    rows: dict = {}
    picks = []
    for r in range(args.rounds):
        for mode in (("tiny", "tuned") if r % 2 == 0 else ("tuned", "tiny")):
            with tempfile.TemporaryDirectory() as d:
                env = {**os.environ, "TILEWISE_CACHE_DIR": f"{d}/tw", "TRITON_CACHE_DIR": f"{d}/triton"}
                t0 = time.perf_counter()
                p = subprocess.run([sys.executable, __file__, "--child", mode], env=env, capture_output=True,
                                   text=True)
                print(f"round {r + 1} {mode}: {time.perf_counter() - t0:.1f} s, rc {p.returncode}", flush=True)
                if p.returncode:
                    print(p.stderr[-3000:])
                    sys.exit(1)
                for line in p.stdout.splitlines():
                    if line.startswith("{"):
                        rec = json.loads(line)
                        rows.setdefault((rec["dtype"], tuple(rec["shape"])), {}).setdefault(mode, []).append(rec)
                if mode == "tuned" and r == 0:
                    picks = _picks(Path(d) / "tw")
    print(f"\n{'dtype':9} {'M x N x K':>18} {'first s tiny/tuned':>20} {'device us tiny/tuned':>22} {'ratio':>6}  ran")
    tot = {"tiny": 0.0, "tuned": 0.0}
    for (dtype, shape), by in rows.items():
        med = {m: sorted(x["device_us"] for x in by[m])[len(by[m]) // 2] for m in by}
        first = {m: sum(x["first_s"] for x in by[m]) / len(by[m]) for m in by}
        for m in tot:
            tot[m] += first[m]
        err = max(x["rel_err"] for m in by for x in by[m])
        print(f"{dtype:9} {'x'.join(map(str, shape)):>18} {first['tiny']:9.3f}/{first['tuned']:<9.3f} "
              f"{med['tiny']:10.2f}/{med['tuned']:<10.2f} {med['tiny'] / med['tuned']:6.3f}  "
              f"{by['tiny'][0]['ran']} vs {by['tuned'][0]['ran']} (max rel err {err:.1e})")
    print(f"first calls summed: tiny {tot['tiny']:.2f} s, tuned {tot['tuned']:.2f} s")
    print("\nTriton's timing of each config (tuned child, round 1), ms:")
    for p in picks:
        ts = ", ".join(f"{c}={t:.4f}" if t is not None else f"{c}=-" for c, t in zip(p["configs"], p["timings_ms"]))
        print(f"  {p['kernel']} {p['key']}: best #{p['best']}: {ts}")


if __name__ == "__main__":
    main()
