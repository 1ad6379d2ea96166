"""The forward at issue 30's grid points: v5, v5 with overlapped consumers on its grid and on its persistent
grid (``ws_overlap="persistent"``), each with Q as a register operand (``ws_q_regs``), and at D 64 three
overlapped consumers, against SDPA's cuDNN backend, same run.

Why Q in registers: S = Q K^T with both operands in shared memory reads Q's 2 KB and K's 4 KB a k-step
(m64 n128 k16, 64 cycles at full rate): 96 B a cycle of the SM's 128. With P V (V's 4 KB a k-step) and
the TMA fills, a CTA of two consumers moves ~224 KB through shared memory per 128 keys at D 128 in the
~2,048 cycles its products take at full rate: ~109 B a cycle, 85 % of the bandwidth. Q in registers
(32 registers at D 128, 16 at D 64) takes 32 KB of that away (~94 B a cycle).

Prediction (before any GPU run): overlap + Q in registers 1-3 % ahead of the overlap alone at D 128 from
S 4096; nothing at S 1024-2048, where the tiles are few. The persistent overlap 3-6 % ahead of the grid's at
D 128 without causal (v5's persistent grid gave v5 4-8 % there), behind with causal (its static round
robin: 3-5 % behind for v5); Q in registers frees a persistent CTA's Q buffer at the item's start, so the next
item's Q load overlaps the whole item. Outputs bitwise equal to the overlap's. At D 64
three overlapped consumers (160 registers, spill-free) 2-5 % ahead of v5's three from S 4096 (two
overlapped consumers were behind v5's three: docs/tuning/attention.md, "FA3's consumer schedule").

Needs research/patches/v5-overlap.patch (gluon_overlap.py) applied. Each variant runs twice, alternating;
the table shows each variant's median of its two do_bench medians, x cuDNN (above 1: ours faster).
Run on the GPU (~2 minutes): PYTHONPATH=src python3 research/attention_fwd_operands.py
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C

# (H, Hkv, D), S, causal; B x S = 16384 (issue 30's grid, the lengths where the forward target is 1.05x).
HEADS = [(16, 16, 128), (32, 8, 128), (32, 8, 64)]
LENGTHS = [2048, 4096, 8192, 16384]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    print("H/Hkv D S causal | x cuDNN: v5, overlap, overlap + Q regs | cuDNN ms | check", flush=True)
    for (H, Hkv, D) in HEADS:
        for S in LENGTHS:
            for causal in (False, True):
                B = 16384 // S
                g = torch.Generator(device="cuda").manual_seed(S + D + H + causal)
                q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
                k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
                # v5 as the library runs it (three consumers at D 64, the persistent grid where the rules
                # say); the overlapped kernel has two consumers on v5's grid.
                base = A.default_policy(q, k, causal=causal).replace(forward="ws")
                ov = base.replace(ws_overlap=True, ws_config=None, ws_persistent=False)
                policies = {"v5": base.replace(ws_overlap=False), "overlap": ov, "q_regs": ov.replace(ws_q_regs=True),
                            "overlap_p": ov.replace(ws_overlap="persistent"),
                            "q_regs_p": ov.replace(ws_overlap="persistent", ws_q_regs=True)}
                if D == 64:  # three overlapped consumers on v5's D 64 tile (192 query rows a CTA)
                    policies["overlap3"] = ov.replace(ws_config=C.WS_THREE)
                outs = {n: A.flash_attention(q, k, v, causal=causal, policy=p, return_lse=True)
                        for n, p in policies.items()}
                same = all(torch.equal(a, b) for n in ("q_regs", "overlap_p", "q_regs_p")
                           for a, b in zip(outs["overlap"], outs[n]))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    t_c = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                       enable_gqa=Hkv != H))
                times = {n: [] for n in policies}
                for _ in range(2):
                    for n, p in policies.items():
                        times[n].append(bench(lambda p=p: A.flash_attention(q, k, v, causal=causal, policy=p)))
                ratios = "  ".join(f"{n} {t_c / statistics.median(t):.3f}" for n, t in times.items())
                print(f"H{H}/{Hkv} D{D} S{S} causal={causal} | {ratios} | cuDNN {t_c:.3f} ms | "
                      f"{'variants bitwise equal to overlap' if same else 'variants DIFFER'}", flush=True)


if __name__ == "__main__":
    main()
