"""Forward + backward through ``flash_attention`` at D 64 with the default policy (v6's dQ kernel with three
consumers, 4 stages and the pipe where ``configs.WS_BWD_DQ_THREE`` says) against the same policy with two dQ
consumers (``ws_bwd_dq_config=(64, 3, 240)``, the kernel before) and SDPA's cuDNN backend; one process, A B B A,
gradients compared bit for bit between the two policies.

Why: the dQ kernel alone measured 1.01-1.09x with three consumers from Sq 4096 (`research/attention_dq_three_ab.py`),
but the bench rows at d7b1998 read B 4 H 32 / 8 S 4096 without causal at 0.958x cuDNN (1.024x in earlier rows,
another H100): single medians from different machines. This times the whole call, where the rule acts.

Prediction (2026-12-07, before a run; H100): three / two 1.01-1.04x at the S >= 4096 shapes (dQ is ~40 % of the
backward, the backward ~70 % of the call); 1.000x (the same policy) at S 1024 / 2048 causal; gradients bitwise equal.
Run on the GPU (~1 minute): PYTHONPATH=src python3 research/attention_dq_three_e2e.py
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import configs as C
from tilewise.ops.attention.api import flash_attention

from _timing import abba_ms, warm_clocks

# (B, H, Hkv, S, causal) at D 64: the Llama-3.2-1B shapes, issue 30's grid points, one control below the rule.
SHAPES = [(4, 32, 8, 4096, False), (4, 32, 8, 4096, True), (1, 32, 8, 16384, True), (4, 16, 16, 4096, False),
          (8, 32, 8, 2048, False), (8, 16, 16, 2048, True)]
D = 64
# Other shapes from the command line, B,H,Hkv,S,causal each: 2,32,8,8192,1
ARG_SHAPES = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]]
if any(len(t) != 5 for t in ARG_SHAPES):
    sys.exit(f"usage: {sys.argv[0]} [B,H,Hkv,S,causal ...] (five integers each), got {sys.argv[1:]}")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=80, return_mode="median")


def main():
    warm_clocks()
    print(f"{torch.cuda.get_device_name()}: B H/Hkv S D causal | fwd+bwd ms: default / two dQ consumers / cuDNN | "
          "default x two, x cuDNN | dQ config | bitwise", flush=True)
    for B, H, Hkv, S, causal in ([(b, h, kv, s, bool(c)) for b, h, kv, s, c in ARG_SHAPES] or SHAPES):
        g = torch.Generator(device="cuda").manual_seed(S + H + causal)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        default = C.choose_policy(D, S, S, causal=causal)
        two = default.replace(ws_bwd_dq_config=(64, 3, 240))
        leaves = [t.requires_grad_(True) for t in (q, k, v)]

        def ours(policy):
            out = flash_attention(q, k, v, causal=causal, policy=policy)
            return torch.autograd.grad(out, leaves, do)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H)
            return torch.autograd.grad(out, leaves, do)

        same = all(torch.equal(a, b) for a, b in zip(ours(default), ours(two)))
        t, _ = abba_ms({"default": lambda: ours(default), "two": lambda: ours(two), "cudnn": cudnn}, bench)
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | {t['default']:.3f} / {t['two']:.3f} / {t['cudnn']:.3f} | "
              f"{t['two'] / t['default']:.3f} {t['cudnn'] / t['default']:.3f} | {default.ws_bwd_dq_config} | {same}",
              flush=True)


if __name__ == "__main__":
    main()
