#!/usr/bin/env python3
"""Replay a GPU run's recorded test durations under pytest-xdist schedulers, on any machine.

Each collected quick-tier test becomes a test that sleeps its recorded seconds times --scale, in the
real collection order; the wall time of each scheduler, scaled back, predicts the quick tier's wall
time on the GPU (sleeping tests need no cores; the per-test overhead of this machine is measured
with scale 0 and taken off). Used for scripts/gpu-check's choice of --dist worksteal:

    python research/xdist_schedule_replay.py bench/results/logs/durations-quick-cold-016a510.jsonl

Needs pytest-xdist. Measured here (2 cores) from the cold quick tier at 016a510 (254 s on the H200
under the default scheduler): load 221 s, worksteal 170 s, longest-first + worksteal 170 s,
longest-first + load 715 s (the first chunk holds every long test).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = '''
import os
def pytest_collection_modifyitems(config, items):
    if os.environ.get("REPLAY_SORT"):
        items.sort(key=lambda it: -it.callspec.params["case"][1])
'''
TEST = '''
import json, time, pytest
CASES = json.load(open({cases!r}))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_case(case):
    time.sleep(case[1] * {scale!r})
'''


def collection_order() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests"], cwd=ROOT, capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def wall(tmp: Path, workers: int, dist: str, sort: bool) -> float:
    import os

    env = dict(os.environ, REPLAY_SORT="1" if sort else "")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
                          "--dist", dist, str(tmp)], capture_output=True, text=True, env=env).stdout
    m = re.search(r"in ([0-9.]+)s", out.splitlines()[-1] if out else "")
    if not m:
        sys.exit(f"replay failed:\n{out[-2000:]}")
    return float(m.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("durations", type=Path, help="a --durations-out file of a GPU run (one JSON object a line)")
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--scale", type=float, default=0.2)
    a = p.parse_args()
    seconds = {}
    for line in a.durations.read_text().splitlines():
        row = json.loads(line)
        seconds[row["id"]] = row["s"]
    order = collection_order()
    cases = [[i, seconds.get(i, 0.0)] for i in order]
    print(f"{len(order)} tests collected, {sum(i in seconds for i in order)} with a recorded time; "
          f"sum {sum(c[1] for c in cases):.0f} s, longest {max(c[1] for c in cases):.1f} s")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "cases.json").write_text(json.dumps(cases))
        (tmp / "conftest.py").write_text(CONFTEST)
        results = {}
        for scale in (0.0, a.scale):
            (tmp / "test_replay.py").write_text(TEST.format(cases=str(tmp / "cases.json"), scale=scale))
            for dist, sort in (("load", False), ("worksteal", False), ("worksteal", True), ("load", True)):
                results[scale, dist, sort] = wall(tmp, a.workers, dist, sort)
        for (scale, dist, sort), s in results.items():
            if scale:
                est = (s - results[0.0, dist, sort]) / scale
                print(f"{dist:10s} {'longest first' if sort else 'collection order':16s} {est:6.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
