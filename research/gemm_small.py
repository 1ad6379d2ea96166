"""Which kernel and tile for small GEMMs? gemm(auto) against cuBLAS at 512 ... 2048, bf16 and fp16,
device time only (time_ms_graph: 20 calls in one CUDA graph, replayed), for:
    - torch.matmul (cuBLAS), gemm(auto) (today: v3_tma_persistent, autotuned over 5 tiles),
    - v1_tiled's kernel with each tile forced (no autotuner), v2_persistent's with a few,
    - gemm_splitk with 2 and 4 K slices (64 x 64 tiles),
    - v4_streamk (added after run 1: the answer to 1536's 144 tiles on 132 SMs; prediction: about
      1.1 tile-times instead of 2 waves, i.e. 0.66x -> ~1.1x cuBLAS at 1536, ~0.9x at 1000).
      Run 3 (3d7ee57): 0.03-0.35x: the holder of a tile's last K-step waited for the programs before
      it, whose partials came at the end of their ranges: a chain through all programs (770 us at
      2048). Rewritten: the last program to arrive on a tile does the fix-up, nobody waits, TMA loads
      where rows allow; run 4 compares tiles (BM, BN, BK, stages, warps). Prediction for run 4:
      1536 ~1.0x cuBLAS (26 K-steps a program against 2 x 24 in two waves), 1000 ~0.9x.
Bench (55151a6^, logs/bench-gemm-triton.log): graph-replayed gemm(auto) / cuBLAS 512: 0.86x bf16,
0.42x fp16; 1000: 0.74x bf16, 0.65x fp16 (the sweep target is 0.85x).

Prediction (before the run): at 512 and 1000 a 128 x 128 tile leaves most of the 132 SMs idle
(16 and 64 tiles); 64 x 64 / 64 x 128 tiles (64-256 tiles) or 2-4 K slices should reach 0.85-1.0x.

Each candidate is checked against an fp32 matmul first (relative error < 1e-2). Run on the GPU
(~3 minutes, mostly compiles): PYTHONPATH=src python3 research/gemm_small.py
"""

import time

import torch
import triton

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import api as G
from tilewise.ops.gemm import triton_kernels as tk
from tilewise.ops.gemm.configs import Tile

SIZES = [512, 768, 1000, 1536, 2048, 2304, 2999, 3072, 4096]
STREAMK = [(128, 128, 64, 4, 8), (128, 128, 64, 3, 8), (128, 256, 64, 3, 8), (128, 64, 64, 4, 4)]
TILED = [(64, 64, 4, 4), (64, 64, 3, 4), (64, 128, 4, 4), (128, 64, 4, 4), (128, 128, 4, 4), (128, 128, 4, 8),
         (64, 256, 3, 8)]
PERSISTENT = [(64, 64, 4, 4), (64, 128, 4, 4), (128, 128, 4, 8)]


def meta(a):
    return dict(HAS_BIAS=False, HAS_SCALES=False, STORE_AUX=False, ACTIVATION=0, PRECISION="tf32", UPCAST=False)


def tiled(a, b, out, cfg):
    bm, bn, st, w = cfg
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    tk._gemm_kernel[grid](a, b, out, out, out, out, out, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                         b.stride(1), out.stride(0), out.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8,
                         **meta(a), num_warps=w, num_stages=st)


def persistent(a, b, out, cfg, sms):
    bm, bn, st, w = cfg
    M, K = a.shape
    N = b.shape[1]
    grid = (min(sms, triton.cdiv(M, bm) * triton.cdiv(N, bn)),)
    tk._gemm_persistent_kernel[grid](a, b, out, out, out, out, out, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                    b.stride(1), out.stride(0), out.stride(1), sms, BLOCK_M=bm, BLOCK_N=bn,
                                    BLOCK_K=64, GROUP_M=8, **meta(a), num_warps=w, num_stages=st)


def main():
    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(0)
    summary = []
    for dtype in (torch.bfloat16, torch.float16):
        for n in SIZES:
            a = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
            out = torch.empty(n, n, device="cuda", dtype=dtype)
            ref = a.float() @ b.float()
            cands = {"cublas": lambda: torch.matmul(a, b, out=out), "gemm(auto)": lambda: G.gemm(a, b, out=out)}
            for c in TILED:
                cands[f"tiled {c}"] = lambda c=c: tiled(a, b, out, c)
            for c in PERSISTENT:
                cands[f"persistent {c}"] = lambda c=c: persistent(a, b, out, c, sms)
            for s in (2, 4):
                cands[f"splitk {s}"] = lambda s=s: G.gemm_splitk(a, b, out=out, splits=s)
            cands["v4_streamk"] = lambda: G.VARIANTS["v4_streamk"](a, b, out=out)
            for c in STREAMK:
                cands[f"streamk {c}"] = lambda c=c: tk.run_streamk(a, b, out, None, None, None, None, "tf32", None,
                                                                    tile=Tile(*c))
            times = {}
            for name, fn in cands.items():
                out.fill_(float("nan"))
                try:
                    fn()
                    torch.cuda.synchronize()
                except Exception as e:  # a tile that does not build: say so, go on
                    print(f"  {n} {dtype} {name}: failed ({type(e).__name__}: {str(e)[:100]})")
                    continue
                err = ((out.float() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    print(f"  {n} {dtype} {name}: rel err {err:.2e}, not timed")
                    continue
                times[name] = time_ms_graph(fn)
            base = times["cublas"]
            flops = 2 * n ** 3
            print(f"{n}^3 {dtype}: cublas {base * 1e3:.2f} us ({flops / base / 1e9:.0f} TFLOP/s)")
            for name, t in sorted(times.items(), key=lambda kv: kv[1]):
                print(f"    {name:28s} {t * 1e3:7.2f} us  {base / t:5.2f}x cuBLAS")
            best = min((t, nm) for nm, t in times.items() if nm != "cublas")
            sk = min(((t, nm) for nm, t in times.items() if "streamk" in nm), default=(float("inf"), "-"))
            summary.append((n, str(dtype), best[1], base / best[0], base / times.get("gemm(auto)", float("inf")),
                            sk[1], base / sk[0]))
    print("best per size (vs cuBLAS; gemm(auto) today):")
    for n, dt, nm, r, ra, sk, rs in summary:
        print(f"  {n:5d} {dt:15s} {nm:28s} {r:.2f}x   auto {ra:.2f}x   best stream-K {sk} {rs:.2f}x")
    print(f"elapsed {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
