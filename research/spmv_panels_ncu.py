"""Driver for Nsight Compute on the panels kernel (uniform matrix): builds the matrix and the panels
for one config (as many panels as clusters of its size fit), runs it 3 times.
ncu --clock-control none --kernel-name regex:spmv_panels --launch-skip 1 --launch-count 1 --set full \\
    python3 research/spmv_panels_ncu.py NT CL U [plain]
(``plain``: without rounds, every add atomic.)
"""
import sys

import torch

from tilewise.bench.suites import spmv as suite
from tilewise.ops.spmv import api as op
from tilewise.ops.spmv import kernels as kn

args = sys.argv[1:] or ["1024", "2", "8"]
cfg = tuple(int(v) for v in args[:3])
rounds = "plain" not in args
A = suite.make_matrix("uniform", seed=0)
M, N = A.shape
x = torch.randn(N, device="cuda")
fit = kn.clusters_fit(torch.cuda.current_device(), cfg[1])
Pn = op.Panels.from_csr(A, rows=-(-M // fit), cluster=cfg[1], rounds=rounds)
y = torch.empty(M, device="cuda")
for _ in range(3):
    op.panels(Pn, x, y, config=cfg)
torch.cuda.synchronize()
print("panels", cfg, "rounds", rounds, "P", Pn.panels, "rows", Pn.rows)
