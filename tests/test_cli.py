import os
import subprocess
import sys

import pytest

from tilewise.bench import harness
from tilewise.cost import Cost
from tilewise.runtime.device import save_ceilings

from test_harness import CEIL


def _run(*args, cwd=None, env_extra=None):
    env = {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": "", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "tilewise", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


@pytest.mark.parametrize("cmd", [["info"], ["bench", "--quick"]])
def test_no_gpu_says_so_and_exits_zero(cmd, tmp_path):
    p = _run(*cmd, cwd=tmp_path, env_extra={"TILEWISE_CACHE_DIR": str(tmp_path / "c")})
    assert p.returncode == 0, p.stderr
    assert "No GPU" in p.stdout
    assert not (tmp_path / "bench").exists()  # nothing written


def test_bench_list_and_unknown_op():
    p = _run("bench", "--list")
    assert p.returncode == 0 and "vector_add" in p.stdout.split()
    p = _run("bench", "nosuchop")
    assert p.returncode == 2 and "unknown op" in p.stdout


def test_help_from_console_script_and_module():
    p = _run("--help")
    assert p.returncode == 0 and "bench" in p.stdout and "roofline" in p.stdout


def test_report_and_roofline_from_csv(tmp_path):
    csv_path = tmp_path / "Test_GPU.csv"
    rows = [harness.make_row("vector_add", v, "n=268435456", "float32", ms, Cost(2**28, 12 * 2**28), CEIL,
                             device="Test GPU", sha="abc", date="2026-01-01T00:00:00")
            for v, ms in (("v1_naive", 3.5), ("v2_vectorized", 3.3))]
    harness.append_csv(csv_path, rows)
    save_ceilings(CEIL, tmp_path / "Test_GPU-ceilings.json")
    p = _run("report", "--csv", str(csv_path), "--all")
    assert p.returncode == 0, p.stderr
    assert "| vector_add | v2_vectorized | n=268435456 | float32 |" in p.stdout
    assert "| vector_add | v1_naive |" in p.stdout
    p = _run("roofline", "--csv", str(csv_path), "--out", str(tmp_path / "r.png"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_no_arguments_prints_help():
    p = _run()
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: tilewise") and "verify-status" in p.stdout and not p.stderr


def test_report_finds_the_checkouts_results_from_elsewhere(tmp_path, monkeypatch, capsys):
    """Outside the repository root: the checkout's bench/results; with no checkout either, the error
    names every directory it looked in."""
    from tilewise import cli, verify

    monkeypatch.chdir(tmp_path)
    root = verify.repo_root()
    if root is not None and any((root / "bench" / "results").glob("*.csv")):
        assert cli.main(["report"]) == 0
        assert "| op | variant |" in capsys.readouterr().out
    monkeypatch.setattr(verify, "repo_root", lambda *a, **k: None)
    with pytest.raises(SystemExit, match=str(tmp_path / "bench" / "results")):
        cli.main(["report"])


def test_check_table_keeps_every_number_at_80_columns():
    from rich.console import Console

    from tilewise import cli

    t = cli._check_table("kernels compiled for sm_90 (NVRTC 13.0)")
    rows = [("gemm_sm90<__nv_bfloat16,128,192,2,1,5,1>_with_a_long_instantiation_name", "168", "213248", "0", "0/0"),
            ("transpose_v4_vec<__half,false,128,64,512,2,8,false,true>", "64", "33280", "16", "8/8")]
    for r in rows:
        t.add_row(*r)
    con = Console(width=80, record=True, highlight=False)
    con.print(t)
    text = con.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for r in rows:
        for cell in r[1:]:
            assert any(cell in line.split() or f"{cell} " in line or line.rstrip().endswith(cell)
                       for line in text.splitlines()), (cell, text)
    assert "regs" in text and "spill st/ld B" in text


def test_train_command_skips_teardown_with_its_outputs_complete(tmp_path):
    """`tilewise train` (``cli.run``) ends with os._exit once its outputs are written: an atexit hook
    registered before it never runs, while the printed summary, metrics.json, loss_curve.png and the
    checkpoint are all there and whole; another command exits through the interpreter as usual."""
    from test_classifier import write_tiny_sst2

    data = tmp_path / "data"
    data.mkdir()
    write_tiny_sst2(data)
    canary, out = tmp_path / "atexit-ran", tmp_path / "run"
    code = (f"import atexit, sys; atexit.register(lambda: open({str(canary)!r}, 'w').close()); "
            f"from tilewise.cli import run; sys.exit(run())")
    tools = ("TILEWISE_FAST_EXIT", "CUDA_INJECTION64_PATH", "LD_PRELOAD")  # none in the child: it may exit fast
    env = {k: v for k, v in os.environ.items() if k not in tools}
    env.update(CUDA_VISIBLE_DEVICES="", TILEWISE_CACHE_DIR=str(tmp_path / "c"), COLUMNS="200")
    argv = ["train", "--data-dir", str(data), "--epochs", "1", "--device", "cpu", "--embedding-init", "random",
            "--output-dir", str(out)]
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "metrics:" in p.stdout and "best dev accuracy" in p.stdout  # flushed before the exit
    assert not canary.exists(), "the interpreter's teardown ran"
    import json

    from tilewise.sst2 import checkpoint

    assert json.loads((out / "metrics.json").read_text())["epochs"][0]["epoch"] == 1
    png = (out / "loss_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and png.endswith(b"IEND\xaeB`\x82")
    assert checkpoint.read_checkpoint(out / "checkpoint.pt")["epoch"] == 1
    p = subprocess.run([sys.executable, "-c", code, "report", "--csv", str(tmp_path / "none.csv")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert canary.exists(), "a command other than train skipped the teardown"
    canary.unlink()
    p = subprocess.run([sys.executable, "-c", code, *argv[:-1], str(tmp_path / "run2")], capture_output=True,
                       text=True, env={**env, "TILEWISE_FAST_EXIT": "0"}, timeout=300)
    assert p.returncode == 0 and canary.exists(), "TILEWISE_FAST_EXIT=0 kept the teardown out"


@pytest.mark.parametrize("env, fast", [({}, True), ({"TILEWISE_FAST_EXIT": "0"}, False),
                                       ({"CUDA_INJECTION64_PATH": "/opt/nsys/libinj.so"}, False),
                                       ({"LD_PRELOAD": "libjemalloc.so"}, False)])
def test_fast_exit_only_without_a_tool_in_the_process(monkeypatch, env, fast):
    """Nsight Systems / Compute inject into the process and flush their data at exit; a preloaded library
    may too: ``train`` then exits through the interpreter's teardown."""
    from tilewise import settings

    for name in ("TILEWISE_FAST_EXIT", "CUDA_INJECTION64_PATH", "LD_PRELOAD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert settings.fast_exit() is fast


def test_train_imports_numpy_before_torch(tmp_path):
    """``tilewise train`` imports numpy before anything imports torch (once its children have started):
    torch imports numpy from C++ and turns an exception raised inside that import into a warning, so a
    Ctrl-C landing there was lost (the kill test saw a `train` run on after its SIGINT). The first of the
    two a `train` asks for is numpy."""
    code = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def spy(name, *a, **k):\n"
            "    top = name.split('.')[0]\n"
            "    if top in ('numpy', 'torch') and not hasattr(builtins, '_first'):\n"
            "        builtins._first = top\n"
            "        print('FIRST', top, flush=True)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = spy\n"
            "from tilewise.cli import run\n"
            "sys.exit(run())\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TILEWISE_FAST_EXIT": "0"}
    p = subprocess.run([sys.executable, "-c", code, "train", "--data-dir", str(tmp_path / "none"), "--device", "cpu",
                        "--output-dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "FIRST numpy" in p.stdout, (p.stdout, p.stderr[-2000:])


def test_every_command_runs_inside_the_interrupt_latch(monkeypatch):
    """A command runs inside ``_startup.latched_interrupts`` (a swallowed Ctrl-C is raised again at its
    next check), and Python's own SIGINT handler is back after it."""
    import signal

    from tilewise import cli

    seen = []
    monkeypatch.setattr(cli, "cmd_report", lambda args: seen.append(signal.getsignal(signal.SIGINT)) or 0)
    # Python's own handler first: a process started in the background by a non-interactive shell ignores
    # SIGINT, and the latch leaves a caller's choice alone.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(["report"]) == 0
        assert seen and seen[0] is not signal.default_int_handler and callable(seen[0])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
