"""Safety of `tilewise train`'s files (issue 29): checkpoints load without unpickling arbitrary
objects, every output is replaced atomically (a kill leaves the last good checkpoint), the output
directory is locked and checked writable before training, and --resume applies new lr / weight decay."""

import argparse
import errno
import fcntl
import io
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from tilewise.sst2 import checkpoint, commands, loop

from test_classifier import tiny_config, write_tiny_sst2


pytestmark = pytest.mark.usefixtures("one_thread")


class _Planted:
    """Unpickling this creates ``marker`` (any callable would run the same way)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(path: Path, marker: Path, form: str, extra: dict | None = None) -> None:
    obj = {**(extra or {}), "model": _Planted(marker), "vocab": ["<pad>", "<unk>"], "config": {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    if form == "torch.save":
        torch.save(obj, path)
    else:  # a bare pickle, which torch.load reads as its legacy format
        path.write_bytes(pickle.dumps(obj))


def _predict_cli(path, capsys) -> tuple[int, str]:
    p = argparse.ArgumentParser()
    commands.add_predict_arguments(p)
    rc = commands.main_predict(p.parse_args([str(path), "great", "--device", "cpu", "--backend", "torch"]))
    return rc, capsys.readouterr().err


# --------------------------------------------------------------------------- 1: loading runs no code


@pytest.mark.parametrize("form", ["torch.save", "pickle"])
def test_load_checkpoint_refuses_a_pickle_that_runs_code(tmp_path, capsys, form):
    marker = tmp_path / "marker"
    ck = tmp_path / "evil" / "checkpoint.pt"
    _plant(ck, marker, form)
    with pytest.raises(ValueError, match="not a tilewise checkpoint") as e:
        checkpoint.load_checkpoint(ck, device="cpu", backend="torch")
    assert str(ck) in str(e.value) and "loads safely" in str(e.value)
    assert not marker.exists()
    with pytest.raises(ValueError, match="not a tilewise checkpoint"):
        commands.predict(ck.parent, ["great"], device="cpu", backend="torch")
    rc, err = _predict_cli(ck, capsys)
    assert rc == 2 and str(ck) in err.replace("\n", "") and "Traceback" not in err
    assert not marker.exists()


def test_resume_refuses_a_pickle_that_runs_code(tmp_path, capsys):
    loop.train(tiny_config(tmp_path, epochs=1, plot=False))
    ck = tmp_path / "run" / "checkpoint.pt"
    good = torch.load(ck, weights_only=True)
    marker = tmp_path / "marker"
    _plant(ck, marker, "torch.save", extra={k: v for k, v in good.items() if k != "model"})
    with pytest.raises(ValueError, match="not a tilewise checkpoint") as e:
        loop.train(tiny_config(tmp_path, epochs=2, resume=True, plot=False))
    assert str(ck) in str(e.value)
    assert not marker.exists()
    p = argparse.ArgumentParser()
    commands.add_arguments(p)
    args = p.parse_args(["--data-dir", str(tmp_path / "sst2"), "--epochs", "2", "--batch-size", "16", "--hidden", "16",
                         "--embedding-init", "random", "--backend", "torch", "--device", "cpu", "--no-progress",
                         "--no-plot", "--output-dir", str(tmp_path / "run"), "--resume"])
    assert commands.main(args) == 2
    err = capsys.readouterr().err
    assert str(ck) in err.replace("\n", "") and "Traceback" not in err
    assert not marker.exists()


def _not_a_checkpoint(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "random":
        path.write_bytes(random.Random(0).randbytes(4096))
    elif kind == "text":
        path.write_text("this is not a checkpoint\n")
    elif kind == "json":
        path.write_text(json.dumps({"model": {}, "vocab": ["a"], "config": {"hidden": 4}}))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("notes.txt", "hello")
    elif kind == "torch-other":  # a tensor file, not a training checkpoint
        torch.save({"weight": torch.zeros(3)}, path)
    elif kind == "torch-wrong-shapes":
        torch.save({"model": {"fc1.weight": torch.zeros(2)}, "vocab": ["<pad>", "<unk>", "a"],
                    "config": {"embed_dim": 4, "hidden": 3, "dropout": 0.0}}, path)


@pytest.mark.parametrize("kind", ["random", "text", "json", "empty", "zip", "torch-other", "torch-wrong-shapes"])
def test_not_a_checkpoint_is_a_clear_error(tmp_path, capsys, kind):
    ck = tmp_path / "d" / "checkpoint.pt"
    _not_a_checkpoint(ck, kind)
    with pytest.raises(ValueError, match="not a tilewise checkpoint") as e:
        checkpoint.load_checkpoint(ck, device="cpu", backend="torch")
    assert str(ck) in str(e.value)
    rc, err = _predict_cli(ck.parent, capsys)
    assert rc == 2 and str(ck) in err.replace("\n", "") and "Traceback" not in err
    p = argparse.ArgumentParser()
    commands.add_evaluate_arguments(p)
    assert commands.main_evaluate(p.parse_args([str(ck), "--device", "cpu", "--backend", "torch"])) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_checkpoints_hold_plain_data_only(tmp_path):
    """What train saves, with every option that adds state, loads with weights_only."""
    loop.train(tiny_config(tmp_path, epochs=2, ema=0.9, word_dropout=0.1, lr_schedule="cosine",
                           freeze_embeddings_epochs=1, buckets=(8, 16), plot=False))
    ck = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ck["epoch"] == 2 and ck["ema"] is not None and ck["config"]["buckets"] == [8, 16]  # JSON: a list
    checkpoint.load_checkpoint(tmp_path / "run", device="cpu", backend="torch")


# --------------------------------------------------------------------------- 3: atomic writes


def test_interrupted_save_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """An interrupt in the middle of epoch 2's checkpoint write leaves epoch 1's intact, and no
    temporary file behind."""
    real_save = torch.save
    calls = []

    def torn_save(obj, f, *a, **k):
        calls.append(1)
        if len(calls) == 1:
            return real_save(obj, f, *a, **k)
        buf = io.BytesIO()
        real_save(obj, buf)
        half = buf.getvalue()[: len(buf.getvalue()) // 2]
        if isinstance(f, (str, os.PathLike)):
            Path(f).write_bytes(half)
        else:
            f.write(half)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        loop.train(tiny_config(tmp_path, epochs=3, plot=False))
    monkeypatch.setattr(torch, "save", real_save)
    out = tmp_path / "run"
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))
    m = loop.train(tiny_config(tmp_path, epochs=2, resume=True, plot=True))
    assert len(m["epochs"]) == 2
    assert json.loads((out / "metrics.json").read_text())["epochs"][-1]["epoch"] == 2
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert not list(out.glob(".*.tmp"))


_HIDDEN = 4096  # a checkpoint of ~2.6 MB: its write is a good part of each 1-step epoch


def _start_training(data: Path, out: Path, env: dict) -> subprocess.Popen:
    """A training process that saves a checkpoint after every step (1-step epochs) until killed. Its stderr
    goes to ``<out>.stderr`` (beside the output directory), for the stacks of one that does not stop."""
    cmd = [sys.executable, "-m", "tilewise", "train", "--data-dir", str(data), "--epochs", "100000",
           "--max-steps", "1", "--batch-size", "16", "--lr", "1e-2", "--hidden", str(_HIDDEN), "--dropout", "0.1",
           "--embedding-init", "random", "--backend", "torch", "--device", "cpu", "--seed", "0",
           "--output-dir", str(out), "--no-progress", "--no-plot"]
    with open(f"{out}.stderr", "wb") as err:
        # SIGINT at its default in the child: pytest started in the background by a non-interactive shell (a CI
        # runner, `.ci/run &`) has SIGINT ignored, which exec keeps, and the run would never see its Ctrl-C
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


STUCK_S = 30.0  # seconds a signalled run may take to stop


def _stop_stuck(proc: subprocess.Popen, out: Path, what: str) -> None:
    """A run that outlived its signal: SIGTERM first (train's faulthandler dumps every thread's stack to
    stderr), then SIGKILL; fail with where it was."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    tail = Path(f"{out}.stderr").read_text(errors="replace")[-3000:]
    pytest.fail(f"{what}: still running {STUCK_S:.0f} s after its signal; its stderr ends:\n{tail}")


def _check_after_kill(tmp_path: Path, out: Path, what: str) -> bool:
    """The checkpoint is absent or loads, and --resume continues from it; True if it was there."""
    names = {p.name for p in out.iterdir()} if out.is_dir() else set()
    assert names <= {"checkpoint.pt", checkpoint.LOCK_NAME} | {n for n in names if n.endswith(".tmp")}, (what, names)
    ck = out / "checkpoint.pt"
    if not ck.exists():
        return False
    checkpoint.load_checkpoint(ck, device="cpu", backend="torch")  # raises if torn
    epoch = torch.load(ck, weights_only=True)["epoch"]
    m = loop.train(tiny_config(tmp_path, epochs=epoch + 1, max_steps=1, hidden=_HIDDEN, output_dir=str(out),
                               resume=True, plot=False))
    assert len(m["epochs"]) == epoch + 1, what
    assert torch.load(ck, weights_only=True)["epoch"] == epoch + 1, what
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")], what  # the resumed run removed leftovers
    return True


def test_kills_during_training_leave_a_loadable_checkpoint(tmp_path):
    """24 trainings (two at a time) killed with SIGKILL, SIGTERM or SIGINT at random moments: each
    output directory has no checkpoint (killed before the first) or one that loads and resumes."""
    seed = int(os.environ.get("TILEWISE_KILL_SEED", time.time_ns() % 100000))
    rng = random.Random(seed)
    data = write_tiny_sst2(tmp_path / "sst2")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    sigs = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT] * 8
    rng.shuffle(sigs)
    present = 0
    for i in range(0, len(sigs), 2):
        trials = []
        for j, sig in enumerate(sigs[i:i + 2]):
            out = tmp_path / f"run{i + j}"
            early = rng.random() < 0.2  # sometimes any time from the start, before a first save too
            trials.append((out, sig, early, _start_training(data, out, env), time.monotonic()))
        for out, sig, early, proc, t0 in trials:
            if early:
                time.sleep(max(0.0, t0 + rng.uniform(0.0, 2.5) - time.monotonic()))
            else:
                while not (out / "checkpoint.pt").exists() and proc.poll() is None and time.monotonic() - t0 < 30:
                    time.sleep(0.005)
                time.sleep(rng.uniform(0.0, 0.25))
            assert proc.poll() is None, f"training ended by itself (rc {proc.returncode}); seed {seed}"
            proc.send_signal(sig)
        for out, sig, early, proc, t0 in trials:
            what = f"{out.name} {signal.Signals(sig).name} (early={early}), seed {seed}"
            try:
                proc.wait(timeout=STUCK_S)
            except subprocess.TimeoutExpired:
                _stop_stuck(proc, out, what)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            present += _check_after_kill(tmp_path, out, what)
    assert present >= len(sigs) // 2, f"only {present} of {len(sigs)} runs got to a checkpoint; seed {seed}"


# --------------------------------------------------------------------------- 4: the output directory


def _cli_args(tmp_path, out: Path, *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    commands.add_arguments(p)
    return p.parse_args(["--data-dir", str(write_tiny_sst2(tmp_path / "sst2")), "--epochs", "1", "--batch-size", "16",
                         "--hidden", "16", "--embedding-init", "random", "--backend", "torch", "--device", "cpu",
                         "--no-progress", "--no-plot", "--output-dir", str(out), *extra])


def _count_steps(monkeypatch) -> list:
    steps = []
    real = loop.eager_step

    def spy(*a, **k):
        steps.append(1)
        return real(*a, **k)

    monkeypatch.setattr(loop, "eager_step", spy)
    return steps


def test_a_second_run_into_a_held_directory_fails_at_once(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    out.mkdir()
    steps = _count_steps(monkeypatch)
    with open(out / "train.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        t0 = time.monotonic()
        with pytest.raises(checkpoint.OutputDirError, match="in use by another training run") as e:
            loop.train(tiny_config(tmp_path, epochs=1, plot=False))
        assert str(out) in str(e.value) and time.monotonic() - t0 < 5
        assert commands.main(_cli_args(tmp_path, out)) == 2
        err = capsys.readouterr().err
        assert str(out) in err.replace("\n", "") and "in use" in err and "Traceback" not in err
    assert not steps and not (out / "checkpoint.pt").exists()
    # Released: a run goes through, and it holds the lock for the whole run (here: during evaluation).
    seen = []
    real_eval = loop.evaluate

    def try_lock(*a, **k):
        with open(out / "train.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("free")
            except BlockingIOError:
                seen.append("held")
        return real_eval(*a, **k)

    monkeypatch.setattr(loop, "evaluate", try_lock)
    loop.train(tiny_config(tmp_path, epochs=2, plot=False))
    assert seen == ["held", "held"] and steps
    with open(out / "train.lock", "a") as f:  # and released after it
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.parametrize("how", ["chmod", "simulated"])
def test_unwritable_output_dir_fails_before_training(tmp_path, monkeypatch, capsys, how):
    out = tmp_path / "run"
    out.mkdir()
    if how == "chmod":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories (the simulated case covers it)")
        out.chmod(0o555)
    else:  # every file created in out fails, as in a read-only directory (also for root)
        real_open = os.open

        def ro_open(path, flags, *a, **k):
            if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR) and Path(path).parent == out:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_open(path, flags, *a, **k)

        monkeypatch.setattr(os, "open", ro_open)
    steps = _count_steps(monkeypatch)
    try:
        with pytest.raises(checkpoint.OutputDirError, match="not writable") as e:
            loop.train(tiny_config(tmp_path, epochs=1, plot=False))
        assert str(out) in str(e.value)
        assert commands.main(_cli_args(tmp_path, out)) == 2
        err = capsys.readouterr().err
        assert str(out) in err.replace("\n", "") and "not writable" in err and "Traceback" not in err
        assert not steps
    finally:
        out.chmod(0o755)


# --------------------------------------------------------------------------- 5: --resume with new hyper-parameters


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_resume_applies_new_lr_and_weight_decay(tmp_path, monkeypatch, schedule):
    """A resumed run trains with the lr, embedding lr and weight decay it is given (the checkpoint's
    optimizer state carries the old ones), and metrics.json records what ran."""
    ran = []
    real = loop.eager_step

    def spy(model, opt, *a, **k):
        ran.append([(float(g["lr"]), g["weight_decay"]) for g in opt.param_groups])
        return real(model, opt, *a, **k)

    monkeypatch.setattr(loop, "eager_step", spy)
    kw = dict(lr_schedule=schedule, plot=False, max_steps=4)
    loop.train(tiny_config(tmp_path, epochs=1, lr=1e-2, weight_decay=0.01, **kw))
    assert len(ran) == 4 and all([wd for _, wd in r] == [0.01, 0.01] for r in ran)
    ran.clear()
    m = loop.train(tiny_config(tmp_path, epochs=2, lr=1e-3, embedding_lr=5e-3, weight_decay=0.1, resume=True, **kw))
    assert len(ran) == 4 and all([wd for _, wd in r] == [0.1, 0.1] for r in ran)
    if schedule == "constant":
        assert all(r == [(5e-3, 0.1), (1e-3, 0.1)] for r in ran)
        assert m["epochs"][1]["lr_end"] == [5e-3, 1e-3]
    else:  # the new lrs, decayed over the 8 steps of the 2 epochs
        cfg = tiny_config(tmp_path, epochs=2, lr=1e-3, embedding_lr=5e-3, **kw)
        for s, r in enumerate(ran):
            assert [lr for lr, _ in r] == pytest.approx(list(loop.group_lrs(cfg, 1, 4 + s, 8)))
    assert m["epochs"][1]["weight_decay"] == [0.1, 0.1]
    assert any("lr 0.01 -> 0.001" in n and "weight_decay 0.01 -> 0.1" in n for n in m["notes"])
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["config"]["lr"] == 1e-3 and saved["config"]["weight_decay"] == 0.1
    assert saved["epochs"][1]["weight_decay"] == [0.1, 0.1] and saved["epochs"][1]["lr_end"] == m["epochs"][1]["lr_end"]
    groups = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.1]



def test_a_swallowed_ctrl_c_is_raised_again_at_the_next_step():
    """``_startup.latched_interrupts``: a SIGINT whose KeyboardInterrupt something swallowed (CPython's weakref
    callbacks, torch's C++ import of numpy) is raised again by ``raise_if_interrupted`` (train's every step);
    outside the block, or without one, nothing is pending, and Python's own handler is back."""
    from tilewise import _startup

    # The block's precondition, made here: Python's own handler, SIGINT not blocked. A suite started in the
    # background by a non-interactive shell (`cmd &`) ignores SIGINT, and the latch then leaves it alone:
    # one CI simulation run that way saw no KeyboardInterrupt here. The state found is in the message.
    before = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _startup.raise_if_interrupted()  # nothing pending
    with pytest.raises(KeyboardInterrupt):
        with _startup.latched_interrupts():
            _startup.raise_if_interrupted()
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass  # swallowed, as start-up code did
            _startup.raise_if_interrupted()
        pytest.fail(f"no KeyboardInterrupt; SIGINT's handler and blocked set before the test: {before!r}")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with _startup.latched_interrupts():  # a new block starts with nothing pending
        _startup.raise_if_interrupted()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a caller's choice is left alone
    try:
        with _startup.latched_interrupts():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
