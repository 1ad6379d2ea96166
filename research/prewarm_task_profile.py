"""Question: where do the seconds of one of `tilewise train`'s background compile tasks go?

At 464b6fc on the H200 the 7 tasks (sst2/prewarm.py, split by bucket) took 14.7 s, the longest
(train.head.16: pooling, output layer and loss at the length-16 shapes only) 13.5 s after its
imports: as long as the unsplit head task's 16.6 s run, so the time is not the number of shapes.
This runs one task (warmup.TASKS[name]) in this process, with empty caches when the caller gives
them, and splits its time into NVRTC compiles, Triton compiles by stage, autotune timing
(cold_start_profile.py's hooks), and cProfile's top functions by cumulative time.

    for t in train.embedding train.fc1.16 train.head.16; do D=$(mktemp -d); \\
      TILEWISE_CACHE_DIR=$D/tw TRITON_CACHE_DIR=$D/triton PYTHONPATH=src \\
      python research/prewarm_task_profile.py $t; done
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cold_start_profile as csp  # noqa: E402  (imports torch and triton, defines the hooks)
import torch  # noqa: E402
from triton import knobs  # noqa: E402

from tilewise.warmup import TASKS  # noqa: E402

T_IMPORTS = time.perf_counter()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("task", help="a name from `tilewise warmup --list`, e.g. train.head.16")
    p.add_argument("--top", type=int, default=30, help="cProfile rows to print")
    a = p.parse_args()
    if a.task not in TASKS:
        raise SystemExit(f"task must be one of {sorted(TASKS)}, got {a.task!r}")
    knobs.compilation.listener = csp._listener
    csp._wrap_nvrtc()
    csp._wrap_autotune()
    t = time.perf_counter()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t_cuda = time.perf_counter() - t
    csp.WHERE["phase"] = a.task
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    TASKS[a.task].fn()
    prof.disable()
    t_task = time.perf_counter() - t
    print(f"{a.task}: imports {T_IMPORTS - T0:.2f} s, CUDA context {t_cuda:.2f} s, the task {t_task:.2f} s "
          f"(under cProfile)")
    for (_, what), (n, s) in sorted(csp.STATS.items(), key=lambda kv: -kv[1][1]):
        print(f"    {what:<52} {n:4} x, {s:7.2f} s")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(a.top)
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(a.top // 2)
    print("\n".join(line[:160] for line in buf.getvalue().splitlines() if line.strip()))


if __name__ == "__main__":
    main()
