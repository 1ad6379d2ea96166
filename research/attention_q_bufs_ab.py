"""v5's persistent forward with two Q buffers a consumer (``attn_fwd_ws_persistent_kernel``'s Q_BUFS = 2)
against one, same run, same inputs, outputs compared bit for bit; cuDNN beside them.

Why: with one buffer the loader waits for a consumer's whole work item (its q_empty arrive comes after the
last P V) before it loads the next item's Q, and it issues that item's K / V loads only after Q's; so each
item starts with a TMA round trip for Q and K's first tile that the epilogue (normalize, store O and the
log-sum-exp) only partly hides. With two buffers the next Q loads as soon as the loader is done with this
item's K / V (about STAGES key tiles before its end). Arithmetic on fa956a6's rows (research/notes/attention.md,
"Twenty-fourth session") put 3-5 key-tile times of fixed cost on each item at D 128; the Q round trip is
~1 us of a ~1.8 us tile.
Prediction (2026-12-05, before any GPU run): D 128 without causal (the persistent grid is the route below
S 4096) 1-4 % faster at S 1024 / 2048, 0-2 % at 4096; causal (not the route) and D 64's three consumers
about the same; shared memory 164 -> 197 KB at D 128 (sm_90 SASS under Triton 3.6: no spills, the default
Q_BUFS = 1 builds byte for byte main's).
Measured (H100, f38f538, the consumer's two loops): without causal bitwise equal and 1.021-1.036x at D 128
S 1024-4096 and D 64 S 2048; causal wrong, from ptxas (docs/tuning/attention.md, "Two Q buffers"). Since then
the two-buffer consumer runs one loop; predicted: the same gains, causal bitwise equal and 1.00-1.03x.
Measured (H100, a07282b, one loop with one copy of the products): causal bitwise equal, 0.973x; without causal
1.018-1.065x at D 128 S 1024-4096, 1.035x at D 64 S 2048 (logs/attention-q-bufs-ab-a07282b.log). The
"default" column is the library's route (after that run: two buffers at D 128 plain below S 4096; D 64 on v5's
grid), for the D 64 rule. The B side is the policy's ``ws_q_buffers=2``; the policy pins the persistent kernel
(no overlap, no call plans). Rounds A B B A, the mean of the middle two rounds' do_bench medians.
Run on the GPU: PYTHONPATH=src python3 research/attention_q_bufs_ab.py [--overlap]
--overlap: the same for the overlapped consumers on the persistent grid (D 128's route from S 4096). Prediction
(2026-12-06, before a run): 1.02-1.04x one buffer at S 2048-4096, 1.01-1.02x from 8192 (an item's fixed cost is a
smaller share of a longer item), causal 0.97-1.00x; S 2048 ahead of v5's persistent kernel with two buffers.
Measured (H100, d153f64): 1.005x at S 2048, 0.985-0.995x from 4096; the overlap with one buffer 1.017x the default
(v5 persistent, two buffers) at S 2048. Hence the overlap rule from S 2048; the "v5 persistent QB2" column is
that former route, S 1024 and GQA S 2048 for the next rule (prediction: the overlap 1.01-1.02x it at S 2048,
about even at 1024).
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C

# (B, H, Hkv, S, D, causal), B x S = 16384
SHAPES = [(16, 16, 16, 1024, 128, False), (8, 16, 16, 2048, 128, False), (8, 32, 8, 2048, 128, False),
          (4, 16, 16, 4096, 128, False), (8, 16, 16, 2048, 128, True), (8, 16, 16, 2048, 64, False),
          (4, 32, 8, 4096, 64, False), (16, 16, 16, 1024, 64, False), (4, 16, 16, 4096, 64, False),
          (2, 16, 16, 8192, 64, False)]
# --overlap: the overlapped consumers on the persistent grid (ws_overlap="persistent", D 128 from S 4096 by default)
OVERLAP_SHAPES = [(16, 16, 16, 1024, 128, False), (8, 16, 16, 2048, 128, False), (8, 32, 8, 2048, 128, False),
                  (4, 16, 16, 4096, 128, False), (4, 32, 8, 4096, 128, False),
                  (2, 16, 16, 8192, 128, False), (1, 16, 16, 16384, 128, False), (2, 16, 16, 8192, 128, True)]


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main():
    overlap = "--overlap" in sys.argv[1:]
    print(torch.cuda.get_device_name(), "(the overlapped consumers)" if overlap else "", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(11)
    for B, H, Hkv, S, D, causal in OVERLAP_SHAPES if overlap else SHAPES:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        policy = A.default_policy(q, k, causal=causal).replace(
            forward="ws", ws_persistent=True, ws_overlap="persistent" if overlap else False, plans=False,
            ws_q_buffers=1,
            ws_config=C.WS_THREE if D == 64 else None)

        def one(q=q, k=k, v=v, causal=causal, policy=policy):
            return A.flash_attention(q, k, v, causal=causal, policy=policy)

        def two(q=q, k=k, v=v, causal=causal, policy=policy.replace(ws_q_buffers=2)):
            return A.flash_attention(q, k, v, causal=causal, policy=policy)

        def cudnn(q=q, k=k, v=v, causal=causal):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hkv)
        def default(q=q, k=k, v=v, causal=causal):  # the library's route (choose_policy), call plans on
            return A.flash_attention(q, k, v, causal=causal)
        fns = {"one Q buffer": one, "two Q buffers": two, "default": default, "cudnn": cudnn}
        if overlap:  # v5's own persistent kernel with two Q buffers: the route below the overlap rule
            fns["v5 persistent QB2"] = lambda q=q, k=k, v=v, causal=causal, policy=policy.replace(
                ws_overlap=False, ws_q_buffers=2): A.flash_attention(q, k, v, causal=causal, policy=policy)
        a, b, d, c = (fns[n]() for n in ("one Q buffer", "two Q buffers", "default", "cudnn"))
        same = torch.equal(a, b)
        err = ((b.float() - c.float()).norm() / c.float().norm()).item()
        med, _ = abba_ms(fns, bench)
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal}: " + ", ".join(
            f"{n} {ms:.4f} ms ({flops / ms / 1e9:.0f} TF, x cuDNN {med['cudnn'] / ms:.3f})" for n, ms in med.items())
            + f" | two / one {med['one Q buffer'] / med['two Q buffers']:.3f}x, two / default "
              f"{med['default'] / med['two Q buffers']:.3f}x, bitwise equal {same}, "
              f"vs cuDNN {err:.1e}"
            + (f", one / v5 persistent QB2 {med['v5 persistent QB2'] / med['one Q buffer']:.3f}x" if overlap else ""),
            flush=True)


if __name__ == "__main__":
    main()
