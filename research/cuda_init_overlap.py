"""Question: can the CUDA context's creation (4.8-5.2 s before the classifier's first step on the H200,
cold_start_profile at b7971f1) overlap the CPU work `tilewise train` does before it needs the GPU
(reading SST-2, the vocabulary, encoding)?

Each measurement is a fresh process (a context is created once per process): "serial" creates the
context, then does the CPU work; "thread" starts the context's creation in a thread, does the CPU work,
then joins. If creation holds the GIL throughout, the two match; if it releases it, "thread" is
shorter by up to the smaller of the two.

    PYTHONPATH=src python research/cuda_init_overlap.py [--data-dir DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, threading, time
t0 = time.perf_counter()
import torch
from tilewise.sst2 import loop
t_import = time.perf_counter() - t0
mode, data_dir = sys.argv[1], sys.argv[2] or None

def context():
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()

def cpu_work():
    data = loop._load_data(data_dir, False)
    vocab = loop._vocab(data, 1)
    loop._encoded(data, vocab, 64)

t = time.perf_counter()
if mode == "context":
    context()
elif mode == "cpu":
    cpu_work()
elif mode == "serial":
    context(); cpu_work()
else:
    th = threading.Thread(target=context)
    th.start(); cpu_work(); th.join()
print(json.dumps({"mode": mode, "import_s": t_import, "s": time.perf_counter() - t}))
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    res = {}
    for mode in ("context", "cpu", "serial", "thread"):
        runs = []
        for _ in range(a.repeats):
            out = subprocess.run([sys.executable, "-c", CHILD, mode, a.data_dir], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr[-2000:])
            runs.append(json.loads(out.stdout.strip().splitlines()[-1])["s"])
        res[mode] = statistics.median(runs)
        print(f"{mode:>8}: median {res[mode]:6.2f} s  ({', '.join(f'{r:.2f}' for r in runs)})", flush=True)
    print(f"saved by the thread: {res['serial'] - res['thread']:.2f} s "
          f"(at most {min(res['context'], res['cpu']):.2f} s)")


if __name__ == "__main__":
    main()
