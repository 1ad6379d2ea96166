"""Does a TMA-pipelined cluster kernel (v7) bring the long-row softmax forward to the copy ceiling?

bf16 softmax forward over 4096 x 131072 (one read, one write of 1 GiB each). v5_cluster_cuda holds
a row slice in registers: each CTA loads, reduces, waits at the cluster barrier and stores in turn,
and the SM's CTAs move in step, so the memory pipe idles through the exp pass and the barrier:
73.1 % of copy on the H200 (2659856). v7 (rowwise_cluster.cu, rc_softmax_fwd_tma) fetches each
CTA's slice with one bulk copy (TMA) into one of S shared-memory stages, S - 1 rows ahead, and
does one cluster barrier a row.

Prediction (written before the first run): per SM a 16384-element slice costs ~0.5 us of ALU and
~0.5 us of exp against ~2 us of memory at the SM's share of copy bandwidth, so once the loads run
ahead the kernel is memory-bound: >= 85 % of copy (<= 0.593 ms), >= 1.8x torch.softmax.

Every configuration is checked against a float64 reference first (softmax and log-softmax, poisoned
output), then timed beside copy, torch.softmax, torch.compile, v5 and v6 in the same run.
Run on the GPU (< 1 minute): PYTHONPATH=src python3 research/softmax_tma.py
"""

import torch
from triton.testing import do_bench

from _timing import softmax_case
from tilewise.ops.rowwise import cluster as rc
from tilewise.ops.rowwise import softmax as sm


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def rel(a, b):
    fin = torch.isfinite(b)
    a, b = torch.where(fin, a.double(), 0), torch.where(fin, b.double(), 0)
    return ((a - b).norm() / b.norm()).item()


def main():
    x, y, nbytes, copy = softmax_case(bench)
    M, N = x.shape
    gbs = lambda ms: nbytes / ms / 1e6  # noqa: E731
    t_torch = bench(lambda: torch.softmax(x, -1))
    comp = torch.compile(lambda t: torch.softmax(t, -1))
    comp(x)
    t_comp = bench(lambda: comp(x))
    print(f"softmax fwd {M}x{N} bf16: copy {gbs(copy):.0f} GB/s ({copy:.4f} ms); torch.softmax {gbs(t_torch):.0f} "
          f"({t_torch:.4f} ms); torch.compile {gbs(t_comp):.0f}")
    xs = x[:64]
    refs = {log: sm.reference(xs.double(), log) for log in (False, True)}
    rows = [("v5_cluster_cuda", lambda: sm.VARIANTS["v5_cluster_cuda"](x, y)),
            ("v6_cluster_pipe", lambda: sm.VARIANTS["v6_cluster_pipe"](x, y))]
    for cfg in rc.TMA_CONFIGS[("fwd", 2)]:
        errs = []
        for log in (False, True):
            ys = torch.full_like(xs, float("nan"))
            rc.softmax_fwd_tma(xs, ys, log, config=cfg)
            errs.append(rel(ys, refs[log]))
        y.fill_(float("nan"))
        rc.softmax_fwd_tma(x, y, False, config=cfg)
        errs.append(rel(y[-64:], sm.reference(x[-64:].double())))
        ok = all(e < 1e-2 for e in errs)
        print(f"  v7 {cfg}: rel err softmax {errs[0]:.1e} log {errs[1]:.1e} last rows {errs[2]:.1e}"
              f"{'' if ok else '  FAILED, not timed'}")
        if ok:
            rows.append((f"v7 {cfg}", lambda cfg=cfg: rc.softmax_fwd_tma(x, y, False, config=cfg)))
    for name, fn in rows:
        ms = bench(fn)
        print(f"  {name:28s} {ms:.4f} ms  {gbs(ms):5.0f} GB/s = {100 * copy / ms:5.1f} % of copy  "
              f"{t_torch / ms:.2f}x torch  {t_comp / ms:.2f}x compile")


if __name__ == "__main__":
    main()
