"""scripts/record_run.py on the CPU: a device call's archive (a green tier, bench rows, a step's log) and its cache
seeds recorded into a scratch copy of the repository's layout; a red tier keeps only its log; mismatched
headers or commits and archive members outside the step's folder are refused."""

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
HEADER = "op,variant,shape,dtype,median_ms,gbps,tflops,roofline_pct,baseline,baseline_ms,speedup,device,git_sha,date\n"


def _repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "bench" / "results").mkdir(parents=True)
    (root / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "gpu_tiers.py", root / "tests" / "gpu_tiers.py")
    (root / "bench" / "results" / "NVIDIA_H200.csv").write_text(HEADER + "old,row,,,,,,,,,,NVIDIA H200,0000000,d\n")
    return root


def _archive(files_at: Path, name: str, members: dict):
    files_at.mkdir(parents=True, exist_ok=True)
    with tarfile.open(files_at / f"{name}.tgz", "w:gz") as tar:
        top = tarfile.TarInfo(name)  # as `tar czf NAME.tgz -C /tmp NAME` writes it: the folder first
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        for path, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _tier(ok: bool, sha: str = "abc1234") -> dict:
    rec = {"commit": sha, "ok": ok, "device": "NVIDIA H200", "quick_tier": {"passed": 3, "failed": 0 if ok else 1}}
    return {"o1/tier/verified.json": json.dumps(rec), "o1/tier/gpu-coverage.json": '{"builds": {}}',
            "o1/tier/pytest.log": "3 passed",
            "o1/tier/durations.jsonl": '{"id": "tests/t.py::a", "s": 1.5, "outcome": "passed"}\n'}


def test_a_green_call_is_recorded_everywhere(tmp_path):
    rr = load_script("record_run")
    root = _repo(tmp_path)
    files_at = tmp_path / "files"
    rows = HEADER + "llama_train_step,hf_tilewise,x,bfloat16,1.0,0,0,0,,,,NVIDIA H200,abc1234,d\n" * 2
    _archive(files_at, "o1", {**_tier(True), "o1/llama/csv/NVIDIA_H200.csv": rows, "o1/llama.log": "llama log",
                              "o1/steps.txt": "tier rc=0"})
    (files_at / "seed").mkdir()
    (files_at / "seed" / "seed-1.tgz").write_bytes(b"new seed")
    (root / ".cache" / "device-seed").mkdir(parents=True)
    (root / ".cache" / "device-seed" / "seed-2.tgz").write_bytes(b"stale")
    said = rr.record(files_at, "o1", "abc1234", ["llama=bench-llama"], readme=False, root=root)
    res = root / "bench" / "results"
    assert json.loads((res / "verified.json").read_text())["commit"] == "abc1234"
    assert (res / "gpu-coverage.json").read_text() == '{"builds": {}}'
    assert (res / "logs" / "gpu-check-quick-abc1234.log").read_text() == "3 passed"
    assert json.loads((root / "tests" / "gpu_durations.json").read_text())["seconds"] == {"tests/t.py::a": 1.5}
    lines = (res / "NVIDIA_H200.csv").read_text().splitlines()
    assert len(lines) == 4 and lines[0] + "\n" == HEADER and lines[1].startswith("old,row")
    assert (res / "logs" / "bench-llama-abc1234.log").read_text() == "llama log"
    assert sorted(p.name for p in (root / ".cache" / "device-seed").iterdir()) == ["seed-1.tgz"]
    assert any("2 rows" in s for s in said)


def test_a_red_tier_keeps_only_its_log(tmp_path):
    rr = load_script("record_run")
    root = _repo(tmp_path)
    _archive(tmp_path / "files", "o1", _tier(False))
    rr.record(tmp_path / "files", "o1", "abc1234", [], readme=False, root=root)
    res = root / "bench" / "results"
    assert not (res / "verified.json").exists() and not (res / "gpu-coverage.json").exists()
    assert (res / "logs" / "gpu-check-quick-abc1234-failed.log").is_file()
    assert not (root / "tests" / "gpu_durations.json").exists()


@pytest.mark.parametrize("case", ["header", "commit", "outside", "no coverage"])
def test_record_refuses_what_does_not_fit(tmp_path, case):
    rr = load_script("record_run")
    root = _repo(tmp_path)
    partial = {k: v for k, v in _tier(True).items() if not k.endswith("gpu-coverage.json")}
    members = {"header": {"o1/b/csv/NVIDIA_H200.csv": "op,other\nx,y\n"}, "commit": _tier(True, sha="fff0000"),
               "outside": {"o2/evil.txt": "x"}, "no coverage": partial}[case]
    _archive(tmp_path / "files", "o1", members)
    with pytest.raises(ValueError):
        rr.record(tmp_path / "files", "o1", "abc1234", [], readme=False, root=root)
    assert (root / "bench" / "results" / "NVIDIA_H200.csv").read_text().count("\n") == 2
    assert not (root / "bench" / "results" / "verified.json").exists()
