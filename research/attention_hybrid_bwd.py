"""Question: at Llama-3.2-1B's attention shapes, does our forward followed by cuDNN's backward beat
both cuDNN's forward + backward and ours?

Why: at B 1 H 32 / 8 S 16384 D 64 causal our forward is ahead of cuDNN's (1.11x at H 16 in the grid,
bench/results/NVIDIA_H200.csv) while our backward (v6: 7 matmuls a tile in two kernels) is behind
(7.17 against 6.33 ms, docs/tuning/attention.md, "v6 causal launch order"); in the Llama step that
backward is 13.5 ms a step behind cuDNN's (docs/tuning/bench.md). cuDNN's backward reads the forward's
output and its softmax statistics (the log-sum-exp), which our forward also writes. If the two meet
(layout, units), a hybrid is possible for the model (issue 31), though not an answer to issue 30.

Steps, each reported on its own (a failure prints and the next runs):
  1. cuDNN's forward (``aten._scaled_dot_product_cudnn_attention``): the shape, dtype and units of
     its log-sum-exp against ours (``flash_attention(..., return_lse=True)``).
  2. cuDNN's backward (``aten._scaled_dot_product_cudnn_attention_backward``) from our out and lse,
     against the gradients of cuDNN's own forward + backward and of the fp32 reference (small shape).
  3. Times (triton.testing.do_bench medians, ms): cuDNN forward + backward; ours; ours + cuDNN's.
GQA goes to cuDNN as is (H != Hkv); where it refuses, k and v are repeated to H heads, which the
step then prints.

    PYTHONPATH=src python3 research/attention_hybrid_bwd.py [--shapes llama|small]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton

import tilewise

aten = torch.ops.aten


def _cudnn_fwd(q, k, v, scale):
    out, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, True, False, scale=scale)
    return out, lse, (cq, ck, mq, mk, seed, off)


def _cudnn_bwd(do, q, k, v, out, lse, extra, scale):
    cq, ck, mq, mk, seed, off = extra
    empty = q.new_empty(0)
    return aten._scaled_dot_product_cudnn_attention_backward(do, q, k, v, out, lse, seed, off, empty, cq, ck,
                                                             mq, mk, 0.0, True, scale=scale)


def _expand(t, H):
    return t.repeat_interleave(H // t.shape[1], dim=1) if t.shape[1] != H else t


def _step(name, fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - report and go on: each step answers a part of the question
        print(f"  {name}: {type(e).__name__}: {str(e)[:300]}")
        return None


def run(B, H, Hkv, S, D, check):
    g = torch.Generator(device="cuda").manual_seed(S)
    q = torch.randn(B, H, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
    do = torch.randn(B, H, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
    scale = D ** -0.5
    print(f"B {B} H {H}/{Hkv} S {S} D {D} causal bf16")
    gqa = {"k": k, "v": v}
    first = _step("cuDNN forward, GQA as is", lambda: _cudnn_fwd(q, k, v, scale))
    if first is None:
        gqa = {"k": _expand(k, H), "v": _expand(v, H)}
        first = _step("cuDNN forward, k / v repeated", lambda: _cudnn_fwd(q, gqa["k"], gqa["v"], scale))
        if first is None:
            return
        print("  cuDNN takes GQA only with k / v repeated to H heads (their gradients summed back below)")
    kc, vc = gqa["k"], gqa["v"]
    out_c, lse_c, extra = first
    out_t, lse_t = tilewise.flash_attention(q, k, v, causal=True, scale=scale, return_lse=True)
    print(f"  lse: cuDNN {tuple(lse_c.shape)} {lse_c.dtype} strides {lse_c.stride()}; ours {tuple(lse_t.shape)} "
          f"{lse_t.dtype}")
    ours_as_c = lse_t.reshape(lse_c.shape).to(lse_c.dtype)
    diff = (ours_as_c - lse_c).abs().max().item()
    print(f"  max |lse ours - lse cuDNN| = {diff:.3e} (natural log, same scale if ~1e-3); out max diff "
          f"{(out_t.float() - out_c.float()).abs().max().item():.3e}")

    def fold(dk):  # repeated heads' gradients back to Hkv
        return dk if dk.shape[1] == Hkv else dk.unflatten(1, (Hkv, H // Hkv)).sum(2)

    grads_c = _step("cuDNN backward of cuDNN's forward", lambda: _cudnn_bwd(do, q, kc, vc, out_c, lse_c, extra, scale))
    grads_h = _step("cuDNN backward of our forward",
                    lambda: _cudnn_bwd(do, q, kc, vc, out_t.contiguous(), ours_as_c.contiguous(), extra, scale))
    if grads_c is not None and grads_h is not None:
        for n, a, b in zip("qkv", grads_h, grads_c):
            a, b = (fold(a), fold(b)) if n != "q" else (a, b)
            rel = ((a.float() - b.float()).norm() / b.float().norm()).item()
            print(f"  d{n}: hybrid against cuDNN's own, relative {rel:.2e}")
    if check and grads_h is not None:
        leaves = [t.float().requires_grad_(True) for t in (q, _expand(k, H), _expand(v, H))]
        ref = F.scaled_dot_product_attention(*leaves, is_causal=True, scale=scale)
        ref.backward(do.float())
        for n, a, r in zip("qkv", grads_h, (leaves[0].grad, fold(leaves[1].grad), fold(leaves[2].grad))):
            a = fold(a) if n != "q" else a
            print(f"  d{n}: hybrid against the fp32 reference, relative "
                  f"{((a.float() - r).norm() / r.norm()).item():.2e}")

    def cudnn_both():
        o, lse, ex = _cudnn_fwd(q, kc, vc, scale)
        return _cudnn_bwd(do, q, kc, vc, o, lse, ex, scale)

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

    def ours_both():
        o = tilewise.flash_attention(qg, kg, vg, causal=True, scale=scale)
        return torch.autograd.grad(o, (qg, kg, vg), do)

    def hybrid():
        o, lse = tilewise.flash_attention(q, k, v, causal=True, scale=scale, return_lse=True)
        return _cudnn_bwd(do, q, kc, vc, o, lse.reshape(lse_c.shape), extra, scale)

    for name, fn in (("cuDNN forward + backward", cudnn_both), ("ours forward + backward", ours_both),
                     ("ours forward + cuDNN backward", hybrid), ("ours forward", lambda: tilewise.flash_attention(
                         q, k, v, causal=True, scale=scale)), ("cuDNN forward", lambda: _cudnn_fwd(q, kc, vc, scale))):
        ms = _step(name, lambda fn=fn: triton.testing.do_bench(fn, warmup=25, rep=200))
        if ms is not None:
            print(f"  {name:<32} {ms:7.3f} ms")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="llama", choices=("llama", "small"))
    a = p.parse_args()
    print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name())
    if a.shapes == "small":
        run(1, 4, 2, 300, 64, check=True)
        return
    run(1, 4, 2, 300, 64, check=True)
    run(4, 32, 8, 4096, 64, check=False)
    run(1, 32, 8, 16384, 64, check=False)


if __name__ == "__main__":
    main()
