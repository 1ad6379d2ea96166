"""verified.json and `tilewise verify-status` on a package tree of their own (CPU)."""

import json

from tilewise import verify


def _package(tmp_path):
    pkg = tmp_path / "src" / "tilewise"
    (pkg / "ops" / "include").mkdir(parents=True)
    (pkg / "runtime").mkdir()
    (pkg / "ops" / "k.cu").write_text("__global__ void k() {}\n")
    (pkg / "ops" / "include" / "h.cuh").write_text("// header\n")
    (pkg / "ops" / "k.py").write_text("X = 1\n")
    (pkg / "runtime" / "launch.py").write_text("Y = 2\n")
    (pkg / "cli.py").write_text("not a GPU source\n")
    (tmp_path / "pyproject.toml").write_text("")
    return pkg


def test_record_then_status(tmp_path):
    pkg = _package(tmp_path)
    assert [p.name for p in verify.gpu_sources(pkg)] == ["h.cuh", "k.cu", "k.py", "launch.py"]
    record = tmp_path / "bench" / "results" / "verified.json"
    code, msg = verify.status(None, pkg)
    assert code == 2 and "scripts/gpu-check" in msg
    quick = dict(passed=10, failed=0, skipped=1, errors=0, seconds=61.5, workers=12)
    rec = verify.write_record(record, commit="abc1234", device="NVIDIA H200", quick=quick,
                              steps={"quick": 61.5}, package=pkg)
    assert rec["ok"] and json.loads(record.read_text())["source_digest"] == verify.digest(verify.source_hashes(pkg))
    code, msg = verify.status(None, pkg)
    assert code == 0 and "abc1234" in msg and "10 passed" in msg
    (pkg / "cli.py").write_text("changed, still not a GPU source\n")
    assert verify.status(None, pkg)[0] == 0
    (pkg / "ops" / "k.cu").write_text("__global__ void k() { /* changed */ }\n")
    (pkg / "ops" / "new.py").write_text("Z = 3\n")
    code, msg = verify.status(None, pkg)
    assert code == 1 and "changed ops/k.cu" in msg and "new     ops/new.py" in msg


def test_failed_run_and_bad_record(tmp_path):
    pkg = _package(tmp_path)
    record = tmp_path / "v.json"
    verify.write_record(record, commit="abc", device="d", quick=dict(passed=3, failed=1), steps={}, package=pkg)
    code, msg = verify.status(record, pkg)
    assert code == 1 and "that run failed" in msg
    record.write_text("{not json")
    assert verify.status(record, pkg)[0] == 2


def test_installed_copy_has_no_record(tmp_path):
    pkg = tmp_path / "site-packages" / "tilewise"
    (pkg / "ops").mkdir(parents=True)
    code, msg = verify.status(None, pkg)
    assert code == 2 and "installed copy" in msg
