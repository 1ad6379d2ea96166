"""Programmatic dependent launch in gemm_sm90: the kernel triggers its dependents at its start and
waits (griddepcontrol.wait) after its set-up, before its first global access; the host launches it
with programmatic stream serialization (cuLaunchKernelEx). Interleaved graph-replayed rounds beside
cuBLAS, each variant checked against float64 on a NaN-poisoned output:
- old: the .cu before the change (given on the command line), launched plainly;
- plain: this .cu launched plainly (the two instructions are then no-ops: their own cost);
- pdl: this .cu with the launch attribute.
Two sequences: the GEMM back to back (the bench's graph rows), and each GEMM after a small
elementwise kernel of PyTorch's (a predecessor that never triggers early).

Why: fp16 1000^3 sits at 0.83-0.87x cuBLAS (7.2 us against 8.3), and K = 64 already costs 4.00 us
against cuBLAS's 3.49: a fixed cost per call. With a 20-call graph each call waits for the last
one's grid to finish before its own CTAs are even placed; under PDL they are placed and set up
while it drains.
Prediction, written before the run: pdl 0.3-0.8 us off every back-to-back call (1000^3 fp16 8.3 ->
7.6-8.0 us, 0.90-0.95x), less in relative terms at 3072 / 4096; plain within +-1 % of old; after
PyTorch's kernel 0-0.3 us.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_pdl.py OLD.cu
"""
import sys

import torch
from _timing import warm_clocks
from gemm_sm90_ab_old import old_launcher
from gemm_sm90_feed import operands
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc

SHAPES = [(1000, 1000, 1000, "64x128_c2x1"), (1000, 1000, 64, "64x128_c2x1"), (1536, 1536, 1536, "192x96_c1x2"),
          (3072, 3072, 3072, "128x192_c2x1"), (4096, 4096, 4096, "128x256_c2x1"), (5000, 5000, 5000, "128x256_c2x1")]


def shape(old_path, m, n, k, name, dtype):
    a, b, out, ref = operands(m, n, k, dtype, m + k)
    cfg = gc.SM90_CONFIGS[name]
    old = old_launcher(old_path, cfg, dtype, maps=3, tail_args=True)  # launched plainly, no tail
    x = torch.randn(1 << 16, device="cuda")
    y = torch.empty_like(x)

    def ours(pdl):
        def f():
            return gs.gemm_sm90(a, b, out=out, config=name, pdl=pdl)
        return f

    for after in (False, True):
        def seq(fn):
            if not after:
                return fn

            def g():
                torch.add(x, 1.0, out=y)
                return fn()
            return g
        graphs = {"cublas": graph_of(seq(lambda: torch.matmul(a, b, out=out)))}
        # (the old launcher passes no tail: at 5000^3 "old" runs seven whole waves)
        graphs["old"] = checked_graph(seq(lambda: old(a, b, out)), out, ref, "old")
        graphs["plain"] = checked_graph(seq(ours(False)), out, ref, "plain")
        graphs["pdl"] = checked_graph(seq(ours(True)), out, ref, "pdl")
        rounds_report(graphs, 7, f"{str(dtype)[6:]:8s} {m}x{n}x{k} {'after add' if after else 'back to back'}", 8)
    torch.cuda.empty_cache()


def main():
    old_path = sys.argv[1]
    print(torch.cuda.get_device_name(), flush=True)
    warm_clocks()
    for m, n, k, name in SHAPES:
        for dtype in (torch.float16, torch.bfloat16):
            shape(old_path, m, n, k, name, dtype)


if __name__ == "__main__":
    main()
