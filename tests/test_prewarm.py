"""``tilewise train --prewarm`` (sst2/prewarm.py): the classifier's pieces compiled in child processes
while the run starts; a marker in the kernel cache lets the next run skip it; other shapes, backends
and devices skip it and say why."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from tilewise import _jobs, settings
from tilewise.sst2 import prewarm
from tilewise.sst2.config import TrainConfig


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv(settings.CACHE_DIR, str(tmp_path / "tw"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tmp_path


def _fake_children(monkeypatch, failing=""):
    def command(name):
        if name == failing:
            return [sys.executable, "-c", "import sys; sys.stderr.write('no kernel for you\\n'); sys.exit(4)"]
        return [sys.executable, "-c", "pass"]

    monkeypatch.setattr(_jobs, "child_command", command)


def test_pieces_run_then_the_marker_skips_the_next_run(monkeypatch, cache):
    _fake_children(monkeypatch)
    pw = prewarm.start_prewarm("Test GPU")
    assert pw is not None and pw._thread.daemon  # a run that fails before wait() does not wait for it
    line = pw.wait()
    assert "3 pieces of the model compiled side by side" in line
    assert prewarm.prewarm_marker("Test GPU").is_file()
    assert prewarm.start_prewarm("Test GPU") is None
    assert prewarm.start_prewarm("Another GPU") is not None  # another device: its own marker


def test_a_failed_piece_is_named_and_leaves_no_marker(monkeypatch, cache):
    _fake_children(monkeypatch, failing="train.fc1")
    line = prewarm.start_prewarm("Test GPU").wait()
    assert "train.fc1 failed (no kernel for you)" in line and "compile what is missing" in line
    assert not prewarm.prewarm_marker("Test GPU").exists()


def test_marker_follows_the_triton_cache(monkeypatch, cache):
    a = prewarm.prewarm_marker("Test GPU")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache / "elsewhere"))
    assert prewarm.prewarm_marker("Test GPU") != a
    assert a.parent == cache / "tw" / "warm"


def test_the_pieces_are_the_classifier_at_train_shapes():
    assert [t.name for t in prewarm.CLASSIFIER_TASKS] == ["train.embedding", "train.fc1", "train.head"]
    assert not any(t.alone for t in prewarm.CLASSIFIER_TASKS)
    with pytest.raises(ValueError, match="part must be one of"):
        prewarm._classifier_part("fc3")


@pytest.mark.parametrize("change, why", [
    (dict(backend="torch"), "for one GPU process"),
    (dict(hidden=128), "default model shape"),
    (dict(buckets=(8, 64)), "default model shape"),
])
def test_run_skips_with_a_reason(change, why):
    cfg = replace(TrainConfig(prewarm=True), **change)
    backend = change.get("backend", "tilewise")
    pw, note = prewarm.start_for_run(cfg, backend, torch.device("cuda") if backend == "tilewise" else
                                      torch.device("cpu"), None)
    assert pw is None and why in note


def test_cpu_run_with_prewarm_trains_and_says_it_skipped(tmp_path, one_thread):
    from tilewise.sst2 import commands

    data = tmp_path / "data"
    data.mkdir()
    rows = "sentence\tlabel\n" + "".join(f"{w} movie\t{i % 2}\n" for i, w in enumerate(["good", "bad"] * 8))
    for split in ("train", "dev"):
        (data / f"{split}.tsv").write_text(rows)
    args = ["--data-dir", str(data), "--epochs", "1", "--max-steps", "2", "--device", "cpu", "--embedding-init",
            "random", "--output-dir", str(tmp_path / "run"), "--prewarm", "--no-plot", "--no-progress"]
    p = subprocess.run([sys.executable, "-m", "tilewise", "train", *args], capture_output=True, text=True,
                       env=settings.child_environment(tmp_path / "tw", tmp_path / "triton"), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    notes = json.loads((tmp_path / "run" / "metrics.json").read_text())["notes"]
    assert any(n.startswith("--prewarm: skipped") for n in notes), notes
    assert commands.config_from_args(_parsed(args)).prewarm is True


def _parsed(args):
    import argparse

    from tilewise.sst2 import commands

    ap = argparse.ArgumentParser()
    commands.add_arguments(ap)
    return ap.parse_args(args)


@pytest.mark.gpu
def test_gpu_pieces_leave_nothing_for_the_whole_step(tmp_path):
    # The three pieces compile (and tune) what the graphed training step and evaluation need: the whole
    # workload run after them in a fresh process adds no Triton kernel and no NVRTC module.
    env = settings.child_environment(tmp_path / "tw", tmp_path / "triton")
    pieces = [t.name for t in prewarm.CLASSIFIER_TASKS]
    procs = [subprocess.Popen([sys.executable, "-m", "tilewise.warmup", "--task", n], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in pieces]
    for n, p in zip(pieces, procs):
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"{n}: {err[-3000:]}"

    def files():
        return {str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file() and "warm" not in f.parts}

    before = files()
    p = subprocess.run([sys.executable, "-m", "tilewise.warmup", "--task", "train"], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    new = sorted(files() - before)
    assert not new, f"the whole step compiled what the pieces missed: {new[:12]}"


def test_import_in_background_loads_the_module(tmp_path, monkeypatch):
    # A module imported by the thread is the one a later import finds; a failing one is left to that import.
    (tmp_path / "tw_slow_mod.py").write_text("import time\ntime.sleep(0.2)\nVALUE = 7\n")
    (tmp_path / "tw_bad_mod.py").write_text("raise RuntimeError('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    th = prewarm.import_in_background("tw_slow_mod")
    import tw_slow_mod  # waits on the thread's import

    assert tw_slow_mod.VALUE == 7
    th.join(5)
    assert not th.is_alive() and sys.modules["tw_slow_mod"] is tw_slow_mod
    prewarm.import_in_background("tw_bad_mod").join(5)
    with pytest.raises(RuntimeError, match="no"):
        import tw_bad_mod  # noqa: F401
