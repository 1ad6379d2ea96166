"""Does a Ctrl-C early in `tilewise train` stop the run? SIGINT at a random moment of its first seconds, many times.

Why: the kill test (tests/test_train_safety.py) failed once in a CI simulation: a run sent SIGINT early went on
training. Two causes were found with this script (docs/design.md, "A Ctrl-C during `train`'s start-up"):
torch's C++ import of numpy turns an exception raised inside it into a warning, and CPython drops one raised
in importlib's weakref callback. The window is a few hundred milliseconds of the imports, so it shows on a loaded
host: run two busy loops beside it (`yes > /dev/null &` twice) on the 2-core CPU host.

Measured there (2026-12-05): before the fix 3 of 100 runs trained on (2 of 40, 1 of 60); after it 0 of 190.

Each run: `python -m tilewise train` on a tiny generated SST-2 (CPU, torch backend, 1-step epochs), SIGINT after
a uniform 0-2.5 s, then up to 15 s to end; a run still alive is counted, its stderr kept in DIR/run<i>.stderr.

Run on the CPU host: PYTHONPATH=src python3 research/train_sigint.py [--runs 60] [--seed 0] [--dir /tmp/sigint]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default="/tmp/sigint")
    a = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_classifier import write_tiny_sst2

    root = Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    data = write_tiny_sst2(root / "sst2")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    rng = random.Random(a.seed)
    stuck = 0
    for i in range(a.runs):
        out = root / f"run{i}"
        cmd = [sys.executable, "-m", "tilewise", "train", "--data-dir", str(data), "--epochs", "100000",
               "--max-steps", "1", "--batch-size", "16", "--hidden", "16", "--embedding-init", "random",
               "--backend", "torch", "--device", "cpu", "--output-dir", str(out), "--no-progress", "--no-plot"]
        with open(f"{out}.stderr", "wb") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        t = rng.uniform(0.0, 2.5)
        time.sleep(t)
        if proc.poll() is not None:
            print(f"{i}: ended by itself (rc {proc.returncode})", flush=True)
            continue
        proc.send_signal(signal.SIGINT)
        try:
            print(f"{i}: SIGINT at {t:.2f} s, rc {proc.wait(timeout=15)}", flush=True)
        except subprocess.TimeoutExpired:
            stuck += 1
            print(f"{i}: SIGINT at {t:.2f} s, STILL RUNNING after 15 s (stderr: {out}.stderr)", flush=True)
            proc.send_signal(signal.SIGTERM)  # train's faulthandler writes every thread's stack
            time.sleep(3)
            proc.kill()
            proc.wait()
    print(f"{stuck} of {a.runs} runs went on after their SIGINT")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
