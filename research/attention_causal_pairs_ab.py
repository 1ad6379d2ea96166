"""The persistent grids' causal work items in pairs (``gluon_items.persistent_item``), against the causal route, its
parts and cuDNN; one run, same inputs, A B B A.

Why: research/attention_causal_chain_ab.py at 5ed4dfa (H100, `attention-causal-chain-ab-*.log`) had the persistent
overlap under causal far behind with 16 K / V heads and ahead with 8: at B 16 S 1024 D 128 0.58x cuDNN (H 16 / 16)
against 0.89x (H 32 / 8), 248 against 399 TFLOP/s, while the grids ran both at ~330. The walk then sorted items longest
first, so one round's 132 CTAs computed the same query tile of 132 different heads: no two read the same K / V
(GQA: four), and a key tile a CTA every ~1.7 us is 64 KB x 132 / 1.7 us = 5 TB/s, above HBM's ~3.3 (H100). Pairs
(a head's longest tile with its shortest, both on one CTA, pairs head-major) keep about n_m / 2 CTAs on one head's
K / V at a time with the same balance (a model of the schedule: busiest CTA 1.031x the mean at B * S = 16384, the
sorted walk's 1.004-1.031x; K / V heads shared by 4-100 CTAs a round against 1-16).

Prediction (2026-12-06, before the run): persistent (two Q buffers, unchained) x cuDNN at D 128 S 1024 0.58 -> 0.85-0.92
with H 16, 0.89 -> 0.90-0.95 with GQA; S 2048 0.64 -> 0.90-0.97 (H 16), 0.93 -> 0.94-0.99 (GQA); S 4096 0.92 ->
0.98-1.04; S 8192 1.03 -> 1.05-1.10 (H 16, the route's overlap grid there 1.13). The chained items ~1.0x unchained.
Every persistent output bitwise equal to the overlap grid's (the same rows, another order). If the persistent overlap
leads the route: the rules for (128, True) (persistent grid, two Q buffers, the overlap from the S where it leads).
Run on the GPU: PYTHONPATH=src python3 research/attention_causal_pairs_ab.py [--d64]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_fwd as ag
from tilewise.ops.attention import gluon_overlap as ao

# (B, H, Hkv, S, D), causal, B x S = 16384
SHAPES = [(32, 16, 16, 512, 128), (16, 16, 16, 1024, 128), (16, 32, 8, 1024, 128), (8, 16, 16, 2048, 128),
          (8, 32, 8, 2048, 128), (4, 16, 16, 4096, 128), (4, 32, 8, 4096, 128), (2, 16, 16, 8192, 128),
          (1, 32, 8, 16384, 128), (16, 16, 16, 1024, 64), (16, 32, 8, 1024, 64), (8, 16, 16, 2048, 64),
          (4, 32, 8, 4096, 64)]
# ``--d64``: D 64 from S 1024 to 16384 (where a D 64 causal rule would reach)
D64_SHAPES = [(16, 16, 16, 1024, 64), (16, 32, 8, 1024, 64), (8, 16, 16, 2048, 64), (8, 32, 8, 2048, 64),
              (4, 16, 16, 4096, 64), (4, 32, 8, 4096, 64), (2, 16, 16, 8192, 64), (2, 32, 8, 8192, 64),
              (1, 32, 8, 16384, 64)]


def main():
    print(torch.cuda.get_device_name(), "(causal)", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(19)
    for B, H, Hkv, S, D in D64_SHAPES if "--d64" in sys.argv else SHAPES:
        two = (128, 2, C.WS_FWD_CONSUMER_REGS, None, 2)  # the overlap's persistent grid takes two consumers
        cfg = C.ws_fwd_config(D, False, None if D == 128 else C.WS_THREE)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        names = ("v5 grid", "overlap grid", "v5 persistent", "persistent", "chained")
        out = {n: (torch.full_like(q, float("nan")), torch.full((B, H, S), float("nan"), device="cuda")) for n in names}

        def ours(name, fwd, config=two, **kw):
            o, lse = out[name]
            return lambda: fwd(q, k, v, True, D ** -0.5, o, lse, config=config, **kw)[0]

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != Hkv)

        fns = {"route": lambda: A.flash_attention(q, k, v, causal=True),
               "v5 grid": ours("v5 grid", ag.fwd, config=cfg),  # D 64: three consumers
               "overlap grid": ours("overlap grid", ao.fwd),
               "v5 persistent": ours("v5 persistent", ag.fwd, config=cfg, persistent=True, q_buffers=2),
               "persistent": ours("persistent", ao.fwd, persistent=True, q_buffers=2, chain=False),
               "chained": ours("chained", ao.fwd, persistent=True, q_buffers=2, chain=True),
               "cudnn": cudnn}
        ref = cudnn().float()
        errs = {n: ((fn().float() - ref).norm() / ref.norm()).item() for n, fn in fns.items() if n != "cudnn"}
        same = all(torch.equal(a, b) for n in ("persistent", "chained") for a, b in zip(out["overlap grid"], out[n]))
        same_v5 = all(torch.equal(a, b) for a, b in zip(out["v5 grid"], out["v5 persistent"]))
        med, _ = abba_ms(fns, bench)
        flops = 2 * B * H * S * S * D  # causal: half of 4 B H S^2 D
        best = min((n for n in med if n != "cudnn"), key=med.get)
        print(f"B{B} H{H}/{Hkv} S{S} D{D}: " + ", ".join(
            f"{n} {ms:.4f} ms ({flops / ms / 1e9:.0f} TF, x cuDNN {med['cudnn'] / ms:.3f})" for n, ms in med.items())
            + f" | persistent / route {med['route'] / med['persistent']:.3f}x, chained / persistent "
              f"{med['persistent'] / med['chained']:.3f}x, best {best}, bitwise equal to the grids {same} / {same_v5}, "
              f"worst vs cuDNN {max(errs.values()):.1e}", flush=True)


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


if __name__ == "__main__":
    main()
