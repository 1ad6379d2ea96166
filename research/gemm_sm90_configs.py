"""The CUDA C sm_90a GEMM (tilewise/ops/gemm/sm90.cu: wgmma, TMA, cluster multicast) against cuBLAS
and gemm() (Triton) on the sizes where gemm() misses 0.85x cuBLAS graph-replayed (1000, 1536,
3072) and on the squares (4096, 8192): every config, bf16 and fp16, correctness first (output
poisoned with NaN, relative error against fp32), then graph-replayed and eager times, same run.

Prediction before the first run (the L2 arithmetic of research/notes/matmul.md: ~6 TB/s from L2 to
the SMs): 1536^3 with 192 x 96 tiles in 1 x 2 clusters (A multicast) reads ~75 MB from L2, like
cuBLAS: 0.85-1.0x cuBLAS (gemm() 0.72x); 3072^3 with 128 x 192 in 2 x 1: 0.85-1.0x; 1000^3 with
128 x 64 in 1 x 2 (33 MB): 0.8-1.0x; 4096 / 8192 with 128 x 256: 0.9-1.05x.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_configs.py [--sizes 1536,3072]
"""
import sys

import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms, time_ms_graph
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import api as gt


def main(sizes):
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    warm_clocks()
    for dtype in (torch.bfloat16, torch.float16):
        for n in sizes:
            M = N = K = n
            g = torch.Generator(device="cuda").manual_seed(n)
            a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g)
            out = torch.empty(M, N, device="cuda", dtype=dtype)
            ref = a.float() @ b.float()
            rows = [("cublas", lambda: torch.matmul(a, b, out=out)), ("gemm()", lambda: gt.gemm(a, b, out=out))]
            auto = gc.sm90_config_for(M, N, K)
            for name in sorted(gc.SM90_CONFIGS):
                out.fill_(float("nan"))
                try:
                    gs.gemm_sm90(a, b, out=out, config=name)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"{n}^3 {dtype} {name}: FAILED {type(e).__name__}: {e}", flush=True)
                    continue
                err = ((out.float() - ref).norm() / ref.norm()).item()
                ok = err < (2e-3 if dtype is torch.float16 else 1e-2) and bool(out.isfinite().all())
                print(f"{n}^3 {str(dtype)[6:]} {name}: rel err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
                if ok:
                    rows.append((name + ("*" if name == auto else ""), lambda c=name: gs.gemm_sm90(a, b, out=out, config=c)))
            flops = 2 * M * N * K
            t = {name: (time_ms_graph(fn), time_ms(fn)) for name, fn in rows}
            cb = t["cublas"]
            for name, (gr, e) in t.items():
                print(f"{n}^3 {str(dtype)[6:]:8s} {name:16s} graph {gr * 1e3:8.1f} us {cb[0] / gr:6.3f}x cublas "
                      f"{flops / gr / 1e9:6.1f} TFLOP/s | eager {e * 1e3:8.1f} us {cb[1] / e:6.3f}x", flush=True)


if __name__ == "__main__":
    sizes = (1000, 1536, 2048, 3072, 4096, 8192)
    if "--sizes" in sys.argv:
        sizes = tuple(int(s) for s in sys.argv[sys.argv.index("--sizes") + 1].split(","))
    main(sizes)
