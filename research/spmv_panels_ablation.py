"""Which part of the panels kernel sets its time on the uniform matrix (2M x 2M, 32 random columns a
row)? The library kernel's loop with one part changed (spmv_panels_ablation.cu, MODE 0-4: the real
loop, a plain racy add instead of the shared-memory atomic, no shared memory at all, no gather, an
atomic without bank conflicts), at several panel shapes (panels x CTAs a cluster) and unrolls,
beside the library's panels kernel and jds, one run. Prints microseconds and the share of the
same run's copy bandwidth at the bytes floor (the issue's measure).
Run on the GPU: PYTHONPATH=src python3 research/spmv_panels_ablation.py
"""
from pathlib import Path

import torch
from triton.testing import do_bench

from tilewise.bench.suites import spmv as suite
from tilewise.ops.spmv import api as op
from tilewise.ops.spmv import configs as cf
from tilewise.ops.spmv import kernels as kn
from tilewise.runtime import cuda as rt
from tilewise.runtime.device import measure_copy_gbps

SRC = Path(__file__).with_suffix(".cu")
MODES = {0: "atomic (library)", 1: "racy add, no atomic", 2: "no shared memory", 3: "no gather", 4: "atomic, no conflicts"}


def bench(fn):
    return do_bench(fn, warmup=5, rep=40, return_mode="median")


def main():
    names = rt.name_expressions_for(SRC)
    mod = rt.load(SRC, names)
    params = [rt.Tensor("key", (torch.int32,)), rt.Tensor("val", (torch.float32,)),
              rt.Tensor("chunk_col0", (torch.int32,)), rt.Tensor("panel_chunk", (torch.int32,)),
              rt.Tensor("x", (torch.float32,)), rt.Tensor("y", (torch.float32,)), rt.Scalar("M", "i32"),
              rt.Scalar("R", "i32")]
    copy = measure_copy_gbps(1 << 30)
    A = suite.make_matrix("uniform", seed=0)
    M, N = A.shape
    x = torch.randn(N, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    ref = op.reference(A.row_ptr, A.col, A.val, x)
    floor = op.cost(M, N, A.nnz).bytes
    pct = lambda ms: 100 * floor / ms / 1e6 / copy  # noqa: E731
    y = torch.empty(M, device="cuda")
    J = op.JDS.from_csr(A)
    t = bench(lambda: op.jds(J, x, y))
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s; jds {t * 1e3:.1f} us {pct(t):.1f} %")
    del J
    kernels = {}
    for n in names:
        nt, cl, u, mode = (int(v) for v in n[n.index("<") + 1:-1].split(","))
        kernels.setdefault((nt, cl), []).append((u, mode, n))
    for (nt, cl), ks in sorted(kernels.items()):
        fit = kn.clusters_fit(torch.cuda.current_device(), cl)
        per_sm = 2 if nt == 512 else 1
        for n_p in (fit * per_sm, fit * per_sm * 3 // 4):
            rows = -(-M // n_p)
            if rows * 4 * per_sm > cf.PANEL_MAX_ROWS * 4:
                print(f"NT {nt} CL {cl} P {n_p}: {rows} rows do not fit")
                continue
            Pn = op.Panels.from_csr(A, rows=rows, cluster=cl, rounds=False)  # the layout these kernels read
            for u, mode, n in sorted(ks):
                k = mod.kernel(n, params)
                k.set_max_dynamic_shared(cf.PANEL_MAX_ROWS * 4)
                run = lambda: k(Pn.panels * cl, nt, Pn.key, Pn.val, Pn.chunk_col0, Pn.panel_chunk, x, y, M, rows,  # noqa: E731
                                shmem=rows * 4)
                y.fill_(float("nan"))
                run()
                err = float((y.double() - ref).norm() / ref.norm())
                t = bench(run)
                lib = ""
                if mode == 0 and (nt, cl, u) in cf.PANEL_CONFIGS:
                    tl = bench(lambda: op.panels(Pn, x, y, config=(nt, cl, u)))
                    lib = f"  library kernel {tl * 1e3:.1f} us"
                print(f"NT {nt:4d} CL {cl} U {u:2d} P {Pn.panels:3d} rows {rows:5d} {MODES[mode]:22s} {t * 1e3:7.1f} us "
                      f"{pct(t):5.1f} %  err {err:.1e}{lib}", flush=True)
            del Pn


if __name__ == "__main__":
    main()
