"""v5's slow mode at D 64 causal, short S (issue 30): in two of three H100 runs of
``attention_d64_causal_tiles.py --short`` one cell (H 16, S 256 or S 512) ran every v5 variant 0.58-0.67x v3,
while the same cell ran 1.18-1.20x on another machine. Each variant there has its own O and LSE; q, k, v are the
cell's. So: does the mode follow the input tensors (their addresses: TMA descriptors, L2 / DRAM channel spread),
or the time (a clock or machine state that comes and goes)?

How: for each shape, ``SETS`` input sets (q, k, v fresh from randn, a spacer allocation of 0-3 MiB before each
set so the addresses move), v3 and v5's plain two on each, timed A B B A by do_bench (L2 flushed); then every set
that ran v5 over 1.25x its shape's fastest set is timed again after the others, and once more from a copy of its
tensors at new addresses (same values).

Prediction (before the run): address-bound. A slow set is slow again on re-timing (within 10 %) and its copy
at new addresses is fast; the slow sets are 0-3 of 12 a shape; v3 shows no such spread (max/min < 1.1). If the
slow sets are not slow again on re-timing, the mode is of time, not inputs: then the from-512 route's risk is a
machine state, and a per-process probe cannot avoid it.
Run on the GPU (~60 s): PYTHONPATH=src python3 research/attention_d64_slow_mode.py
"""
import torch
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_fwd as ag

D = 64
SHAPES = [(64, 16, 16, 256), (32, 16, 16, 512), (64, 32, 8, 256), (32, 32, 8, 512)]
SETS = 12
TWO = (128, 2, C.WS_FWD_CONSUMER_REGS, None, 2)


def bench(fn):
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def fns_for(q, k, v):
    B, H, S, _ = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, S), float("nan"), device="cuda")
    v3 = A.default_policy(q, k, causal=True).replace(forward="pointer")
    return {"v3": lambda: A.flash_attention(q, k, v, causal=True, policy=v3),
            "v5 two": lambda: ag.fwd(q, k, v, True, D ** -0.5, o, lse, config=TWO, persistent=True,
                                     q_buffers=2)[0]}


def where(t):
    p = t.data_ptr()
    return f"{p >> 20:#x} MiB (mod 2 MiB {p % (1 << 21):#x})"


def main():
    print(torch.cuda.get_device_name(), "(D 64, causal, bf16)", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(29)
    for B, H, Hkv, S in SHAPES:
        sets, rows, keep = [], [], []
        for i in range(SETS):
            keep.append(torch.empty((i * 7919) % (3 << 20) + 1, device="cuda", dtype=torch.uint8))
            q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            fns = fns_for(q, k, v)
            ref = fns["v3"]().float()
            err = ((fns["v5 two"]().float() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, f"v5 two off v3 by {err:.1e}"
            med, _ = abba_ms(fns, bench)
            sets.append((q, k, v))
            rows.append(med)
            print(f"B{B} H{H}/{Hkv} S{S} set {i:2d}: v3 {med['v3'] * 1e3:6.1f} us, v5 two {med['v5 two'] * 1e3:6.1f} us"
                  f" ({med['v3'] / med['v5 two']:.3f}x v3) q at {where(q)}, k at {where(k)}", flush=True)
        best = min(r["v5 two"] for r in rows)
        v3s = [r["v3"] for r in rows]
        slow = [i for i, r in enumerate(rows) if r["v5 two"] > 1.25 * best]
        print(f"B{B} H{H}/{Hkv} S{S}: v5 two min {best * 1e3:.1f} max {max(r['v5 two'] for r in rows) * 1e3:.1f} us;"
              f" v3 max/min {max(v3s) / min(v3s):.3f}; slow sets {slow}", flush=True)
        for i in slow:
            q, k, v = sets[i]
            again, _ = abba_ms(fns_for(q, k, v), bench)
            moved = tuple(t.clone() for t in (q, k, v))
            copy, _ = abba_ms(fns_for(*moved), bench)
            print(f"  set {i} again: v5 two {again['v5 two'] * 1e3:.1f} us ({again['v3'] / again['v5 two']:.3f}x v3);"
                  f" its copy at {where(moved[0])}: {copy['v5 two'] * 1e3:.1f} us "
                  f"({copy['v3'] / copy['v5 two']:.3f}x v3)", flush=True)
        del sets, keep
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
