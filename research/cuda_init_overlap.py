"""Question: can what `tilewise train` waits for before its first step overlap the CPU work it does
before it needs the GPU (reading SST-2, the vocabulary, encoding)? Two waits: the CUDA context, and
`import torch._dynamo`, which AdamW's constructor does on its first call (add_param_group is wrapped
by torch._disable_dynamo); that import was 3.8 s of the classifier's 7.9 s warm start on the H200
(cold_start_profile at 23b9501), against ~1 s on a 2-core CPU machine, so the device's file reads
may dominate it, and file reads release the GIL.

Each measurement is a fresh process (a context is created once per process): "serial" creates the
context, then does the CPU work; "thread" starts the context's creation in a thread, does the CPU work,
then joins; "dynamo" and "both" do the same with the import of torch._dynamo, and with the context and
the import in two threads. If creation holds the GIL throughout, the two match; if it releases it, "thread" is
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

def dynamo():
    import torch._dynamo  # noqa: F401

def cpu_work():
    data = loop._load_data(data_dir, False)
    vocab = loop._vocab(data, 1)
    loop._encoded(data, vocab, 64)

def overlapped(*fns):
    ths = [threading.Thread(target=f) for f in fns]
    for th in ths:
        th.start()
    cpu_work()
    for th in ths:
        th.join()

t = time.perf_counter()
if mode == "context":
    context()
elif mode == "import":
    dynamo()
elif mode == "cpu":
    cpu_work()
elif mode == "serial":
    context(); cpu_work()
elif mode == "serial_all":
    context(); dynamo(); cpu_work()
elif mode == "thread":
    overlapped(context)
else:  # "both"
    overlapped(context, dynamo)
print(json.dumps({"mode": mode, "import_s": t_import, "s": time.perf_counter() - t}))
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    res = {}
    for mode in ("context", "import", "cpu", "serial", "thread", "serial_all", "both"):
        runs = []
        for _ in range(a.repeats):
            out = subprocess.run([sys.executable, "-c", CHILD, mode, a.data_dir], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr[-2000:])
            runs.append(json.loads(out.stdout.strip().splitlines()[-1])["s"])
        res[mode] = statistics.median(runs)
        print(f"{mode:>8}: median {res[mode]:6.2f} s  ({', '.join(f'{r:.2f}' for r in runs)})", flush=True)
    print(f"context in a thread saves {res['serial'] - res['thread']:.2f} s "
          f"(at most {min(res['context'], res['cpu']):.2f} s)")
    print(f"context and import in threads save {res['serial_all'] - res['both']:.2f} s "
          f"(at most {min(res['context'] + res['import'], res['cpu']):.2f} s if the CPU work is the floor)")


if __name__ == "__main__":
    main()
