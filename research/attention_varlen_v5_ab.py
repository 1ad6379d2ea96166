"""Packed sequences (``flash_attention_varlen``) with v5's persistent forward against v3's (issue 30: varlen >= 1.0x
FlexAttention with a document block mask; the H200 rows of 2026-12-05 put our forward + backward at 0.995-1.004x
Flex's and the forward at 1.41x).

Why: varlen ran v3's pointer forward (369 TFLOP/s at the bench's 8 causal documents, D 128, on the H200) where the
dense route runs v5 (550-600). ``gluon_fwd.fwd_varlen`` runs v5's persistent kernel over work items by sequence
(ceil(max_q / rows an item) a sequence and head, those past a sequence's queries skipped), reading the packed
(total, heads x D) rows by TMA; the backward stays v3's two kernels.

How: three packings, bf16, causal, each timed by turns (``harness.time_ms_rounds``: v3's forward and v5's, then
forward + backward as v3 + v3, v5 + v3 and v5 + v6: v6's two kernels by sequence, ``gluon_bwd`` with ``varlen``),
outputs and gradients compared with v3's (within bf16 rounding) and document 0 against the fp32 reference:
  bench:  the bench's 8 documents (4096 .. 700, 16,296 tokens), H 16, D 128
  llama:  16 documents of 1024 (16,384 tokens), GQA 32 / 8, D 64 (a Llama-3.2-1B batch of packed documents)
  ragged: 40 documents of 1 .. 2,000 tokens (seeded), GQA 32 / 8, D 128

Prediction (before any run): forward v5 / v3 1.35-1.6x at D 128 and 1.2-1.45x at D 64 (the ragged packing at the
low end: more partial items); forward + backward v5 + v3 1.05-1.12x (the v3 backward is ~80 % of the call), v5 + v6
1.3-1.5x at D 128 and 1.1-1.3x at D 64 (the dense backward's v6 / v3 ratios, H200: 1.38-1.61x and 1.05-1.24x). If
the forward gains under 1.15x anywhere, the per-item skip (the loader and consumers read the offsets every item) or
the partial last item of each sequence is where to look.
Run on the GPU (~60 s): cd research && PYTHONPATH=../src python3 attention_varlen_v5_ab.py
"""
import random

import torch

from tilewise.bench.harness import time_ms_rounds
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import varlen as V

DOCS = {
    "bench": ((4096, 3000, 2500, 2000, 1800, 1200, 1000, 700), 16, 16, 128),
    "llama": ((1024,) * 16, 32, 8, 64),
    "ragged": (tuple(random.Random(40).randint(1, 2000) for _ in range(40)), 32, 8, 128),
}


def packing(lens, H, Hkv, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lens)
    q, go = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(total, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device="cuda")
    return q, k, v, go, cu


def fns_flops(ms, flops):
    """(name, FLOP multiple) of each timed version: a forward 1, a forward + backward 3.5 (the backward 2.5x)."""
    return [(name, 1.0 if name.startswith("fwd ") else 3.5) for name in ms]


def main():
    print(f"device: {torch.cuda.get_device_name()}")
    for name, (lens, H, Hkv, D) in DOCS.items():
        q, k, v, go, cu = packing(lens, H, Hkv, D, len(lens))
        S = max(lens)
        base = C.choose_policy(D, S, S, causal=True)
        pol = {"v3": base.replace(forward="pointer", backward="two_kernel"),
               "v5": base.replace(forward="ws", backward="two_kernel"),
               "v5+v6": base.replace(forward="ws", backward="ws")}

        def fwd(p, a=q, b=k, c=v):
            return V.flash_attention_varlen(a, b, c, cu, cu, S, S, causal=True, policy=p, check_seqlens=False)

        outs = {n: fwd(p) for n, p in pol.items()}
        diff = (outs["v5"].float() - outs["v3"].float()).abs().max().item()
        n0 = lens[0]
        ref = V.reference(q[:n0].float(), k[:n0].float(), v[:n0].float(), cu[:2], cu[:2], causal=True)
        err = ((outs["v5"][:n0].float() - ref).norm() / ref.norm()).item()
        print(f"{name}: {len(lens)} documents, {sum(lens)} tokens, max {S}, H {H} / {Hkv}, D {D}; "
              f"v5 - v3 max |diff| {diff:.3g}, v5 document 0 relative error {err:.3g}")
        ins = [t.detach().requires_grad_(True) for t in (q, k, v)]
        grads = {n: torch.autograd.grad(fwd(p, *ins), ins, go) for n, p in pol.items()}
        gdiff = max((a.float() - b.float()).abs().max().item() for a, b in zip(grads["v5+v6"], grads["v3"]))
        print(f"  v5+v6 - v3 gradients max |diff| {gdiff:.3g}")
        fns = {f"fwd {n}": (lambda p=p: fwd(p)) for n, p in pol.items() if n != "v5+v6"}
        for n, p in pol.items():
            fns[f"fwd+bwd {n}"] = lambda p=p, ins=ins, go=go: torch.autograd.grad(fwd(p, *ins), ins, go)
        ms = time_ms_rounds(fns)
        flops = sum(4.0 * H * n * n * D / 2 for n in lens)
        for name, mult in fns_flops(ms, flops):
            print(f"  {name:14s} {ms[name]:.4f} ms ({flops * mult / ms[name] / 1e9:.0f} TFLOP/s)  speed x v3 "
                  f"{ms[name.split()[0] + ' v3'] / ms[name]:.3f}")
        del q, k, v, go, ins, outs, grads
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
