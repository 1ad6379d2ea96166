"""Triton autotuner picks kept on disk, so a new process skips the timing.

Triton can keep its own picks (``cache_results``), but it gives up on configs that carry a pre-hook,
and every TMA config of the gemm autotuner has one (the hook sets the descriptors' block shapes). A
pre-hook cannot be written to a file; a position in the pruned config list can. So ``StoredAutotuner``
stores, per tuning key, the index of the winner among the configs it timed, together with their
descriptions, and on a hit takes that config object (pre-hook included) from the list it has now.

One JSON file per pick under ``<cache_dir>/autotune/``, named by a hash over what could change the
pick or the code: Triton's version key, the device (name, capability, SM count), the kernel's source
key, Triton's cache-invalidating environment, the tuning key and the configs. A file that does not
parse, names another key or other configs is ignored and the configs are timed again; writes are
atomic. Nothing in the file is executed: it holds numbers and strings only.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path

import torch
from triton.runtime.autotuner import Autotuner, Heuristics

from .. import settings
from .._files import write_atomic

FORMAT = 1


def describe(config) -> str:
    """A config as text: its meta-parameters and launch options (not its pre-hook, which is code)."""
    hook = getattr(config.pre_hook, "__qualname__", None)
    return f"{config}, pre_hook: {hook}"


def _triton_identity() -> list[str]:
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import triton_key

    return [triton_key(), str(sorted(get_cache_invalidating_env_vars().items()))]


def _device_tag() -> str:
    i = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    return f"{p.name}|sm_{p.major}{p.minor}|{p.multi_processor_count}"


def jit_of(fn):
    """The kernel under autotuner / heuristics wrappers (each keeps the wrapped one as ``.fn``)."""
    while isinstance(fn, (Autotuner, Heuristics)):
        fn = fn.fn
    return fn


def _source_key(kernel) -> str:
    # A JITFunction's cache_key hashes its source and its callees'; the interpreter's stand-in has none.
    key = getattr(kernel, "cache_key", None)
    if key is None:
        key = hashlib.sha256(inspect.getsource(kernel.fn).encode()).hexdigest()
    return key


class StoredAutotuner(Autotuner):
    """``triton.autotune`` whose picks outlive the process (see the module's docstring).

    ``store``: the folder for the pick files (default ``settings.cache_dir() / "autotune"``, read
    when a pick is looked up, so a cache moved after import counts)."""

    def __init__(self, *args, store: Path | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.store = store
        self.cache_results = True  # run() consults check_disk_cache only when this is set

    def folder(self) -> Path:
        return Path(self.store) if self.store is not None else settings.cache_dir() / "autotune"

    def pick_path(self, tuning_key, configs) -> tuple[Path, list[str]]:
        described = [describe(c) for c in configs]
        parts = _triton_identity() + [_device_tag(), _source_key(jit_of(self.fn)), repr(tuning_key)] + described
        digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
        return self.folder() / f"{jit_of(self.fn).__name__[:80]}-{digest}.json", described

    def check_disk_cache(self, tuning_key, configs, bench_fn) -> bool:
        if len(configs) == 1:  # nothing to choose (Triton 3.6 would still time it)
            self.cache[tuning_key] = configs[0]
            return True
        path, described = self.pick_path(tuning_key, configs)
        best = _read_pick(path, repr(tuning_key), described)
        if best is not None:
            self.cache[tuning_key] = configs[best]
            return True
        bench_fn()
        chosen = self.cache[tuning_key]
        index = next(i for i, c in enumerate(configs) if c is chosen)
        timings = getattr(self, "configs_timings", {}) or {}
        record = {"format": FORMAT, "kernel": jit_of(self.fn).__name__, "key": repr(tuning_key),
                  "configs": described, "best": index,
                  "timings_ms": [_first(timings.get(c)) for c in configs]}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(record, indent=1).encode())
        except OSError:
            pass  # a read-only cache costs the next process the timing, nothing else
        return False


def _first(t):
    # Triton records a config's timing as a list of quantiles, or inf for a config that failed.
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return float(t) if isinstance(t, (int, float)) and t == t and t != float("inf") else None


def _read_pick(path: Path, key: str, described: list[str]) -> int | None:
    """The stored winner's index, or None when the file is missing, damaged or about other configs."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT or rec.get("key") != key:
        return None
    best = rec.get("best")
    if rec.get("configs") != described or not isinstance(best, int) or isinstance(best, bool):
        return None
    return best if 0 <= best < len(described) else None


def stored_autotune(configs, key, prune_configs_by=None, store: Path | None = None):
    """As ``triton.autotune(configs, key, prune_configs_by=...)``, with the picks kept on disk."""

    def decorator(fn):
        return StoredAutotuner(fn, fn.arg_names, configs, key, None, None, prune_configs_by=prune_configs_by,
                               store=store)

    return decorator
