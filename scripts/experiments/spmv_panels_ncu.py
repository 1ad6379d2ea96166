"""Driver for Nsight Compute on the panels kernel (uniform matrix): builds the matrix and two panel
shapes (132 panels x 1 CTA, as many 3-CTA clusters as fit), runs each config 3 times.
ncu --clock-control none --kernel-name regex:spmv_panels --launch-skip 1 --launch-count 1 --set full \\
    python3 scripts/experiments/spmv_panels_ncu.py 1024,1,4
"""
import sys

import torch

from tilewise.bench.suites import spmv as suite
from tilewise.ops import spmv as op

cfg = tuple(int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1024,1,4").split(","))
A = suite.make_matrix("uniform", seed=0)
M, N = A.shape
x = torch.randn(N, device="cuda")
fit = op._clusters_fit(torch.cuda.current_device(), cfg[1])
Pn = op.Panels.from_csr(A, rows=-(-M // fit), cluster=cfg[1])
y = torch.empty(M, device="cuda")
for _ in range(3):
    op.panels(Pn, x, y, config=cfg)
torch.cuda.synchronize()
print("panels", cfg, "P", Pn.panels, "rows", Pn.rows)
