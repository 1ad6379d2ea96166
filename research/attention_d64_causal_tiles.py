"""D 64 causal forward at S 1024-2048 (issue 30's lowest grid points, 0.87-0.96x cuDNN): the route's kernel with
other key tiles and ring depths, and v5's two plain consumers on the same persistent grid, against cuDNN; one run,
same inputs, timed A B C ... then reversed (``_timing.abba_ms``).

Why: the route there is two overlapped consumers on the persistent grid with two Q buffers (``WS_OVERLAP_SPANS``,
BLOCK_N 128, two stages: 32 KB of K / V a stage, ~80 KB in all). cuDNN's forward at D 64 runs 64 x 128 x 64 tiles
with 134 KB of shared memory (`attention-cudnn-fwd-kernels-d66fbda*.log`): a deeper ring. At S 1024 a work item is
4.5 key tiles on average (pairs: 9 a pair), so the ring's fill at each item start and the half-masked diagonal tile
(1 in 4.5) weigh more than at long S. Not measured before: a third stage, 64-key tiles (the diagonal's masked half
becomes a quarter of a 128 tile) with four stages, and v5's plain (not overlapped) two consumers on this grid at D 64.

Prediction (before the run): three stages 1.00-1.03x the route at S 1024 (the fill of the ring hides behind the
first tile), ~1.00x at 2048; 64-key tiles 0.95-1.02x (less masked work, twice the barriers and softmax passes a key);
v5's plain two consumers 0.95-1.00x the overlap. If one leads by >= 2 % at both S 1024 points: a D 64 causal tile
rule (configs.WS_OVERLAP_SPANS' config) and the quick tier.
Run on the GPU (~90 s, new builds): PYTHONPATH=src python3 research/attention_d64_causal_tiles.py

Measured (H100, 6d028b4, `attention-d64-causal-tiles-6d028b4*.log`): v5's plain two consumers 1.074 / 1.084x the route
at S 1024, 0.958 / 0.961x at 2048; now the route from 1024 to 2048 (configs.WS_PERSISTENT_SPANS, de85109).

``--short``: the new route's neighbours at S 256-1024, v3 running D 64
causal below 1024 (WS_FWD_RULES): v5's plain two with one Q buffer, with O by stores instead of TMA, and v3's
forward (``policy=replace(forward="pointer")``). Prediction: v5's plain two ahead of v3 at S 512 (1.05-1.15x: v3
was 0.82x cuDNN at S 1024 where the plain two now run 0.95x), even or behind at 256; one Q buffer and the stores
within 2 % of the route. If v5's plain two lead v3 by >= 3 % at S 512 in both head layouts: WS_FWD_RULES[(64,
True, False)] and the span from 512, then the quick tier.
Measured (two H100s, a7d20c5 and 8442841, `attention-d64-causal-tiles-short-*.log`): at S 512 v5's plain two 1.143x /
1.144x v3 with GQA, 0.665x / 1.180x with 16 heads (the first run's v5 cells there slow on that machine); the rule as
research/patches/d64-causal-from-512.patch, waiting for a third run. Third run (354c853, `--modes`): 1.186x / 1.154x at
S 512, v5 slow at H 16 S 256; the rule is on main since eb5af09 (docs/tuning/attention.md, "a third run").
That slow mode is this script's, not the kernel's (``attention_d64_slow_mode.py``, 947a4ea): its variants call
``gluon_fwd.fwd`` directly, whose host time (92-223 us a call) can exceed do_bench's flush plus a short kernel; by
graph replay, and through flash_attention's call plans, v5 was never slow. Read the short cells' variants with that
in mind; the route column goes through the plans.

``--short --modes``: after each shape's table, v3 and v5's plain two called alternately 300 times, each call
timed alone (events, synchronized): the quantiles of each and the share of calls over 1.3x its median. A slow
mode that comes and goes within a run shows as a long tail or two peaks; one that holds for a whole process
shows as a median as slow as the table's. Prediction: no tail (p95 within 5 % of the median) on a machine
where the table shows no slow cell.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_fwd as ag
from tilewise.ops.attention import gluon_overlap as ao

# (B, H, Hkv, S), D 64, causal, B x S = 16384
SHAPES = [(16, 16, 16, 1024), (16, 32, 8, 1024), (8, 16, 16, 2048), (8, 32, 8, 2048)]
SHORT = [(64, 16, 16, 256), (64, 32, 8, 256), (32, 16, 16, 512), (32, 32, 8, 512), (16, 16, 16, 1024),
         (16, 32, 8, 1024)]
REGS = C.WS_FWD_CONSUMER_REGS
# name -> (kernel module, (BLOCK_N, STAGES, consumer registers, maxnreg, consumers))
VARIANTS = {"overlap n128 s2": (ao, (128, 2, REGS, None, 2)), "overlap n128 s3": (ao, (128, 3, REGS, None, 2)),
            "overlap n64 s4": (ao, (64, 4, REGS, None, 2)), "overlap n64 s6": (ao, (64, 6, REGS, None, 2)),
            "v5 two n128 s2": (ag, (128, 2, REGS, None, 2)),
            "v5 two n128 s3": (ag, (128, 3, REGS, None, 2))}
TWO = (128, 2, REGS, None, 2)
# ``--short``: name -> (kernel module, config, fwd's keywords beyond persistent=True)
SHORT_VARIANTS = {"v5 two": (ag, TWO, dict(q_buffers=2)), "v5 two, one Q buffer": (ag, TWO, dict(q_buffers=1)),
                  "v5 two, O by stores": (ag, TWO, dict(q_buffers=2, tma_out=False))}


def main():
    D = 64
    print(torch.cuda.get_device_name(), "(D 64, causal, bf16)", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(23)
    short = "--short" in sys.argv
    variants = SHORT_VARIANTS if short else {n: (mod, cfg, dict(q_buffers=2)) for n, (mod, cfg) in VARIANTS.items()}
    for B, H, Hkv, S in SHORT if short else SHAPES:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != Hkv)

        ref = cudnn().float()
        fns, errs = {"route": lambda: A.flash_attention(q, k, v, causal=True)}, {}
        if short:
            v3 = A.default_policy(q, k, causal=True).replace(forward="pointer")
            fns["v3"] = lambda: A.flash_attention(q, k, v, causal=True, policy=v3)
            errs["v3"] = ((fns["v3"]().float() - ref).norm() / ref.norm()).item()
        for name, (mod, cfg, kw) in variants.items():
            o = torch.full_like(q, float("nan"))
            lse = torch.full((B, H, S), float("nan"), device="cuda")

            def fn(mod=mod, cfg=cfg, kw=kw, o=o, lse=lse):
                return mod.fwd(q, k, v, True, D ** -0.5, o, lse, config=cfg, persistent=True, **kw)[0]

            try:
                errs[name] = ((fn().float() - ref).norm() / ref.norm()).item()
            except Exception as e:  # noqa: BLE001 - a build that does not compile or launch: said, not timed
                print(f"  {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            if not errs[name] < 2e-2:
                print(f"  {name}: wrong output, relative error {errs[name]:.1e}: not timed", flush=True)
                continue
            fns[name] = fn
        errs["route"] = ((fns["route"]().float() - ref).norm() / ref.norm()).item()
        fns["cudnn"] = cudnn
        med, _ = abba_ms(fns, lambda f: do_bench(f, warmup=10, rep=100, return_mode="median"))
        flops = 2 * B * H * S * S * D
        if "--modes" in sys.argv:
            modes({n: fns[n] for n in ("v3", "v5 two") if n in fns})
        print(f"B{B} H{H}/{Hkv} S{S}: " + ", ".join(
            f"{n} {ms * 1e3:.1f} us ({flops / ms / 1e9:.0f} TF, x cuDNN {med['cudnn'] / ms:.3f}"
            + (f", x route {med['route'] / ms:.3f}" if n not in ("route", "cudnn") else "") + ")"
            for n, ms in med.items()) + f" | worst error vs cuDNN {max(errs.values()):.1e}", flush=True)


def modes(fns, calls=300):
    """Each of ``fns`` called ``calls`` times in turn, each call timed alone: p5 / p50 / p95 / max in us and
    the share of calls over 1.3x the median."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = {n: [] for n in fns}
    for _ in range(calls):
        for n, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[n].append(a.elapsed_time(b) * 1e3)
    for n, t in times.items():
        t.sort()
        med = t[len(t) // 2]
        slow = sum(x > 1.3 * med for x in t) / len(t)
        print(f"  modes {n}: p5 {t[len(t) // 20]:.1f} p50 {med:.1f} p95 {t[len(t) * 19 // 20]:.1f} max {t[-1]:.1f} us,"
              f" {slow:.1%} of calls over 1.3x the median", flush=True)


if __name__ == "__main__":
    main()
