"""Which kernels packed sequences (``flash_attention_varlen``) should take at D 64 and D 128, and why v5's varlen
forward lost to v3's at D 64 (issue 30).

Why: on the H100 (546369f, ``attention_varlen_v5_ab.py``) v5's persistent forward ran 1.22-1.51x v3's pointer
forward at D 128, but 0.867x at D 64 on 16 causal documents of 1024 (GQA 32 / 8): 0.291 ms, 236 TFLOP/s, where
the dense route on the same work (B 16 S 1024, head-major) runs the same kernel build at 0.215 ms (319 TFLOP/s).
``configs.VARLEN_WS_HEAD_DIMS`` keeps D 64 on v3 until this says otherwise.

How: causal packings, bf16, GQA 32 / 8, by turns (``harness.time_ms_rounds``): the varlen forward as v3, v5 and the
default route; forward + backward as v3 + v3, v5 + v3, v5 + v6 and the default; and for equal lengths the dense
``flash_attention`` on the same tokens as a (B, H, S, D) head-major copy and as the (B, S, H, D) sequence-major
view (the rows' layout the varlen kernels read: heads x D elements apart). The host's time of the default varlen
forward + backward and of the v3 and v5 forwards (``host_ms``: issued while the GPU spins) says whether a row is bound
by the CPU (v5's varlen launch takes Triton's own dispatch: its offsets are keyword arguments); the default's host
time is also taken with the policy's call plans off (the same where packed calls have none).
  - dense sequence-major as slow as varlen v5: the strided rows (TMA boxes of 64 rows x 128 bytes, 4 KB apart at
    H 32) cost the D 64 kernel; both routes would want a fix in the loader, not the varlen path.
  - dense sequence-major as fast as head-major: the varlen kernel's own work (the offsets' loads every item, the
    item skip, the LSE rows) is where to look.
Prediction (before any run): dense sequence-major within 5 % of head-major; varlen v5 at D 64 0.85-0.9x v3 at every
length (the per-item offsets' loads on the consumers' critical path); D 128 v5 1.2-1.5x v3.
Run on the GPU (~150 s; ``--only D64`` takes the packings whose name starts so; ``--profile``: after the table, the
host's functions by cumulative time over 50 default forward + backward calls of each packing, under cProfile):
cd research && PYTHONPATH=../src python3 attention_varlen_routes.py [--only PREFIX] [--profile]
"""
import argparse
import cProfile
import pstats
import random

import torch

from attention_varlen_v5_ab import packing
from tilewise.bench.harness import time_ms_rounds
from tilewise.bench.suites.attention import host_ms
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import varlen as V

PACKINGS = {
    "D64 16x1024": ((1024,) * 16, 64),
    "D64 8x2048": ((2048,) * 8, 64),
    "D64 4x4096": ((4096,) * 4, 64),
    "D64 ragged": (tuple(random.Random(40).randint(1, 2000) for _ in range(40)), 64),
    "D128 16x1024": ((1024,) * 16, 128),
    "D128 4x4096": ((4096,) * 4, 128),
}
H, HKV = 32, 8


def profile_host(fn, calls=50, top=18):
    """``fn``'s host functions by cumulative time over ``calls`` calls issued while the GPU spins (cProfile)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time: no call waits for the device
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="packings whose name starts with this")
    ap.add_argument("--profile", action="store_true", help="cProfile the default forward + backward's host time")
    opts = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}")
    for name, (lens, D) in PACKINGS.items():
        if not name.startswith(opts.only):
            continue
        q, k, v, go, cu = packing(lens, H, HKV, D, len(lens))
        S, B = max(lens), len(lens)
        base = C.choose_policy(D, S, S, causal=True)
        default = C.choose_varlen_policy(D, S, S, causal=True)
        pol = {"v3": base.replace(forward="pointer", backward="two_kernel"),
               "v5": base.replace(forward="ws", backward="two_kernel"),
               "v5+v6": base.replace(forward="ws", backward="ws"), "default": None}
        ins = [t.detach().requires_grad_(True) for t in (q, k, v)]

        def fwd(p, a=q, b=k, c=v):
            return V.flash_attention_varlen(a, b, c, cu, cu, S, S, causal=True, policy=p, check_seqlens=False)

        fns = {f"fwd {n}": (lambda p=p: fwd(p)) for n, p in pol.items() if n != "v5+v6"}
        for n, p in pol.items():
            fns[f"fwd+bwd {n}"] = lambda p=p, ins=ins, go=go: torch.autograd.grad(fwd(p, *ins), ins, go)
        if len(set(lens)) == 1:  # the same tokens as a dense batch: head-major copies and sequence-major views
            seq = [t.view(B, S, t.shape[1], D).transpose(1, 2) for t in (q, k, v, go)]
            layouts = {"head-major": [t.contiguous() for t in seq], "seq-major": seq}
            for lay, (a, b, c, g) in layouts.items():
                dins = [t.detach().requires_grad_(True) for t in (a, b, c)]
                fns[f"fwd dense {lay}"] = lambda a=a, b=b, c=c: A.flash_attention(a, b, c, causal=True)
                fns[f"fwd+bwd dense {lay}"] = (lambda dins=dins, g=g: torch.autograd.grad(
                    A.flash_attention(*dins, causal=True), dins, g))
        ref = fwd(pol["v3"])
        for n, p in pol.items():
            err = (fwd(p).float() - ref.float()).abs().max().item()
            assert err < 3e-2, f"{name} {n}: max |diff| against v3 {err:.3g}"
        ms = time_ms_rounds(fns)
        host = host_ms(lambda ins=ins, go=go: torch.autograd.grad(fwd(None, *ins), ins, go), calls=50)
        unplanned = default.replace(plans=False)  # (call plans for packed calls: research/patches/varlen-plans)
        host_off = host_ms(lambda ins=ins, go=go: torch.autograd.grad(fwd(unplanned, *ins), ins, go), calls=50)
        host_fwd = {n: host_ms(lambda p=pol[n]: fwd(p), calls=50) for n in ("v3", "v5")}
        flops = sum(4.0 * H * n * n * D / 2 for n in lens)
        print(f"{name}: {B} documents, {sum(lens)} tokens, max {S}, H {H} / {HKV}; default policy forward "
              f"{default.forward}, backward {default.backward}; host time of its forward + backward {host:.3f} ms "
              f"({host_off:.3f} without call plans), "
              f"of the forward v3 {host_fwd['v3']:.3f} / v5 {host_fwd['v5']:.3f} ms")
        for n, t in ms.items():
            mult = 1.0 if n.startswith("fwd ") else 3.5
            v3 = ms["fwd v3" if n.startswith("fwd ") else "fwd+bwd v3"]
            print(f"  {n:24s} {t:.4f} ms ({flops * mult / t / 1e9:4.0f} TFLOP/s)  speed x v3 {v3 / t:.3f}")
        if opts.profile:
            profile_host(lambda ins=ins, go=go: torch.autograd.grad(fwd(None, *ins), ins, go))
        del q, k, v, go, ins, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
