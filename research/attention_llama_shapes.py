"""Our attention against cuDNN's at the Llama-3.2-1B training shapes (issue 31's step), kernel by kernel.

Why: in `research/llama_step_profile.py --all` at 4 x 4096 (H200, c0709cc,
bench/results/logs/llama-step-profile-c0709cc.log), attention takes 56.3 ms a step with tilewise
(v5's forward 12.7, v6's dK / dV 27.8 and dQ 15.3 over 16 layers) and 47.8 ms with cuDNN (forward
11.9, backward 33.1 + 2.8 of pre / post kernels). This is the larger part of the gap to Liger
(257.1 against 264.6 ms a step). The bench grid's rows are H 16 without GQA. This times the
model's shapes: B 4 H 32 Hkv 8 S 4096 D 64 causal, and B 1 S 16384. The candidates are the tiles
and routes a config change could pick, plus the fused backward of research/attention_fused_bwd.py.

Every candidate is first checked against the default route's gradients; then do_bench medians.
Prediction: v6's D = 64 tiles were tuned at H 16 without GQA, so expect none more than ~5 % ahead
at these shapes. The fused backward's ceiling (dQ not written) should be ~1.15x cuDNN's backward,
as at D = 128; with the adds, slower than v6, as at D = 128.

Run on the GPU: PYTHONPATH=src python3 research/attention_llama_shapes.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C

sys.path.insert(0, str(Path(__file__).parent))
import attention_fused_bwd as FB  # noqa: E402

SHAPES = [(4, 32, 8, 4096, 64), (1, 32, 8, 16384, 64)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def case(B, H, Hkv, S, D):
    g = torch.Generator(device="cuda").manual_seed(S + D)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
            for _ in range(2))
    go = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    base = A.default_policy(q, k, causal=True)
    print(f"B{B} H{H}/{Hkv} S{S} D{D} causal; default policy: forward={base.forward} "
          f"ws_config={base.ws_config} backward={base.backward}", flush=True)
    fwd = {
        "default": base,
        "v5 two consumers": base.replace(forward="ws", ws_config=(128, 2, C.WS_FWD_CONSUMER_REGS, None, 2)),
        "v5 three, BLOCK_N 64 x 3": base.replace(forward="ws", ws_config=(64, 3, 160, None, 3)),
        "v3": base.replace(forward="pointer"),
    }
    with torch.no_grad():
        ref_out = A.flash_attention(q, k, v, causal=True, policy=base)
        for name, pol in fwd.items():
            try:
                out = A.flash_attention(q, k, v, causal=True, policy=pol)
            except Exception as ex:  # noqa: BLE001 - a config that does not build: say so, go on
                print(f"  fwd {name:<28} {type(ex).__name__}: {str(ex).splitlines()[-1][:200]}", flush=True)
                continue
            e = _err(out, ref_out)
            ms = bench(lambda pol=pol: A.flash_attention(q, k, v, causal=True, policy=pol)) if e < 1e-2 else None
            print(f"  fwd {name:<28} {'%.3f ms' % ms if ms else 'FAILED check (%.2e)' % e}", flush=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
        print(f"  fwd {'cuDNN':<28} {ms:.3f} ms", flush=True)

    out = A.flash_attention(q, k, v, causal=True, policy=base)
    ref = torch.autograd.grad(out, (q, k, v), go, retain_graph=True)
    bwd = {
        "default (v6)": base,
        "v6 dK/dV BLOCK_M 32 x 3": base.replace(backward="ws", ws_bwd_config=(32, 3, 240)),
        "v6 dQ BLOCK_N 128 x 2": base.replace(backward="ws", ws_bwd_dq_config=(128, 2, 240)),
        "v6 dK/dV 64 x 3": base.replace(backward="ws", ws_bwd_config=(64, 3, 240)),
        "v3 two kernels": base.replace(backward="two_kernel"),
    }
    for name, pol in bwd.items():
        try:
            o = A.flash_attention(q, k, v, causal=True, policy=pol)
            got = torch.autograd.grad(o, (q, k, v), go, retain_graph=True)
        except Exception as ex:  # noqa: BLE001
            print(f"  bwd {name:<28} {type(ex).__name__}: {str(ex).splitlines()[-1][:200]}", flush=True)
            continue
        e = max(_err(a, b) for a, b in zip(got, ref))
        ms = bench(lambda o=o: torch.autograd.grad(o, (q, k, v), go, retain_graph=True)) if e < 2e-2 else None
        print(f"  bwd {name:<28} {'%.3f ms' % ms if ms else 'FAILED check (%.2e)' % e}", flush=True)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ms = bench(lambda: torch.autograd.grad(oc, (q, k, v), go, retain_graph=True))
    print(f"  bwd {'cuDNN':<28} {ms:.3f} ms", flush=True)
    with torch.no_grad():
        o2, lse = A._fwd_impl(q, k, v, None, None, True, D ** -0.5, base)
    # (dQ mode, dS^T to shared memory before dK's product, v6's LSE / Delta loads); research/attention_fused_bwd.py
    for mode, order, stats, name in ((4, False, 1, "v7 writer warp"), (5, False, 1, "v7 writer, 8-col groups"),
                                     (3, False, 1, "v7 ceiling (dQ not written)")):
        cfg = (64, 2, 240, True, False, mode, False, order, stats)
        try:
            got = FB.fused_bwd(q.detach(), k.detach(), v.detach(), o2, go, lse, True, D ** -0.5, cfg)
        except Exception as ex:  # noqa: BLE001 - a variant that does not build: say so, go on
            print(f"  bwd {name:<28} {type(ex).__name__}: {str(ex).splitlines()[-1][:200]}", flush=True)
            continue
        e = max(_err(a, b) for a, b in zip(got, ref))
        ok = e < 2e-2 or mode == 3
        ms = bench(lambda cfg=cfg: FB.fused_bwd(q.detach(), k.detach(), v.detach(), o2, go, lse, True, D ** -0.5,
                                                 cfg)) if ok else None
        print(f"  bwd {name:<28} {'%.3f ms' % ms if ms else 'FAILED check (%.2e)' % e}"
              f"{' (dQ not written: its check is skipped)' if mode == 3 else ''}", flush=True)


def main():
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):
        x @ x
    for shape in SHAPES:
        case(*shape)


if __name__ == "__main__":
    main()
