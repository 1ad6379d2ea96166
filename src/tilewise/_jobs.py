"""Tasks run each in a child Python process, several at once: ``tilewise warmup``'s runner. A task is
a function of no arguments named in ``tilewise.warmup``'s table; its child is ``python -m
tilewise.warmup --task NAME`` with the environment from ``settings.child_environment``. Compiles in
separate processes run in parallel, where threads would share one GIL and Triton's compile lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from . import settings

TASK_TIMEOUT_S = 1800.0
STDERR_TAIL = 2000


@dataclass(frozen=True)
class Task:
    name: str                  # what the child runs and the report names: "<family>" or "<family>.<part>"
    family: str                # an op family (a package under tilewise/ops) or a workload
    what: str                  # one line for --list
    fn: Callable[[], None] = field(repr=False)
    alone: bool = False        # autotunes: runs after the others, one at a time


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    error: str = ""            # the exit status and stderr's tail of a failed task



# --------------------------------------------------------------------------- running tasks (in the parent)


@dataclass(frozen=True)
class Job:
    """One child process: a task's name, its command line, and whether it runs alone."""
    name: str
    argv: tuple[str, ...]
    alone: bool = False


def child_command(name: str) -> list[str]:
    return [sys.executable, "-m", "tilewise.warmup", "--task", name]


def jobs_for(tasks: Iterable[Task]) -> list[Job]:
    return [Job(t.name, tuple(child_command(t.name)), t.alone) for t in tasks]


def default_jobs() -> int:
    return min(os.cpu_count() or 1, 8)


def run_job(job: Job, env: dict[str, str] | None = None, timeout_s: float = TASK_TIMEOUT_S) -> Result:
    """Run one child; its failure (an exit status other than 0, or the time limit) is a Result
    holding the status and the tail of its stderr."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(list(job.argv), env=env if env is not None else settings.child_environment(),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return Result(job.name, False, time.perf_counter() - t0,
                      f"timed out after {timeout_s:.0f} s\n{err[-STDERR_TAIL:]}".rstrip())
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        return Result(job.name, False, secs, f"exit status {p.returncode}\n{p.stderr[-STDERR_TAIL:]}".rstrip())
    return Result(job.name, True, secs)


def run_jobs(jobs: Sequence[Job], n_jobs: int, *, on_start: Callable[[str], None] = lambda n: None,
             on_done: Callable[[Result], None] = lambda r: None, env: dict[str, str] | None = None,
             timeout_s: float = TASK_TIMEOUT_S) -> list[Result]:
    """The jobs that may share the machine, up to ``n_jobs`` at once; then the ``alone`` ones one
    after the other. Results in the order of ``jobs``."""
    if n_jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {n_jobs}")
    env = settings.child_environment() if env is None else env

    def one(job: Job) -> Result:
        on_start(job.name)
        r = run_job(job, env, timeout_s)
        on_done(r)
        return r

    shared = [j for j in jobs if not j.alone]
    with ThreadPoolExecutor(max_workers=n_jobs) as pool:
        done = dict(zip((j.name for j in shared), pool.map(one, shared)))
    for j in jobs:
        if j.alone:
            done[j.name] = one(j)
    return [done[j.name] for j in jobs]


def triton_cache_dir() -> Path:
    """Where Triton keeps compiled kernels (its own reading of TRITON_CACHE_DIR)."""
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):  # Triton before knobs
        from triton.runtime.cache import default_cache_dir

        return Path(default_cache_dir())
