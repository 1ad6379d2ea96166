"""Why is v4_streamk slow? (gemm_small run 4: 1536^3 bf16 25.1 us against 18.2 us for two full waves
of 128 x 128 tiles, although each program runs 27 K-steps instead of 48.) Same kernel, same tile
(128 x 128 x 64, 4 stages, 8 warps), graph-replayed, bf16, three ways:
    sk        as the library runs it;
    sk_nofix  counters preset high, so no program is ever last: partial stores and atomics stay,
              the fix-up loads and the split tiles' epilogues go (wrong output: timing only);
    dp        ITERS_PER_PROG a multiple of the K-steps of a tile: whole tiles only, no partials.
Prediction: if dp ~ v3's time and sk_nofix ~ sk, the fix-up is cheap and the split itself (K-range
per program, L2 pattern) costs; if sk_nofix << sk, the fix-up (a program reading other programs'
64 KiB slabs) is the cost. Run: PYTHONPATH=src python3 research/streamk_diag.py
"""

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import api as G
from tilewise.ops.gemm import triton_kernels as tk

BM, BN, BK, ST, W = 128, 128, 64, 4, 8


def launch(a, b, out, ipp, counts):
    M, K = a.shape
    N = b.shape[1]
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    total = tiles * triton.cdiv(K, BK)
    progs = triton.cdiv(total, ipp)
    ws = torch.empty((2 * progs, BM * BN), device=a.device, dtype=torch.float32)
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
    b_desc = TensorDescriptor.from_tensor(b, [BK, BN])
    tk._gemm_streamk_kernel[(progs,)](a, b, a_desc, b_desc, out, out, out, out, out, ws, counts, M, N, K,
                                      a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
                                      ipp, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=8, USE_TMA=True, B_KMAJOR=False,
                                      HAS_BIAS=False, HAS_SCALES=False, STORE_AUX=False, ACTIVATION=0, PRECISION="tf32",
                                      UPCAST=False, num_stages=ST, num_warps=W)


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n in (1536, 2048, 3072):
        g = torch.Generator(device="cuda").manual_seed(n)
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        ipt = triton.cdiv(n, BK)
        tiles = triton.cdiv(n, BM) * triton.cdiv(n, BN)
        total = tiles * ipt
        ipp_sk = triton.cdiv(total, min(sms, total))
        ipp_dp = triton.cdiv(tiles, sms) * ipt
        zeros = torch.zeros(tiles, device="cuda", dtype=torch.int32)
        high = torch.full((tiles,), 1 << 20, device="cuda", dtype=torch.int32)
        cases = {"cublas": lambda: torch.matmul(a, b, out=out),
                 "v3 gemm(auto)": lambda: G.gemm(a, b, out=out),
                 "sk": lambda: launch(a, b, out, ipp_sk, zeros),
                 "sk_nofix": lambda: launch(a, b, out, ipp_sk, high),
                 "dp": lambda: launch(a, b, out, ipp_dp, zeros)}
        res = {}
        for name, fn in cases.items():
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            res[name] = time_ms_graph(fn)
            print(f"{n}^3 {name:14s} {res[name] * 1e3:7.2f} us  {res['cublas'] / res[name]:5.2f}x cuBLAS  "
                  f"rel err {err:.1e}  (ipp sk {ipp_sk}, dp {ipp_dp}, K-steps a tile {ipt})")


if __name__ == "__main__":
    main()
