"""v6's causal launch order: head by head (each head's CTAs longest to shortest) against block-major
within head groups (``gluon_bwd._lpt``, ``configs.causal_head_group``), same run, same kernels.

Why: with causal masking a v6 CTA's work falls with its block index (dK / dV: key block n sees the
query tiles from n on; dQ: query block m sees keys up to m). Launched head by head, the last heads'
longest CTAs start last. A list-scheduling model (132 SMs, one CTA an SM, a CTA costing its tiles + 2)
puts the busiest SM at 1.14x the mean for dK / dV at the Llama-3.2-1B shape (B 4 H 32 / 8 S 4096
D 64) and 1.07x at B 4 H 16 S 4096; block-major in head groups that fill the SMs once: 1.00x.
Prediction: the causal dK / dV kernel ~10 % faster at B 4 H 32 / 8 S 4096, ~5 % at H 16, dQ 0-3 %;
at 1 x 16384 (8 KV heads) ~1 %. Risk: more heads read at a time (L2), seen as no gain.

Measured (H200, code c2e56d7, bench/results/logs/attention-causal-order-c2e56d7.log): bitwise equal
everywhere; dK / dV + dQ 1.02-1.04x faster grouped at S 2048-8192 (the Llama shape 2.014 -> 1.955 ms,
cuDNN 1.837; the dK / dV kernel 1.04x there, not the model's 1.14x: more heads are read at a time),
0.96-0.98x at S 1024 and 16384, and 0.96x for dK / dV at B 4 H 16 S 4096 D 64. So
``configs.CAUSAL_GROUPED_BLOCKS`` keeps the grouped order to 16-64 blocks a head.

Each order's dQ, dK, dV must match the other's bit for bit (the same CTAs, launched in another order).
Run on the GPU: PYTHONPATH=src python3 research/attention_causal_order.py
"""

from __future__ import annotations

import torch
import triton

from tilewise.ops.attention import gluon_bwd as gb

from _timing import cudnn_backward_ms, v6_backward_inputs

SHAPES = [(4, 32, 8, 4096, 64), (1, 32, 8, 16384, 64), (4, 16, 16, 4096, 64), (4, 16, 16, 4096, 128),
          (2, 32, 8, 8192, 128), (8, 16, 16, 2048, 128), (16, 16, 16, 1024, 128)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    print("B H Hkv S D (causal) | dkdv head-by-head -> grouped | dq head-by-head -> grouped | v6 bwd kernels"
          " -> grouped | cuDNN backward", flush=True)
    for B, H, Hkv, S, D in SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, True, seed=S + D)
        res = {}
        for name, hg in (("old", 1), ("new", None)):
            dk, dv, dq = (torch.full_like(t, float("nan")) for t in (k, v, q))
            gb.dkdv(q, k, v, do, lse, delta, True, scale, dk, dv, head_group=hg)
            gb.dq(q, k, v, do, lse, delta, True, scale, dq, head_group=hg)
            res[name] = (dq, dk, dv)
            t_kv = bench(lambda hg=hg, dk=dk, dv=dv: gb.dkdv(q, k, v, do, lse, delta, True, scale, dk, dv,
                                                             head_group=hg))
            t_q = bench(lambda hg=hg, dq=dq: gb.dq(q, k, v, do, lse, delta, True, scale, dq, head_group=hg))
            res[name + "_t"] = (t_kv, t_q)
        same = all(torch.equal(a, b) for a, b in zip(res["old"], res["new"]))
        finite = all(torch.isfinite(t).all().item() for t in res["new"])
        t_c = cudnn_backward_ms(q, k, v, do, True, bench)
        (a1, b1), (a2, b2) = res["old_t"], res["new_t"]
        print(f"B{B} H{H}/{Hkv} S{S} D{D} | {a1:.3f} -> {a2:.3f} ms ({a1 / a2:.3f}x) | {b1:.3f} -> {b2:.3f} "
              f"({b1 / b2:.3f}x) | {a1 + b1:.3f} -> {a2 + b2:.3f} | cuDNN {t_c:.3f} | "
              f"{'bitwise equal' if same else 'DIFFER'}{'' if finite else ', NOT FINITE'}", flush=True)


if __name__ == "__main__":
    main()
