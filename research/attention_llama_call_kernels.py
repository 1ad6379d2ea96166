"""Every kernel of one Llama attention call as `apply_tilewise` runs it (fused q / k / v's RoPE, the attention,
its output's transpose; forward + backward), by route, with the call's time: where a 1 x 16384 step's attention
goes beyond the two backward kernels.

Why: at 1 x 16384 (Llama-3.2-1B shape, D 64 causal, GQA 32 / 8) our whole call and the hybrid route (our forward,
cuDNN's backward) gave the same step (352.1-353.4 against 352.6-352.8 ms, H100, 426e340 / 1d4d109), though v6's two
backward kernels profiled at 3.29 + 2.44 ms against cuDNN's 5.84 + 0.28 (`attention-cudnn-bwd-kernels-426e340*.log`):
~0.4 ms a layer, ~6 ms a step, went somewhere. Candidates: the Delta pass, layout copies of q / k / v or of dO,
a gradient's dtype or layout conversion, allocations, host gaps between launches.

Routes: "auto" (`auto_attention_forward`: the hybrid at 16384, our whole call at 4096), "own" (`attention_forward`:
flash_attention at every call), "sdpa" (SDPA's cuDNN on the same q / k / v, as `tilewise_auto`'s SDPA route).
For each: the kernels a call launches (us a call, from the profiler's trace), their sum, and the call's time by
events (median of 20, back to back), so the difference is the device's idle time inside a call.

Prediction (2026-12-07, before a run; H100): "own" carries ~0.3-0.5 ms a call outside its dK / dV and dQ kernels
at 1 x 16384 (the Delta pass ~0.05 ms, the rest copies or conversions of dO or the gradients), which is why it
does not lead "auto" in the step.
Run on the GPU (~25 s warm): PYTHONPATH=src python3 research/attention_llama_call_kernels.py

Measured (2026-12-07, H100, three runs, attention-llama-call-kernels-055dc26.log): prediction wrong. Outside its
two backward kernels "own" launches only the Delta pass (52 us); at 1 x 16384 its backward kernels took 3.43 + 2.53
ms in this run (3.29 + 2.44 in attention_cudnn_bwd_kernels'), against cuDNN's 5.80 + 0.29, so the three routes
are within 2 % a call (auto 8.52-8.72, own 8.73-8.79, sdpa 8.75 ms). At 4 x 4096 auto (now flash_attention's
whole call) 2.45-2.51 against sdpa's 2.67-2.68. The "idle" column is not exact (the profiled calls and the timed
ones run at different clocks: it reads negative at 4 x 4096).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from tilewise.integrations import transformers as tw
from tilewise.ops.rope.api import apply_rotary_qkv

from _timing import kernel_rows, median_event_ms, print_kernel_rows

H, HKV, D = 32, 8, 64
SHAPES = ((1, 16384), (4, 4096))


def call(route: str, qkv: torch.Tensor, cos, sin, dout: torch.Tensor):
    module = types.SimpleNamespace(is_causal=True, training=True)
    q, k, v = apply_rotary_qkv(qkv, cos, sin, H, HKV)
    if route == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).contiguous()
    else:
        hook = tw.auto_attention_forward if route == "auto" else tw.attention_forward
        out, _ = hook(module, q, k, v, None, scaling=D ** -0.5)
    out.backward(dout)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    for B, S in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(S)
        qkv = (torch.randn(B, S, (H + 2 * HKV) * D, device="cuda", generator=g) / 2).to(torch.bfloat16)
        qkv.requires_grad_(True)
        theta = torch.rand(1, S, D // 2, device="cuda", generator=g) * 6.28
        cos, sin = (f(torch.cat([theta, theta], -1)).to(torch.bfloat16) for f in (torch.cos, torch.sin))
        dout = torch.randn(B, S, H, D, device="cuda", generator=g).to(torch.bfloat16)
        grads = {}
        for route in ("auto", "own", "sdpa"):
            def fn(route=route):
                qkv.grad = None
                call(route, qkv, cos, sin, dout)
            fn()
            grads[route] = qkv.grad.float()
            ms = median_event_ms(fn, reps=20, warmup=3, sync_each=False)
            rows = kernel_rows(fn)
            busy = sum(r[2] for r in rows) / 1e3
            print(f"B {B} S {S} {route}: {ms:.3f} ms a call, kernels {busy:.3f} ms, idle {ms - busy:.3f} ms",
                  flush=True)
            print_kernel_rows(rows)
        ref = grads["sdpa"]
        for route in ("auto", "own"):
            err = (grads[route] - ref).norm() / ref.norm()
            print(f"  qkv.grad {route} against sdpa's: relative error {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
