"""Host time of one gemm_sm90 call, plain launch (cuLaunchKernel) against the programmatic dependent
launch (cuLaunchKernelEx with a cached launch configuration), and gemm()'s planned call, beside
torch.matmul: back-to-back calls, no sync between them (bench.harness.host_us_per_call), on small
products where the host sets the pace.

Why: the full bench at ebebb31 had gemm_sm90's eager rows at 1000^3 3x slower than gemm()'s, with
compute-sanitizer running on the other GPU of the host; this separates the launch path's own cost
from that contention. Prediction, written before the run: the Ex launch within +-1 us of the plain
one (one more Python-level struct per call, cached); gemm_sm90's checked call ~10-15 us, gemm()'s
planned call ~8-10 us, torch.matmul ~5 us.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_host.py
"""
import torch

from tilewise.bench.harness import host_us_per_call
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import api as gt
from tilewise.ops.gemm.configs import GemmPolicy


def main():
    print(torch.cuda.get_device_name(), flush=True)
    for m, n, k in ((1000, 1000, 1000), (512, 512, 512), (1024, 1024, 16384)):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        row = {"torch.matmul": host_us_per_call(lambda: torch.matmul(a, b, out=out), calls=1000, repeats=7)}
        for pdl in (False, True):
            policy = GemmPolicy(pdl=pdl)
            row[f"gemm_sm90 pdl={int(pdl)}"] = host_us_per_call(lambda: gs.gemm_sm90(a, b, out=out, pdl=pdl),
                                                                calls=1000, repeats=7)
            row[f"gemm() pdl={int(pdl)}"] = host_us_per_call(lambda: gt.gemm(a, b, out=out, policy=policy), calls=1000,
                                                             repeats=7)
        print(f"{m}x{n}x{k} fp16 host us/call: " + ", ".join(f"{k_} {v:.1f}" for k_, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
