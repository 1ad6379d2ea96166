"""Which kernels does SDPA's cuDNN backward launch along issue 30's grid, with what grid, block, registers and shared
memory, and for how long? Beside it, v6's two kernels (``gluon_bwd.dkdv`` / ``dq``, the default configs) on the same
inputs. From the profiler's trace (Kineto's kernel events carry grid, block, registers per thread, shared memory).

Why: `attention_bwd_scaling.py` (2026-12-07, H100) put cuDNN's backward at 575 TFLOP/s at B 1 H 32 / 8 S 16384
D 128, against 517 at S 8192 with the same GQA and 525 at S 16384 with 16 heads of their own; our kernels held
675-770 there. Whether cuDNN changes kernel, tile or grid at that size (or splits the work by query heads) decides
what to try on our side.

Prediction (2026-12-07, before a run): the same kernel name at every S; at S 16384 GQA a grid that walks the four
query heads of a group in one CTA (grid.y = Hkv, not H) or a larger key tile.
Run on the GPU (~30 s): PYTHONPATH=src python3 research/attention_cudnn_bwd_kernels.py [--forward]
(--forward, prepared 2026-12-07, not run: cuDNN's forward kernels beside ours where our forward is furthest under
1.05x cuDNN; prediction: cuDNN's D 128 forward a persistent 132-CTA kernel with a 128-row tile and two consumer
warpgroups, as ours, so the gap is in the tile loop, not the grid.)

Measured (2026-12-07, H100, attention-cudnn-bwd-kernels-426e340*.log): one persistent kernel at every S (132 CTAs,
384 threads, 64 x 64 tiles), dQ in fp32 converted after, GQA's dK / dV summed over the group by two
fmha_reduce_head launches after: no CTA walks a group's query heads (that half of the prediction was wrong).
docs/tuning/attention.md, "The waiting rules landed; cuDNN's backward kernels; the floor of dQ's fp32 additions".
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_bwd as gb

from _timing import kernel_rows, print_kernel_rows, v6_backward_inputs

# (B, H, Hkv, S, D, causal): the scaling run's D 128 rows where cuDNN's rate moved, and the Llama D 64 rows.
SHAPES = [(2, 32, 8, 8192, 128, False), (1, 32, 8, 16384, 128, False), (1, 16, 16, 16384, 128, False),
          (4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True)]


# `--forward`: the grid's forward points furthest under issue 30's 1.05x (H100 0d2c241, x cuDNN): D 128 without causal
# at every S (0.945-0.988), D 64 causal S 1024 (0.879).
FWD_SHAPES = [(8, 16, 16, 2048, 128, False), (4, 16, 16, 4096, 128, False), (1, 16, 16, 16384, 128, False),
              (16, 16, 16, 1024, 64, True), (4, 32, 8, 4096, 128, False)]


def show(title: str, fn) -> None:
    print(title, flush=True)
    print_kernel_rows(kernel_rows(fn))


def forward():
    """cuDNN's forward kernels beside flash_attention's default forward (no gradients) at FWD_SHAPES."""
    from tilewise.ops.attention.api import flash_attention

    for B, H, Hkv, S, D, causal in FWD_SHAPES:
        q, k, v, _, _, _, _ = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D)
        with torch.no_grad():
            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H)
            show(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} forward cudnn:", cudnn)
            show(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} forward ours:",
                 lambda: flash_attention(q, k, v, causal=causal))


def main():
    print(torch.cuda.get_device_name(), flush=True)
    if "--forward" in sys.argv:
        return forward()
    for B, H, Hkv, S, D, causal in SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D)
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            oc = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=Hkv != H)
        pol = C.choose_policy(D, S, S, causal=causal)
        kv_cfg, q_cfg = C.ws_bwd_dkdv_config(D, pol.ws_bwd_config), C.ws_bwd_dq_config(D, pol.ws_bwd_dq_config)
        dk, dv, dq = (torch.empty_like(t) for t in (k, v, q))
        ours = (lambda: (gb.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv, config=kv_cfg),
                         gb.dq(q, k, v, do, lse, delta, causal, scale, dq, config=q_cfg)))
        for who, fn in (("cudnn", lambda: torch.autograd.grad(oc, (qq, kk, vv), do, retain_graph=True)),
                        ("v6", ours)):
            show(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} {who}:", fn)


if __name__ == "__main__":
    main()
