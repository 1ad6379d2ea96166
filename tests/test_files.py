"""tilewise._files.write_atomic: the one way the project replaces a file."""

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
