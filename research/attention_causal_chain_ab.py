"""Causal forward at D 128 and 64 on the persistent overlap, chained (``gluon_overlap.fwd(chain=True)`` with causal),
against the library's causal route and its parts; one run, same inputs, A B B A.

Why: the causal forward is issue 30's widest forward gap on the H100 (D 128: 0.75x cuDNN at S 1024, 0.85-0.88x at
2048; bench rows at 9ba9ac2). The route there is v5's grid (the overlapped consumers from S 4096, on their own
grid). docs/tuning/attention.md, "A work item's cost with chained items": v5's grid pays t 1.947 us a key tile and
c 4.02 us a round, the chained persistent overlap t 1.68-1.73 and c 2.4-2.6 (plain). A causal item is the same
key tiles but fewer of them, so the fixed cost is a larger share and the chain should pay at least as much. The
persistent grid walks causal items longest first with every odd round reversed (``gluon_fwd._ptile``'s snake).
Arithmetic at B 8 H 16 S 2048: 17408 key tiles on 132 SMs, 15.5 items an SM: v5's grid 257 + 62 = 319 us
(measured ~333), the chained overlap 223 + 39 = 262 us plus imbalance.

Prediction (2026-12-06, before any run): chained / the unchained two-buffer kernel 1.02-1.04x (as without causal),
bitwise equal; chained / route 1.10-1.20x at S 1024-2048 (x cuDNN 0.75 -> 0.85-0.90 at S 1024, 0.85 -> 0.95-1.00 at
2048), 1.02-1.08x at 4096 (where the route is the overlap's grid), 1.00-1.04x at 8192. If it wins: the persistent
grid, two Q buffers and the chain under causal at D 128 (``WS_PERSISTENT_RULES``, ``WS_Q_BUFFER_RULES``,
``WS_OVERLAP_RULES[(128, True)]``, the auto ``chain`` in ``gluon_overlap.fwd``).
D 64 (the route: v3 below S 4096, 0.81x cuDNN at S 1024 and 0.87x at 2048): the chained overlap with two consumers
(the chain needs two) against v5's three on its grid and the route; prediction 1.05-1.15x the route at S 1024-2048.
Run on the GPU: PYTHONPATH=src python3 research/attention_causal_chain_ab.py
"""
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
SHAPES = [(16, 16, 16, 1024, 128), (16, 32, 8, 1024, 128), (8, 16, 16, 2048, 128), (8, 32, 8, 2048, 128),
          (4, 16, 16, 4096, 128), (4, 32, 8, 4096, 128), (2, 16, 16, 8192, 128),
          (16, 16, 16, 1024, 64), (16, 32, 8, 1024, 64), (8, 16, 16, 2048, 64), (8, 32, 8, 2048, 64),
          (4, 32, 8, 4096, 64)]


def main():
    print(torch.cuda.get_device_name(), "(causal)", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(17)
    for B, H, Hkv, S, D in SHAPES:
        two = (128, 2, C.WS_FWD_CONSUMER_REGS, None, 2)  # the overlap's persistent grid takes two consumers
        cfg = C.ws_fwd_config(D, False, None if D == 128 else C.WS_THREE)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        out = {n: (torch.full_like(q, float("nan")), torch.full((B, H, S), float("nan"), device="cuda"))
               for n in ("v5 grid", "overlap grid", "persistent QB1", "persistent QB2", "chained")}

        def ours(name, fwd, config=two, **kw):
            o, lse = out[name]
            return lambda: fwd(q, k, v, True, D ** -0.5, o, lse, config=config, **kw)[0]

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != Hkv)

        fns = {"route": lambda: A.flash_attention(q, k, v, causal=True),
               "v5 grid": ours("v5 grid", ag.fwd, config=cfg),  # D 64: three consumers
               "overlap grid": ours("overlap grid", ao.fwd, config=cfg),
               "persistent QB1": ours("persistent QB1", ao.fwd, persistent=True, q_buffers=1),
               "persistent QB2": ours("persistent QB2", ao.fwd, persistent=True, q_buffers=2, chain=False),
               "chained": ours("chained", ao.fwd, persistent=True, q_buffers=2, chain=True),
               "cudnn": cudnn}
        ref = cudnn().float()
        errs = {n: ((fn().float() - ref).norm() / ref.norm()).item() for n, fn in fns.items() if n != "cudnn"}
        same = all(torch.equal(a, b) for a, b in zip(out["persistent QB2"], out["chained"]))
        med, _ = abba_ms(fns, bench)
        flops = 2 * B * H * S * S * D  # causal: half of 4 B H S^2 D
        print(f"B{B} H{H}/{Hkv} S{S} D{D}: " + ", ".join(
            f"{n} {ms:.4f} ms ({flops / ms / 1e9:.0f} TF, x cuDNN {med['cudnn'] / ms:.3f})" for n, ms in med.items())
            + f" | chained / QB2 {med['persistent QB2'] / med['chained']:.3f}x, chained / route "
              f"{med['route'] / med['chained']:.3f}x, bitwise equal {same}, worst vs cuDNN {max(errs.values()):.1e}",
            flush=True)


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


if __name__ == "__main__":
    main()
