"""Sliding-window causal forward at S = 16384 (H = 16, bf16): v3's band kernel, v5's band kernel on
its own grid (one CTA a 128-row query tile) and on the persistent grid (one CTA an SM walking the
(query tile, head) items, ring and Q buffers running on across items), against the full causal
forward (issue 30: window 1024 <= 0.15x of it).

Also v5's band kernel with 64-key tiles (4 or 3 stages), which halve the masked edge tiles' waste.
Why the persistent grid: at window 1024 a CTA runs only ~9 key tiles of 128, so its Q load, ring fill
and epilogue (paid with the tensor pipe idle on v5's own grid) weigh ~3x more than at S = 4096
non-causal, where the persistent grid already gained 4-8 %.
Prediction (D = 128, window 1024): v5 grid ~0.33 ms (0.346 at 41f20b5, before ``_skip_tile``),
persistent ~0.29-0.30 ms, full causal ~1.90 ms: ~0.155x.

Three interleaved rounds of triton's do_bench (median, L2 flushed); each candidate checked against
the fp32 reference on heads 0-1 first.
Run on the GPU (~1 minute): PYTHONPATH=src python3 research/attention_window.py
"""
import torch
from triton.testing import do_bench

from _timing import interleaved_rounds, warm_clocks
from tilewise.ops.attention import api as A


def bench(fn):
    return do_bench(fn, warmup=10, rep=80, return_mode="median")


warm_clocks()
B, H, S = 1, 16, 16384
for D in (128, 64):
    g = torch.Generator(device="cuda").manual_seed(D)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    base = A.default_policy(q, k)
    full = {"full causal": lambda: A.flash_attention(q, k, v, causal=True)}
    t_full = interleaved_rounds(f"D={D} full causal", full, lambda fn: fn()[:, :2],
                                A.reference(q[:, :2].float(), k[:, :2].float(), v[:, :2].float(), causal=True),
                                2 * B * H * S * S * D, bench, baselines=("full causal",))["full causal"]
    for left in (1024, 4096):
        ws = base.replace(forward="ws", ws_band=True, ws_config=None)
        policies = {"v3 band": base.replace(forward="pointer"), "v5 band grid": ws,
                    "v5 band persistent": ws.replace(ws_band_persistent=True),
                    "v5 band BN64 x4": ws.replace(ws_config=(64, 4, 232, None, 2)),
                    "v5 band BN64 x3": ws.replace(ws_config=(64, 3, 232, None, 2))}
        cands = {n: (lambda p=p, w=left: A.flash_attention(q, k, v, causal=True, window=(w, None), policy=p))
                 for n, p in policies.items()}
        ref = A.reference(q[:, :2].float(), k[:, :2].float(), v[:, :2].float(), causal=True, window=(left, None))
        kept = sum(min(i + 1, left + 1) for i in range(S))
        med = interleaved_rounds(f"D={D} window {left}", cands, lambda fn: fn()[:, :2], ref,
                                 4 * B * H * kept * D, bench, baselines=("v3 band", "v5 band grid"))
        for name, ms in sorted(med.items(), key=lambda x: x[1]):
            print(f"  {name}: {ms / t_full:.3f}x of full causal ({t_full:.4f} ms)", flush=True)
