"""Writing files so that a reader or a killed writer sees the old file or the new one, never part of
one. A leaf module: it imports nothing from the package."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path


_umask_lock = threading.Lock()


def _proc_umask() -> int | None:
    """The umask as Linux shows it in /proc (4.7+), read without changing it; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _umask() -> int:
    """The process umask. Where /proc does not show it, it can only be read by setting it, so that
    happens under a lock: two threads interleaving umask(0) / umask(old) could leave it at 0 (every
    later file world-writable)."""
    umask = _proc_umask()
    if umask is not None:
        return umask
    with _umask_lock:
        umask = os.umask(0o077)  # the narrowest value while it is briefly changed
        os.umask(umask)
    return umask


def _new_file_mode() -> int:
    return 0o666 & ~_umask()


def write_atomic(path: str | os.PathLike, data) -> Path:
    """Replace ``path`` by ``data`` (bytes-like): a uniquely named temporary file in the same
    directory, flushed and fsynced, renamed over it, then the directory fsynced so the rename
    survives a crash. The file keeps its permission bits (a new one gets the umask's, not
    mkstemp's 0600); the temporary file is removed on any error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else _new_file_mode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path
