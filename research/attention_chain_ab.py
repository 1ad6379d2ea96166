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
Run on the GPU: PYTHONPATH=src python3 research/attention_chain_ab.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_overlap as ao

# (B, H, Hkv, S), D 128 without causal, B x S = 16384
SHAPES = [(16, 16, 16, 1024), (8, 16, 16, 2048), (8, 32, 8, 2048), (4, 16, 16, 4096), (4, 32, 8, 4096),
          (2, 16, 16, 8192), (1, 16, 16, 16384)]
D = 128


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main():
    print(torch.cuda.get_device_name(), flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(13)
    cfg = C.ws_fwd_config(D, False, None)
    for B, H, Hkv, S in SHAPES:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        outs = {c: (torch.full_like(q, float("nan")), torch.full((B, H, S), float("nan"), device="cuda"))
                for c in (False, True)}

        def direct(chain, q=q, k=k, v=v):
            out, lse = outs[chain]
            return ao.fwd(q, k, v, False, D ** -0.5, out, lse, config=cfg, persistent=True, q_buffers=2,
                          chain=chain)[0]

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
