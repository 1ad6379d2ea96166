"""Which kernel does cuBLAS run for the square bf16 sizes where gemm(auto) trails it (issue 5:
1000, 1536, 2304, 3072 at 0.65-0.85x) and where it does not (2048, 4096, 8192)? torch.profiler
gives each launch's kernel name (CUTLASS-style names carry the tile, the cluster shape and
whether stream-K is on) and its device time; our gemm(auto) runs beside it for the same shapes.
Run: PYTHONPATH=src python3 research/cublas_kernels.py
"""

import torch

from tilewise.ops.gemm import api as G

from _timing import profiled

SIZES = [1000, 1536, 2048, 2304, 3072, 4096, 8192]


def kernels(fn, reps=5):
    prof = profiled(fn, reps, warmup=3)
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n, t = out.get(e.name, (0, 0.0))
            out[e.name] = (n + 1, t + e.device_time)
    return {k: (n // reps, t / reps) for k, (n, t) in out.items()}


def main():
    for n in SIZES:
        g = torch.Generator(device="cuda").manual_seed(n)
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        for who, fn in (("cublas", lambda: torch.matmul(a, b, out=out)), ("gemm(auto)", lambda: G.gemm(a, b, out=out))):
            for name, (cnt, us) in kernels(fn).items():
                print(f"{n:5d} {who:10s} {us:8.2f} us  x{cnt}  {name[:200]}")


if __name__ == "__main__":
    main()
