"""GEMM tiles whose sides are not powers of two (192 = 128 + 64, 96 = 64 + 32), built in Triton 3.6
from two or four power-of-two products a K-step, against cuBLAS and gemm(auto), same run,
graph-replayed (as the bench's sweep). bf16, squares 1536, 2304, 3072, 4096.

Why: cuBLAS runs 192 x 96 at 1536 (128 tiles: one wave on 132 SMs), 192 x 128 at 2304, 192 x 192 at
3072 (logs/cublas-kernels.log); our power-of-two tiles quantize badly there (3072 with 128 x 256:
288 tiles = 2.2 waves, 73 % of the last; 1536 with 128 x 128: 144 tiles = 1.1 waves). Triton
needs power-of-two tensor sides, so a 128 x 192 tile is two accumulators (128 x 128 and 128 x 64)
fed by one A tile and two B tiles (TMA descriptors), each K-step two wgmma products.
Before (bench e7c4f50, graph-replayed): 1536 0.62x cuBLAS, 2304 ~0.8x, 3072 0.82x, 4096 0.93x.
Prediction: 3072 with 128 x 192 (384 tiles = 2.9 waves) ~0.9x; 1536 with 192 x 96 (128 tiles)
~0.8x; no gain at 4096.

Measured (H200, cd229ca, logs/gemm-split-tiles.log; x cuBLAS, graph-replayed): 1536: 128 x (128 + 64)
0.714x (96 tiles) against gemm()'s 0.640x; 192 x 96 0.55-0.58x (its 64-row half runs 64 x 16 / 64
x 32 wgmma); 2304: 0.87-0.88x, and this kernel's plain 128 x 128 0.886x against gemm()'s 0.742x
(its autotuner's pick); 3072: 128 x (128 + 64) 0.881x against 0.826x, 192 x 192 0.815x; 4096: 0.71x
against 0.957x. So gemm() takes the 128 x 192 tile where the wave model says it fills the GPU
better (gemm_triton.tma_tile_for).

Run on the GPU (~2 minutes): PYTHONPATH=src python3 research/gemm_split_tiles.py
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from _timing import run_checked, square_gemm_case
from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import api as G
from tilewise.ops.gemm import triton_kernels as tk


@triton.jit
def _split_kernel(a1_d, a2_d, b1_d, b2_d, c11_d, c12_d, c21_d, c22_d, M, N, K, NUM_SMS,
                  BM1: tl.constexpr, BM2: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr,
                  BK: tl.constexpr, GROUP_M: tl.constexpr):
    # A (BM1 + BM2) x (BN1 + BN2) tile as up to four power-of-two blocks; BM2 / BN2 = 0: no split.
    BM: tl.constexpr = BM1 + BM2
    BN: tl.constexpr = BN1 + BN2
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = tk._tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc11 = tl.zeros((BM1, BN1), dtype=tl.float32)
        if BN2 > 0:
            acc12 = tl.zeros((BM1, BN2), dtype=tl.float32)
        if BM2 > 0:
            acc21 = tl.zeros((BM2, BN1), dtype=tl.float32)
            if BN2 > 0:
                acc22 = tl.zeros((BM2, BN2), dtype=tl.float32)
        for kk in range(k_tiles):
            off_k = kk * BK
            a1 = a1_d.load([off_m, off_k])
            b1 = b1_d.load([off_k, off_n])
            acc11 = tl.dot(a1, b1, acc11)
            if BN2 > 0:
                b2 = b2_d.load([off_k, off_n + BN1])
                acc12 = tl.dot(a1, b2, acc12)
            if BM2 > 0:
                a2 = a2_d.load([off_m + BM1, off_k])
                acc21 = tl.dot(a2, b1, acc21)
                if BN2 > 0:
                    acc22 = tl.dot(a2, b2, acc22)
        c11_d.store([off_m, off_n], acc11.to(c11_d.dtype))
        if BN2 > 0:
            c12_d.store([off_m, off_n + BN1], acc12.to(c12_d.dtype))
        if BM2 > 0:
            c21_d.store([off_m + BM1, off_n], acc21.to(c21_d.dtype))
            if BN2 > 0:
                c22_d.store([off_m + BM1, off_n + BN1], acc22.to(c22_d.dtype))


def run(a, b, out, cfg, sms):
    bm1, bm2, bn1, bn2, stages, warps = cfg
    M, K = a.shape
    N = b.shape[1]
    bk = 64
    a1 = TensorDescriptor.from_tensor(a, [bm1, bk])
    a2 = TensorDescriptor.from_tensor(a, [max(bm2, 16), bk])
    b1 = TensorDescriptor.from_tensor(b, [bk, bn1])
    b2 = TensorDescriptor.from_tensor(b, [bk, max(bn2, 16)])
    c11 = TensorDescriptor.from_tensor(out, [bm1, bn1])
    c12 = TensorDescriptor.from_tensor(out, [bm1, max(bn2, 16)])
    c21 = TensorDescriptor.from_tensor(out, [max(bm2, 16), bn1])
    c22 = TensorDescriptor.from_tensor(out, [max(bm2, 16), max(bn2, 16)])
    tiles = triton.cdiv(M, bm1 + bm2) * triton.cdiv(N, bn1 + bn2)
    _split_kernel[(min(sms, tiles),)](a1, a2, b1, b2, c11, c12, c21, c22, M, N, K, sms,
                                      BM1=bm1, BM2=bm2, BN1=bn1, BN2=bn2, BK=bk, GROUP_M=8,
                                      num_stages=stages, num_warps=warps)


CONFIGS = {  # (BM1, BM2, BN1, BN2, stages, warps)
    1536: [(128, 64, 64, 32, 4, 8), (128, 64, 64, 32, 3, 8), (64, 32, 128, 64, 4, 4), (128, 0, 128, 64, 4, 8),
           (128, 0, 128, 0, 4, 8)],
    2304: [(128, 64, 128, 0, 4, 8), (128, 0, 128, 64, 4, 8), (128, 0, 128, 64, 3, 8), (128, 0, 128, 0, 4, 8)],
    3072: [(128, 0, 128, 64, 4, 8), (128, 0, 128, 64, 3, 8), (128, 64, 128, 0, 4, 8), (128, 64, 128, 64, 3, 8),
           (128, 0, 256, 0, 3, 8)],
    4096: [(128, 0, 128, 64, 4, 8), (128, 0, 256, 0, 3, 8)],
}


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dtype = torch.bfloat16
    for n, cfgs in CONFIGS.items():
        a, b, out, ref = square_gemm_case(n, dtype)
        base = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        ta = time_ms_graph(lambda: G.gemm(a, b, out=out))
        print(f"{n}: cuBLAS {base * 1e3:.1f} us ({2 * n ** 3 / base / 1e9:.0f} TF/s), auto {base / ta:.3f}x", flush=True)
        for cfg in cfgs:
            err, e = run_checked(lambda: run(a, b, out, cfg, sms), out, ref)
            if e is not None:
                print(f"  {cfg}: {type(e).__name__}: {str(e)[:150]}", flush=True)
                continue
            t = time_ms_graph(lambda: run(a, b, out, cfg, sms))
            tiles = triton.cdiv(n, cfg[0] + cfg[1]) ** 0 * triton.cdiv(n, cfg[0] + cfg[1]) * triton.cdiv(n, cfg[2] + cfg[3])
            print(f"  {cfg[0]}+{cfg[1]} x {cfg[2]}+{cfg[3]} st{cfg[4]} w{cfg[5]}: {base / t:.3f}x cuBLAS, "
                  f"{2 * n ** 3 / t / 1e9:.0f} TF/s, {tiles} tiles ({tiles / sms:.2f} waves), err {err:.1e}"
                  + ("" if err < 1e-2 else " WRONG"), flush=True)


if __name__ == "__main__":
    main()
