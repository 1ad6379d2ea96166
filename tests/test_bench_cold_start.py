"""The cold_start bench suite: skipped by --quick, the child's JSON and the empty / warm medians on
fake children (CPU); the classifier case on the GPU; train's start-up record in metrics.json."""

import json
import sys

import pytest

from tilewise import settings
from tilewise.bench import harness
from tilewise.bench.suites import cold_start as cs
from tilewise.sst2 import loop

from test_classifier import tiny_config

CLASSIFIER = next(c for c in cs.CASES if c.name == "classifier_step")


def test_quick_skips_the_suite_and_the_cases_are_listed():
    r = harness.Runner(quick=True)
    logged: list[str] = []
    r.log = logged.append
    cs.run(r)
    assert r.rows == [] and "skipped under --quick" in logged[0]
    assert [c.name for c in cs.CASES] == ["classifier_step", "flash_attention_fwd_bwd", "train_100_steps"]
    assert all(c.baseline.startswith("torch") for c in cs.CASES)
    from tilewise.sst2.config import SST2_VOCAB

    assert cs.V == SST2_VOCAB  # written out there (see its comment); the same vocabulary


def test_train_case_only_with_the_sst2_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("TILEWISE_SST2_DIR", raising=False)
    assert "train_100_steps" not in [c.name for c in cs.cases()]
    monkeypatch.setenv("TILEWISE_SST2_DIR", str(tmp_path))
    assert [c.name for c in cs.cases()] == [c.name for c in cs.CASES]


def test_cases_can_be_chosen_by_name(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEWISE_SST2_DIR", str(tmp_path))
    monkeypatch.setenv("TILEWISE_BENCH_COLD_START_CASES", "train_100_steps, classifier_step")
    assert [c.name for c in cs.cases()] == ["classifier_step", "train_100_steps"]
    monkeypatch.setenv("TILEWISE_BENCH_COLD_START_CASES", "train_100_steps,nope")
    with pytest.raises(ValueError, match="TILEWISE_BENCH_COLD_START_CASES.*nope"):
        cs.cases()


def test_parse_child_takes_the_last_result_line():
    out = 'start-up: 1.00 s\n{"not": "ours"}\n{"cold_start": "x", "first_s": 2.5}\n{broken\n'
    assert cs.parse_child(out, "x")["first_s"] == 2.5
    with pytest.raises(cs.ChildError, match="case y: the child printed no result line"):
        cs.parse_child('{"other": 1}\nplain text\n', "case y")


def test_run_child_parses_json_and_raises_with_stderr_tail(monkeypatch, tmp_path):
    seen = {}

    def argv(case, backend, extra=()):
        seen["args"] = (case, backend, list(extra))
        code = ("import json, os; print('noise'); print(json.dumps({'cold_start': 'c', 'first_s': 1.25, "
                "'cache': os.environ['TILEWISE_CACHE_DIR'], 'triton': os.environ['TRITON_CACHE_DIR']}))")
        return [sys.executable, "-c", code]

    monkeypatch.setattr(cs, "child_argv", argv)
    got = cs.run_child("classifier_step", "torch", tmp_path, ["a"])
    assert seen["args"] == ("classifier_step", "torch", ["a"])
    assert got["first_s"] == 1.25 and got["process_s"] > 0
    assert got["cache"] == str(tmp_path / "tilewise") and got["triton"] == str(tmp_path / "triton")

    monkeypatch.setattr(cs, "child_argv", lambda *a, **k: [
        sys.executable, "-c", "import sys; print('x' * 5000, file=sys.stderr); print('boom at the end', "
                              "file=sys.stderr); sys.exit(3)"])
    with pytest.raises(cs.ChildError, match=r"(?s)classifier_step \(tilewise\).*status 3.*boom at the end") as e:
        cs.run_child("classifier_step", "tilewise", tmp_path)
    assert len(str(e.value)) < cs.STDERR_TAIL + 200  # the tail, not the whole stderr


def _fake_children(monkeypatch, seconds: dict):
    """run_child replaced: each (backend) hands out its list of first_s values in turn; the
    caches folder each call got is recorded."""
    calls = []

    def fake(case, backend, caches, extra=(), timeout_s=None):
        calls.append((backend, caches))
        return {"cold_start": case, "first_s": seconds[backend].pop(0)}

    monkeypatch.setattr(cs, "run_child", fake)
    return calls


def test_empty_then_median_of_warm_runs(monkeypatch):
    calls = _fake_children(monkeypatch, {"torch": [4.0, 1.0, 1.2, 1.1], "tilewise_adamw": [20.0, 3.0, 1.0, 2.0]})
    r = harness.Runner()
    cs.measure(r, [CLASSIFIER])
    assert len(calls) == 2 * (1 + cs.WARM_RUNS)
    # each backend: one folder, new for it, shared by its empty run and its warm runs
    assert len({c for b, c in calls if b == "torch"}) == 1 and len({c for _, c in calls}) == 2
    rows = {(x.variant, x.shape.rsplit(", ", 1)[1]): x for x in r.rows}
    assert rows["torch", "empty caches"].median_ms == 4000 and rows["torch", "warm caches"].median_ms == 1100
    ours_empty, ours_warm = rows["tilewise_adamw", "empty caches"], rows["tilewise_adamw", "warm caches"]
    assert ours_empty.median_ms == 20000 and ours_warm.median_ms == 2000  # median of 3, 1, 2
    assert ours_warm.baseline == "torch" and ours_warm.baseline_ms == 1100
    assert ours_warm.speedup == pytest.approx(0.55)
    assert all(x.op == "cold_start" and x.shape.startswith("classifier_step B=64") for x in r.rows)
    assert not rows["torch", "warm caches"].baseline  # the baseline's own row names none


def test_a_failing_child_fails_the_suite_after_the_rest_ran(monkeypatch):
    def fake(case, backend, caches, extra=(), timeout_s=None):
        if backend == "torch":
            raise cs.ChildError("cold_start classifier_step (torch): the child exited with status 1; stderr ends:\n"
                                "no sdpa")
        return {"cold_start": case, "first_s": 5.0}

    monkeypatch.setattr(cs, "run_child", fake)
    r = harness.Runner()
    with pytest.raises(harness.CheckError, match="no sdpa"):
        cs.measure(r, [CLASSIFIER])
    assert [(x.variant, x.baseline) for x in r.rows] == [("tilewise_adamw", "")] * 2  # ours kept, no baseline


def test_train_records_its_start_up(tmp_path):
    m = loop.train(tiny_config(tmp_path, epochs=1, max_steps=3, plot=False))
    st = m["startup"]
    assert set(st) == {"setup_s", "first_step_s"} and st["setup_s"] > 0 and st["first_step_s"] > 0
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["startup"] == st
    m = loop.train(tiny_config(tmp_path, epochs=0, output_dir=str(tmp_path / "none"), plot=False))
    assert m["startup"] is None  # no step, nothing to time


@pytest.mark.gpu
@pytest.mark.slow
def test_classifier_case_warm_is_faster_than_empty(monkeypatch):
    monkeypatch.setattr(cs, "WARM_RUNS", 1)
    r = harness.Runner()
    cs.measure(r, [CLASSIFIER])
    rows = {(x.variant, x.shape.rsplit(", ", 1)[1]): x.median_ms for x in r.rows}
    assert rows["tilewise", "warm caches"] < rows["tilewise", "empty caches"], rows


def test_train_case_times_tilewise_beside_torch(monkeypatch, tmp_path):
    # The train case runs the baseline and the tilewise backend with train's default AdamW (tilewise's),
    # each on its own fresh caches; ours name the torch row of the same shape.
    monkeypatch.setenv(settings.SST2_DIR, str(tmp_path))
    train = next(c for c in cs.CASES if c.name == "train_100_steps")
    assert train.variants == ("tilewise_adamw",)
    assert set(train.variants) | {"torch"} <= set(cs.TRAIN_VARIANTS)
    assert cs.TRAIN_VARIANTS["tilewise_adamw"][-2:] == ("--optimizer", "tilewise")
    assert cs.TRAIN_VARIANTS["torch"][-2:] == ("--optimizer", "torch")
    seen = []

    def fake(case, backend, caches, extra=(), timeout_s=None):
        seen.append(backend)
        return {"cold_start": case, "first_s": 2.0, "process_s": 10.0 if backend == "torch" else 7.0}

    monkeypatch.setattr(cs, "run_child", fake)
    r = harness.Runner()
    cs.measure(r, [train])
    assert sorted(set(seen)) == ["tilewise_adamw", "torch"]
    walls = {x.variant: x for x in r.rows if "wall, empty" in x.shape}
    for ours in train.variants:
        assert walls[ours].median_ms == 7000 and walls[ours].baseline == "torch"
        assert walls[ours].baseline_ms == 10000


def test_classifier_variants_build_the_model_as_train_does():
    """Each classifier_step variant names the model's backend and train's optimizer for it (tilewise_adamw:
    train's default), so its rows keep their meaning."""
    from tilewise.sst2.config import TrainConfig

    assert CLASSIFIER.variants == ("tilewise_adamw",)
    assert cs.CLASSIFIER_VARIANTS["tilewise_adamw"] == ("tilewise", TrainConfig().optimizer)
    assert cs.CLASSIFIER_VARIANTS["torch"] == ("torch", "torch")
    for name, (backend, optimizer) in cs.CLASSIFIER_VARIANTS.items():
        assert cs.TRAIN_VARIANTS[name] == ("--backend", backend, "--optimizer", optimizer)


def test_train_child_ends_as_the_train_command_does(monkeypatch, capsys):
    """The train case's child prints its result, then ends through ``_startup.end_process`` (no interpreter
    teardown), as `tilewise train` does, so the row's wall time is the command's; other cases exit as usual."""
    from tilewise import _startup

    for name in ("TILEWISE_FAST_EXIT", "CUDA_INJECTION64_PATH", "LD_PRELOAD"):  # no profiler here
        monkeypatch.delenv(name, raising=False)
    ended = []
    monkeypatch.setattr(_startup, "end_process", ended.append)
    for case in ("train_100_steps", "classifier_step"):
        monkeypatch.setitem(cs._CHILDREN, case, lambda backend, t0, extra: {"first_s": 1.0})
        assert cs.child_main(0.0, [case, "torch"]) == 0
        assert cs.parse_child(capsys.readouterr().out, case)["first_s"] == 1.0
    assert ended == [0]
