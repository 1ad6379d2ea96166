"""Record a device call's results in the repository (run here, after the call; commit yourself):

    python3 scripts/record_run.py FILES_AT NAME --commit SHA [--log STEP=LOGNAME ...] [--no-readme]

FILES_AT: the folder the device tool put the call's $OUT files in; NAME: the ``scripts/device-step`` name
whose archive (``NAME.tgz``: /tmp/NAME on the device) holds the steps. SHA: the commit the call ran (the
device copy has no .git, so gpu-check and bench-run name it from TILEWISE_GIT_SHA).

- A gpu-check tier (``NAME/<step>/verified.json``): when its record is ok, ``verified.json`` and
  ``gpu-coverage.json`` into bench/results/, its durations folded into tests/gpu_durations.json and its pytest
  log kept as bench/results/logs/gpu-check-quick-SHA.log; when not, the log alone, as ...-SHA-failed.log.
- Bench rows (``NAME/**/csv/*.csv`` from ``scripts/bench-run``): appended to bench/results/<the same file name>
  (the header must match), then the README's table redrawn from NVIDIA_H200.csv if that file took rows.
- ``--log STEP=LOGNAME``: the step's log (``NAME/STEP.log``) kept as bench/results/logs/LOGNAME-SHA.log.
- Cache seeds (``FILES_AT/seed/seed-*.tgz``, ``scripts/_seed.sh``): they replace .cache/device-seed/.
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_cache import extract  # noqa: E402 - a sibling script, not a package


def _tiers(run: Path, root: Path, sha: str, said: list):
    for rec_path in sorted(run.glob("*/verified.json")):
        tier = rec_path.parent
        rec = json.loads(rec_path.read_text())
        logs = root / "bench" / "results" / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if rec.get("commit") != sha:
            raise ValueError(f"record_run: {rec_path} names commit {rec.get('commit')!r}, not {sha!r}")
        if not rec.get("ok"):
            shutil.copy(tier / "pytest.log", logs / f"gpu-check-quick-{sha}-failed.log")
            said.append(f"tier {tier.name}: NOT ok ({rec.get('quick_tier')}); its log only, as -failed")
            continue
        missing = [f for f in ("gpu-coverage.json", "pytest.log", "durations.jsonl") if not (tier / f).is_file()]
        if missing:  # nothing copied: a record without its coverage would fail CI's coverage check
            raise ValueError(f"record_run: tier {tier.name} is ok but lacks {', '.join(missing)}")
        shutil.copy(rec_path, root / "bench" / "results" / "verified.json")
        shutil.copy(tier / "gpu-coverage.json", root / "bench" / "results" / "gpu-coverage.json")
        shutil.copy(tier / "pytest.log", logs / f"gpu-check-quick-{sha}.log")
        path = os.pathsep.join([str(root / "src"), str(ROOT / "src")])
        merged = subprocess.run([sys.executable, str(root / "tests" / "gpu_tiers.py"), "merge",
                                 str(tier / "durations.jsonl")], cwd=root, capture_output=True, text=True,
                                env=dict(os.environ, PYTHONPATH=path))
        if merged.returncode:
            raise RuntimeError(f"record_run: merging durations failed:\n{merged.stderr}")
        said.append(f"tier {tier.name}: ok {rec.get('quick_tier', {}).get('passed')} passed on {rec.get('device')}; "
                    f"verified.json, gpu-coverage.json, durations, log")


def _rows(run: Path, root: Path, said: list) -> set:
    """Append the call's bench rows to bench/results/<device>.csv; the names of the files written."""
    written = set()
    for src in sorted(run.glob("**/csv/*.csv")):
        with open(src, newline="") as f:
            rows = list(csv.reader(f))
        if len(rows) < 2:
            continue
        dest = root / "bench" / "results" / src.name
        if dest.exists():
            with open(dest, newline="") as f:
                header = next(csv.reader(f))
            if header != rows[0]:
                raise ValueError(f"record_run: {src}'s header differs from {dest}'s")
            with open(dest, "a", newline="") as f:
                csv.writer(f, lineterminator="\n").writerows(rows[1:])
        else:
            with open(dest, "w", newline="") as f:
                csv.writer(f, lineterminator="\n").writerows(rows)
        said.append(f"{len(rows) - 1} rows from {src.relative_to(run)} into {dest.relative_to(root)}")
        written.add(src.name)
    return written


def record(files_at: Path, name: str, sha: str, logs: list, readme: bool, root: Path = ROOT) -> list:
    said = []
    archive = files_at / f"{name}.tgz"
    with tempfile.TemporaryDirectory() as tmp:
        if archive.exists():
            extract(archive, {name: Path(tmp) / name})
            run = Path(tmp) / name
            _tiers(run, root, sha, said)
            env = dict(os.environ, PYTHONPATH=str(root / "src"))
            written = _rows(run, root, said)
            if "NVIDIA_H200.csv" in written and readme:
                subprocess.run([sys.executable, "-m", "tilewise", "report", "--csv", "bench/results/NVIDIA_H200.csv",
                                "--readme", "README.md"], cwd=root, check=True, env=env)
                said.append("README table redrawn")
            if written and readme:  # rows of any device: the targets read every <device>.csv
                subprocess.run([sys.executable, "-m", "tilewise", "report", "--targets", "--readme", "README.md",
                                "--png", "bench/results/attention-grid.png"], cwd=root, check=True, env=env)
                said.append("targets redrawn (README section, bench/results/attention-grid.png)")
            for spec in logs:
                step, _, logname = spec.partition("=")
                if not logname:
                    raise ValueError(f"record_run: --log takes STEP=LOGNAME, got {spec!r}")
                dest = root / "bench" / "results" / "logs" / f"{logname}-{sha}.log"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(run / f"{step}.log", dest)
                said.append(f"log {step} -> {dest.relative_to(root)}")
        else:
            said.append(f"no {archive.name} in {files_at}")
    seeds = sorted((files_at / "seed").glob("seed-*.tgz"))
    if seeds:
        keep = root / ".cache" / "device-seed"
        keep.mkdir(parents=True, exist_ok=True)
        for old in keep.glob("seed-*.tgz"):
            old.unlink()  # every part is restored: old ones would ride along
        for s in seeds:
            shutil.copy(s, keep / s.name)
        said.append(f"{len(seeds)} seed parts into .cache/device-seed "
                    f"({sum(s.stat().st_size for s in seeds) / 2**20:.1f} MiB)")
    return said


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files_at", type=Path)
    ap.add_argument("name")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--log", action="append", default=[], metavar="STEP=LOGNAME")
    ap.add_argument("--no-readme", action="store_true")
    a = ap.parse_args(argv)
    for line in record(a.files_at, a.name, a.commit, a.log, not a.no_readme):
        print("record_run:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
