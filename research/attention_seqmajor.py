"""Sequence-major attention: v5 / v6 reading and writing transformers' (B, S, H, D) storage in place,
against the copies they needed before, and against cuDNN on the same strided tensors.

Question: in a transformers Llama step q and k reach attention head-major (tilewise's RoPE returns
contiguous (B, H, S, D)), v and the output gradient dO as (B, H, S, D) views of (B, S, H, D)
storage, and the caller transposes the output back to (B, S, H * D) and v's gradient goes back to
v_proj as (B, S, Hkv * D). Before, an eager call copied v and dO to contiguous for v5 / v6, the
caller's ``out.transpose(1, 2).contiguous()`` copied the output and v_proj's backward copied dV:
four copies a layer. Now v5 / v6 take each tensor's own (RB, RH, CH) (ops/attention/layout.py),
the output is allocated sequence-major and dV in v's layout, so all four go. How much of a
layer's attention time does that save, and is anything lost inside the kernels (the sequence-major
TMA boxes are D-wide slices of H * D-wide rows; the stores' rows are H * D apart)?

Prediction: the kernels themselves run within noise of the head-major ones (same boxes, same
arithmetic; rows of 128 / 256 bytes either way). The copies are memory-bound: at B 4, S 4096,
Hkv 8, D 64 (Llama-3.2-1B) v and dV are 16.8 MB each, dO and the output 67 MB each, so about
2 x (2 x 16.8 + 2 x 67) MB = 335 MB moved, ~0.1 ms at ~3.5 TB/s of a ~3.5 ms fwd + bwd, a 2-4%
gain; at B 4, H 16, S 4096, D 128 all four are 67 MB (~0.15 ms of ~7 ms). cuDNN stays ahead at
D = 64 (the step's profile: 47.8 vs 56.3 ms a step).

Measured (H200, code 768d022, bench/results/logs/attention-seqmajor-768d022.log): bitwise equal to
the copy path; fwd + bwd 1.065x the copy path at the Llama shape (2.887 -> 2.712 ms, cuDNN 2.604),
1.138x at D 128 causal, 1.057x at D 128: more than predicted.

Columns: "copies" (the before path: v.contiguous() and dO.contiguous() around head-major v5 / v6,
the caller's output copy and dV's copy back to (B, S, Hkv, D)), "seq-major" (this change: no
copies), "cudnn" (SDPA's cuDNN backend on the same q, k, v and dO; with GQA through
``enable_gqa`` where the backend takes it, else K and V expanded to H heads first, as transformers
does); fwd + bwd a call, ms (do_bench median, L2 flushed); and the copy kernels a call (profiler,
kernel names with "copy"). First the correctness check: at small shapes the sequence-major path
against the copy path (max relative error; the same kernels on the same values, so expected 0)
and both against the fp32 reference.

Run on the GPU: PYTHONPATH=src python3 research/attention_seqmajor.py
"""

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import api as A


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def inputs(B, H, Hkv, S, D, seed):
    """q, k head-major (RoPE's outputs), v a view of (B, S, Hkv, D) (v_proj's output), dO a view of
    (B, S, H, D) (the gradient of the caller's transposed output); all bf16, q, k, v leaves."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, S, D, device="cuda", generator=g).bfloat16().requires_grad_(True)
    k = torch.randn(B, Hkv, S, D, device="cuda", generator=g).bfloat16().requires_grad_(True)
    v_lin = torch.randn(B, S, Hkv, D, device="cuda", generator=g).bfloat16().requires_grad_(True)
    do = torch.randn(B, S, H, D, device="cuda", generator=g).bfloat16().transpose(1, 2)
    return q, k, v_lin, do


def copies_path(q, k, v_lin, do, causal):
    """Before: v and dO copied to contiguous for v5 / v6, the output copied back to (B, S, H, D) by the
    caller, dV copied back to (B, S, Hkv, D) for v_proj. Returns (out, dq, dk, dv), all in the
    caller's layouts."""
    v = v_lin.transpose(1, 2).contiguous()
    out = A.flash_attention(q, k, v, causal=causal)
    out_bshd = out.transpose(1, 2).contiguous()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do.contiguous())
    return out_bshd, dq, dk, dv.transpose(1, 2).contiguous()


def seq_major_path(q, k, v_lin, do, causal):
    """This change: v and dO read in place, the output written sequence-major, dV in v's layout: the
    caller's transposes back are free."""
    v = v_lin.transpose(1, 2)
    out = A.flash_attention(q, k, v, causal=causal)
    out_bshd = out.transpose(1, 2).contiguous()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    return out_bshd, dq, dk, dv.transpose(1, 2).contiguous()


def cudnn_path(q, k, v_lin, do, causal, gqa_ok):
    v = v_lin.transpose(1, 2)
    kk, vv = k, v
    group = q.shape[1] // k.shape[1]
    if group > 1 and not gqa_ok:  # transformers' repeat_kv
        kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=group > 1 and gqa_ok)
    out_bshd = out.transpose(1, 2).contiguous()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v_lin), do)
    return out_bshd, dq, dk, dv


def reference_path(q, k, v_lin, do, causal):
    q, k, v_lin = (t.detach().float().requires_grad_(True) for t in (q, k, v_lin))
    out = A.reference(q, k, v_lin.transpose(1, 2), causal=causal)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v_lin), do.float())
    return out.transpose(1, 2), dq, dk, dv


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def kernels_run(fn):
    """The kernels ``fn`` launches through the attention module's launcher, by name."""
    names, launch = [], A._launch

    def recording(kernel, grid, *args, **kwargs):
        names.append(getattr(kernel, "fn", kernel).__name__)
        return launch(kernel, grid, *args, **kwargs)

    A._launch = recording
    try:
        fn()
    finally:
        A._launch = launch
    return names


def copy_kernels(fn):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if "copy" in e.key.lower())


def cudnn_gqa_ok(q, k, v_lin, do, causal):
    try:
        cudnn_path(q, k, v_lin, do, causal, True)
        return True
    except RuntimeError:
        return False


def check(B, H, Hkv, S, D, causal):
    q, k, v_lin, do = inputs(B, H, Hkv, S, D, seed=S + D)
    names = ("out", "dq", "dk", "dv")
    old = copies_path(q, k, v_lin, do, causal)
    new = seq_major_path(q, k, v_lin, do, causal)
    ref = reference_path(q, k, v_lin, do, causal)
    ran = kernels_run(lambda: seq_major_path(q, k, v_lin, do, causal))
    print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal}: kernels {ran}")
    for n, a, b, r in zip(names, new, old, ref):
        print(f"  {n}: seq-major vs copies {rel_err(a, b):.2e} (bitwise {torch.equal(a, b)}), "
              f"seq-major vs fp32 {rel_err(a, r):.2e}, copies vs fp32 {rel_err(b, r):.2e}")


def timing(B, H, Hkv, S, D, causal):
    q, k, v_lin, do = inputs(B, H, Hkv, S, D, seed=1)
    gqa_ok = cudnn_gqa_ok(q, k, v_lin, do, causal)
    runs = {"copies": lambda: copies_path(q, k, v_lin, do, causal),
            "seq-major": lambda: seq_major_path(q, k, v_lin, do, causal),
            "cudnn": lambda: cudnn_path(q, k, v_lin, do, causal, gqa_ok)}
    ms = {n: bench(f) for n, f in runs.items()}
    n_copies = {n: copy_kernels(f) for n, f in runs.items()}
    label = f"B{B} H{H}/{Hkv} S{S} D{D}{' causal' if causal else ''}"
    cells = " | ".join(f"{ms[n]:.3f} ms ({n_copies[n]} copies)" for n in runs)
    print(f"| {label} | {cells} | {ms['copies'] / ms['seq-major']:.3f}x |"
          + ("" if gqa_ok or H == Hkv else " (cudnn: K / V expanded)"))


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    print("correctness (max |a - b| / max |b|)")
    check(2, 8, 4, 1000, 64, True)
    check(2, 8, 2, 1100, 128, False)
    check(2, 32, 8, 4100, 64, True)
    print()
    print("| shape | copies | seq-major | cudnn | copies / seq-major |")
    print("| --- | --- | --- | --- | --- |")
    timing(4, 32, 8, 4096, 64, True)  # Llama-3.2-1B
    timing(4, 16, 16, 4096, 128, True)
    timing(4, 16, 16, 4096, 128, False)


if __name__ == "__main__":
    main()
