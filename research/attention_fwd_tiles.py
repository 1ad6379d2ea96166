"""Forward tiles at D = 128 against FlexAttention and SDPA cuDNN, same run, interleaved rounds.

The quick bench put our plain forward at 0.97-1.0x FlexAttention at D = 128 S = 8192 non-causal
(2.268 ms against 2.200, bench cd229ca) and 1.04x at S = 4096, with the one tile (128 x 64, 8
warps, 3 stages) chosen at S = 4096. A grid of 2048 CTAs at one CTA an SM is 15.5 waves on 132
SMs, so the last wave runs half empty (~3 %); deeper pipelines or other tiles may also move it.
Prediction: no tile leads the current one by more than 3 % at S = 4096; at S = 8192 the same.

Times (triton's do_bench, median, L2 flushed) of v3 (pointer loads) and v4 (TMA) under each tile,
FlexAttention (compiled), SDPA cuDNN and flash; three rounds, the median of the rounds printed.
Run on the GPU (~3 minutes): PYTHONPATH=src python3 research/attention_fwd_tiles.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from triton.testing import do_bench

from _timing import interleaved_rounds
from tilewise.ops.attention import api as A

TILES = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 4), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 4)]
flex = torch.compile(flex_attention, dynamic=False)


def bench(fn):
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


for (B, S) in ((4, 4096), (2, 8192)):
    D, H = 128, 16
    g = torch.Generator(device="cuda").manual_seed(S)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for causal in (False, True):
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device="cuda") if causal else None
        cands = {"flex": lambda: flex(q, k, v, block_mask=bm)}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            cands[name] = run
        base = A.default_policy(q, k, causal=causal)
        for t in TILES:
            v3 = base.replace(forward="pointer", tiles={"fwd": t})
            v4 = base.replace(forward="tma", tiles={"fwd": t})

            def ours(policy=v3):
                return A.flash_attention(q, k, v, causal=causal, policy=policy)

            def ours_tma(policy=v4):
                return A.flash_attention(q, k, v, causal=causal, policy=policy)
            cands[f"v3 {t}"] = ours
            cands[f"v4 {t}"] = ours_tma
        interleaved_rounds(f"D={D} B={B} S={S} causal={causal}", cands, lambda fn: fn(), cands["cudnn"](), flops,
                           bench, baselines=("flex", "cudnn"))
