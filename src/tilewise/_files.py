"""Writing files so that a reader or a killed writer sees the old file or the new one, never part of
one, and locking a file or directory between processes. A leaf module: it imports nothing from the
package."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows has no flock
    fcntl = None


class LockUnavailable(OSError):
    """``path`` opened, but it cannot be flocked (a filesystem or platform without flock)."""


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



def _flock(fd: int, *, wait: bool, required: bool) -> bool:
    """Whether ``fd`` now holds an exclusive flock (see ``exclusive_lock``)."""
    try:
        if fcntl is None:
            raise LockUnavailable(errno.ENOLCK, "flock is not available on this platform")
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        raise
    except OSError as e:
        if required:
            raise (e if isinstance(e, LockUnavailable) else LockUnavailable(e.errno, e.strerror)) from e
        return False


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, *, wait: bool = True, create: bool = False,
                   required: bool = True) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` for the block: a directory or file opened read-only, or
    with ``create`` a lock file opened (made if missing) for writing. The kernel drops the lock when
    the process dies, however it dies, so no stale lock outlives its holder.

    Opening ``path`` raises its OSError. ``wait=False``: BlockingIOError at once when another
    process holds the lock. Where flock fails otherwise (or there is none): LockUnavailable, or
    with ``required=False`` the block runs unlocked."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT if create else os.O_RDONLY, 0o644)
    try:
        locked = _flock(fd, wait=wait, required=required)
        try:
            yield
        finally:
            if locked:  # before the close: a forked child sharing the descriptor would keep the lock
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
