"""Ring depth of the persistent overlap (``gluon_overlap.fwd(persistent=True)``): STAGES 3 (and 4 at D 64) against
the route's 2, same inputs, outputs compared with cuDNN's; one run, A B B A.

Why: consumers offset by a fraction of an item (``research/patches/chain-stagger.patch``) ran 0.86-0.95x the lockstep
kernel on an H100, even at S 16384 where items are long: with two stages a consumer ahead waits for the other to free
the older stage before the loader can refill it, so the ring, not the tensor cores, set the pace. A deeper ring
may also absorb the consumers' own jitter in lockstep. Shared memory: at D 128 three stages fit with one Q buffer
only (32 + 3 x 64 = 224 KB; the chain needs two), at D 64 with two (32 + 3 x 32 = 128 KB, four: 160 KB).
Prediction (2026-12-06, before a run): D 128 plain, one Q buffer, STAGES 3 against 2: 1.00-1.03x, still below the
chained route; D 64 causal (the new span's kernel, two Q buffers) STAGES 3-4 against 2: 1.00-1.03x.
Run on the GPU: PYTHONPATH=src python3 research/attention_stages_ab.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_overlap as ao

# (B, H, Hkv, S, D, causal, {name: (STAGES, Q buffers, chain)})
D128 = {"QB1 ST2": (2, 1, False), "QB1 ST3": (3, 1, False)}
D64 = {"QB2 ST2": (2, 2, None), "QB2 ST3": (3, 2, None), "QB2 ST4": (4, 2, None)}
SHAPES = [(8, 16, 16, 2048, 128, False, D128), (8, 32, 8, 2048, 128, False, D128), (4, 16, 16, 4096, 128, False, D128),
          (8, 16, 16, 2048, 64, True, D64), (4, 32, 8, 4096, 64, True, D64), (16, 16, 16, 1024, 64, True, D64)]


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main():
    print(torch.cuda.get_device_name(), "(the persistent overlap's ring depth)", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(19)
    for B, H, Hkv, S, D, causal, variants in SHAPES:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))

        def cudnn(q=q, k=k, v=v, causal=causal):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hkv)

        ref = cudnn().float()
        fns = {"route": lambda q=q, k=k, v=v, causal=causal: A.flash_attention(q, k, v, causal=causal), "cudnn": cudnn}
        errs = {}
        route = C.ws_fwd_config(D, False)
        for name, (stages, qb, chain) in variants.items():
            out = torch.full_like(q, float("nan"))
            lse = torch.full((B, H, S), float("nan"), device="cuda")
            cfg = (route[0], stages, *route[2:])  # the route's config but its STAGES

            def fn(cfg=cfg, qb=qb, chain=chain, out=out, lse=lse, q=q, k=k, v=v, causal=causal):
                return ao.fwd(q, k, v, causal, D ** -0.5, out, lse, config=cfg, persistent=True, q_buffers=qb,
                              chain=chain)[0]
            try:
                errs[name] = ((fn().float() - ref).norm() / ref.norm()).item()
                fns[name] = fn
            except Exception as e:  # noqa: BLE001 - a build that does not fit is a result here
                print(f"  {name}: {type(e).__name__}: {str(e)[:160]}", flush=True)
        med, _ = abba_ms(fns, bench)
        print(f"B{B} H{H}/{Hkv} S{S} D{D}{' causal' if causal else ''}: " + ", ".join(
            f"{n} {ms:.4f} ms (x cuDNN {med['cudnn'] / ms:.3f})" for n, ms in med.items())
            + " | error vs cuDNN " + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)


if __name__ == "__main__":
    main()
