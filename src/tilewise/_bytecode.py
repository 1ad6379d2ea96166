"""A Python bytecode cache for tilewise's command-line processes, where the interpreter has none.

A virtual environment installed without compiling bytecode (uv's default), in a folder the process
may not write or under ``PYTHONDONTWRITEBYTECODE``, compiles every module it imports from source, in
every process and every run. On the H200 machine that is most of a warm start:
``import torch`` took 3.6 s and sympy's import (autograd's and the optimizer's first use) 2.6-3.3 s a
process, nearly all in ``compile`` (docs/tuning/bench.md, start-up). Where that is so, ``enable``
points ``sys.pycache_prefix`` into tilewise's cache folder and lets the process write there, so the
next process reads the bytecode instead. The kernel cache's folder is the right home: an empty cache
(a cold start) then really is cold, and clearing it clears this too.

``TILEWISE_BYTECODE_CACHE``: ``auto`` (default) acts only when torch's or sympy's bytecode is missing
where the interpreter looks and the interpreter would not write it there; ``1`` always; ``0`` never. It is called
at the start of the ``tilewise`` command and of each warmup child, never on ``import tilewise``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from . import settings

SUBDIR = "bytecode"
# The imports that cost most (sympy: autograd's and the optimizers' first use); their bytecode stands
# for the rest of site-packages. Once the prefix is set every module's bytecode comes from it.
PROBES = ("torch", "sympy")


def _writable(folder: Path) -> bool:
    """Could this process create a file in ``folder`` (made first where missing)?"""
    for p in (folder, *folder.parents):
        if p.exists():
            return os.access(p, os.W_OK | os.X_OK)
    return False


def has_usable_bytecode(module: str) -> bool | None:
    """True where the interpreter finds, or will write, the bytecode of ``module``'s top file;
    None where the module is not installed (or is not a source file)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.cached or not spec.origin or not spec.origin.endswith(".py"):
        return None
    pyc = Path(spec.cached)
    if pyc.is_file():
        return True
    return not sys.dont_write_bytecode and _writable(pyc.parent)


def folder() -> Path:
    """Where the cache keeps the bytecode (``sys.pycache_prefix``'s tree mirrors the source paths)."""
    return settings.cache_dir() / SUBDIR


def enable(mode: str | None = None, probes: tuple = PROBES) -> Path | None:
    """Point this process's bytecode at ``folder()`` where ``mode`` (default: the setting) asks for
    it (``auto``: one of ``probes`` has no usable bytecode); returns the folder, or None where it left
    the interpreter as it was."""
    mode = settings.bytecode_cache() if mode is None else mode
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"bytecode cache mode must be 'auto', 'on' or 'off', got {mode!r}")
    if mode == "off" or (mode == "auto" and all(has_usable_bytecode(m) is not False for m in probes)):
        return None
    target = folder()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only cache: the imports compile as before
        return None
    if not os.access(target, os.W_OK | os.X_OK):
        return None
    sys.pycache_prefix = str(target)
    # PYTHONDONTWRITEBYTECODE keeps .pyc files out of source folders; this folder is not one
    sys.dont_write_bytecode = False
    return target
