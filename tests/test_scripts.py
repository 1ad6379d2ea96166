"""scripts/attention-grid on the CPU: nvidia-smi and python3 replaced by stubs on PATH (two GPUs; a
bench that writes one CSV row naming its shape and GPU), so what is checked is the script's own
work: every shape run once, dealt round robin to the GPUs, the CSVs merged under one header, the
tables in shape order, and three files under $OUT."""

import csv
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NVIDIA_SMI = """#!/bin/bash
echo "GPU 0: stub"
echo "GPU 1: stub"
"""

PYTHON3 = """#!/bin/bash
out=""
while [ $# -gt 0 ]; do [ "$1" = "--out" ] && out=$2; shift; done
printf 'op,variant,shape\\nattention_fwd,stub,%s@%s\\n' "$TILEWISE_BENCH_ATTENTION_SHAPES" "$CUDA_VISIBLE_DEVICES" \\
  > "$out/NVIDIA_H200.csv"
echo "table $TILEWISE_BENCH_ATTENTION_SHAPES"
"""


def _run_grid(tmp_path, **env_vars):
    """Run the script with the stubs first on PATH and $OUT under tmp_path; (process, $OUT)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in (("nvidia-smi", NVIDIA_SMI), ("python3", PYTHON3)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", OUT=str(out), TILEWISE_GIT_SHA="abc123", **env_vars)
    p = subprocess.run([str(ROOT / "scripts" / "attention-grid")], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p, out


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_attention_grid_refuses_to_run_without_the_commit_its_rows_name(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TILEWISE_GIT_SHA"}
    p = subprocess.run([str(ROOT / "scripts" / "attention-grid")], env=dict(env, OUT=str(tmp_path)),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "TILEWISE_GIT_SHA" in p.stderr and not os.listdir(tmp_path)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_attention_grid_deals_shapes_to_gpus_and_merges(tmp_path):
    shapes = ["4096x64", "4096x128", "1024x64"]
    p, out = _run_grid(tmp_path, GRID_SHAPES=" ".join(shapes))
    assert sorted(os.listdir(out)) == ["grid.csv", "grid.log", "grid.tgz"]
    rows = list(csv.DictReader(open(out / "grid.csv")))
    assert [r["shape"] for r in rows] == ["4096x64@0", "4096x128@1", "1024x64@0"]  # shape order, GPUs round robin
    log = (out / "grid.log").read_text()
    assert [line for line in log.splitlines() if line.startswith("===")] == [f"=== {s}" for s in shapes]
    with tarfile.open(out / "grid.tgz") as t:
        names = t.getnames()
    assert all(f"./{s}/NVIDIA_H200.csv" in names for s in shapes)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_attention_grid_stops_starting_shapes_after_the_limit(tmp_path):
    p, out = _run_grid(tmp_path, GRID_SHAPES="4096x64 1024x64", GRID_LIMIT_S="-1")
    assert "not started" in p.stdout
    assert list(csv.DictReader(open(out / "grid.csv"))) == []


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_attention_grid_on_the_gpus_named(tmp_path):
    p, out = _run_grid(tmp_path, GRID_SHAPES="4096x64 4096x128 1024x64", GRID_GPUS="1")
    assert [r["shape"] for r in csv.DictReader(open(out / "grid.csv"))] == ["4096x64@1", "4096x128@1", "1024x64@1"]


def test_attention_targets_reads_the_default_row_against_same_run_baselines(tmp_path):
    """scripts/attention-targets: ratios = baseline / flash_attention from the same run, the newest
    run by default, the best SDPA backend for bias rows, a later run of a shape replacing an earlier."""
    head = ("op,variant,shape,dtype,median_ms,gbps,tflops,roofline_pct,baseline,baseline_ms,speedup,"
            "device,git_sha,date\n")
    rows = [("attention_fwd", "sdpa_flash", "B=4,H=16,S=4096,D=128", 3.0, "aaa", "2026-01-01"),
            ("attention_fwd", "flash_attention", "B=4,H=16,S=4096,D=128", 1.5, "aaa", "2026-01-01"),
            ("attention_fwd", "sdpa_flash", "B=4,H=16,S=4096,D=128", 2.0, "bbb", "2026-01-02"),
            ("attention_fwd", "sdpa_cudnn", "B=4,H=16,S=4096,D=128", 1.0, "bbb", "2026-01-02"),
            ("attention_fwd", "flash_attention", "B=4,H=16,S=4096,D=128", 1.25, "bbb", "2026-01-02"),
            ("attention_bias_fwd", "sdpa_cudnn", "B=4,H=16,S=4096,D=128,bias", 2.6, "bbb", "2026-01-02"),
            ("attention_bias_fwd", "sdpa_efficient", "B=4,H=16,S=4096,D=128,bias", 5.0, "bbb", "2026-01-02"),
            ("attention_bias_fwd", "flash_attention", "B=4,H=16,S=4096,D=128,bias", 2.0, "bbb", "2026-01-02")]
    path = tmp_path / "r.csv"
    path.write_text(head + "".join(f'{o},{v},"{s}",bfloat16,{ms},0,0,0,,,,H200,{sha},{d}\n'
                                   for o, v, s, ms, sha, d in rows))
    script = str(ROOT / "scripts" / "attention-targets")
    newest = subprocess.run([sys.executable, script, "--csv", str(path)], capture_output=True, text=True, timeout=60)
    assert newest.returncode == 0, newest.stderr
    lines = newest.stdout.splitlines()
    assert lines[0].startswith("runs: bbb")
    fwd = next(line for line in lines if line.startswith("attention_fwd "))
    assert "1.60x" in fwd and "0.80x" in fwd  # flash 2.0 / 1.25, cudnn 1.0 / 1.25
    bias = next(line for line in lines if line.startswith("attention_bias_fwd "))
    assert "1.30x (sdpa_cudnn)" in bias
    old = subprocess.run([sys.executable, script, "--csv", str(path), "--sha", "aaa"], capture_output=True, text=True,
                         timeout=60)
    assert "2.00x" in old.stdout and "attention_bias" not in old.stdout


def _bench_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "variant", "shape", "dtype", "median_ms"])
        w.writerows(rows)
    return str(path)


def test_ab_compare_flags_a_row_only_when_every_round_agrees(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import ab_compare
    finally:
        sys.path.pop(0)
    base = [("softmax", "v2", "4096x4096", "bf16", "1.0"), ("gemm", "api", "1024", "bf16", "2.0"),
            ("copy", "torch", "n=1", "fp32", "1.0")]
    new1 = [("softmax", "v2", "4096x4096", "bf16", "1.10"), ("gemm", "api", "1024", "bf16", "2.10"),
            ("copy", "torch", "n=1", "fp32", "1.0")]
    new2 = [("softmax", "v2", "4096x4096", "bf16", "1.08"), ("gemm", "api", "1024", "bf16", "1.98")]
    files = [_bench_csv(tmp_path / f"{n}.csv", r) for n, r in
             (("b1", base), ("n1", new1), ("b2", base), ("n2", new2))]
    lines, bad = ab_compare.compare([(ab_compare.read_rows(files[0]), ab_compare.read_rows(files[1])),
                                     (ab_compare.read_rows(files[2]), ab_compare.read_rows(files[3]))], 0.03)
    text = "\n".join(lines)
    assert "SLOWER   softmax | v2" in text  # 10 % and 8 % slower in both rounds
    assert "same     gemm | api" in text  # 5 % slower once, 1 % faster once: noise
    assert "MISSING  copy | torch" in text and bad == 2
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_compare.py"), *files[:2]],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "2 moved beyond 3%" in p.stdout
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("op,variant\nx,y\n")
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_compare.py"), str(bad_csv), files[0]],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "bad.csv:2: not a bench row" in p.stderr


def test_ab_compare_holds_rows_to_the_noise_of_their_ops_external_rows(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import ab_compare
    finally:
        sys.path.pop(0)
    base = {("gemm", "v3", "s", "bf16"): 1.0, ("gemm", "cublas", "s", "bf16"): 1.0, ("copy", "v2", "n", "fp32"): 1.0,
            ("copy", "torch.copy_", "n", "fp32"): 1.0, ("gemm", "v1", "s", "bf16"): 1.0}
    new = {("gemm", "v3", "s", "bf16"): 1.05, ("gemm", "cublas", "s", "bf16"): 1.06, ("copy", "v2", "n", "fp32"): 1.05,
           ("copy", "torch.copy_", "n", "fp32"): 1.01, ("gemm", "v1", "s", "bf16"): 1.08}
    lines, bad = ab_compare.compare([(base, new)], 0.03)
    text = "\n".join(lines)
    assert "noise    gemm | v3" in text and "external rows moved up to 6.0%" in text  # cuBLAS moved 6 %
    assert "SLOWER   gemm | v1" in text  # 8 %: past the noise too
    assert "SLOWER   copy | v2" in text  # torch.copy_ moved 1 %: 5 % stands out
    assert "SLOWER   gemm | cublas" in text  # external rows are reported as they are
    assert bad == 3


def test_sass_compare_sees_a_changed_kernel_and_not_a_moved_one(tmp_path):
    """scripts/sass_compare.py: the same tree twice is "same" for every kernel; an edit that changes
    the code of one kernel makes that kernel, and only it, "DIFFERS" (exit status 1)."""
    import shutil

    src = ROOT / "src"
    other = tmp_path / "src"
    shutil.copytree(src, other, ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [sys.executable, str(ROOT / "scripts" / "sass_compare.py"), str(src), str(other), "transpose/transpose.cu"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("same") >= 9 and "DIFFERS" not in p.stdout
    cu = other / "tilewise" / "ops" / "transpose" / "transpose.cu"
    text = cu.read_text()
    assert text.count("dst[n * M + m] = src[m * N + n];") == 1  # v1_naive's store
    cu.write_text(text.replace("dst[n * M + m] = src[m * N + n];", "dst[n * M + m] = src[m * N + n] + src[m * N + n];"))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1
    differs = [line for line in p.stdout.splitlines() if line.startswith("DIFFERS")]
    assert differs and all("transpose_v1_naive" in line for line in differs), p.stdout


def test_device_step_keeps_each_steps_log_and_packs_them(tmp_path):
    """scripts/device-step: the command's exit status (124 past its limit), its log, and $OUT/NAME.tgz
    holding every step so far."""
    import tarfile

    name = f"ds{os.getpid()}"
    env = {**os.environ, "OUT": str(tmp_path)}
    step = [str(ROOT / "scripts" / "device-step"), name]
    assert subprocess.run([*step, "5", "one", "echo", "hi"], env=env, capture_output=True).returncode == 0
    assert subprocess.run([*step, "1", "two", "sleep", "5"], env=env, capture_output=True).returncode == 124
    with tarfile.open(tmp_path / f"{name}.tgz") as t:
        names = set(t.getnames())
        assert {f"{name}/one.log", f"{name}/two.log", f"{name}/steps.txt"} <= names
        assert t.extractfile(f"{name}/one.log").read() == b"hi\n"
    subprocess.run(["rm", "-rf", f"/tmp/{name}"])


def test_bench_run_needs_the_commit_and_a_suite(tmp_path):
    """scripts/bench-run: refuses to run without TILEWISE_GIT_SHA or without a suite; with both it runs
    ``tilewise bench`` from src/ (here ``--list``), whatever PYTHONPATH held."""
    # A copy of the layout it uses, without this checkout's .whl/ (wheels built for the device's Python).
    (tmp_path / "scripts").mkdir()
    for name in ("bench-run", "_wheels.sh"):
        shutil.copy2(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    (tmp_path / "src").symlink_to(ROOT / "src")
    script = str(tmp_path / "scripts" / "bench-run")
    env = {k: v for k, v in os.environ.items() if k != "TILEWISE_GIT_SHA"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # python3: this interpreter
    p = subprocess.run([script, str(tmp_path), "vector_add"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "TILEWISE_GIT_SHA" in p.stderr
    env["TILEWISE_GIT_SHA"] = "abc1234"
    assert subprocess.run([script, str(tmp_path)], env=env, capture_output=True, timeout=60).returncode == 2
    p = subprocess.run([script, str(tmp_path), "--list"], env={**env, "PYTHONPATH": ""}, capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0 and "vector_add" in p.stdout, p.stderr[-2000:]
