"""Bench suites, one module per op: ``run(runner)`` checks, times and adds rows.

A suite's versions are checked against the op's reference before they are timed, and each suite
times the baselines a user would call instead (PyTorch eager, torch.compile, vendor libraries)
in the same run.
"""

from __future__ import annotations

import importlib

# name -> module under tilewise.bench.suites
SUITES = {
    "launch": "launch",
    "vector_add": "vector_add",
}


def get(name: str):
    if name not in SUITES:
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{SUITES[name]}")
