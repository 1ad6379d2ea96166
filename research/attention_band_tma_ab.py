"""v5's band kernel (sliding windows) with O stored by TMA from a buffer a consumer
(``gluon_band.fwd_band(tma_out=True)``) against its 4-byte stores; same run, same inputs, outputs compared bit for
bit; the full causal forward and the library's window route beside them.

Why: at window 1024 (S 16384) a band CTA runs ~9 key tiles of 128, and Nsight Compute put the band kernel's
epilogue region at 7.8 % of its samples (stores 1.3 %; docs/tuning/attention.md, "An item's end under Nsight
Compute"). On the persistent overlap the same TMA epilogue gained 1.04-1.10x where items were 8-32 tiles long.
Unlike the persistent forwards the band kernel hands its Q buffer back before the epilogue (the next item's Q loads
during it), so O gets its own 16 KB a consumer at D 128 instead of the Q buffer.
Prediction (2026-12-07, before a run): window 1024 1.02-1.05x the stores on the band's grid and persistent grid at
D 128, 1.01-1.03x at D 64; window 4096 (~33 tiles an item) 1.00-1.02x; bitwise equal, also at odd sizes.
Run on the GPU (~1 minute): PYTHONPATH=src python3 research/attention_band_tma_ab.py
"""
import torch
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import gluon_band as gb
from tilewise.ops.attention import reference as R


def bench(fn):
    return do_bench(fn, warmup=10, rep=80, return_mode="median")


def call(q, k, v, band, out, lse, persistent, tma_out):
    return gb.fwd_band(q, k, v, band, q.shape[-1] ** -0.5, out, lse, persistent=persistent, tma_out=tma_out)[0]


def buffers(q):
    B, H, S, _ = q.shape
    return [(torch.full_like(q, float("nan")), torch.full((B, H, S), float("nan"), device="cuda")) for _ in range(2)]


def main():
    print(torch.cuda.get_device_name(), flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(23)
    # Odd sizes first: a partial last query tile (masked stores), GQA, a window past the sequence.
    for B, H, Hkv, S, D, left in [(2, 4, 2, 1031, 128, 300), (1, 8, 8, 777, 64, 1024), (3, 4, 4, 129, 128, 64)]:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        band = R.band(True, (left, None), "top_left", S, S)
        for persistent in (False, True):
            res = buffers(q)
            for on in (False, True):
                call(q, k, v, band, *res[on], persistent, on)
            ref = A.reference(q.float(), k.float(), v.float(), causal=True, window=(left, None))
            err = ((res[1][0].float() - ref).norm() / ref.norm()).item()
            same = torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
            print(f"check B{B} H{H}/{Hkv} S{S} D{D} window {left} persistent={persistent}: bitwise equal {same}, "
                  f"vs fp32 {err:.1e}", flush=True)
    B, H, S = 1, 16, 16384
    for D in (128, 64):
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        t_full, _ = abba_ms({"full": lambda: A.flash_attention(q, k, v, causal=True)}, bench)
        for left in (1024, 4096):
            band = R.band(True, (left, None), "top_left", S, S)
            for persistent in (False, True):
                outs = buffers(q)
                fns = {"stores": lambda o=outs[0], p=persistent: call(q, k, v, band, *o, p, False),
                       "TMA out": lambda o=outs[1], p=persistent: call(q, k, v, band, *o, p, True),
                       "route": lambda w=left: A.flash_attention(q, k, v, causal=True, window=(w, None))}
                a, b = fns["stores"]().clone(), fns["TMA out"]().clone()
                same = torch.equal(a, b) and torch.equal(outs[0][1], outs[1][1])
                med, _ = abba_ms(fns, bench)
                print(f"D{D} window {left} persistent={persistent}: " + ", ".join(
                    f"{n} {ms:.4f} ms ({ms / t_full['full']:.3f}x full causal)" for n, ms in med.items())
                    + f" | TMA out / stores {med['stores'] / med['TMA out']:.3f}x, bitwise equal {same}", flush=True)


if __name__ == "__main__":
    main()
