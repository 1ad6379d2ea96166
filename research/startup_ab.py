"""A/B of `tilewise train`'s start-up between two source trees, cold and warm, alternated in one run.

The cold_start bench's train_100_steps case (``tilewise train --epochs 1 --max-steps 100
--embedding-init random``, tilewise backend, train's default optimizer) measured for each tree in turn,
ROUNDS times, the order flipped each round (A B, B A, ...) so neither tree always runs on a cooler
page cache. Each measurement is the bench's own ``measure_backend``: one child on fresh empty caches,
then three on the caches it filled. A first untimed child primes the page cache (torch's files) so the
first measured cold run is not the machine's first ``import torch``.

Run on the GPU from the repository root, with the second tree made by applying patches to a copy:

    cp -a . /tmp/b && (cd /tmp/b && git apply research/patches/X.patch)
    TILEWISE_SST2_DIR=.data/sst2 python3 research/startup_ab.py A=src B=/tmp/b/src --rounds 3

Prints one JSON line per measurement and a summary (medians over rounds) per tree.

``--trace SRC``: instead, one `train` on empty caches and one on the caches it filled, each line of its
output prefixed with the seconds since the process started, and metrics.json's start-up and epoch
seconds: where a cold run's seconds after its first step go (eval, checkpoint, plot, exit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_MEASURE = ("import json; from tilewise.bench.suites import cold_start as c; "
            "case = next(x for x in c.CASES if x.name == 'train_100_steps'); "
            "print('RESULT ' + json.dumps(c.measure_backend(case, 'tilewise_adamw')), flush=True)")
_PRIME = "import torch, tilewise; torch.zeros(1, device='cuda')"


def _run(src: str, code: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"{src}: exited {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout


def trace(src: str) -> None:
    """One cold and one warm `train` with timestamped output lines (see the module's docstring)."""
    data = os.environ["TILEWISE_SST2_DIR"]
    with tempfile.TemporaryDirectory(prefix="startup-trace-") as d:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(src), TILEWISE_CACHE_DIR=f"{d}/tw",
                   TRITON_CACHE_DIR=f"{d}/triton", PYTHONUNBUFFERED="1")
        for run in ("empty", "warm"):
            out = Path(d) / run
            argv = [sys.executable, "-m", "tilewise", "train", "--data-dir", data, "--epochs", "1", "--max-steps",
                    "100", "--embedding-init", "random", "--output-dir", str(out)]
            t0 = time.perf_counter()
            p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in p.stdout:
                print(f"[{run} {time.perf_counter() - t0:7.2f}] {line.rstrip()}", flush=True)
            p.wait()
            m = json.loads((out / "metrics.json").read_text())
            print(f"[{run} {time.perf_counter() - t0:7.2f}] exit {p.returncode}; startup {m['startup']}; "
                  f"train_seconds {m['epochs'][0]['train_seconds']:.2f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", nargs="*", help="NAME=SRC_DIR, two of them")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trace", metavar="SRC", help="trace one tree's cold and warm run instead")
    a = ap.parse_args()
    if a.trace:
        trace(a.trace)
        return 0
    if len(a.trees) != 2:
        ap.error("give two NAME=SRC_DIR trees (or --trace SRC)")
    trees = [t.split("=", 1) for t in a.trees]
    _run(trees[0][1], _PRIME)
    got: dict[str, list] = {name: [] for name, _ in trees}
    for r in range(a.rounds):
        for name, src in (trees if r % 2 == 0 else trees[::-1]):
            line = next(x for x in _run(src, _MEASURE).splitlines() if x.startswith("RESULT "))
            res = json.loads(line[len("RESULT "):])
            row = {"round": r, "tree": name,
                   "empty_first_s": res["empty"]["first_s"], "empty_wall_s": res["empty"]["process_s"],
                   "warm_first_s": statistics.median(w["first_s"] for w in res["warm"]),
                   "warm_wall_s": statistics.median(w["process_s"] for w in res["warm"])}
            got[name].append(row)
            print(json.dumps(row), flush=True)
    for name, rows in got.items():
        med = {k: round(statistics.median(x[k] for x in rows), 3)
               for k in ("empty_first_s", "empty_wall_s", "warm_first_s", "warm_wall_s")}
        print(f"{name}: medians over {len(rows)} rounds {json.dumps(med)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
