"""Start-up work a process can do beside its imports and set-up (``tilewise train``, warmup's children)."""

from __future__ import annotations

import threading


def _triton_key() -> None:
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # no Triton, or one without it: its first kernel does what it needs
        return
    try:
        triton_key()
    except Exception:  # noqa: BLE001 - a hash that fails here fails again, reported, at the first kernel
        pass


def prefetch_triton_key() -> threading.Thread:
    """Start a daemon thread computing ``triton.runtime.cache.triton_key()``, and return it.

    Triton names its on-disk kernel cache by a hash of its own installation (every compiler, backend and
    language module, and libtriton), computed once a process, at the first kernel it looks up: ~0.5 s
    with the files in the page cache on the H200 machine's host, more without (docs/design.md,
    "Start-up"). Reading and hashing release the GIL, so
    the thread runs beside the caller's imports or model set-up, and the first kernel finds the hash
    cached (``functools.lru_cache``); if it asks first, it computes the hash itself, as without this."""
    t = threading.Thread(target=_triton_key, name="tilewise-triton-key", daemon=True)
    t.start()
    return t
