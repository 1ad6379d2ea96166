"""D = 64 forward tiles that the sweeps so far left out: 128 x 128 and 256 x 64 (each warpgroup of
8 warps then owns 128 query rows: K and V are read from L2 half as often per row), for the bias
forward (TMA kernel, a (1, H, S, S) bf16 bias) and the plain forward, against the current tiles
and SDPA cuDNN, three interleaved rounds, S = 4096 (B = 4) and 8192 (B = 2), H = 16.

Why: the bias forward at D = 64 sits at 1.25-1.28x cuDNN (target 1.3x, logs/attention-bias-ab.log)
and the plain one at 0.90-0.95x cuDNN. Per key tile a 128 x 64 CTA reads 8 + 8 KiB of K and V and
16 KiB of bias; a 256-row tile reads the same K and V for twice the rows.
Prediction: 256 x 64 spills or loses occupancy (two 128-row accumulators a warpgroup: ~200
registers a thread); if it compiles without spills, bias forward -3 to -5 %.

Measured (149d4be, logs/attention-d64-tiles.log, ms, median of three rounds): bias S = 4096
128 x 64 x 8 x 3 (current) 0.875, 256 x 64 x 8 x 3 0.942, 256 x 64 x 8 x 2 1.125, 128 x 128 x 8 x 2
1.188; S = 8192 1.816 / 1.840 / 2.229 / 2.364. Plain (v4 TMA under each tile, v3 default beside):
v3 0.638 / 1.261, v4 128 x 64 0.682 / 1.330, 128 x 128 0.942 / 1.764, 256 x 64 1.006 / 1.865. No new
tile leads; the defaults stay. The default bias path timed twice in the run (labelled "v3 (plain
default)" in that log, "default path" now, and under its own tile) differs by 2-4 %: the spread
of one run.

Run on the GPU (~2 minutes): PYTHONPATH=src python3 research/attention_d64_tiles.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import bias_attention_case, interleaved_rounds
from tilewise.ops.attention import api as A

BIAS_TILES = [(128, 64, 8, 3), (128, 128, 8, 2), (256, 64, 8, 2), (256, 64, 8, 3)]
PLAIN_TILES = [(128, 64, 8, 3), (128, 128, 8, 2), (256, 64, 8, 2)]


def bench(fn):
    return do_bench(fn, warmup=5, rep=60, return_mode="median")


def cudnn(q, k, v, bias):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def ours(policy):
    def run(q, k, v, bias):
        return A.flash_attention(q, k, v, bias=bias, policy=policy)
    return run


for B, S in ((4, 4096), (2, 8192)):
    g = torch.Generator(device="cuda").manual_seed(S)
    q, k, v, bias, ref_b, _, flops = bias_attention_case(B, 16, S, 64, g, bench)
    ref_p = cudnn(q, k, v, None)
    for label, b, ref, kind, tiles in (("bias", bias, ref_b, "fwd_tma_bias", BIAS_TILES),
                                       ("plain", None, ref_p, "fwd", PLAIN_TILES)):
        cands = {"cudnn": cudnn, "default path": lambda q, k, v, bias: A.flash_attention(q, k, v, bias=bias)}
        # The tiles' kernel: v4 (forward "tma") for the plain forward, the TMA bias kernel (forward "pointer",
        # bias_tma on) with the bias; not v5.
        base = A.default_policy(q, k, bias=b).replace(forward="tma" if kind == "fwd" else "pointer")
        cands.update({f"{kind} {t}": ours(base.replace(tiles={kind: t})) for t in tiles})
        interleaved_rounds(f"{label} D=64 B={B} S={S}", cands, lambda fn: fn(q, k, v, b), ref, flops, bench)
