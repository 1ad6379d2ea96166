"""Bench suites, one module per op: ``run(runner)`` checks, times and adds rows.

A suite's versions are checked against the op's reference before they are timed, and each suite
times the baselines a user would call instead (PyTorch eager, torch.compile, vendor libraries)
in the same run. Every module in this package is a suite, named after the module.
"""

from __future__ import annotations

import importlib
import pkgutil

SUITES = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def get(name: str):
    if name not in SUITES:
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}")
