"""Bias forward, two batch elements a program sharing each bias tile (attention's _fwd_bias_pair)
against the one-element kernel (batch-fastest grid) and SDPA cuDNN, same run. B=4 H=16 S=4096
and B=2 H=16 S=8192, D = 64, bf16, a (1, H, S, S) bias, non-causal (the bench's bias rows).

Before (bench 38046a9): D = 64 bias forward 0.953 ms at S = 4096 (1.16x cuDNN), 1.19x at S = 8192;
without bias 0.634 ms: the bias costs 0.32 ms for 2.15 GB read from L2 (batch-fastest grid: each
bias tile from DRAM once, then from L2 by the other B - 1 programs) through a load Triton does
not pipeline.
Prediction: halving the bias reads halves that: ~0.79 ms at S = 4096 (~1.4x cuDNN), if the two
accumulators fit (sm_90 build, Triton 3.6: 252 registers at 64 x 64 x 4 warps, no spill).

Run 1 (9ee77eb+pair, logs/attention-bias-pair.log): prediction wrong. S = 4096: one-element kernel
0.901 ms (1.14x cuDNN), best pair tile 128 x 64 x 8 x 3 0.971 ms (the 64 x 64 x 4 tiles 1.05-1.25
ms); S = 8192: 1.975 against 1.911 (1.03x). The quick bench with the pair kernel at 128 x 64 x 8 x 3
(logs/bench-attention-bias-pair-128x64x8x3.log): 1.15x cuDNN, as without it. Left opt-in.

Prints one line per tile and "BEST bm,bn,warps,stages" (the fastest at S = 4096). Run on the GPU:
PYTHONPATH=src python3 research/attention_bias_pair.py
"""

import torch
from triton.testing import do_bench

from _timing import bias_attention_case
from tilewise.ops.attention import api as A

TILES = [(64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3), (64, 32, 4, 3), (128, 32, 8, 3)]


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    best = {}
    for B, S in ((4, 4096), (2, 8192)):
        H, D = 16, 64
        q, k, v, bias, ref, t_cudnn, flops = bias_attention_case(B, H, S, D, g, bench)
        # v3's pointer bias forwards (not v5, not the TMA bias kernel): one element a program, or the pair kernel.
        single = A.default_policy(q, k, bias=bias).replace(forward="pointer", bias_tma=False, bias_pair=False)
        t_single = bench(lambda: A.flash_attention(q, k, v, bias=bias, policy=single))
        print(f"B={B} S={S} D={D}: cuDNN {t_cudnn:.4f} ms; one-element kernel {t_single:.4f} ms "
              f"({t_cudnn / t_single:.3f}x cuDNN)", flush=True)
        for tile in TILES:
            pair = single.replace(bias_pair=True, tiles={"fwd_bias_pair": tile})
            try:
                out = A.flash_attention(q, k, v, bias=bias, policy=pair)
            except Exception as e:  # a tile that does not build: say so, go on
                print(f"  pair {tile}: failed ({type(e).__name__}: {str(e)[:120]})")
                continue
            err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
            t = bench(lambda: A.flash_attention(q, k, v, bias=bias, policy=pair))
            print(f"  pair {tile} {t:.4f} ms {flops / t / 1e9:4.0f} TFLOP/s {t_cudnn / t:.3f}x cuDNN "
                  f"{t_single / t:.3f}x one-element  rel err vs cuDNN {err:.1e}", flush=True)
            if S == 4096 and err < 1e-2:
                best[tile] = t
    if best:
        print("BEST " + ",".join(map(str, min(best, key=best.get))))


if __name__ == "__main__":
    main()
