"""tilewise._files: write_atomic, the one way the project replaces a file, and exclusive_lock,
the one flock between processes (the bench CSV's directory, a training run's output directory)."""

import errno
import fcntl
import os

import pytest

from tilewise import _files


def test_write_atomic_replaces_keeps_mode_and_cleans_up(tmp_path, monkeypatch):
    p = tmp_path / "sub" / "f.json"
    _files.write_atomic(p, b"one")
    assert p.read_bytes() == b"one"
    os.chmod(p, 0o640)
    _files.write_atomic(p, b"two")
    assert p.read_bytes() == b"two" and (p.stat().st_mode & 0o777) == 0o640

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(_files.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        _files.write_atomic(p, b"three")
    assert p.read_bytes() == b"two"
    assert [q.name for q in p.parent.iterdir()] == ["f.json"]  # no temporary file left


def _held_elsewhere(path) -> bool:
    """Whether another open file description of ``path`` is refused the lock."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_exclusive_lock_holds_for_the_block(tmp_path):
    lock = tmp_path / "run.lock"
    with _files.exclusive_lock(lock, wait=False, create=True):
        assert lock.exists() and _held_elsewhere(lock)
        with pytest.raises(BlockingIOError):
            with _files.exclusive_lock(lock, wait=False, create=True):
                pass
    assert not _held_elsewhere(lock)
    with _files.exclusive_lock(tmp_path):  # a directory, opened read-only
        assert _held_elsewhere(tmp_path)
    assert not _held_elsewhere(tmp_path)
    with pytest.raises(FileNotFoundError):  # opening fails with its own error
        with _files.exclusive_lock(tmp_path / "none" / "x.lock", create=True):
            pass


def test_exclusive_lock_without_flock(tmp_path, monkeypatch):
    """A filesystem without flock: LockUnavailable (an OSError with the reason), or with
    required=False the block runs unlocked."""
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_files.fcntl, "flock", no_flock)
    with pytest.raises(_files.LockUnavailable) as e:
        with _files.exclusive_lock(tmp_path):
            pass
    assert e.value.strerror == "No locks available"
    ran = []
    with _files.exclusive_lock(tmp_path, required=False):
        ran.append(1)
    assert ran == [1]
