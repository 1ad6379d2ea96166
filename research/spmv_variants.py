"""Which SpMV kernel, at which setting, is fastest on each matrix of the bench suite? One run over
the library's kernels (tilewise/ops/spmv/spmv.cu) on the full-size suite matrices
(tilewise/bench/suites/spmv.py::make_matrix), beside PyTorch's CSR ``A @ x`` (cuSPARSE), same run.

Timed, each after its output is checked against a float64 reference on a NaN-poisoned y:
  csr_scalar; csr_vector at SUB 2..32; csr_split at its default threshold and at 4096 (the first
  bench run's); csr_stream; csr_merge at every (nt, ipt) of MERGE_CONFIGS (its partition plan built
  first, the build time printed); ell and jds (conversion time printed; ell skipped where it
  refuses); and spmv()'s own pick (``auto``).
Prints one line per run (ms, speed-up over cuSPARSE, GB/s against the bytes floor of cost()), then
per matrix the best kernel and the best csr_merge setting, and a summary table to check choose()
against: its pick's speed-up next to the best one's.
Also prints the copy bandwidth of the same run (1 GiB torch copy: read + write over time) and each
run's share of it at the bytes floor (the issue's "% of the floor's bandwidth").
Run on the GPU (< 2 minutes on an H200):
PYTHONPATH=src python3 research/spmv_variants.py [--only PREFIX[,PREFIX]] [KIND ...]
"""

import sys
import time

import torch
from triton.testing import do_bench

from tilewise.bench.suites import spmv as suite
from tilewise.ops.spmv import api as op
from tilewise.ops.spmv import configs as cf
from tilewise.ops.spmv import kernels as kn
from tilewise.runtime.device import measure_copy_gbps

T0 = time.time()


def bench(fn):
    return do_bench(fn, warmup=5, rep=30, return_mode="median")


def variants(A):
    """(name, format builder or None, call) for every kernel and setting."""
    out = [("csr_scalar", None, op.csr_scalar)]
    for s in (2, 4, 8, 16, 32):
        out.append((f"csr_vector/sub={s}", None, lambda F, x, y, s=s: op.csr_vector(F, x, y, sub=s)))
    default_split = cf.split_len(A.stats.mean)
    for ll in sorted({default_split, cf.LONG_LEN}):
        out.append((f"csr_split/long={ll}", None, lambda F, x, y, ll=ll: op.csr_split(F, x, y, long_len=ll)))
    out.append(("csr_stream", None, op.csr_stream))
    for nt, ipt in cf.MERGE_CONFIGS:
        out.append((f"csr_merge/{nt}x{ipt}", None, lambda F, x, y, nt=nt, ipt=ipt: op.csr_merge(F, x, y, nt=nt, ipt=ipt)))
    out.append(("ell", op.ELL.from_csr, op.ell))
    for c in cf.JDS_CONFIGS:
        out.append((f"jds/{c[0]}x{c[1]}", op.JDS.from_csr, lambda F, x, y, c=c: op.jds(F, x, y, config=c)))
    M = A.shape[0]
    dev = torch.cuda.current_device()
    for cl in sorted(cf.PANEL_DEFAULT):
        fit = kn.clusters_fit(dev, cl)
        for n_p in sorted({fit, max(1, fit * 3 // 4)}, reverse=True):
            rows = -(-M // n_p)
            if rows > cf.PANEL_MAX_ROWS:
                continue
            for c in [c for c in cf.PANEL_CONFIGS if c[1] == cl]:
                for rounds in (0,) + cf.PANEL_ROUNDS:
                    out.append((f"panels/{c[0]}x{c[1]}x{c[2]}/P={-(-M // rows)}{f'/rounds{rounds}' if rounds else ''}",
                                lambda A_, rows=rows, cl=cl, r=rounds: op.Panels.from_csr(
                                    A_, rows=rows, cluster=cl, rounds=bool(r), round_chunks=r or cf.PANEL_ROUND),
                                lambda F, x, y, c=c: op.panels(F, x, y, config=c)))
    out.append(("auto", None, lambda F, x, y: op.spmv(F, x, y)))
    return out


def rel_err(y, ref):
    if not bool(torch.isfinite(y).all()):
        return float("inf")
    return float((y.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def main(kinds, only=None):
    wrong, summary = [], []
    copy = measure_copy_gbps(1 << 30)
    dev = torch.cuda.current_device()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s (same run); clusters of the panels kernel "
          f"resident at once: " + ", ".join(f"{cl}: {kn.clusters_fit(dev, cl)}" for cl in sorted(cf.PANEL_DEFAULT)))
    for kind in kinds:
        t = time.time()
        if kind.startswith("uniform:"):
            g0 = torch.Generator(device="cuda").manual_seed(0)
            A = suite._random_rows(torch.full((2_000_000,), int(kind.split(":")[1]), device="cuda"), 2_000_000, g0)
        else:
            A = suite.make_matrix(kind, seed=0)
        M, N = A.shape
        st = A.stats
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(N, device="cuda", generator=g)
        y = torch.empty(M, device="cuda")
        ref = op.reference(A.row_ptr, A.col, A.val, x)
        floor = op.cost(M, N, A.nnz).bytes
        gbs = lambda ms: floor / ms / 1e6  # noqa: E731
        pct = lambda ms: 100 * gbs(ms) / copy  # noqa: E731
        At = A.to_torch()
        assert rel_err(At @ x, ref) < 1e-4, "torch.sparse disagrees with the reference"
        base = bench(lambda: At @ x)
        pick = cf.choose(st)
        print(f"\n{kind}: {M} x {N}, nnz {A.nnz}, rows mean {st.mean:.1f} max {st.max} std {st.std:.1f} "
              f"empty {st.empty_rows}; choose() -> {pick}  [built in {time.time() - t:.1f} s, {time.time() - T0:.0f} s]")
        print(f"  {'torch.sparse (cuSPARSE)':28s} {base:8.4f} ms  {1.0:6.3f}x  {gbs(base):6.0f} GB/s {pct(base):5.1f} %")
        tiles = sorted({nt * ipt for nt, ipt in cf.MERGE_CONFIGS}) if not only or any(
            o.startswith("csr_merge") or "csr_merge".startswith(o) for o in only) else []
        plans = {tl: op.merge_plan(A, tl) for tl in tiles}
        print("  merge plans: " + ", ".join(f"tile {tl}: {p.build_ms:.2f} ms, {p.n_tiles} tiles, {p.n_seg} straddling rows"
                                            for tl, p in plans.items()))
        times = {}
        for name, build, fn in variants(A):
            if only and name != "auto" and not name.startswith(only):
                continue
            F = A
            if build is not None:
                try:
                    F = build(A)
                except ValueError as e:
                    print(f"  {name:28s} skipped: {str(e)[:80]}")
                    continue
            y.fill_(float("nan"))
            fn(F, x, y)
            err = rel_err(y, ref)
            extra = f"  (conversion {F.build_ms:.2f} ms)" if build is not None else ""
            if err > 1e-5:
                wrong.append((kind, name, err))
                print(f"  {name:28s} WRONG OUTPUT: relative error {err:.2e}")
                continue
            ms = bench(lambda: fn(F, x, y))
            times[name] = ms
            print(f"  {name:28s} {ms:8.4f} ms  {base / ms:6.3f}x  {gbs(ms):6.0f} GB/s {pct(ms):5.1f} %{extra}")
            del F
        ranked = sorted((ms, n) for n, ms in times.items() if n != "auto")
        merge = sorted((ms, n) for n, ms in times.items() if n.startswith("csr_merge"))
        if ranked:
            print(f"  best: {ranked[0][1]} {base / ranked[0][0]:.3f}x; next {[(n, round(base / ms, 3)) for ms, n in ranked[1:4]]}")
        if merge:
            print(f"  best csr_merge: {merge[0][1]} {base / merge[0][0]:.3f}x")
        summary.append((kind, base, pick, times.get("auto"), ranked[0] if ranked else None, merge[0] if merge else None,
                        times.get("csr_split/long=" + str(cf.split_len(st.mean)))))
        del A, At, x, y, ref, plans
        torch.cuda.empty_cache()

    print(f"\n{'matrix':9s} {'cuSPARSE ms':>11s}  {'choose()':12s} {'auto x':>7s}  {'best':26s} {'x':>6s}  "
          f"{'best merge':20s} {'x':>6s}  {'split x':>7s}")
    for kind, base, pick, auto, best, merge, split in summary:
        f = lambda v: f"{base / v:6.3f}" if v else "   -  "  # noqa: E731
        print(f"{kind:9s} {base:11.4f}  {pick:12s} {f(auto):>7s}  {best[1] if best else '-':26s} {f(best[0] if best else None)}  "
              f"{merge[1] if merge else '-':20s} {f(merge[0] if merge else None)}  {f(split):>7s}")
    print(f"\ntotal {time.time() - T0:.0f} s")
    if wrong:
        raise SystemExit(f"{len(wrong)} runs gave wrong output: {wrong}")


if __name__ == "__main__":
    args = sys.argv[1:]
    only = None
    if args[:1] == ["--only"]:
        only, args = tuple(args[1].split(",")), args[2:]
    main(args or list(suite.KINDS), only)
