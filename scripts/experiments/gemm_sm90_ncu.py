"""Driver for Nsight Compute on gemm_sm90: one square size, one config, three calls.
ncu --clock-control none --kernel-name regex:gemm_sm90 --launch-skip 2 --launch-count 1 --set full \\
    python3 scripts/experiments/gemm_sm90_ncu.py N CONFIG [K] [cublas]
(K defaults to N; ``cublas``: run torch.matmul on the same operands instead, for its kernel.)
"""
import sys

import torch

from tilewise.ops import gemm_sm90 as gs

n, name = int(sys.argv[1]), sys.argv[2]
k = int(sys.argv[3]) if len(sys.argv) > 3 else n
g = torch.Generator(device="cuda").manual_seed(n)
a = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g)
out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    if "cublas" in sys.argv:
        torch.matmul(a, b, out=out)
    else:
        gs.gemm_sm90(a, b, out=out, config=name)
torch.cuda.synchronize()
print(n, name, "done")
