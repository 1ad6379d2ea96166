"""Our forward with cuDNN's backward: does cuDNN's backward take our output and log-sum-exp, and does
the pair beat cuDNN's forward + backward where our forward is the faster one (D = 64, long S)?

Why: in the llama bench at 1 x 16384 (Llama-3.2-1B shape, D = 64, GQA 32 / 8, causal) attention is
160 of 350 ms a step and runs on cuDNN both ways ("tilewise_auto": SDPA for calls with gradients,
because our backward is 0.86-0.89x cuDNN's). Our forward alone is 1.02-1.11x cuDNN's at D = 64 from
S = 8192. If cuDNN's backward (aten._scaled_dot_product_cudnn_attention_backward) accepts our O and
LSE, the step keeps cuDNN's backward and gains our forward: at ~10 % of a ~2.8 ms forward, about
0.28 ms a layer, ~4.5 ms a step at 16 layers (prediction).

What it does, per shape (q, k, v in transformers' layout: (B, S, H, D) storage viewed as (B, H, S, D)):
1. probes cuDNN's forward op: the log-sum-exp's shape, strides and units against ours;
2. checks the hybrid's gradients (our forward's O / LSE into cuDNN's backward) against the fp32
   reference and against cuDNN's own forward + backward (relative errors printed);
3. times (triton do_bench, median, L2 flushed): cuDNN forward, our forward, cuDNN forward + backward
   through SDPA's autograd, and the hybrid's forward + backward.

Run on the GPU: PYTHONPATH=src python3 research/attention_cudnn_bwd_hybrid.py [--inputs]

--inputs: where the ~0.8 ms goes. cuDNN's backward op alone, on the same q, k, v, dO, with each (O, LSE)
pair: cuDNN forward's own, ours, the two mixes, and cuDNN's own with a dummy philox seed / offset (as the
hybrid passes); then both whole forward + backward paths. Rounds alternate the order (A B B A), medians of
the rounds' do_bench medians. Prediction (2026-12-05, before the run): the op's time depends on its inputs'
values or layout only through O and LSE's strides and alignment, which match (same strides printed above);
so the backward op alone ties across the pairs (within 2 %) and the gap is outside it (our forward's
autograd path, e.g. a copy or a different kernel with return_lse) -- if the op itself is slower on our
pair, the mixes say which of O or LSE does it.
Measured (H100, 599ce19, `bench/results/logs/attention-cudnn-bwd-inputs-599ce19.log`): the op alone within 2 % on
every pair (6.506 / 6.608 ms at 1 x 16384, 1.981 / 1.964 at 4 x 4096); the hybrid's forward + backward 8.804
against cuDNN's path 9.190 ms at 1 x 16384 (1.044x), 2.743 / 2.749 at 4 x 4096. The H200's 0.8 ms did not come
back on the H100.

Measured (H200, 2026-12-05, code 2373afd, `bench/results/logs/attention-cudnn-bwd-hybrid-2373afd.log`): cuDNN's
backward takes our O and LSE (LSE within 1.9e-6 of cuDNN's own, (B, H, S, 1); gradients within 3e-4 of
cuDNN's whole path), but the pair is slower than cuDNN's forward + backward at all three shapes (0.90x,
0.94x, 0.90x): our forward is 1.09x / 1.05x cuDNN's at S 16384 / 8192, and cuDNN's backward then takes
~0.8 ms longer than after its own forward. The llama step at 1 x 16384 did not move (356.0 ms with the
route in tilewise_auto, 356.2 without). Not landed; the route is `research/patches/cudnn-backward-policy.patch`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import tilewise
from tilewise.ops.attention import reference as R

ATEN = torch.ops.aten
SHAPES = [  # (B, H, Hkv, S, D, causal): the llama bench's attention (Llama-3.2-1B heads) at its two shapes
    (1, 32, 8, 16384, 64, True), (4, 32, 8, 4096, 64, True), (2, 32, 8, 8192, 64, True)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def cudnn_fwd(q, k, v, causal, scale):
    """cuDNN's forward op; k / v expanded to q's heads when the op does not take GQA."""
    return ATEN._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)


class Hybrid(torch.autograd.Function):
    """Our forward; cuDNN's backward on our O and LSE (cuDNN's (B, H, S, 1) layout of it)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        out, lse = tilewise.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        seed = torch.empty((), dtype=torch.int64, device=q.device)  # dropout 0: never read
        # No bias, no cumulative lengths: undefined tensors (None; an empty tensor reads as a 1-D bias).
        dq, dk, dv = ATEN._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, out, lse.unsqueeze(-1), seed, seed, None, None, None, q.shape[2], k.shape[2], 0.0,
            ctx.causal, scale=ctx.scale)
        return dq, dk, dv, None, None


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):
        x @ x  # clocks up
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, H, Hkv, S, D, causal in SHAPES:
        label = f"B{B} H{H} Hkv{Hkv} S{S} D{D}{' causal' if causal else ''}"
        scale = D ** -0.5

        def make(h):
            return torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
        q, k, v = make(H), make(Hkv), make(Hkv)
        do = make(H)
        # 1. cuDNN's forward op and its LSE
        try:
            oc, lsec, *rest = cudnn_fwd(q, k, v, causal, scale)
            gqa_native = True
        except RuntimeError as e:
            print(f"{label}: cuDNN op refused GQA ({str(e)[:160]}); expanding k / v")
            gqa_native = False
            kx, vx = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
            oc, lsec, *rest = cudnn_fwd(q, kx, vx, causal, scale)
        ours, lse = tilewise.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
        print(f"{label}: cuDNN lse {tuple(lsec.shape)} {lsec.stride()} {lsec.dtype}; ours {tuple(lse.shape)} "
              f"{lse.stride()}; max |lse diff| {(lsec.reshape(lse.shape) - lse).abs().max().item():.3g}; "
              f"cuDNN out strides {oc.stride()}, ours {ours.stride()}; GQA native {gqa_native}")
        if not gqa_native:
            print(f"{label}: skipped (no GQA in cuDNN's op)")
            continue
        # 2. gradients: the hybrid against fp32 and against cuDNN's own
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        Hybrid.apply(*leaves, causal, scale).backward(do)
        hyb = [t.grad for t in leaves]
        G = H // Hkv  # the reference on batch 0, K / V head 0 and its G query heads (S x S in fp32)
        ref_leaves = [t[:1, :n].detach().float().requires_grad_() for t, n in ((q, G), (k, 1), (v, 1))]
        R.reference(*ref_leaves, causal=causal, scale=scale).backward(do[:1, :G].float())
        cl = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(*cl, is_causal=causal, scale=scale, enable_gqa=H != Hkv).backward(do)
        for name, n, a, c, r in zip("qkv", (G, 1, 1), hyb, [t.grad for t in cl], [t.grad for t in ref_leaves]):
            print(f"  d{name}: hybrid vs fp32 {rel(a[:1, :n], r):.3g}, cuDNN vs fp32 {rel(c[:1, :n], r):.3g}, "
                  f"hybrid vs cuDNN {rel(a, c):.3g}")
        # 3. times
        with torch.no_grad():
            t_cf = bench(lambda: cudnn_fwd(q, k, v, causal, scale))
            t_of = bench(lambda: tilewise.flash_attention(q, k, v, causal=causal, scale=scale))

        def cudnn_fb():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(*cl, is_causal=causal, scale=scale, enable_gqa=H != Hkv).backward(do)

        def hybrid_fb():
            Hybrid.apply(*leaves, causal, scale).backward(do)
        t_cfb, t_hfb = bench(cudnn_fb), bench(hybrid_fb)
        print(f"  fwd: cuDNN {t_cf:.3f} ms, ours {t_of:.3f} ms ({t_cf / t_of:.3f}x); fwd+bwd: cuDNN {t_cfb:.3f}, "
              f"hybrid {t_hfb:.3f} ({t_cfb / t_hfb:.3f}x)", flush=True)


def inputs():
    import sys

    from _timing import abba_ms
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    shapes = SHAPES[:1] if "--first" in sys.argv else SHAPES[:2]
    for B, H, Hkv, S, D, causal in shapes:
        label = f"B{B} H{H} Hkv{Hkv} S{S} D{D}{' causal' if causal else ''}"
        scale = D ** -0.5

        def make(h):
            return torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
        q, k, v, do = make(H), make(Hkv), make(Hkv), make(H)
        with torch.no_grad():
            res = cudnn_fwd(q, k, v, causal, scale)
            oc, lsec, seed_c, off_c = res[0], res[1], res[6], res[7]
            ours, lse = tilewise.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
        lse4 = lse.unsqueeze(-1)
        dummy = torch.empty((), dtype=torch.int64, device=q.device)
        for name, t in (("cuDNN O", oc), ("our O", ours), ("cuDNN LSE", lsec), ("our LSE", lse4)):
            print(f"{label}: {name} {tuple(t.shape)} strides {t.stride()} ptr%1024 {t.data_ptr() % 1024} "
                  f"storage {t.untyped_storage().nbytes()} B", flush=True)
        print(f"  philox seed {seed_c.dtype} {seed_c.device} {tuple(seed_c.shape)}, offset {off_c.dtype} "
              f"{off_c.device} {tuple(off_c.shape)}", flush=True)
        pairs = {"cuDNN O + LSE": (oc, lsec, seed_c, off_c), "our O + LSE": (ours, lse4, dummy, dummy),
                 "our O, cuDNN LSE": (ours, lsec, dummy, dummy), "cuDNN O, our LSE": (oc, lse4, dummy, dummy),
                 "cuDNN O + LSE, dummy seed": (oc, lsec, dummy, dummy)}

        def bwd_of(o, lse_, seed, off):
            def fn():
                return ATEN._scaled_dot_product_cudnn_attention_backward(
                    do, q, k, v, o, lse_, seed, off, None, None, None, S, S, 0.0, causal, scale=scale)
            return fn
        fns = {name: bwd_of(*p) for name, p in pairs.items()}
        ref = [t.float() for t in fns["cuDNN O + LSE"]()]
        for name, fn in fns.items():
            got = fn()
            print(f"  {name}: dq, dk, dv vs cuDNN's own pair " +
                  ", ".join(f"{rel(a, b):.2g}" for a, b in zip(got, ref)), flush=True)
        cl = [t.detach().requires_grad_() for t in (q, k, v)]
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def cudnn_fb():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(*cl, is_causal=causal, scale=scale, enable_gqa=H != Hkv).backward(do)

        def hybrid_fb():
            Hybrid.apply(*leaves, causal, scale).backward(do)
        fns["fwd+bwd: cuDNN (SDPA autograd)"] = cudnn_fb
        fns["fwd+bwd: hybrid"] = hybrid_fb
        fns["fwd: cuDNN op"] = torch.no_grad()(lambda: cudnn_fwd(q, k, v, causal, scale))
        fns["fwd: ours, return_lse"] = torch.no_grad()(
            lambda: tilewise.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True))
        med, times = abba_ms(fns, bench)
        for n in fns:
            print(f"  {n:32s} {med[n]:.3f} ms (rounds {', '.join(f'{t:.3f}' for t in times[n])})"
                  + (f"  {med[n] / med['cuDNN O + LSE']:.3f}x the op on cuDNN's pair" if not n.startswith("fwd")
                     else ""), flush=True)


if __name__ == "__main__":
    import sys

    if "--inputs" in sys.argv:
        inputs()
    else:
        main()
