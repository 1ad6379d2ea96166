"""`tilewise warmup`: the task table and the runner on the CPU (listing, selection, a failing task,
no GPU); on the GPU, that warmed caches leave a new process nothing to compile."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tilewise
from tilewise import _jobs, cli, settings, warmup

OPS = Path(tilewise.__file__).resolve().parent / "ops"


def _run(*args, env=None):
    env = env or {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "tilewise", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_list_needs_no_gpu():
    p = _run("warmup", "--list")
    assert p.returncode == 0, p.stderr
    words = p.stdout.split()
    for name in [*warmup.families(), *warmup.workloads()]:
        assert name in words
    assert "train" in words and "gemm" in words


def test_the_table_names_only_families_that_exist():
    fams = warmup.families()
    assert fams and set(fams) <= {p.name for p in OPS.iterdir() if (p / "__init__.py").is_file()}
    assert set(warmup.workloads()) == {"train"}
    assert len(warmup.TASKS) == len(warmup.FAMILY_TASKS) + len(warmup.WORKLOAD_TASKS)  # names are unique
    for t in warmup.FAMILY_TASKS + warmup.WORKLOAD_TASKS:
        assert t.name == t.family or t.name.startswith(t.family + "."), t
        assert callable(t.fn) and t.what
    # what autotunes runs alone
    # (the classifier's pieces share the machine: each holds one piece's small GEMMs; the whole step after them)
    assert all(t.alone for t in warmup.families()["gemm"])
    assert [t.name for t in warmup.WORKLOAD_TASKS if t.alone] == ["train"]
    assert {t.name for t in warmup.WORKLOAD_TASKS if not t.alone} == {
        "train.embedding", *(f"train.fc1.{T}" for T in (16, 32, 64)), "train.pool", "train.out", "train.loss"}
    assert not any(t.alone for t in warmup.families()["transpose"])


def test_select():
    assert warmup.select(None, None) == list(warmup.FAMILY_TASKS + warmup.WORKLOAD_TASKS)
    names = [t.name for t in warmup.select(["transpose", "attention"], ["train"])]
    assert names[0] == "transpose" and names[-1] == "train"
    assert {n for n in names if n.startswith("attention")} == {t.name for t in warmup.families()["attention"]}
    with pytest.raises(ValueError, match="unknown --ops family 'nope'; choose from .*transpose"):
        warmup.select(["nope"], None)
    with pytest.raises(ValueError, match="unknown --workload 'infer'"):
        warmup.select(None, ["infer"])


def test_unknown_family_and_bad_jobs_exit_2():
    p = _run("warmup", "--ops", "nope")
    assert p.returncode == 2 and "unknown --ops family 'nope'" in p.stderr
    p = _run("warmup", "--jobs", "0")
    assert p.returncode == 2 and "--jobs must be >= 1" in p.stderr


def test_no_gpu_exits_2_and_says_why(tmp_path):
    env = {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": "", "TILEWISE_CACHE_DIR": str(tmp_path / "c")}
    p = _run("warmup", "--ops", "transpose", env=env)
    assert p.returncode == 2
    assert "No GPU" in p.stderr and "needs a CUDA GPU" in p.stderr
    assert not (tmp_path / "c").exists()  # nothing compiled, nothing written


def _fake_children(monkeypatch, tmp_path, failing: str):
    """Children that pass at once, except ``failing``'s, which writes to stderr and exits 3; a GPU
    said to be there; caches in ``tmp_path``; a wide console."""
    monkeypatch.setattr(cli, "_no_gpu_reason", lambda: None)
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "tw"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("COLUMNS", "200")
    def command(name):
        if name == failing:
            return [sys.executable, "-c", "import sys; sys.stderr.write('kernel [x] exploded\\n'); sys.exit(3)"]
        return [sys.executable, "-c", "pass"]

    monkeypatch.setattr(_jobs, "child_command", command)


def test_a_failing_task_exits_1_naming_it(monkeypatch, capsys, tmp_path):
    _fake_children(monkeypatch, tmp_path, failing="transpose")
    code = cli.main(["warmup", "--ops", "transpose", "norm", "gemm", "--jobs", "2"])
    out = capsys.readouterr().out
    assert code == 1
    assert "task transpose failed: exit status 3" in out and "kernel [x] exploded" in out
    assert "1 of 3 warmup task(s) failed: transpose" in out
    for name in ("norm", "gemm"):
        assert name in out  # the per-task table


def test_all_passing_exits_0(monkeypatch, capsys, tmp_path):
    _fake_children(monkeypatch, tmp_path, failing="")
    assert cli.main(["warmup", "--ops", "rope", "--workload", "train", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert f"tilewise kernel cache {tmp_path / 'tw'}" in out and f"Triton cache {tmp_path / 'triton'}" in out
    assert "failed" not in out


def test_run_jobs_runs_the_alone_ones_last_and_keeps_the_order():
    ok = (sys.executable, "-c", "pass")
    jobs = [warmup.Job("tune", ok, alone=True), warmup.Job("a", ok), warmup.Job("b", ok)]
    started: list[str] = []
    res = warmup.run_jobs(jobs, 2, on_start=started.append, env=settings.child_environment())
    assert [r.name for r in res] == ["tune", "a", "b"] and all(r.ok for r in res)
    assert started[-1] == "tune" and sorted(started[:2]) == ["a", "b"]
    with pytest.raises(ValueError, match="--jobs must be >= 1"):
        warmup.run_jobs(jobs, 0)


def test_a_task_over_its_time_is_a_failure():
    job = warmup.Job("slow", (sys.executable, "-c", "import time; time.sleep(30)"))
    r = warmup.run_job(job, settings.child_environment(), timeout_s=1)
    assert not r.ok and "timed out after 1 s" in r.error


def test_child_rejects_unknown_task():
    p = subprocess.run([sys.executable, "-m", "tilewise.warmup", "--task", "nope"], capture_output=True, text=True,
                       env=settings.child_environment(), timeout=120)
    assert p.returncode == 2 and "invalid choice" in p.stderr


# --------------------------------------------------------------------------- on the GPU


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


@pytest.mark.gpu
def test_warmup_fills_empty_caches_and_a_new_process_compiles_nothing(tmp_path):
    tw, tr = tmp_path / "tilewise", tmp_path / "triton"
    env = settings.child_environment(cache_dir=tw, triton_cache_dir=tr, COLUMNS="200")
    p = subprocess.run([sys.executable, "-m", "tilewise", "warmup", "--ops", "transpose", "rowwise", "--jobs", "2"],
                       capture_output=True, text=True, env=env, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    before = (_files(tw), _files(tr))
    assert before[0] and before[1], "warmup left a cache empty"
    p = subprocess.run([sys.executable, "-m", "tilewise.warmup", "--task", "transpose", "--task", "rowwise"],
                       capture_output=True, text=True, env=env, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (_files(tw), _files(tr)) == before, "the second process compiled something new"


@pytest.mark.gpu
@pytest.mark.slow
def test_warmup_train_workload(tmp_path):
    tw, tr = tmp_path / "tilewise", tmp_path / "triton"
    env = settings.child_environment(cache_dir=tw, triton_cache_dir=tr, COLUMNS="200")
    p = subprocess.run([sys.executable, "-m", "tilewise", "warmup", "--workload", "train"],
                       capture_output=True, text=True, env=env, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "train" in p.stdout and _files(tw) and _files(tr)


def test_the_classifier_pieces_name_their_parts():
    assert [t.name for t in warmup.CLASSIFIER_TASKS] == [
        "train.embedding", "train.fc1.16", "train.fc1.32", "train.fc1.64", "train.pool", "train.out",
        "train.loss"]
    assert list(warmup.CLASSIFIER_TASKS) == [t for t in warmup.WORKLOAD_TASKS if t.name.startswith("train.")]
    with pytest.raises(ValueError, match="part must be one of"):
        warmup._classifier_part("fc3")
    with pytest.raises(ValueError, match="bucket must be one of"):
        warmup._classifier_part("fc1", 48)


@pytest.mark.gpu
def test_gpu_pieces_leave_nothing_for_the_whole_step(tmp_path):
    # The pieces compile (and tune) what the graphed training step and evaluation need: the whole
    # workload run after them in a fresh process adds no Triton kernel and no NVRTC module.
    env = settings.child_environment(tmp_path / "tw", tmp_path / "triton")
    pieces = [t.name for t in warmup.CLASSIFIER_TASKS]
    procs = [subprocess.Popen([sys.executable, "-m", "tilewise.warmup", "--task", n], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in pieces]
    for n, p in zip(pieces, procs):
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"{n}: {err[-3000:]}"

    def files():
        return {str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file()}

    before = files()
    p = subprocess.run([sys.executable, "-m", "tilewise.warmup", "--task", "train"], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    new = sorted(files() - before)
    assert not new, f"the whole step compiled what the pieces missed: {new[:12]}"


def test_triton_key_is_prefetched_in_a_thread():
    """_startup.prefetch_triton_key: a daemon thread leaves Triton's installation hash cached for the
    process's first kernel (warmup's children and `tilewise train` start it before their imports /
    set-up)."""
    from triton.runtime.cache import triton_key

    from tilewise import _startup

    triton_key.cache_clear()
    t = _startup.prefetch_triton_key()
    assert t.daemon
    t.join(timeout=120)
    assert not t.is_alive() and triton_key.cache_info().currsize == 1
