"""The memory floor of a one-kernel backward: what it costs the H100 to add every key block's dQ partial into an
fp32 dQ in global memory (FA3's and cuDNN's way), without any of the products.

Why: v6's deterministic backward is two kernels, dK / dV (4 products a tile: S, dP, dV, dK) and dQ (3: S, dP, dQ),
7 products against the one-kernel backward's 5. `attention_cudnn_bwd_kernels.py` (2026-12-07, H100,
`attention-cudnn-bwd-kernels-426e340*.log`): cuDNN runs one persistent kernel (132 CTAs, 64 x 64 tiles) and adds dQ
in fp32 (then `convert_dq_to_16bits`), 18.2 ms at B 1 H 32 / 8 S 16384 D 128 against our 12.0 + 8.2 ms. A fused
kernel with our dK / dV kernel's rate would be ~5/4 of its time plus the dQ additions, if the L2 absorbs them beside
the loads the dK / dV kernel already does. The additions are (S / BN) x S x D x 4 bytes a query head (x 1/2 under
causal): 34 GB at that shape with 128-key blocks, 8.6 GB at the Llama's B 1 H 32 / 8 S 16384 D 64 causal.

Kernels, each over the grid (key block, query head), walking the query tiles a key block sees:
  store     TMA store of a [BM, D] fp32 tile (the write floor, not an addition)
  reduce    TMA reduce-add of the tile (cp.reduce.async.bulk, Triton's tensor-descriptor atomic_add)
  red_ptr   the same by pointer atomics (red.global.add.f32 per element; FA2's way)
  loads     the dK / dV kernel's own traffic: Q and dO tiles (bf16) by TMA, no additions
  loads_red loads + reduce: the fused kernel's traffic without its products
Each kernel is checked once (reduce / red_ptr against the count of key blocks a row sees).

Prediction (2026-12-07, before a run; H100): reduce ~3-4 TB/s of added bytes (L2-resident: one head's dQ is 8 MB),
red_ptr 2-3x slower; loads_red at D 128 plain S 16384 ~1.3x loads. If loads_red stays under ~5/4 of the dK / dV
kernel's 12.0 ms there, a fused kernel with dQ by TMA reduce can beat the two kernels (20.2 ms).
Run on the GPU (~15 s): PYTHONPATH=src python3 research/attention_dq_reduce_floor.py [--head-major | --split]
(--split, prepared 2026-12-07 after the runs below, not run: v7's reduce boxes, a consumer's half of D, against whole
rows at the Llama's 1 x 16384 D 64 causal, both walk orders; predicted: halves 1.2-1.5x slower, which v7 mode 4 pays.)

Measured (2026-12-07, H100; attention-dq-reduce-floor-0d2c241*.log, -head-major-d87292f*.log): TMA reduce and
pointer atomics alike, 3.1-3.3 TB/s at D 128 (10.4-10.9 ms at S 16384); at D 64 causal 1.6-1.9 TB/s a KV group a
CTA, 3.1 TB/s a query head a CTA with BM 128 (loads + adds 3.02 ms at 1 x 16384, v6's dQ kernel 2.44 ms).
docs/tuning/attention.md, "The waiting rules landed; cuDNN's backward kernels; the floor of dQ's fp32 additions".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from _timing import median_event_ms

STORE, REDUCE, RED_PTR, LOADS, LOADS_RED = 0, 1, 2, 3, 4
NAMES = {STORE: "store", REDUCE: "reduce", RED_PTR: "red_ptr", LOADS: "loads", LOADS_RED: "loads_red"}


@triton.jit
def dq_traffic_kernel(dq_desc, dq_ptr, q_desc, do_desc, out_ptr, S, G: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr, MODE: tl.constexpr,
                      SPLIT: tl.constexpr = False):
    n = tl.program_id(0)
    hk = tl.program_id(1)
    first = (n * BN) // BM if CAUSAL else 0
    rows = tl.arange(0, BM)
    cols = tl.arange(0, D)
    acc = tl.zeros([BM, D], tl.float32)
    for g in range(G):  # the group's query heads, as our dK / dV kernel walks them
        h = hk * G + g
        for m in range(first, tl.cdiv(S, BM)):
            row0 = h * S + m * BM
            if MODE == 3 or MODE == 4:
                x = q_desc.load([row0, 0]).to(tl.float32) + do_desc.load([row0, 0]).to(tl.float32)
                acc += x
                if MODE == 4:
                    dq_desc.atomic_add([row0, 0], x)
            else:
                ones = tl.full([BM, D], 1.0, tl.float32)
                if SPLIT:  # v7's split D: each consumer adds its half of the columns, a box each
                    half = tl.full([BM, D // 2], 1.0, tl.float32)
                    if MODE == 0:
                        dq_desc.store([row0, 0], half)
                        dq_desc.store([row0, D // 2], half)
                    else:
                        dq_desc.atomic_add([row0, 0], half)
                        dq_desc.atomic_add([row0, D // 2], half)
                elif MODE == 0:
                    dq_desc.store([row0, 0], ones)
                elif MODE == 1:
                    dq_desc.atomic_add([row0, 0], ones)
                else:
                    tl.atomic_add(dq_ptr + (row0 + rows)[:, None] * D + cols[None, :], ones, sem="relaxed")
    if MODE == 3:  # keeps the loads alive
        tl.store(out_ptr + (n * tl.num_programs(1) + hk) * BM * D + rows[:, None] * D + cols[None, :], acc)


def case(H: int, Hkv: int, S: int, D: int, causal: bool, BM: int, BN: int, num_warps: int, split: bool = False):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = (torch.randn(H * S, D, device="cuda", generator=g) / 4).to(torch.bfloat16)
    do = (torch.randn(H * S, D, device="cuda", generator=g) / 4).to(torch.bfloat16)
    dq = torch.zeros(H * S, D, device="cuda", dtype=torch.float32)
    grid = (triton.cdiv(S, BN), Hkv)
    out = torch.empty(grid[0] * grid[1] * BM * D, device="cuda", dtype=torch.float32)
    dq_desc = TensorDescriptor.from_tensor(dq, [BM, D // 2 if split else D])
    q_desc, do_desc = TensorDescriptor.from_tensor(q, [BM, D]), TensorDescriptor.from_tensor(do, [BM, D])
    blocks = torch.arange(S, device="cuda") // BM * BM  # each row's tile start: the key blocks its tile sees
    want = ((blocks + BM - 1) // BN + 1).float() if causal else torch.full((S,), float(grid[0]), device="cuda")
    tiles = sum(triton.cdiv(S, BM) - ((n * BN) // BM if causal else 0) for n in range(grid[0])) * H
    added = tiles * BM * D * 4
    print(f"H {H}/{Hkv} S {S} D {D} causal={causal} BM {BM} BN {BN} warps {num_warps}{' split D' if split else ''}: "
          f"{added / 1e9:.2f} GB of dQ additions", flush=True)
    for mode in ((STORE, REDUCE) if split else (STORE, REDUCE, RED_PTR, LOADS, LOADS_RED)):
        def run(mode=mode):
            dq_traffic_kernel[grid](dq_desc, dq, q_desc, do_desc, out, S, H // Hkv, BM, BN, D, causal, mode, split,
                                    num_warps=num_warps)
        try:
            if mode in (REDUCE, RED_PTR):
                dq.zero_()
                run()
                got = dq.view(H, S, D)
                assert torch.equal(got, want[None, :, None].expand_as(got)), f"{NAMES[mode]}: wrong sums"
            ms = median_event_ms(run, reps=20, warmup=3)
        except Exception as e:  # one mode that does not build under this Triton leaves the others
            print(f"  {NAMES[mode]:9s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            continue
        moved = added * (2 if mode == LOADS_RED else 1)  # Q + dO in bf16 are as many bytes as dQ's fp32
        print(f"  {NAMES[mode]:9s} {ms:8.3f} ms  {moved / ms / 1e9:6.2f} TB/s", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name())
    # The shapes of `attention_cudnn_bwd_kernels.py` (our dK / dV, dQ ms there, H100): D 128 plain 12.0 / 8.2 at
    # S 16384 GQA, 5.5 / 3.9 at B 2 S 8192; the Llama's D 64 causal 3.29 / 2.44 at S 16384, 0.90 / 0.72 at B 4 S 4096.
    import sys
    if "--split" in sys.argv:  # v7's boxes (a consumer's half of D) against whole rows, both walk orders, D 64 causal
        for Hkv in (8, 32):
            for BM, warps in ((64, 4), (128, 8)):
                for split in (False, True):
                    case(32, Hkv, 16384, 64, True, BM, 128, warps, split)
    elif "--head-major" in sys.argv:  # one query head a program (cuDNN's order: dK / dV summed over the group after)
        for H, S, D, causal in ((32, 16384, 128, False), (32, 16384, 64, True), (128, 4096, 64, True)):
            for BM, BN, warps in ((64, 128, 4), (128, 128, 8)):
                case(H, H, S, D, causal, BM, BN, warps)
    else:
        for H, Hkv, S, D, causal in ((32, 8, 16384, 128, False), (32, 8, 16384, 64, True), (128, 32, 4096, 64, True)):
            for BM, BN, warps in ((64, 128, 4), (128, 128, 8)):
                case(H, Hkv, S, D, causal, BM, BN, warps)
