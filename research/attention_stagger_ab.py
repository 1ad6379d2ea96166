"""The chained persistent overlap with its two consumers' item ends a turn apart (``gluon_overlap.fwd(stagger=True)``)
against the same kernel chained without turns (the D 128 route without causal), cuDNN beside them; one run, same
inputs, outputs compared bit for bit. With causal also the route (unchained: the chain lost there) and the chain.

Why: chained, an item's fixed cost is still ~2.6 us a round against cuDNN's ~0.8 (docs/tuning/attention.md, "A work
item's cost with chained items"). Both consumers reach an item's end together (they walk the same key tiles), so
both run their epilogue and their first softmax, which no product of their own overlaps, at the same time, and the
tensor cores idle. With turns consumer 1 issues an item's S_0 only after consumer 0 finished softmax(S_0) (consumer
0 waits, in turn, for consumer 1's S_0 of the item before: at most one item apart), so one's item end runs beside
the other's products. The offset costs nothing once set: the ring lets a consumer lead by up to a key tile.
Prediction (2026-12-06, before a run): staggered / chained 1.01-1.04x at S 1024-2048 (c ~2.6 -> ~1.5-2.0 us), 1.00-1.02x
from 4096; bitwise equal everywhere. Causal (chained, then staggered): back to the route or above at S 2048-8192.
Run on the GPU: PYTHONPATH=src python3 research/attention_stagger_ab.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_overlap as ao

# (B, H, Hkv, S, causal), D 128, B x S = 16384
SHAPES = [(16, 16, 16, 1024, False), (8, 16, 16, 2048, False), (8, 32, 8, 2048, False), (4, 16, 16, 4096, False),
          (4, 32, 8, 4096, False), (2, 16, 16, 8192, False), (1, 16, 16, 16384, False),
          (8, 16, 16, 2048, True), (4, 16, 16, 4096, True), (2, 16, 16, 8192, True)]
D = 128


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main():
    print(torch.cuda.get_device_name(), "(the chained persistent overlap, consumers staggered)", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(17)
    cfg = C.ws_fwd_config(D, False, None)
    for B, H, Hkv, S, causal in SHAPES:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        variants = {"chained": (True, False), "staggered": (True, True)}
        if causal:
            variants = {"unchained": (False, False), **variants}
        outs = {n: (torch.full_like(q, float("nan")), torch.full((B, H, S), float("nan"), device="cuda"))
                for n in variants}

        def direct(name, q=q, k=k, v=v, causal=causal):
            chain, stagger = variants[name]
            out, lse = outs[name]
            return ao.fwd(q, k, v, causal, D ** -0.5, out, lse, config=cfg, persistent=True, q_buffers=2,
                          chain=chain, stagger=stagger)[0]

        def cudnn(q=q, k=k, v=v, causal=causal):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hkv)

        fns = {n: (lambda n=n: direct(n)) for n in variants}
        fns.update(route=lambda q=q, k=k, v=v, causal=causal: A.flash_attention(q, k, v, causal=causal), cudnn=cudnn)
        for n in variants:
            fns[n]()
        ref = fns["cudnn"]()
        same = all(torch.equal(outs[n][0], outs["chained"][0]) and torch.equal(outs[n][1], outs["chained"][1])
                   for n in variants)
        err = ((outs["staggered"][0].float() - ref.float()).norm() / ref.float().norm()).item()
        med, _ = abba_ms(fns, bench)
        flops = 4 * B * H * S * S * D // (2 if causal else 1)
        print(f"B{B} H{H}/{Hkv} S{S} D{D}{' causal' if causal else ''}: " + ", ".join(
            f"{n} {ms:.4f} ms ({flops / ms / 1e9:.0f} TF, x cuDNN {med['cudnn'] / ms:.3f})" for n, ms in med.items())
            + f" | staggered / chained {med['chained'] / med['staggered']:.3f}x, staggered / route "
              f"{med['route'] / med['staggered']:.3f}x, bitwise equal {same}, vs cuDNN {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
