"""Where does the forward with an additive bias lose time? B=4, H=16, S=4096, bf16, D in {64, 128},
a (1, H, S, S) bias (as the bench: ALiBi-like, shared by the batch), non-causal.

Before: v3's forward loaded the bias tile inside each key tile (Triton pipelines only the loads
that feed a dot, so the load's latency was exposed every tile) and walked the grid head-fastest, so
the 4 batches of one head ran 16 heads apart and read the 0.5 GB bias from DRAM 4 times (2.1 GB,
0.5 ms at copy speed, against 0.66 ms of math at D = 64). Bench (681f51b / 54b6af0): 1.092 ms at
D = 64 (0.94x cuDNN), 1.515 ms at D = 128 (1.22x).

Prediction (before the run): prefetching the next tile's bias hides its latency, and the
batch-fastest grid cuts its DRAM reads to 0.54 GB: D = 64 about 0.75 ms (~1.35x cuDNN), D = 128
about 1.38 ms (~1.33x).

Run 1 (logs/attention-bias-fwd-run1.log): prefetching made both slower (D = 64 1.35 ms, D = 128
1.75 ms) and was dropped; batch-fastest: D = 64 1.078 -> 1.044 ms, D = 128 1.372 -> 1.426 ms.
Run 2 times forward tiles (BLOCK_M, BLOCK_N, warps, stages) with a bias, each in both grid orders.

Each candidate is timed against the others in the same run, outputs checked against SDPA cuDNN's. Run on the GPU (< 1 minute): PYTHONPATH=src python3 research/attention_bias_fwd.py
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tilewise.ops.attention import api as A

B, H, S = 4, 16, 4096
TILES = [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 4)]


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    for D in (64, 128):
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        bias = torch.randn(1, H, S, S, device="cuda", dtype=torch.bfloat16, generator=g)
        flops = 4 * B * H * S * S * D
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            t_cudnn = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), warmup=10, rep=100,
                               return_mode="median")
        t_plain = do_bench(lambda: A.flash_attention(q, k, v), warmup=10, rep=100, return_mode="median")
        print(f"D={D}: sdpa_cudnn with bias {t_cudnn:.4f} ms ({flops / t_cudnn / 1e9:.0f} TFLOP/s); "
              f"ours without bias {t_plain:.4f} ms")
        # v3's pointer forward with a bias (not v5, not the TMA bias kernel): the kernel this script tunes.
        base = A.default_policy(q, k, bias=bias).replace(forward="pointer", bias_tma=False)
        for tile in TILES:
            for bf in (False, True):
                policy = base.replace(bias_batch_fastest=bf, tiles={"fwd": tile})
                out = A.flash_attention(q, k, v, bias=bias, policy=policy)
                err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
                t = do_bench(lambda: A.flash_attention(q, k, v, bias=bias, policy=policy), warmup=10, rep=100,
                             return_mode="median")
                print(f"  fwd {tile} batch_fastest={bf!s:5} {t:.4f} ms {flops / t / 1e9:4.0f} TFLOP/s "
                      f"{t_cudnn / t:.3f}x cuDNN  rel err vs cuDNN {err:.1e}")


if __name__ == "__main__":
    main()
