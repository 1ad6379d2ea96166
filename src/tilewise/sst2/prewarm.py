"""``tilewise train``'s background compile: the classifier's kernels built while the run starts up.

With empty kernel caches the first training step compiled them one after another in the training
process (11 Triton kernels and 7 CUDA C ones: ~7 s of the H200 machine's ~19 s to the first step).
Here ``tilewise warmup``'s ``train.*`` tasks (the embedding, the first layer per bucket length, the
pooling, the output layer, the loss: disjoint kernels at the default run's shapes) run as child
processes, side by side, started by the CLI before it imports torch, so the children's imports and
compiles overlap the parent's import, data and model set-up; ``wait`` joins them before the first
step, which then finds its kernels (and the GEMMs' autotuning) in the caches.

Skipped where it cannot help: no CUDA device (probed through the driver, without torch), the torch
backend or the CPU asked for, under torchrun, a config whose kernel shapes differ from the default
run's (the tasks compile those), ``--no-prewarm``, and caches warmed by an earlier run of the same
tilewise, Python and GPU (a marker file in the kernel cache). A failed task is reported and the first
step compiles what it missed, as it did without this.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Sequence

from .. import __version__, settings
from .._files import write_atomic
from .._jobs import STDERR_TAIL, TASK_TIMEOUT_S, Job, child_command
from .config import TrainConfig, classifier_tasks

# The TrainConfig fields the tasks' shapes follow (their defaults are what the tasks compile for).
KERNEL_FIELDS = ("batch_size", "embed_dim", "hidden", "max_len", "buckets")
MARKER = "prewarm-train.json"


def cuda_capability(ordinal: int = 0) -> tuple[int, int] | None:
    """The compute capability of CUDA device ``ordinal`` from the driver (libcuda), or None where
    there is no driver or no such device. Costs the driver's initialization, which the run pays anyway."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    n, major, minor, dev = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    if cu.cuInit(0) != 0 or cu.cuDeviceGetCount(ctypes.byref(n)) != 0 or not 0 <= ordinal < n.value:
        return None
    if cu.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return None
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
    if cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) != 0 or \
            cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev) != 0:
        return None
    return major.value, minor.value


def _key(capability: tuple[int, int]) -> dict:
    """What the caches' contents depend on, beside the kernels' sources (their version) and the kernel
    cache itself (the marker is in it)."""
    return {"tilewise": __version__, "python": sys.executable, "capability": list(capability),
            "triton_cache": settings.triton_cache_override()}


def marker_path() -> Path:
    return settings.cache_dir() / MARKER


def _warmed(key: dict) -> bool:
    try:
        return json.loads(marker_path().read_text()) == key
    except (OSError, ValueError):  # none yet, or not ours: warm again
        return False


def _ordinal(device: str) -> int | None:
    """The CUDA device a ``--device`` value names (auto: 0), or None for a CPU or unknown one."""
    if device in ("auto", "cuda"):
        return 0
    head, _, idx = device.partition(":")
    return int(idx) if head == "cuda" and idx.isdigit() else None


def _config_reason(cfg: TrainConfig, world: int) -> str | None:
    """``skip_reason``'s part that needs no device (checked before the driver is probed)."""
    if not cfg.prewarm:
        return "--no-prewarm"
    if cfg.backend == "torch":
        return "the torch backend compiles no tilewise kernels"
    if world > 1:
        return "under torchrun"
    if settings.triton_interpret():
        return "Triton's interpreter compiles nothing"
    default = TrainConfig()
    differ = [f for f in KERNEL_FIELDS if getattr(cfg, f) != getattr(default, f)]
    if differ:
        return f"the tasks compile the default run's shapes; {', '.join(differ)} differ"
    return None


def _device_reason(capability: tuple[int, int] | None) -> str | None:
    """``skip_reason``'s part that needs the device (its capability keys the marker)."""
    if capability is None:
        return "no CUDA device"
    if _warmed(_key(capability)):
        return "an earlier run warmed the kernel caches"
    return None


def skip_reason(cfg: TrainConfig, world: int, capability: tuple[int, int] | None) -> str | None:
    """Why a run of this config should not compile in the background, or None when it should."""
    return _config_reason(cfg, world) or _device_reason(capability)


class Prewarm:
    """The tasks' child processes, started at construction; ``wait`` or ``cancel`` ends them."""

    def __init__(self, jobs: Sequence[Job], key: dict, timeout_s: float = TASK_TIMEOUT_S):
        self._key, self._timeout = key, timeout_s
        self._t0 = time.perf_counter()
        env = settings.child_environment()
        self._procs: list[tuple[str, subprocess.Popen, IO[bytes]]] = []
        for job in jobs:
            err = tempfile.TemporaryFile()  # files, not pipes: a chatty child never blocks on them
            self._procs.append((job.name, subprocess.Popen(list(job.argv), env=env, stdin=subprocess.DEVNULL,
                                                           stdout=err, stderr=err), err))

    def cancel(self) -> None:
        """Stop the children (the run failed before its first step)."""
        for _, p, err in self._procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            err.close()

    def wait(self) -> str:
        """Join the children; a line for the run's notes. Writes the marker when every task passed."""
        t_wait = time.perf_counter()
        failed, seconds = [], {}
        for name, p, err in self._procs:
            try:
                code = p.wait(timeout=max(0.0, self._t0 + self._timeout - time.perf_counter()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                code = "timed out"
            err.seek(0)
            text = err.read().decode(errors="replace")
            if code == 0:
                seconds[name] = _task_seconds(text)
            else:
                lines = text[-STDERR_TAIL:].strip().splitlines()
                failed.append(f"{name}: {code if code == 'timed out' else f'exit status {code}'}"
                              + (f", {lines[-1]}" if lines else ""))
            err.close()
        now = time.perf_counter()
        if failed:
            return f"background compile: {len(failed)} of {len(self._procs)} tasks failed ({'; '.join(failed)}); " \
                   f"the first step compiles what they missed"
        try:
            write_atomic(marker_path(), json.dumps(self._key).encode())
        except OSError:  # a read-only cache: the next run warms again
            pass
        slowest = max(seconds, key=lambda n: seconds[n] or 0.0, default=None)
        longest = f" (the longest, {slowest}, {seconds[slowest] or 0.0:.1f} s after its imports)" if slowest else ""
        return f"kernels compiled in the background: {len(self._procs)} tasks in {now - self._t0:.1f} s{longest}, " \
               f"{now - t_wait:.1f} s of it waited for"


def _task_seconds(output: str) -> float | None:
    """The seconds a warmup child prints for its task (one JSON line), or None."""
    for line in reversed(output.splitlines()):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("seconds"), (int, float)):
            return float(d["seconds"])
    return None


def start_early(cfg: TrainConfig) -> Prewarm | None:
    """The running tasks, or None where ``skip_reason`` gives one. Imports neither torch nor Triton."""
    world = settings.distributed()[0]
    if _config_reason(cfg, world) is not None:  # before probing the driver
        return None
    ordinal = _ordinal(cfg.device)
    capability = cuda_capability(ordinal) if ordinal is not None else None
    if _device_reason(capability) is not None:
        return None
    names = [name for name, _, _ in classifier_tasks()]  # warmup.py's tasks, each in a child
    return Prewarm([Job(n, tuple(child_command(n))) for n in names], _key(capability))
