"""Why does gemm()'s tf32 run at 0.24x cuBLAS (4096^3, logs/bench-gemm-triton-full-a1ec8eb)? The
Triton kernels compile to wgmma m64n128k8 tf32 (PTX checked on the CPU), but wgmma takes tf32
operands from shared memory K-major only: B given (K, N) with unit-stride rows is N-major, so
Triton has to re-lay it out in the K loop. Here the same product with B row-major and with B as
w.T (K-major: a (N, K) tensor's transpose), each variant beside cuBLAS (TF32 on), interleaved
graph-replayed rounds, checked against float64.
Prediction, written before the run: K-major B >= 3x faster than row-major B in every variant; a
transposing copy of B (64 MB at 4096^2 fp32, ~30 us) is then worth it for row-major B.
First run (f989096, logs/gemm-tf32-layout-f989096): K-major B 395-427 us (0.94-1.015x cuBLAS)
against row-major 1,593-2,054 us (0.20-0.25x), as predicted; torch's transposing copy_ took 128 us,
so gemm() now uses tilewise's transpose for it (its row "gemm row" includes that copy).
Run on the GPU: PYTHONPATH=src python3 research/gemm_tf32_layout.py
"""
import torch
from _timing import warm_clocks
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report

from tilewise.ops.gemm import api as gt


def main():
    warm_clocks()
    n = 4096
    g = torch.Generator(device="cuda").manual_seed(4)
    a = torch.randn(n, n, device="cuda", generator=g)
    b_row = torch.randn(n, n, device="cuda", generator=g)
    b_k = b_row.t().contiguous().t()  # the same values, K-major
    out = torch.empty(n, n, device="cuda")
    ref = a.double() @ b_row.double()
    torch.backends.cuda.matmul.allow_tf32 = True
    graphs = {"cublas": graph_of(lambda: torch.matmul(a, b_row, out=out)),
              "cublas kmajor": graph_of(lambda: torch.matmul(a, b_k, out=out))}
    for label, b in (("row", b_row), ("kmajor", b_k)):
        for name in ("gemm", "v1_tiled", "v3_tma_persistent"):
            fn = (lambda b=b: gt.gemm(a, b, out=out)) if name == "gemm" else \
                (lambda b=b, name=name: gt.gemm(a, b, out=out, variant=name))
            graphs[f"{name} {label}"] = checked_graph(fn, out, ref, (name, label))
    graphs["transpose B copy"] = graph_of(lambda: b_k.copy_(b_row))
    rounds_report(graphs, 5, f"tf32 {n}^3", 24)


if __name__ == "__main__":
    main()
