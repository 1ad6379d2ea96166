"""Test tiers, shards and per-test durations for the GPU suite (a pytest plugin, loaded by conftest).

Tiers. ``pytest -m gpu`` runs the quick tier: every GPU test function, each at the parameter
combinations its ``quick`` marker keeps. ``--tier full`` runs what the quick tier leaves out (the
exhaustive parametrizations), ``--tier all`` both. CPU tests have no tier: every tier runs them.

    @pytest.mark.quick(rotate="shape", per=2)     # every other combination at 2 of the shapes
    @pytest.mark.quick(where=lambda D, **_: D == 128)
    @pytest.mark.slow                             # the whole function is full tier

``rotate``: each combination of the *other* parameters keeps the ``per`` values of the rotated
parameter(s) that rank first for it by a hash of the two (``_rank``), and a value no combination
kept goes to the one that ranks it first, so every value runs somewhere. The choice depends on the
values alone: adding or removing a parameter value changes only the choices that involve it.

Shards. ``--shard K/N`` keeps a deterministic 1/N of the selected tests, balanced by recorded
seconds (``tests/gpu_durations.json``; a test without a record counts as the median): longest
first, each to the shard with the least so far.

Long tests first. Under pytest-xdist each worker gets a contiguous chunk of the collection and runs
it in order (``--dist worksteal`` then moves the tail of a busy queue to an idle worker), so a test
whose cold compile takes minutes that sits late in a chunk ends the run late (cold quick tier at
8f24230: everything else done within 250 s, the fp32 atomic[128] attention test still compiling).
Each worker's chunk therefore starts with one of the longest recorded tests (``long_first``).

Durations. ``--durations-out FILE`` appends one JSON line per finished test (setup + call +
teardown seconds and the outcome) as it ends, so a run that is killed keeps what it did.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("gpu_durations.json")
TIERS = ("quick", "full", "all")


def pytest_addoption(parser):
    g = parser.getgroup("tilewise GPU tiers")
    g.addoption("--tier", choices=TIERS, default="quick",
                help="GPU tests to run: quick (default), full (what quick leaves out) or all")
    g.addoption("--shard", metavar="K/N", default=None,
                help="run shard K of N (1-based) of the selected tests, balanced by recorded durations")
    g.addoption("--durations-out", metavar="FILE", default=None,
                help="append one JSON line per finished test (nodeid, seconds, outcome) to FILE")


def pytest_configure(config):
    config.addinivalue_line("markers", "quick(rotate=None, per=1, where=None): the parameter combinations "
                                       "of a GPU test that the quick tier runs (see tests/gpu_tiers.py)")
    config.addinivalue_line("markers", "slow: a GPU test of the full tier only")
    _STATE["config"] = config
    shard = config.getoption("shard")
    if shard is not None:
        parse_shard(shard)  # a bad value fails here, before collection


_STATE: dict = {}


def parse_shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard wants K/N with integers, got {text!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {text}: K must be between 1 and N")
    return k, n


def _key(v) -> str:
    return repr(v)


def full_tier(items) -> set[str]:
    """Node ids of the GPU items that belong to the full tier only."""
    groups: dict[tuple, list] = {}
    for it in items:
        if "gpu" in it.keywords:
            groups.setdefault((it.path, it.cls, getattr(it, "originalname", it.name)), []).append(it)
    out: set[str] = set()
    for group in groups.values():
        first = group[0]
        if first.get_closest_marker("slow") is not None:
            out.update(it.nodeid for it in group)
            continue
        mark = first.get_closest_marker("quick")
        if mark is None:
            continue
        kept = _quick_ids(mark, group)
        out.update(it.nodeid for it in group if it.nodeid not in kept)
    return out


def _params(it) -> dict:
    cs = getattr(it, "callspec", None)
    return dict(cs.params) if cs is not None else {}


def _quick_ids(mark, group) -> set[str]:
    """The node ids of one test function's items that the quick tier keeps."""
    unknown = set(mark.kwargs) - {"rotate", "per", "where"}
    if mark.args or unknown:
        raise pytest.UsageError(f"{group[0].nodeid}: quick takes rotate=, per= and where= keywords only")
    where = mark.kwargs.get("where")
    if where is not None:
        group = [it for it in group if where(**_params(it))]
    rotate = mark.kwargs.get("rotate")
    if rotate is None or not group:
        return {it.nodeid for it in group}
    names = (rotate,) if isinstance(rotate, str) else tuple(rotate)
    per = int(mark.kwargs.get("per", 1))
    missing = [n for n in names if n not in _params(group[0])]
    if missing:
        raise pytest.UsageError(f"{group[0].nodeid}: quick(rotate=...) names {missing}, not parameters of the test")

    def split(it):
        p = _params(it)
        return (tuple(_key(p[n]) for n in names),
                tuple(sorted((k, _key(x)) for k, x in p.items() if k not in names)))

    parts = {it.nodeid: split(it) for it in group}
    values = list(dict.fromkeys(v for v, _ in parts.values()))
    combos = list(dict.fromkeys(c for _, c in parts.values()))
    chosen = {c: set(sorted(values, key=lambda v: _rank(c, v))[:per]) for c in combos}
    for v in values:  # every value somewhere: at the combination that ranks it first
        if not any(v in chosen[c] for c in combos):
            chosen[min(combos, key=lambda c: _rank(c, v))].add(v)
    return {i for i, (v, c) in parts.items() if v in chosen[c]}


def _rank(combo: tuple, value: tuple) -> bytes:
    """A combination's preference for a value of the rotated parameters, from their reprs alone: a
    value or combination added to or taken from the parametrization moves no other choice (a
    numbering by collection order would shift every later one)."""
    return hashlib.sha256(repr((combo, value)).encode()).digest()


def recorded_durations() -> dict[str, float]:
    if not DURATIONS.exists():
        return {}
    data = json.loads(DURATIONS.read_text())
    return {str(k): float(v) for k, v in data.get("seconds", {}).items()}


def shard_of(nodeids: list[str], n: int, seconds: dict[str, float]) -> list[int]:
    """Shard index (0-based) of each node id: longest first, each to the least loaded shard."""
    known = [seconds[i] for i in nodeids if i in seconds]
    default = statistics.median(known) if known else 1.0
    cost = {i: seconds.get(i, default) for i in nodeids}
    load = [0.0] * n
    where: dict[str, int] = {}
    for i in sorted(nodeids, key=lambda i: (-cost[i], i)):
        s = min(range(n), key=lambda s: (load[s], s))
        where[i] = s
        load[s] += cost[i]
    return [where[i] for i in nodeids]


def chunk_starts(count: int, workers: int) -> list[int]:
    """Where each worker's first test sits when xdist hands ``count`` tests to ``workers`` idle
    workers: chunk i holds len(pending) // (workers - i) of what is left (its worksteal and load
    schedulers' first split)."""
    starts, left = [], count
    for i in range(workers):
        starts.append(count - left)
        left -= left // (workers - i)
    return starts


def long_first(nodeids: list[str], workers: int, seconds: dict[str, float]) -> list[str]:
    """``nodeids`` reordered so that each of the ``workers`` chunks begins with one of the longest
    recorded tests (longest in chunk 0); every other test keeps its order."""
    recorded = sorted((i for i in nodeids if i in seconds), key=lambda i: (-seconds[i], i))
    longest = recorded[:workers] if len(nodeids) > workers else []
    moved = set(longest)
    rest = iter([i for i in nodeids if i not in moved])
    out, heads = [], dict(zip(chunk_starts(len(nodeids), workers), longest))
    for pos in range(len(nodeids)):
        out.append(heads[pos] if pos in heads else next(rest))
    return out


def pytest_collection_modifyitems(config, items):
    tier = config.getoption("tier")
    full = full_tier(items)
    if tier == "quick":
        keep = [it for it in items if it.nodeid not in full]
    elif tier == "full":
        keep = [it for it in items if it.nodeid in full]
    else:
        keep = list(items)
    shard = config.getoption("shard")
    if shard is not None:
        k, n = parse_shard(shard)
        ids = [it.nodeid for it in keep]
        idx = shard_of(ids, n, recorded_durations())
        keep = [it for it, s in zip(keep, idx) if s == k - 1]
    if len(keep) != len(items):
        kept = {id(it) for it in keep}
        config.hook.pytest_deselected(items=[it for it in items if id(it) not in kept])
        items[:] = keep
    workers = getattr(config, "workerinput", {}).get("workercount", 0)
    if workers > 1:  # every worker computes the same order, as xdist requires
        by_id = {it.nodeid: it for it in items}
        items[:] = [by_id[i] for i in long_first([it.nodeid for it in items], workers, recorded_durations())]


_DURATION: dict[str, tuple[float, str]] = {}


def pytest_runtest_logreport(report):
    """Record setup + call + teardown per test, one line as each ends."""
    config = _STATE.get("config")
    if config is None or hasattr(config, "workerinput"):
        return  # under xdist the controller writes; workers forward their reports to it
    path = config.getoption("durations_out")
    if not path:
        return
    seconds, outcome = _DURATION.get(report.nodeid, (0.0, "passed"))
    if report.outcome != "passed" and outcome == "passed":
        outcome = report.outcome  # a failed or skipped setup or call, not the teardown's "passed"
    _DURATION[report.nodeid] = (seconds + report.duration, outcome)
    if report.when == "teardown":
        seconds, outcome = _DURATION.pop(report.nodeid)
        with open(path, "a") as f:
            f.write(json.dumps({"id": report.nodeid, "s": round(seconds, 4), "outcome": outcome}) + "\n")


def merge(paths: list[str]) -> int:
    """Fold the --durations-out files of GPU runs into tests/gpu_durations.json (the newest record
    of a test wins; ids of removed tests stay, they cost nothing)."""
    data = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    seconds = data.get("seconds", {})
    n = 0
    for p in paths:
        for line in Path(p).read_text().splitlines():
            row = json.loads(line)
            seconds[row["id"]] = row["s"]
            n += 1
    data = {"about": "seconds per GPU test (setup + call + teardown) from scripts/gpu-check runs under "
                     "pytest-xdist on the H200; --shard balances on these (tests/gpu_tiers.py)",
            "seconds": dict(sorted(seconds.items()))}
    from tilewise._files import write_atomic as _write_atomic

    _write_atomic(DURATIONS, (json.dumps(data, indent=0, sort_keys=True) + "\n").encode())
    print(f"{n} durations folded into {DURATIONS} ({len(seconds)} tests)")
    return 0


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 3 or sys.argv[1] != "merge":
        sys.exit("usage: python tests/gpu_tiers.py merge DURATIONS.jsonl...")
    sys.exit(merge(sys.argv[2:]))
