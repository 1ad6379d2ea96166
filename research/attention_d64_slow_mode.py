"""v5's slow mode at D 64 causal, short S (issue 30): in two of three H100 runs of
``attention_d64_causal_tiles.py --short`` one cell (H 16, S 256 or S 512) ran every v5 variant 0.58-0.67x v3, while
the same cell ran 1.18-1.20x on another machine (docs/tuning/attention.md, "D 64 causal below 1024, a third run").

Reading the three logs again: a slow cell adds about the same time whatever its work (H 16 S 256 +67 us, H 16 S 512
+62 us, GQA S 256 +39 us), and only the variants the script calls directly (``gluon_fwd.fwd``: every check, layout
test and TMA descriptor built on each call) were slow; v3 and the route, both through ``flash_attention``'s call
plans, never were. ``do_bench`` times each call between two events around it after an L2 flush (a 256 MB fill), so
a call whose host time exceeds the flush plus the kernel leaves the GPU idle inside the timed span. Hypothesis: the
slow mode is the host, not the kernel: a direct call's host time near that threshold, tipped over by the host's
speed of the moment.

How, per cell and in two passes: v3 and v5's plain two through ``flash_attention`` (the S 512 route's policy, also at
S 256), and v5's plain two called directly, each timed (1) as the tiles script does (do_bench, L2 flushed, A B B A),
(2) by CUDA graph replay (20 calls a graph: device time only), and (3) by its host time a call (the Python call
alone after a synchronize, median of 200). Also the flush's own device time.

Prediction (before the run): the direct call's host time 120-220 us, the two planned calls' 40-90 us; by graph
replay v5's plain two lead v3 in every cell (1.15-1.25x) and the direct and planned v5 calls are within 2 %; any
do_bench cell more than 1.25x its graph time is a direct call whose host time exceeds the flush plus its graph
time. If so, the route (through the plans) does not have the mode and the from-512 rule stands; if a planned v5
call or a graph replay is slow, the mode is the kernel's and the rule goes back to 1024.
Run on the GPU (~60 s): cd research && PYTHONPATH=../src python3 attention_d64_slow_mode.py

Measured (H100 80GB HBM3, 947a4ea, `attention-d64-slow-mode-947a4ea*.log`; the flush 79.9 us): by graph replay the
direct and planned v5 calls agree to 0.7 us in all 8 cells, and v5's plain two lead v3 by 1.14-1.21x in every cell of
both passes; through the plans, do_bench reads v5 1.144-1.207x v3 with no slow cell. The mode showed in the direct
calls only (do_bench 1.17-2.11x their graph time at H 16 S 256 / 512 and GQA S 256, pass 2), whose host time was
92-223 us a call against the planned calls' 36-70 us. Two of the three slow cells had a host time over the flush plus
the graph time; the third (GQA S 256, pass 2: 98 us, under its 186 us) did not, so the median of a synchronized
call is not the exact threshold, but no planned call and no replay was ever slow. The mode is the host: the
from-512 rule stands.
(That run timed the replays with an inline copy of ``harness.time_ms_graph``, since replaced by the call itself.)
"""
import statistics
import time

import torch
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.bench.harness import time_ms_graph
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_fwd as ag

D = 64
SHAPES = [(64, 16, 16, 256), (64, 32, 8, 256), (32, 16, 16, 512), (32, 32, 8, 512)]
TWO = (128, 2, C.WS_FWD_CONSUMER_REGS, None, 2)
GRAPH_CALLS = 20


def flushed_ms(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def graph_ms(fn):
    """Device ms a call by graph replay (``harness.time_ms_graph``); None if the capture fails."""
    try:
        return time_ms_graph(fn, calls=GRAPH_CALLS, repeats=20)
    except Exception as e:  # noqa: BLE001 - said, not timed
        print(f"    capture failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
        return None


def host_us(fn, n=200):
    """Host us of one call after a synchronize, median of n (not ``harness.host_us_per_call``'s back-to-back
    calls: these kernels outlast their launch, so back to back the GPU would set the pace)."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def flush_ms():
    cache = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    for _ in range(5):
        cache.zero_()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(20):
        cache.zero_()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 20


def main():
    print(torch.cuda.get_device_name(), "(D 64, causal, bf16)", flush=True)
    warm_clocks()
    print(f"the L2 flush (256 MB fill): {flush_ms() * 1e3:.1f} us of device time", flush=True)
    route = C.choose_policy(D, 512, 512, causal=True)
    print(f"the S 512 route's policy: forward {route.forward}, persistent {route.ws_persistent}, "
          f"overlap {route.ws_overlap}, q buffers {route.ws_q_buffers}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(31)
    for rnd in range(2):
        for B, H, Hkv, S in SHAPES:
            q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            o = torch.full_like(q, float("nan"))
            lse = torch.full((B, H, S), float("nan"), device="cuda")
            v3 = A.default_policy(q, k, causal=True).replace(forward="pointer")
            fns = {"v3 planned": lambda: A.flash_attention(q, k, v, causal=True, policy=v3),
                   "v5 two planned": lambda: A.flash_attention(q, k, v, causal=True, policy=route),
                   "v5 two direct": lambda: ag.fwd(q, k, v, True, D ** -0.5, o, lse, config=TWO, persistent=True,
                                                   q_buffers=2)[0]}
            ref = fns["v3 planned"]().float()
            for name, fn in fns.items():
                err = ((fn().float() - ref).norm() / ref.norm()).item()
                assert err < 2e-2, f"{name} off v3 by {err:.1e}"
            flushed, _ = abba_ms(fns, flushed_ms)
            rows = []
            for name, fn in fns.items():
                gm = graph_ms(fn)
                rows.append(f"{name}: do_bench {flushed[name] * 1e3:.1f} us, graph "
                            + (f"{gm * 1e3:.1f} us (do_bench / graph {flushed[name] / gm:.2f})" if gm else "-")
                            + f", host {host_us(fn):.1f} us a call")
            lead = {n: flushed["v3 planned"] / flushed[n] for n in ("v5 two planned", "v5 two direct")}
            print(f"pass {rnd + 1} B{B} H{H}/{Hkv} S{S}: v5 two planned {lead['v5 two planned']:.3f}x v3, direct "
                  f"{lead['v5 two direct']:.3f}x (do_bench)", flush=True)
            for r in rows:
                print("   ", r, flush=True)
            fns.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
