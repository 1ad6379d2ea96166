"""Which sizes should gemm() send to gemm_sm90? Square sizes 768 .. 8192 (and a few rectangles of
linear layers), bf16 and fp16, graph-replayed: cuBLAS, gemm() as routed now (Triton), gemm_sm90 with
its tile rule, same run. The table this prints is the routing rule's evidence (research/notes/matmul.md).
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_sweep.py [bf16] [fp16]
"""
import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import api as gt

SHAPES = [(n, n, n) for n in (768, 1000, 1024, 1280, 1536, 1792, 2048, 2304, 2560, 3072, 3584, 4096, 6144, 8192)]
SHAPES += [(8192, 4096, 1024), (8192, 1024, 4096), (4096, 4096, 1024), (2048, 8192, 2048)]


def main(dtypes):
    warm_clocks()
    for dtype in dtypes:
        for M, N, K in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(M + N + K)
            a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g)
            out = torch.empty(M, N, device="cuda", dtype=dtype)
            ref = a.float() @ b.float()
            out.fill_(float("nan"))
            gs.gemm_sm90(a, b, out=out)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            ok = err < (2e-3 if dtype is torch.float16 else 1e-2) and bool(out.isfinite().all())
            tc = time_ms_graph(lambda: torch.matmul(a, b, out=out))
            tg = time_ms_graph(lambda: gt.gemm(a, b, out=out))
            ts = time_ms_graph(lambda: gs.gemm_sm90(a, b, out=out))
            tc2 = time_ms_graph(lambda: torch.matmul(a, b, out=out))
            tc = min(tc, tc2)
            rule = gc.sm90_config_for(M, N, K)
            print(f"{str(dtype)[6:]:8s} {M:5d}x{N:5d}x{K:5d} {rule:14s} cublas {tc * 1e3:8.1f} us  "
                  f"gemm() {tc / tg:6.3f}x  gemm_sm90 {tc / ts:6.3f}x  {'ok' if ok else 'WRONG'} {err:.1e}", flush=True)
            del a, b, out, ref


if __name__ == "__main__":
    import sys

    names = {"bf16": torch.bfloat16, "fp16": torch.float16}
    main([names[a] for a in sys.argv[1:]] or list(names.values()))
