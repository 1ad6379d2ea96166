"""Start-up work a process can do beside its imports and set-up (``tilewise train``, warmup's children), a
Ctrl-C that start-up code cannot swallow, and the end of a process without the interpreter's teardown."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

_interrupted = threading.Event()  # set by latched_interrupts' handler


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


def end_process(code: int) -> None:
    """Flush stdout and stderr and end the process now (``os._exit``), without the interpreter's teardown:
    freeing torch's modules, the CUDA context and cuBLAS handles adds nothing to a finished run (~0.3 s a
    ``train`` on the CPU host). Only for a process whose files are all written and closed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def skips_teardown() -> bool:
    """Whether a finished run may end through ``end_process``: ``settings.fast_exit`` (no profiler riding in
    the process, not turned off) and no tracer (coverage, a debugger), which would lose what it writes at exit."""
    from . import settings

    return settings.fast_exit() and sys.gettrace() is None


@contextlib.contextmanager
def latched_interrupts():
    """Within it, make a Ctrl-C (SIGINT) stick: the handler raises KeyboardInterrupt as Python's own does,
    and also records it, so that ``raise_if_interrupted`` raises it again where it was swallowed. CPython
    drops an exception raised in a weakref callback (importlib's module locks have one) and torch's C++
    import of numpy turns one into a warning; a `train` signalled during its start-up then trained on (the
    kill test; 3 of 100 early SIGINTs on a loaded 2-core host, research/train_sigint.py). Only where SIGINT
    has Python's default handler (not where a caller ignores or handles it) and in the main thread;
    restored on the way out."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def _handler(signum, frame):
        _interrupted.set()
        raise KeyboardInterrupt

    _interrupted.clear()
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is _handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def raise_if_interrupted() -> None:
    """KeyboardInterrupt if ``latched_interrupts``' handler has seen a SIGINT (one that something swallowed)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt
