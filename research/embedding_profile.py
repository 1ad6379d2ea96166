"""Where does an embedding forward + backward spend its device time? (issue 8: >= 5x
torch.nn.functional.embedding at 64 x 64 ids into a 20000 x 50 fp32 table.)

Captures forward + backward (torch.autograd.grad, as the bench's *_graph rows do) of
torch.embedding, of each tilewise version, and of v4_block_scan at each of its extra (warps, ids a
thread at once, rows a block) configs ("v4(NW, LU, RB)") in a CUDA graph, checks the gradient against the
float64 reference, times the replay with events (median of 200), and lists the kernels of 50
replays under torch.profiler: device microseconds a replay per kernel, and the gap (replay time
minus the kernels' sum: launch latency between graph nodes).

Run on the GPU (< 20 s): PYTHONPATH=src python3 research/embedding_profile.py
"""
import functools
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import median_event_ms  # noqa: E402
from tilewise.bench.suites.embedding import _capture  # noqa: E402
from tilewise.ops.embedding import api as op  # noqa: E402
from tilewise.ops.embedding import configs as cf  # noqa: E402


def median_ms(fn, reps=200):
    return median_event_ms(fn, reps=reps, warmup=10)


def main():
    B, T, V, E = 64, 64, 20000, 50
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, V, (B, T), device="cuda", generator=g)
    w = torch.randn(V, E, device="cuda", generator=g)
    gout = torch.randn(B, T, E, device="cuda", generator=g)
    ref = op.reference_backward(ids, gout, V)
    fns = {"torch.embedding": lambda i, ww: torch.nn.functional.embedding(i, ww),
           **op.VARIANTS,
           **{f"v4{c}": functools.partial(op.v4_block_scan, config=c) for c in cf.BLOCK_SCAN_EXTRA}}
    totals = {}
    for name, fn in fns.items():
        graph, out, gw = _capture(fn, ids, w, gout, True)
        gw.fill_(float("nan"))
        graph.replay()
        err = ((gw.double() - ref).norm() / ref.norm()).item()
        ms = median_ms(graph.replay)
        totals[name] = ms
        reps = 50
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                graph.replay()
            torch.cuda.synchronize()
        per = defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name] += ev.device_time / reps
        ksum = sum(per.values())
        print(f"{name:16s} replay {ms * 1e3:6.1f} us  (kernels {ksum:5.1f} us, gaps {ms * 1e3 - ksum:5.1f} us, "
              f"{len(per)} kernels)  grad rel. err {err:.1e}")
        for k, us in sorted(per.items(), key=lambda kv: -kv[1]):
            print(f"      {us:6.1f} us  {k[:110]}")
        del graph, out, gw
    base = totals["torch.embedding"]
    print("speed-up over torch.embedding (graph replay): "
          + ", ".join(f"{k} {base / v:.2f}x" for k, v in totals.items() if k != "torch.embedding"))


if __name__ == "__main__":
    main()
