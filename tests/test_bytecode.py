"""The command line's bytecode cache (tilewise._bytecode): when it acts, and that a second process
reads what the first wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilewise import _bytecode, settings


def _package(root: Path, name: str = "twprobe") -> Path:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "mod.py").write_text("def f():\n    return 42\n")
    return pkg


@pytest.fixture
def interpreter(monkeypatch, tmp_path):
    """This process's bytecode settings, restored after the test; the cache in tmp_path."""
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setenv(settings.CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(settings.BYTECODE_CACHE, raising=False)
    src = tmp_path / "src"
    _package(src)
    monkeypatch.syspath_prepend(str(src))
    return src


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("auto", "auto"), ("1", "on"), ("ON", "on"),
                                         ("0", "off"), ("false", "off")])
def test_setting_spellings(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv(settings.BYTECODE_CACHE, raising=False)
    else:
        monkeypatch.setenv(settings.BYTECODE_CACHE, value)
    assert settings.bytecode_cache() == mode


def test_a_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(settings.BYTECODE_CACHE, "sometimes")
    with pytest.raises(ValueError, match="TILEWISE_BYTECODE_CACHE"):
        settings.bytecode_cache()
    with pytest.raises(ValueError, match="mode"):
        _bytecode.enable(mode="always")


def test_usable_bytecode_is_found_written_or_missing(interpreter, monkeypatch):
    assert _bytecode.has_usable_bytecode("twprobe") is False  # none there, and writing is off
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert _bytecode.has_usable_bytecode("twprobe") is True  # the interpreter writes it on import
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    import importlib.util

    pyc = Path(importlib.util.cache_from_source(str(interpreter / "twprobe" / "__init__.py")))
    pyc.parent.mkdir()
    pyc.write_bytes(b"")
    assert _bytecode.has_usable_bytecode("twprobe") is True
    assert _bytecode.has_usable_bytecode("no_such_module_tw") is None


def test_auto_acts_only_without_usable_bytecode(interpreter, tmp_path, monkeypatch):
    assert _bytecode.enable(mode="off", probes=("twprobe",)) is None
    assert sys.pycache_prefix is None and sys.dont_write_bytecode
    assert _bytecode.enable(mode="auto", probes=("no_such_module_tw",)) is None  # nothing to judge by
    got = _bytecode.enable(mode="auto", probes=("twprobe",))
    assert got == tmp_path / "cache" / "bytecode" and got.is_dir()
    assert sys.pycache_prefix == str(got) and not sys.dont_write_bytecode

    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the interpreter keeps its own: leave it
    assert _bytecode.enable(mode="auto", probes=("twprobe",)) is None and sys.pycache_prefix is None
    assert _bytecode.enable(mode="on", probes=("twprobe",)) == got  # asked for: always


def test_auto_acts_when_any_probe_lacks_bytecode(interpreter, tmp_path, monkeypatch):
    import importlib.util

    _package(interpreter, "twready")
    pyc = Path(importlib.util.cache_from_source(str(interpreter / "twready" / "__init__.py")))
    pyc.parent.mkdir()
    pyc.write_bytes(b"")
    assert _bytecode.enable(mode="auto", probes=("twready",)) is None
    assert _bytecode.enable(mode="auto", probes=("twready", "twprobe")) == tmp_path / "cache" / "bytecode"


def test_a_read_only_cache_leaves_the_interpreter_alone(interpreter, tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("this user writes read-only folders (root)")
        monkeypatch.setenv(settings.CACHE_DIR, str(ro / "cache"))
        assert _bytecode.enable(mode="on", probes=("twprobe",)) is None
        assert sys.pycache_prefix is None
    finally:
        ro.chmod(0o700)


CHILD = textwrap.dedent("""
    from tilewise import _bytecode
    print("folder", _bytecode.enable(probes=("twprobe",)))
    import twprobe.mod
    print("answer", twprobe.mod.f())
""")


def test_the_second_process_reads_what_the_first_wrote(tmp_path):
    """Without usable bytecode (an empty PYTHONPYCACHEPREFIX, writing off: what a venv without .pyc
    files in a read-only folder looks like), the first process compiles the module and writes its
    bytecode in the cache; the second loads the code object from there."""
    src = tmp_path / "src"
    _package(src)
    empty = tmp_path / "empty"
    empty.mkdir()
    tilewise_src = Path(_bytecode.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(empty),
               PYTHONPATH=os.pathsep.join([str(src), str(tilewise_src)]),
               **{settings.CACHE_DIR: str(tmp_path / "cache")})
    env.pop(settings.BYTECODE_CACHE, None)
    runs = [subprocess.run([sys.executable, "-v", "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"folder {tmp_path / 'cache' / 'bytecode'}" in r.stdout and "answer 42" in r.stdout
    pyc = [p for p in (tmp_path / "cache" / "bytecode").rglob("*.pyc") if p.name.startswith("mod.")]
    assert len(pyc) == 1, list((tmp_path / "cache").rglob("*"))
    assert f"code object from '{pyc[0]}'" not in runs[0].stderr  # compiled from source, then written
    assert f"code object from '{pyc[0]}'" in runs[1].stderr
    assert not list(empty.rglob("*.pyc"))  # the interpreter's own prefix untouched


def test_the_command_line_rejects_a_bad_setting(monkeypatch, capsys):
    from tilewise import cli

    monkeypatch.setenv(settings.BYTECODE_CACHE, "sometimes")
    assert cli.main(["info"]) == 2
    assert "TILEWISE_BYTECODE_CACHE" in capsys.readouterr().err


def test_train_reads_torch_from_the_cache_on_its_second_run(tmp_path):
    """`tilewise train` under an interpreter without usable bytecode: the first run writes torch's
    bytecode into the cache and says where in metrics.json; the second run's imports load it."""
    from test_classifier import write_tiny_sst2

    data = write_tiny_sst2(tmp_path / "sst2", n_train=64, n_dev=16)
    empty = tmp_path / "empty"
    empty.mkdir()
    cache = tmp_path / "cache"
    env = settings.child_environment(cache_dir=cache, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(empty))
    env.pop(settings.BYTECODE_CACHE, None)
    stamps = []
    for run in ("first", "second"):
        out = tmp_path / run
        r = subprocess.run([sys.executable, "-m", "tilewise", "train", "--data-dir", str(data), "--epochs", "1",
                            "--max-steps", "2", "--device", "cpu", "--embedding-init", "random", "--no-plot",
                            "--no-progress", "--output-dir", str(out)],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["bytecode_prefix"] == str(cache / "bytecode")
        torch_pyc = list((cache / "bytecode").rglob("torch/__init__.*.pyc"))
        assert len(torch_pyc) == 1
        stamps.append((torch_pyc[0].stat().st_mtime_ns, torch_pyc[0].read_bytes()))
    assert stamps[1] == stamps[0]  # the second run read it, and did not compile and write it again
    assert not list(empty.rglob("*.pyc"))
