"""Bias forward: the TMA kernel (the default) against the pointer kernel, interleaved rounds in one
run, S = 4096 / 8192 / 16384 (B = 4 / 2 / 1, H = 16), D = 64 and 128, a (1, H, S, S) bf16 bias,
SDPA cuDNN beside them.

Why: single runs disagreed on which path leads at D = 64 S = 8192 (pointer 1.996 against TMA 1.818
ms at beeaf9c; 1.686 against 1.802 after the scale fold, logs/attention-bias-tma-fold.log), and
the run-to-run spread (cuDNN 1.02-1.13 ms at S = 4096) is as large as the gaps. Interleaving the
candidates round by round puts them under the same clocks.
Prediction: within 3 % of each other at every shape (no per-shape rule worth having).
Measured (666699e, logs/attention-bias-ab.log): the TMA kernel leads at every shape, by 1-3 %
except D = 64 S = 8192 (9 %); no per-shape rule. Against cuDNN: D = 64 1.25x / 1.28x / 1.28x
(S = 4096 / 8192 / 16384), D = 128 1.31x / 1.32x / 1.27x.

Run on the GPU (~3 minutes): PYTHONPATH=src python3 research/attention_bias_ab.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import bias_attention_case, interleaved_rounds
from tilewise.ops.attention import api as A


def bench(fn):
    return do_bench(fn, warmup=5, rep=60, return_mode="median")


def ours(policy):
    def run(q, k, v, bias):
        return A.flash_attention(q, k, v, bias=bias, policy=policy)
    return run


for D in (64, 128):
    for B, S in ((4, 4096), (2, 8192), (1, 16384)):
        g = torch.Generator(device="cuda").manual_seed(S + D)
        q, k, v, bias, ref, _, flops = bias_attention_case(B, 16, S, D, g, bench)

        def cudnn(q, k, v, bias):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

        # The Triton bias forwards (forward "pointer", not v5): bias_tma picks the TMA kernel or the pointer one.
        base = A.default_policy(q, k, bias=bias).replace(forward="pointer")
        cands = {"cudnn": cudnn, "tma": ours(base.replace(bias_tma=True)),
                 "pointer": ours(base.replace(bias_tma=False))}
        if D == 64:
            cands["pointer 128x64x8x3"] = ours(base.replace(bias_tma=False, tiles={"fwd_bias": (128, 64, 8, 3)}))
        interleaved_rounds(f"D={D} B={B} S={S}", cands, lambda fn: fn(q, k, v, bias), ref, flops, bench)
