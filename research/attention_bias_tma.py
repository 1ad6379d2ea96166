"""Bias forward through v4's TMA kernel (attention's _BIAS_FWD["tma"], the default where it applies)
against the pointer kernel (v3, bias by a masked add), and SDPA cuDNN, same run. B=4 H=16 S=4096 and
B=2 H=16 S=8192, D in {64, 128}, bf16, a (1, H, S, S) bias of q's dtype, non-causal (the bench's
bias rows); tiles swept.

Why: the pointer kernel's bias tile is a masked load, and Triton's pipeliner leaves it synchronous
(every key tile waits for it; K and V arrive num_stages ahead). A tensor-descriptor load that feeds
no dot is pipelined (sm_90 TTGIR, Triton 3.6: the bias among the TMA copies, 19 against 13 without
it at 3 stages; no spill at any tile below). The identity-product route (_BIAS_FWD["via_dot"]) got
the prefetch too but paid a third MMA: 0.925x the add at D = 64 (logs/attention-bias-dot.log).

Before (c6268aa, same script's first case): D = 64 bias by add 0.980 ms against the plain forward's
0.637, cuDNN 1.041 (1.06x); D = 128 1.431 against 1.143, cuDNN 1.770 (1.24x).
Prediction: the bias read (537 MB at S = 4096, from DRAM once with the batch-fastest grid, ~0.14 ms
at 4 TB/s) overlaps the math: D = 64 ~0.72 ms (~1.45x cuDNN), D = 128 ~1.22 ms (~1.45x).

Prints one line per case and tile, and "BEST D bm,bn,warps,stages" (the least sum over S = 4096 and
8192 of the tile's time over the pointer kernel's).
Measured (beeaf9c, logs/attention-bias-tma.log): D = 64 S = 4096 64 x 64 x 4 x 3 0.848 ms against
the pointer kernel's 0.853 (128 x 64 x 8 x 3: 0.853); S = 8192 128 x 64 x 8 x 3 1.818 against 1.996
(64 x 64: 1.941); D = 128 128 x 64 x 8 x 3 0.99-1.01x; 4-stage and 64 x 128 tiles 10-30 % slower.
Re-run after the scale fold (767ce4a) with the short list above: logs/attention-bias-tma-fold.log.
Prediction for the re-run: 128 x 64 x 8 x 3 wins the sum at D = 64 (S = 8192 ~6 % faster than
64 x 64, S = 4096 within 1 %), and would take the S = 8192 row from 1.24x to ~1.3x cuDNN.

Run on the GPU (~1 minute): PYTHONPATH=src python3 research/attention_bias_tma.py
"""

import torch
from triton.testing import do_bench

from _timing import bias_attention_case
from tilewise.ops.attention import api as A

TILES = {64: [(64, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 2), (128, 64, 8, 2)],
         128: [(128, 64, 8, 3), (128, 128, 8, 2)]}


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    best = {}
    for D in (64, 128):
        for B, S in ((4, 4096), (2, 8192)):
            H = 16
            q, k, v, bias, ref, t_cudnn, flops = bias_attention_case(B, H, S, D, g, bench)
            # Forward "pointer" (not v5): bias_tma picks v4's TMA bias kernel or v3's add in the pointer kernel.
            base = A.default_policy(q, k, bias=bias).replace(forward="pointer")
            plain = A.default_policy(q, k).replace(forward="tma")
            t_plain = bench(lambda: A.flash_attention(q, k, v, policy=plain))
            add = base.replace(bias_tma=False)
            t_add = bench(lambda: A.flash_attention(q, k, v, bias=bias, policy=add))
            print(f"D={D} B={B} S={S}: cuDNN {t_cudnn:.4f} ms; v4 without bias {t_plain:.4f}; v3 bias by add "
                  f"{t_add:.4f} ms ({t_cudnn / t_add:.3f}x cuDNN)", flush=True)
            for tile in TILES[D]:
                policy = base.replace(bias_tma=True, tiles={"fwd_tma_bias": tile})
                try:
                    out = A.flash_attention(q, k, v, bias=bias, policy=policy)
                    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
                    t = bench(lambda: A.flash_attention(q, k, v, bias=bias, policy=policy))
                except Exception as e:  # a tile that does not fit shared memory
                    print(f"  tma {tile} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                print(f"  tma {tile} {t:.4f} ms {flops / t / 1e9:4.0f} TFLOP/s {t_cudnn / t:.3f}x cuDNN "
                      f"{t_add / t:.3f}x add  rel err vs cuDNN {err:.1e}", flush=True)
                if err < 1e-2:  # scored over both lengths: the sum of t / (the add's t)
                    scores = best.setdefault(D, {})
                    scores[tile] = scores.get(tile, 0.0) + t / t_add
    for D, times in best.items():
        print(f"BEST {D} " + ",".join(map(str, min(times, key=times.get))))


if __name__ == "__main__":
    main()
