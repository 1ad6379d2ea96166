"""scripts/llama_fsdp.py on the CPU (gloo, fp32): a tiny Llama patched with apply_tilewise (RMSNorm, RoPE,
SwiGLU and the fused loss in Triton's interpreter) under FSDP2 trains to the same losses on two
processes as on one with the same global batch (issue 33's check, before the two-GPU run)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--layers", "2", "--hidden", "32", "--intermediate", "64", "--heads", "4",
        "--kv-heads", "2", "--vocab", "97", "--batch", "4", "--seq", "16", "--steps", "3", "--lr", "1e-3",
        "--parts", "rms_norm,rope,swiglu,loss"]


def _torchrun(n, out, tmp_path, extra=()):
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if exe is None:
        pytest.skip("torchrun is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([exe, "--nproc_per_node", str(n), "--master_port", str(29500 + n + os.getpid() % 1000),
                        str(ROOT / "scripts" / "llama_fsdp.py"), *TINY, *extra, "--out", str(out)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_processes_match_one(tmp_path):
    one = _torchrun(1, tmp_path / "one.json", tmp_path)
    two = _torchrun(2, tmp_path / "two.json", tmp_path)
    assert one["world"] == 1 and two["world"] == 2 and len(one["losses"]) == 3
    for a, b in zip(one["losses"], two["losses"]):
        assert abs(a - b) <= 1e-4 * abs(a), (one["losses"], two["losses"])
    assert one["losses"][-1] < one["losses"][0]  # it trains
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "llama_fsdp.py"), "--compare",
                        str(tmp_path / "one.json"), str(tmp_path / "two.json"), "--tolerance", "1e-4"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "scaling efficiency" in p.stdout, p.stdout + p.stderr


def test_tilewise_adamw_steps_sharded_parameters(tmp_path):
    """tilewise.AdamW on FSDP2's DTensor parameters (each rank updates its local shards) trains as torch's AdamW
    does on one process: the same losses, step by step."""
    torch_one = _torchrun(1, tmp_path / "torch.json", tmp_path)
    ours_two = _torchrun(2, tmp_path / "ours.json", tmp_path, ("--optimizer", "tilewise"))
    for a, b in zip(torch_one["losses"], ours_two["losses"]):
        assert abs(a - b) <= 1e-4 * abs(a), (torch_one["losses"], ours_two["losses"])
