"""Driver for Nsight Compute on gemm_sm90: one square size, one config, three calls.
ncu --clock-control none --kernel-name regex:gemm_sm90 --launch-skip 2 --launch-count 1 --set full \\
    python3 research/gemm_sm90_ncu.py N CONFIG [K] [cublas] [fp16]
(K defaults to N; ``cublas``: run torch.matmul on the same operands instead, for its kernel;
``fp16``: float16 operands instead of bfloat16; TW_OPTS="-DA -DB": the kernel's compile switches.)
"""
import os
import sys

import torch

from tilewise.ops.gemm import sm90 as gs

options = gs.DEFAULT_COMPILE_OPTIONS + tuple(os.environ.get("TW_OPTS", "").split())
dtype = torch.float16 if "fp16" in sys.argv else torch.bfloat16

n, name = int(sys.argv[1]), sys.argv[2]
k = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else n
g = torch.Generator(device="cuda").manual_seed(n)
a = torch.randn(n, k, device="cuda", dtype=dtype, generator=g)
b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
out = torch.empty(n, n, device="cuda", dtype=dtype)
for _ in range(3):
    if "cublas" in sys.argv:
        torch.matmul(a, b, out=out)
    else:
        gs.gemm_sm90(a, b, out=out, config=name, compile_options=options)
torch.cuda.synchronize()
print(n, name, "done")
