"""Question: does RoPE reach torch.compile's bandwidth if each program streams a contiguous block of
one head (SB positions x D) instead of one position across all heads?

ops/rope's kernel takes one (batch, position) row a program and walks its heads: for (B, H, S, D)
tensors that is H scattered 2 x 128-byte reads a row. It ran 0.86-0.93x of torch.compile forward on
the H200 (docs/tuning/rope.md). Inductor's kernel streams q and k in memory order and gathers cos /
sin by index (they stay in L2). This tries the same order with a hand kernel: grid (S / SB, B x
(Hq + Hk)), each program rotating SB consecutive positions of one head of q or k, cos / sin rows read
per program (from L2 after the first head). Timed beside tilewise.apply_rotary and torch.compile of
the reference, forward, bf16, at the bench's shapes.

    PYTHONPATH=src python research/rope_streaming.py            (GPU: times)
    TRITON_INTERPRET=1 PYTHONPATH=src python research/rope_streaming.py --check   (CPU: correctness only)
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from tilewise.ops.rope import api as rope


@triton.jit
def _rope_block_kernel(Q, K, QO, KO, COS, SIN, S, Hq, Hk, half, sc_b, sc_s,
                       SB: tl.constexpr, DB: tl.constexpr):
    # q, k, qo, ko: contiguous (B, H, S, D); cos / sin: (B or 1, S, D) with strides sc_b, sc_s
    sblk = tl.program_id(0)
    bh = tl.program_id(1)  # b * (Hq + Hk) + head; heads >= Hq are k's
    Ht = Hq + Hk
    b = bh // Ht
    h = bh % Ht
    D = 2 * half
    if h < Hq:
        src = Q + (b * Hq + h).to(tl.int64) * S * D
        dst = QO + (b * Hq + h).to(tl.int64) * S * D
    else:
        src = K + (b * Hk + h - Hq).to(tl.int64) * S * D
        dst = KO + (b * Hk + h - Hq).to(tl.int64) * S * D
    rows = sblk * SB + tl.arange(0, SB)
    ds = tl.arange(0, DB)
    m = (rows < S)[:, None] & (ds < half)[None, :]
    xo = rows.to(tl.int64)[:, None] * D + ds[None, :]
    co = b.to(tl.int64) * sc_b + rows.to(tl.int64)[:, None] * sc_s + ds[None, :]
    x1 = tl.load(src + xo, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + xo + half, mask=m, other=0.0).to(tl.float32)
    c1 = tl.load(COS + co, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(COS + co + half, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + co, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + co + half, mask=m, other=0.0).to(tl.float32)
    tl.store(dst + xo, (x1 * c1 - x2 * s1).to(QO.dtype.element_ty), mask=m)
    tl.store(dst + xo + half, (x2 * c2 + x1 * s2).to(QO.dtype.element_ty), mask=m)


def rotate_streaming(q, k, cos, sin, SB=32, warps=4):
    B, Hq, S, D = q.shape
    Hk = k.shape[1]
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    sc_b = 0 if cos.shape[0] == 1 else cos.stride(0)
    grid = (triton.cdiv(S, SB), B * (Hq + Hk))
    _rope_block_kernel[grid](q, k, qo, ko, cos, sin, S, Hq, Hk, D // 2, sc_b, cos.stride(1),
                             SB=SB, DB=triton.next_power_of_2(D // 2), num_warps=warps)
    return qo, ko


def _inputs(B, Hq, Hk, S, D, device, dtype):
    g = torch.Generator().manual_seed(B * S + D)
    q = torch.randn(B, Hq, S, D, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(B, Hk, S, D, generator=g).to(device=device, dtype=dtype)
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    emb = torch.cat([torch.arange(S, dtype=torch.float32)[:, None] * inv[None, :]] * 2, -1)[None]
    return q, k, emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def check():
    for B, Hq, Hk, S, D, SB in ((2, 4, 2, 37, 64, 16), (1, 3, 1, 5, 128, 32), (3, 2, 2, 70, 32, 8)):
        q, k, cos, sin = _inputs(B, Hq, Hk, S, D, "cpu", torch.float32)
        want = rope.reference(q.double(), k.double(), cos.double(), sin.double())
        got = rotate_streaming(q, k, cos, sin, SB=SB)
        for a, e in zip(got, want):
            torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-5)
    print("streaming RoPE matches the reference (interpreter)")


def bench():
    from tilewise.bench.harness import time_ms

    for B, Hq, Hk, S, D in ((4, 32, 8, 4096, 128), (1, 32, 8, 16384, 128), (8, 16, 16, 2048, 64)):
        q, k, cos, sin = _inputs(B, Hq, Hk, S, D, "cuda", torch.bfloat16)
        nbytes = 2 * (q.numel() + k.numel()) * 2
        want = rope.reference(q.float(), k.float(), cos.float(), sin.float())
        comp = torch.compile(rope.reference, dynamic=False)
        rows = [("torch.compile", time_ms(lambda: comp(q, k, cos, sin))),
                ("tilewise.apply_rotary", time_ms(lambda: rope.apply_rotary(q, k, cos, sin)))]
        for SB in (8, 16, 32, 64):
            for warps in (2, 4, 8):
                got = rotate_streaming(q, k, cos, sin, SB, warps)
                for a, e in zip(got, want):
                    torch.testing.assert_close(a.float(), e, rtol=2e-2, atol=2e-2)
                rows.append((f"streaming SB {SB} warps {warps}",
                             time_ms(lambda: rotate_streaming(q, k, cos, sin, SB, warps))))
        print(f"\nrope fwd B={B} Hq={Hq} Hk={Hk} S={S} D={D} (bf16):")
        base = rows[0][1]
        for name, ms in rows:
            print(f"  {name:28} {ms * 1e3:7.1f} us {nbytes / ms / 1e6:6.0f} GB/s  {base / ms:5.2f}x compile")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true", help="correctness under the interpreter only")
    if p.parse_args().check:
        check()
    else:
        bench()
