"""gemm_sm90 variants at the 1000-class sizes, timed in interleaved rounds so clock and order
drift fall on every variant alike: each variant's 20 calls captured in one CUDA graph, the graphs
replayed round-robin (ROUNDS rounds x 3 replays), the median per variant; cuBLAS and gemm() in
the same rounds. Why: single passes moved cuBLAS itself by 15 % at 1000^3 (8.82 then 7.66 us,
logs/gemm-sm90-epilogue-6330a26.log), more than the changes being judged.

Also 1024^3, where cuBLAS takes 5.7 us against 7.7 at 1000^3 (2,000-byte rows: every other 128-byte
row of a TMA box spans two cache lines) and Triton's gemm() 5.9 us against gemm_sm90's 7.4.
At 1536-4096 (BIG): the routed config with and without TW_EARLY_LOCAL / TW_TMA_STORE.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_rounds.py [n ...]
"""
import statistics
import sys

import torch
from _timing import warm_clocks

from tilewise.bench import harness
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import api as gt

OPTIONS = {"default": (), "early": ("-DTW_EARLY_LOCAL",), "tma": ("-DTW_TMA_STORE",),
           "early+tma": ("-DTW_EARLY_LOCAL", "-DTW_TMA_STORE")}
VARIANTS = [("64x128_c2x1", "default"), ("64x128_c2x1", "early"), ("64x128_c2x1", "tma"),
            ("64x128_c2x1", "early+tma"), ("128x64_c1x2", "early+tma"), ("128x128_c2x1", "early+tma")]
# larger sizes: the config gemm() routes there (or would), with and without the bulk-store epilogue
BIG = {1536: "192x96_c1x2", 2048: "128x128_c2x1", 3072: "128x192_c2x1", 4096: "128x256_c2x1"}
ROUNDS, CALLS = 7, 20


def graph_of(fn):
    """fn's CALLS calls in one CUDA graph (the bench harness's capture)."""
    return harness.graph_of(fn, CALLS)


def replay_us(g):
    return harness.replay_ms(g, CALLS) * 1e3


def square_operands(n, dtype):
    """a, b (n x n, seeded by n), an out of the same shape, and the float64 product."""
    g = torch.Generator(device="cuda").manual_seed(n)
    a = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
    return a, b, torch.empty(n, n, device="cuda", dtype=dtype), a.double() @ b.double()


def checked_graph(fn, out, ref, label):
    """fn() into a NaN-poisoned out, checked against the float64 ref, then its graph."""
    out.fill_(float("nan"))
    fn()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert out.isfinite().all() and err < 1e-2, (label, err)
    return graph_of(fn)


def rounds_report(graphs, rounds, prefix, width):
    """Replay the graphs round-robin (rounds x 3 replays each) and print each one's median against
    the "cublas" entry's."""
    samples = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, gr in graphs.items():
            for _ in range(3):
                samples[k].append(replay_us(gr))
    tc = statistics.median(samples["cublas"])
    for k, v in samples.items():
        t = statistics.median(v)
        print(f"{prefix} {k:{width}s} {t:7.2f} us  {tc / t:.3f}x cublas  (min {min(v):.2f}, max {max(v):.2f})",
              flush=True)


def main():
    sizes = [int(x) for x in sys.argv[1:]] or [1000, 1024]
    warm_clocks()
    for n in sizes:
        for dtype in (torch.bfloat16, torch.float16):
            a, b, out, ref = square_operands(n, dtype)
            graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out)),
                      "gemm()": graph_of(lambda: gt.gemm(a, b, out=out))}
            variants = VARIANTS if n not in BIG else [(BIG[n], "early"), (BIG[n], "early+tma"),
                                                          (BIG[n], "default"), (BIG[n], "tma")]
            for name, label in variants:
                options = gs.DEFAULT_COMPILE_OPTIONS + OPTIONS[label]
                graphs[f"{name} {label}"] = checked_graph(
                    lambda: gs.gemm_sm90(a, b, out=out, config=name, compile_options=options), out, ref, (name, label))
            rounds_report(graphs, ROUNDS, f"{str(dtype)[6:]:8s} {n}^3", 24)
            del graphs


if __name__ == "__main__":
    main()
