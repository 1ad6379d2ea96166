"""Which gemm_sm90 tile for large 16-bit products, against gemm() (Triton) and cuBLAS, in
interleaved graph-replayed rounds, each variant checked against float64 on a NaN-poisoned output.

Why: route_big (logs/gemm-sm90-route_big-abb1f38) had gemm_sm90's 128 x 256 tile 1-4 % ahead of
gemm() at 3584^3, 4096^3, 4096 x 4096 x 1024 and 2048 x 8192 x 2048 in both dtypes, but the tile
rule (config_for, a wave-fill score) picked 64 x 128 at 6144^3 (0.60x cuBLAS) and 192 x 96 at
2560^3 (0.85x against gemm()'s 0.94-0.96x): a fill score alone prefers small tiles whenever they
fill the last wave better, though a small tile's K loop runs the tensor cores at half speed
(the fourteenth session's no-load stamps: 64 x 128 557 cycles a K block against 256 at peak).
Prediction, written before the run: 128x256_c2x1 >= gemm() by 2-4 % wherever its tiles fill
three or more waves at >= 90 %; 128 x 192 ahead of 128 x 256 where 128 x 256's waves are
less full (2560, 3072); both >= 0.97x cuBLAS from 3584 up.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_big_tiles.py bf16|fp16
"""
import sys

import torch
from _timing import warm_clocks
from gemm_sm90_feed import operands
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import api as gt

SHAPES = [(2304,) * 3, (2560,) * 3, (3000,) * 3, (3072,) * 3, (3584,) * 3, (4096,) * 3, (5000,) * 3,
          (5120,) * 3, (6144,) * 3, (7168,) * 3, (8192,) * 3, (4096, 4096, 1024), (2048, 8192, 2048),
          (8192, 2048, 4096), (8192, 4096, 1024), (4096, 14336, 4096)]
TILES = ["128x256_c2x1", "128x192_c2x1", "128x192_c1x2", "128x128_c2x1"]


def waves(name, m, n, sms):
    c = gc.SM90_CONFIGS[name]
    tiles = -(-m // c.bm) * -(-n // c.bn)
    w = -(-tiles // sms)
    return f"{tiles} tiles {w} waves {tiles / (w * sms):.2f}"


def run_case(m, n, k, dtype, sms):
    a, b, out, ref = operands(m, n, k, dtype, m + n + k)
    rule = gc.sm90_config_for(m, n, k, sms)
    graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out)),
              "gemm()": checked_graph(lambda: gt.gemm(a, b, out=out), out, ref, "gemm()")}
    for name in TILES + ([rule] if rule not in TILES else []):
        graphs[name + (" (rule)" if name == rule else "")] = checked_graph(
            lambda name=name: gs.gemm_sm90(a, b, out=out, config=name), out, ref, name)
    label = f"{str(dtype)[6:]:8s} {m}x{n}x{k}"
    print(label, "; ".join(f"{t}: {waves(t, m, n, sms)}" for t in TILES), flush=True)
    rounds_report(graphs, 5, label, 20)


def main():
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[sys.argv[1]]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    warm_clocks()
    for m, n, k in SHAPES:
        run_case(m, n, k, dtype, sms)  # its operands and graphs go when it returns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
