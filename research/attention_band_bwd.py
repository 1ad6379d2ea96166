"""v6's backward on a band (``AttentionPolicy.ws_bwd_band``) against v3's two kernels, the band's backward until
now: sliding-window causal forward + backward at S = 16384 (B 1, H 16) and the llama bench's GQA 32 / 8 at
S 4096, bf16, D 128 / 64, windows 1024 and 4096, beside full causal (issue 30: window 1024 <= 0.15x of it).

Why: with window 1024 at S 16384 D 128 the forward + backward was 0.229-0.237x full causal (H100, fa956a6,
`bench/results/logs/bench-attention-grid-fa956a6.log`), the forward alone 0.192x: the backward ran v3's Triton
kernels (1.38 ms) while full causal's runs v6.
Prediction (2026-12-05, before any GPU run): v6 on the band at v6's causal rate for the band's tiles (~9 of a
causal row's ~64 key tiles of 128) plus its edge tiles: the backward 1.38 -> 0.8-0.9 ms at D 128 window 1024,
forward + backward 0.23 -> ~0.17x full causal; gradients within 1e-2 of v3's, bitwise reproducible.

Rounds in the order A B B A (a variant timed later in a round ran slower at long shapes), the median of the
rounds' middle two; gradients compared with v3's first.
Run on the GPU: PYTHONPATH=src python3 research/attention_band_bwd.py
"""
import torch
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A


def bench(fn):
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def fwd_bwd(q, k, v, do, policy, **kw):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def fn():
        A.flash_attention(*leaves, policy=policy, **kw).backward(do)
    return fn, leaves


def main():
    print(torch.cuda.get_device_name(), flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(3)
    for B, H, Hkv, S in ((1, 16, 16, 16384), (4, 32, 8, 4096)):
        for D in (128, 64):
            q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            do = torch.randn_like(q)
            base = A.default_policy(q, k, causal=True).replace(backward="ws", ws_bwd_band=False)
            full_fn, _ = fwd_bwd(q, k, v, do, base, causal=True)
            t_full = bench(full_fn)
            for left in (1024, 4096):
                kw = dict(causal=True, window=(left, None))
                fns = {}
                grads = {}
                for name, pol in (("v3 backward", base), ("v6 backward", base.replace(ws_bwd_band=True))):
                    fn, leaves = fwd_bwd(q, k, v, do, pol, **kw)
                    fn()
                    grads[name] = [t.grad.clone() for t in leaves]
                    fns[name] = fn
                errs = [((a.double() - b.double()).norm() / b.double().norm()).item()
                        for a, b in zip(grads["v6 backward"], grads["v3 backward"])]
                med, _ = abba_ms(fns, bench)
                line = " | ".join(f"{n} {med[n]:.3f} ms ({med[n] / t_full:.3f}x full causal)" for n in fns)
                gain = med["v3 backward"] / med["v6 backward"]
                print(f"B{B} H{H}/{Hkv} S{S} D{D} window {left}: {line} | v6 / v3 {gain:.3f}x"
                      f" | full causal {t_full:.3f} ms | dq, dk, dv vs v3 {', '.join(f'{e:.1e}' for e in errs)}",
                      flush=True)


if __name__ == "__main__":
    main()
