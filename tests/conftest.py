"""CPU runs (CI) test references, the compile check, the harness and the CLI; `pytest -m gpu` runs
the kernels on a GPU. Without a GPU, Triton kernels run in the interpreter."""

import json
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption("--durations-out", metavar="FILE", default=None,
                     help="append one JSON line per finished test (nodeid, seconds, outcome) to FILE")


_DURATION = {}


def pytest_runtest_logreport(report):
    """Record setup + call + teardown per test, one line as each ends: a killed run keeps what it did."""
    config = _CONFIG.get("config")
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


_CONFIG = {}


def pytest_configure(config):
    _CONFIG["config"] = config


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty kernel cache for this test only."""
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so that an element the kernel never wrote fails the comparison."""
    return t.fill_(float("nan"))
