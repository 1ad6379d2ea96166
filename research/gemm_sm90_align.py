"""Do rows that are not whole 128-byte lines cost gemm_sm90 its large-square speed? 5000^3 ran
0.78x cuBLAS in 128 x 256 tiles against 0.91x at 5120^3 (logs/gemm-sm90-big-tiles-*-7f6b697),
though it has 5 % fewer FLOPs; cuBLAS ran 5000^3 at 718 TFLOP/s, its full rate. Here the same
products with A and B as views of buffers whose rows are padded to a multiple of 64 elements (128
bytes), beside the packed ones, cuBLAS on the same views, interleaved graph-replayed rounds.
Prediction, written before the run: padded 5000^3 within 3 % of 5120^3's time scaled by FLOPs
(~400 us); packed stays ~445 us: the misaligned rows cost ~10 %, the 25 % more L2 sectors a
128-byte row segment touches.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_align.py
"""
import torch
from _timing import warm_clocks
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc

SIZES = [5000, 4992, 5120, 3000, 1000]


def view(rows, cols, ld, dtype, g):
    buf = torch.randn(rows, ld, device="cuda", dtype=dtype, generator=g)
    return buf[:, :cols]


def run(n, dtype):
    g = torch.Generator(device="cuda").manual_seed(n)
    cfg = gc.sm90_route_for(n, n, n) or gc.sm90_config_for(n, n, n)
    graphs = {}
    keep = []  # a graph replays on these addresses: they live until the rounds are done
    pad = -(-n // 64) * 64
    for label, ld in (("packed", n), ("padded", pad)):
        if label == "padded" and pad == n:
            continue
        a, b = view(n, n, ld, dtype, g), view(n, n, ld, dtype, g)
        out = torch.empty(n, n, device="cuda", dtype=dtype)
        ref = a.double() @ b.double()
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        keep += [a, b, out, c]
        if not graphs:
            graphs["cublas"] = graph_of(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c))
        else:
            graphs[f"cublas {label}"] = graph_of(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c))
        graphs[f"{cfg} {label}"] = checked_graph(lambda a=a, b=b, out=out: gs.gemm_sm90(a, b, out=out, config=cfg),
                                                 out, ref, (n, label))
        del ref
    rounds_report(graphs, 5, f"{str(dtype)[6:]:8s} {n}^3", 24)


def main():
    warm_clocks()
    for n in SIZES:
        for dtype in (torch.bfloat16, torch.float16):
            run(n, dtype)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
