"""v6's dQ kernel under the pipe schedule with the last tile's dS carried in fp32 (converted to the product's bf16
operand when it is issued), against dS carried as the bf16 operand (the kernel before, loaded from BASE); same run,
same inputs, dQ compared bit for bit.

Why: the sm_90 SASS (Triton 3.6) of the pipe builds carried the bf16 pairs with their halves swapped, 32 PRMT a key
tile (one swap at the product, one at the copy into the carried registers). Carried in fp32 the key-tile loop is 245
instructions at D 128 (bf16 carry 277, no pipe 248) and 228 at D 64 (259, 211), spill-free under Triton 3.6 and 3.9.
The pipe at D 64 lost to the default schedule (0.91-0.95x with 3 or 4 stages, docs/tuning/attention.md, "... v6's
pipe schedule"), where a tile is short and those instructions weigh most.

Prediction (2026-12-07, before a run; H100): D 128 (the default, 4 stages) 1.01-1.03x the bf16 carry; D 64 with 4
stages 1.03-1.06x the bf16 carry, i.e. back to 0.98-1.01x the default schedule; dQ bitwise equal (the same
products of the same rounded operands).

BASE (default .ab/gluon_bwd_base.py: `mkdir -p .ab && git show <commit>:src/tilewise/ops/attention/gluon_bwd.py >
.ab/gluon_bwd_base.py`; .ab/ is git-ignored, carry it) is loaded as a module of the attention package.
Run on the GPU (~1 minute): PYTHONPATH=src python3 research/attention_dq_carry_ab.py [BASE]
"""

from __future__ import annotations

import sys

import torch
import triton

from tilewise.ops.attention import gluon_bwd as gb

from _timing import abba_ms, load_attention_module, v6_backward_inputs, warm_clocks

# (B, H, Hkv, S, D, causal): the Llama-3.2-1B shapes, then issue 30's grid points at D 64 / 128.
SHAPES = [(4, 32, 8, 4096, 64, True), (4, 16, 16, 4096, 64, False), (8, 16, 16, 2048, 64, True),
          (4, 16, 16, 4096, 128, False), (2, 32, 8, 8192, 128, True), (8, 16, 16, 2048, 128, False),
          (16, 16, 16, 1024, 128, True)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=80, return_mode="median")


def main():
    base = load_attention_module(sys.argv[1] if len(sys.argv) > 1 else ".ab/gluon_bwd_base.py", "gluon_bwd_base")
    warm_clocks()
    print(f"{torch.cuda.get_device_name()}: B H/Hkv S D causal | dQ pipe, 4 stages: bf16 carry -> fp32 carry ms (x) | "
          "default schedule (x fp32 carry) | bitwise", flush=True)
    for B, H, Hkv, S, D, causal in SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D + causal)
        pipe, plain = (64, 4, 240, 0, 1), (64, 3, 240)
        outs = {n: torch.full_like(q, float("nan")) for n in ("base", "new", "plain")}
        calls = {"base": lambda: base.dq(q, k, v, do, lse, delta, causal, scale, outs["base"], config=pipe),
                 "new": lambda: gb.dq(q, k, v, do, lse, delta, causal, scale, outs["new"], config=pipe),
                 "plain": lambda: gb.dq(q, k, v, do, lse, delta, causal, scale, outs["plain"], config=plain)}
        for fn in calls.values():
            fn()
        same = torch.equal(outs["base"], outs["new"]) and torch.equal(outs["new"], outs["plain"])
        assert torch.isfinite(outs["new"]).all(), (B, H, S, D, causal)
        t, _ = abba_ms(calls, bench)
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | {t['base']:.3f} -> {t['new']:.3f} "
              f"({t['base'] / t['new']:.3f}x) | {t['plain']:.3f} ({t['plain'] / t['new']:.3f}x) | {same}", flush=True)


if __name__ == "__main__":
    main()
