"""The overlapped persistent forward with its work items chained (``gluon_overlap.fwd(chain=True)``) against
the same kernel unchained with two Q buffers, and the library's route, cuDNN beside them; one run, same inputs,
outputs compared bit for bit.

Why: an item's fixed cost (docs/tuning/attention.md, "A forward item's fixed cost": 3.8 us a round for the
persistent overlap at D 128 against cuDNN's 1.0) holds the item's last P V, its epilogue (normalize, store O and
the log-sum-exp) and the next item's first S = Q K^T with its softmax, one after the other, while the tensor
cores wait. Chained, the next item's S_0 is issued with the last P V and runs during the epilogue (its Q is
already in the second buffer). A 64 x 128 x 128 product is ~0.4 us of a ~1.7 us key tile.
Prediction (2026-12-06, before a run): chained 1.01-1.03x the unchained kernel at S 1024-2048, 1.00-1.01x from
S 8192 (fewer items, each longer); bitwise equal everywhere.
Measured (H100, d5e4eae): bitwise equal; 1.020x (S 1024), 1.038x (2048), 1.033x (GQA 2048), 1.028x (4096), 1.025x
(GQA 4096), 1.008x (8192), 1.014x (16384): docs/tuning/attention.md, "Chained work items".
--v5: the same for v5's persistent kernel (``gluon_fwd.fwd(chain=...)``), D 64's three consumers (the route without
causal from S 1024) and D 128's two. v5 waits for each product before its softmax, so chained its key tile's P V and
the next S run back to back (v5 issued them a softmax apart) besides the epilogue beside the next item's S_0.
Prediction (2026-12-06, before a run): 1.02-1.05x at D 64 S 1024-2048 (short items: the fixed cost is a larger
share), 1.01-1.02x from 4096; D 128 1.02-1.04x at S 1024; bitwise equal.
Measured (H100, 55ff61e): the overlap 1.019-1.041x; --v5 at D 64 (three consumers) 0.933x (S 1024), 0.962x (GQA 1024),
0.974x (2048), 0.991x (GQA 2048), 1.003x (4096), 1.016x (8192): a miss, so v5 chains with two consumers only
(configs.WS_CHAIN_CONSUMERS); D 128 1.025x at S 1024 (docs/tuning/attention.md, "Chained work items", "Landed").
Run on the GPU: PYTHONPATH=src python3 research/attention_chain_ab.py [--v5]
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

# (B, H, Hkv, S, D), without causal, B x S = 16384
SHAPES = [(16, 16, 16, 1024, 128), (8, 16, 16, 2048, 128), (8, 32, 8, 2048, 128), (4, 16, 16, 4096, 128),
          (4, 32, 8, 4096, 128), (2, 16, 16, 8192, 128), (1, 16, 16, 16384, 128)]
V5_SHAPES = [(16, 16, 16, 1024, 64), (16, 32, 8, 1024, 64), (8, 16, 16, 2048, 64), (8, 32, 8, 2048, 64),
             (4, 16, 16, 4096, 64), (4, 32, 8, 4096, 64), (2, 16, 16, 8192, 64), (16, 16, 16, 1024, 128)]


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main():
    v5 = "--v5" in sys.argv[1:]
    print(torch.cuda.get_device_name(), "(v5's persistent kernel)" if v5 else "(the overlapped consumers)", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(13)
    fwd = ag.fwd if v5 else ao.fwd
    for B, H, Hkv, S, D in V5_SHAPES if v5 else SHAPES:
        cfg = C.WS_THREE if D == 64 else C.ws_fwd_config(D, False, None)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        outs = {c: (torch.full_like(q, float("nan")), torch.full((B, H, S), float("nan"), device="cuda"))
                for c in (False, True)}

        def direct(chain, q=q, k=k, v=v):
            out, lse = outs[chain]
            return fwd(q, k, v, False, D ** -0.5, out, lse, config=cfg, persistent=True, q_buffers=2, chain=chain)[0]

        def cudnn(q=q, k=k, v=v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hkv)

        fns = {"unchained QB2": lambda: direct(False), "chained": lambda: direct(True),
               "route": lambda q=q, k=k, v=v: A.flash_attention(q, k, v), "cudnn": cudnn}
        a, b, c = fns["unchained QB2"]().clone(), fns["chained"]().clone(), fns["cudnn"]()
        same = torch.equal(a, b) and torch.equal(outs[False][1], outs[True][1])
        err = ((b.float() - c.float()).norm() / c.float().norm()).item()
        med, _ = abba_ms(fns, bench)
        flops = 4 * B * H * S * S * D
        print(f"B{B} H{H}/{Hkv} S{S} D{D}: " + ", ".join(
            f"{n} {ms:.4f} ms ({flops / ms / 1e9:.0f} TF, x cuDNN {med['cudnn'] / ms:.3f})" for n, ms in med.items())
            + f" | chained / unchained {med['unchained QB2'] / med['chained']:.3f}x, chained / route "
              f"{med['route'] / med['chained']:.3f}x, bitwise equal {same}, vs cuDNN {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
