"""tilewise._files: write_atomic, the one way the project replaces a file, and exclusive_lock,
the one flock between processes (the bench CSV's directory, a training run's output directory)."""

import errno
import fcntl
import os
import threading
import time

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


def test_write_atomic_reads_the_umask_without_changing_it(tmp_path, monkeypatch):
    def no_umask(mask):
        raise AssertionError("os.umask called: another thread would see the changed value")

    if _files._proc_umask() is None:
        pytest.skip("this system shows no umask in /proc")
    monkeypatch.setattr(_files.os, "umask", no_umask)
    p = _files.write_atomic(tmp_path / "f", b"x")
    assert p.stat().st_mode & 0o777 == 0o666 & ~_files._proc_umask()


def test_threads_reading_the_umask_by_setting_it_leave_it_as_it_was(monkeypatch):
    # Where /proc does not show the umask: set-and-restore from eight threads at once, each call slowed
    # down so that unguarded calls interleave (one thread's restore undone by another's set).
    real = os.umask
    before = real(0o022)
    monkeypatch.setattr(_files, "_proc_umask", lambda: None, raising=False)

    def slow_umask(mask):
        old = real(mask)
        time.sleep(0.002)
        return old

    monkeypatch.setattr(_files.os, "umask", slow_umask)
    barrier = threading.Barrier(8)
    modes = []

    def work():
        barrier.wait()
        for _ in range(5):
            modes.append(_files._new_file_mode())

    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = real(before)
    finally:
        real(before)
    assert after == 0o022 and set(modes) == {0o644}
