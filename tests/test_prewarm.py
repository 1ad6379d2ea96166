"""`tilewise train`'s background compile (sst2/prewarm.py): when it starts, what its children's
outcomes give, the marker that skips it next time, and that the CLI starts it before torch's import."""

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tilewise import settings
from tilewise._jobs import Job
from tilewise.sst2 import dataset, loop, prewarm
from tilewise.sst2.config import TrainConfig

SRC = str(Path(__file__).resolve().parent.parent / "src")
CAP = (9, 0)


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv(settings.CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return tmp_path / "cache"


def _job(name, code):
    return Job(name, (sys.executable, "-c", code))


@pytest.mark.parametrize("change,world,cap,want", [
    (dict(prewarm=False), 1, CAP, "--no-prewarm"),
    (dict(backend="torch"), 1, CAP, "torch backend"),
    ({}, 1, None, "no CUDA device"),
    ({}, 2, CAP, "torchrun"),
    (dict(hidden=128), 1, CAP, "hidden differ"),
    (dict(batch_size=32, max_len=48), 1, CAP, "batch_size, max_len differ"),
    (dict(epochs=1, max_steps=100, embedding_init="random", output_dir="x"), 1, CAP, None),
])
def test_skip_reason(cache, change, world, cap, want):
    got = prewarm.skip_reason(dataclasses.replace(TrainConfig(), **change), world, cap)
    assert got == want if want is None else want in got


def test_interpreter_and_marker_skip(cache, monkeypatch):
    cfg = TrainConfig()
    assert prewarm.skip_reason(cfg, 1, CAP) is None
    p = prewarm.Prewarm([_job("a", 'print("warming"); print(\'{"task": "a", "seconds": 1.25}\')'),
                         _job("b", "pass")], prewarm._key(CAP))
    note = p.wait()
    assert note.startswith("kernels compiled in the background: 2 tasks") and "the longest, a, 1.2 s" in note
    assert json.loads((cache / prewarm.MARKER).read_text()) == prewarm._key(CAP)
    assert "earlier run" in prewarm.skip_reason(cfg, 1, CAP)
    assert prewarm.skip_reason(cfg, 1, (8, 0)) is None  # another GPU: the marker's key differs
    (cache / prewarm.MARKER).write_text("{not json")
    assert prewarm.skip_reason(cfg, 1, CAP) is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in prewarm.skip_reason(cfg, 1, CAP)


def test_failed_task_is_reported_and_leaves_no_marker(cache):
    jobs = [_job("ok", "pass"), _job("bad", "import sys; print('no compiler here', file=sys.stderr); sys.exit(3)")]
    note = prewarm.Prewarm(jobs, prewarm._key(CAP)).wait()
    assert "1 of 2 tasks failed" in note and "bad: exit status 3, no compiler here" in note
    assert not (cache / prewarm.MARKER).exists()


def test_timeout_and_cancel_stop_the_children(cache):
    t0 = time.perf_counter()
    note = prewarm.Prewarm([_job("slow", "import time; time.sleep(60)")], prewarm._key(CAP), timeout_s=1.0).wait()
    assert "slow: timed out" in note and time.perf_counter() - t0 < 30
    p = prewarm.Prewarm([_job("slow", "import time; time.sleep(60)")], prewarm._key(CAP))
    t0 = time.perf_counter()
    p.cancel()
    assert all(proc.poll() is not None for _, proc, _ in p._procs) and time.perf_counter() - t0 < 30
    assert not (cache / prewarm.MARKER).exists()


def test_a_run_that_fails_before_its_first_step_stops_the_children(cache, tmp_path):
    p = prewarm.Prewarm([_job("slow", "import time; time.sleep(60)")], prewarm._key(CAP))
    cfg = TrainConfig(data_dir=str(tmp_path / "no-data"), device="cpu", output_dir=str(tmp_path / "out"),
                      progress=False, plot=False)
    with pytest.raises(dataset.MissingDataError):
        loop.train(cfg, prewarm=p)
    assert all(proc.poll() is not None for _, proc, _ in p._procs)


def test_the_background_tasks_are_warmups_tasks():
    from tilewise import warmup

    assert [t.name for t in warmup.CLASSIFIER_TASKS] == [n for n, _, _ in prewarm.classifier_tasks()]


def test_start_early_on_a_cpu_config_starts_nothing(cache):
    assert prewarm.start_early(TrainConfig(device="cpu")) is None
    assert prewarm.start_early(TrainConfig(backend="torch")) is None
    assert prewarm._ordinal("cuda:3") == 3 and prewarm._ordinal("auto") == 0 and prewarm._ordinal("cpu") is None


def test_the_cli_reads_train_options_without_importing_torch():
    code = ("import sys; from tilewise import cli; from tilewise.sst2 import commands; import argparse; "
            "p = argparse.ArgumentParser(); commands.add_arguments(p); "
            "cfg = commands.config_from_args(p.parse_args(['--no-prewarm', '--device', 'cpu'])); "
            "assert cfg.prewarm is False; print('torch' in sys.modules, 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=settings.child_environment(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
