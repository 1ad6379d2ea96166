"""Bias forward with the bias tile prefetched (attention's _BIAS_FWD["via_dot"]) against the plain
add, and SDPA cuDNN, same run. B=4 H=16 S=4096 and B=2 H=16 S=8192, D in {64, 128}, bf16, a
(1, H, S, S) bias, non-causal (the bench's bias rows).

Why: in the sm_90 TTGIR (Triton 3.6 and 3.9, compiled without a GPU) the forward's bias tile is a
synchronous load inside the key loop: K and V arrive by cp.async num_stages ahead, the bias every
key tile waits for. Triton's pipeliner prefetches only loads that feed a dot and carry no mask
(tl.range(num_stages=...) did not change it; a toy loop showed the mask alone stops it). via_dot
loads the bias with clamped indices (no mask) as the A operand of a product with the identity
(exact for a bias of q's 2-byte dtype), one more (BLOCK_M, BLOCK_N, BLOCK_N) MMA a key tile; the
TTGIR then has the bias among the cp.async copies (15 against 12; tests/test_attention.py
test_sm90_bias_via_dot_is_prefetched).

Before (bench 38046a9, 9ee77eb+pair): D = 64 0.95-0.97 ms at S = 4096 (1.14-1.16x cuDNN), the plain
forward 0.63 ms; D = 128 1.40 ms (1.30x), S = 8192 D = 128 1.25x.
Prediction: the bias wait (~0.3 ms at D = 64) mostly goes, the extra MMA costs ~0.1 ms: D = 64
~0.75-0.80 ms (~1.4x cuDNN); D = 128 ~1.3 ms (~1.4x).

Prints one line per case and tile, and "BEST D bm,bn,warps,stages" for via_dot at S = 4096.
Run on the GPU (~1 minute): PYTHONPATH=src python3 scripts/experiments/attention_bias_dot.py
"""

import torch
from triton.testing import do_bench

from _timing import bias_attention_case
from tilewise.ops import attention as A

TILES = {64: [(64, 64, 4, 3), (64, 64, 4, 4), (128, 64, 8, 3), (64, 32, 4, 4)],
         128: [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3)]}


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    best = {}
    for D in (64, 128):
        for B, S in ((4, 4096), (2, 8192)):
            H = 16
            q, k, v, bias, ref, t_cudnn, flops = bias_attention_case(B, H, S, D, g, bench)
            t_plain = bench(lambda: A.flash_attention(q, k, v))
            old = dict(A._BIAS_FWD)
            try:
                A._BIAS_FWD.update(via_dot=False)
                t_add = bench(lambda: A.flash_attention(q, k, v, bias=bias))
                print(f"D={D} B={B} S={S}: cuDNN {t_cudnn:.4f} ms; ours without bias {t_plain:.4f}; bias by add "
                      f"{t_add:.4f} ms ({t_cudnn / t_add:.3f}x cuDNN)", flush=True)
                A._BIAS_FWD.update(via_dot=True)
                for tile in TILES[D]:
                    with A.override_configs(fwd_bias=tile):
                        out = A.flash_attention(q, k, v, bias=bias)
                        err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
                        t = bench(lambda: A.flash_attention(q, k, v, bias=bias))
                    print(f"  via_dot {tile} {t:.4f} ms {flops / t / 1e9:4.0f} TFLOP/s {t_cudnn / t:.3f}x cuDNN "
                          f"{t_add / t:.3f}x add  rel err vs cuDNN {err:.1e}", flush=True)
                    if S == 4096 and err < 1e-2:
                        best.setdefault(D, {})[tile] = t
            finally:
                A._BIAS_FWD.clear()
                A._BIAS_FWD.update(old)
    for D, times in best.items():
        print(f"BEST {D} " + ",".join(map(str, min(times, key=times.get))))


if __name__ == "__main__":
    main()
