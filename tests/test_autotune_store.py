"""The stored autotune picks: a second autotuner (a new process's) takes the first one's pick from
disk without timing, pre-hooks survive, and damaged or foreign files are timed again."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import triton
import triton.language as tl

from tilewise import settings
from tilewise.runtime import autotune_store as st


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def _hook(nargs):
    pass


def _configs():
    return [triton.Config({"BLOCK": b}, num_warps=w, pre_hook=_hook) for b, w in ((64, 2), (128, 4), (256, 4))]


@pytest.fixture
def no_device(monkeypatch):
    # The store keys picks by device; on the CPU a fixed tag stands in for the GPU's.
    monkeypatch.setattr(st, "_device_tag", lambda: "test-device|sm_90|132")


def _tuner(tmp_path):
    return st.StoredAutotuner(_copy_kernel, _copy_kernel.arg_names, _configs(), ["n"], None, None, store=tmp_path)


def _bench_picking(tuner, key, configs, index, calls):
    def bench():
        calls.append(key)
        tuner.configs_timings = {c: [float(i + 1 if i != index else 0.5)] for i, c in enumerate(configs)}
        tuner.cache[key] = configs[index]
    return bench


def test_second_tuner_takes_the_pick_from_disk(tmp_path, no_device):
    key = (1000, "torch.float32")
    first, calls = _tuner(tmp_path), []
    assert first.check_disk_cache(key, first.configs, _bench_picking(first, key, first.configs, 2, calls)) is False
    assert calls == [key]
    files = list(tmp_path.glob("_copy_kernel-*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["best"] == 2 and rec["timings_ms"][2] == 0.5

    second, calls2 = _tuner(tmp_path), []
    hit = second.check_disk_cache(key, second.configs, _bench_picking(second, key, second.configs, 0, calls2))
    assert hit is True and calls2 == []
    chosen = second.cache[key]
    assert chosen is second.configs[2] and chosen.kwargs == {"BLOCK": 256}
    assert chosen.pre_hook is _hook  # the live config object, hook included


def test_other_key_or_configs_or_device_is_timed_again(tmp_path, no_device, monkeypatch):
    key = (1000, "torch.float32")
    t = _tuner(tmp_path)
    t.check_disk_cache(key, t.configs, _bench_picking(t, key, t.configs, 1, []))
    calls = []
    t2 = _tuner(tmp_path)
    assert t2.check_disk_cache((2000, "torch.float32"), t2.configs,
                               _bench_picking(t2, (2000, "torch.float32"), t2.configs, 0, calls)) is False
    fewer = t2.configs[:2]
    assert t2.check_disk_cache(key, fewer, _bench_picking(t2, key, fewer, 0, calls)) is False
    monkeypatch.setattr(st, "_device_tag", lambda: "other-gpu|sm_80|108")
    assert t2.check_disk_cache(key, t2.configs, _bench_picking(t2, key, t2.configs, 0, calls)) is False
    assert len(calls) == 3


@pytest.mark.parametrize("damage", ["{not json", '{"format": 1, "best": 7}', '[1, 2]', '{"format": 1, "best": true}'])
def test_damaged_file_is_timed_again_and_rewritten(tmp_path, no_device, damage):
    key = (1000, "torch.float32")
    t = _tuner(tmp_path)
    path, described = t.pick_path(key, t.configs)
    path.parent.mkdir(parents=True, exist_ok=True)
    if damage.startswith('{"format": 1, "best"'):
        rec = json.loads(damage)
        rec.update(key=repr(key), configs=described)
        damage = json.dumps(rec)
    path.write_text(damage)
    calls = []
    assert t.check_disk_cache(key, t.configs, _bench_picking(t, key, t.configs, 1, calls)) is False
    assert calls == [key]
    assert json.loads(path.read_text())["best"] == 1


def test_one_config_needs_no_timing_and_no_file(tmp_path, no_device):
    t = _tuner(tmp_path)
    calls = []
    one = t.configs[:1]
    assert t.check_disk_cache((5,), one, lambda: calls.append(1)) is True
    assert calls == [] and t.cache[(5,)] is one[0] and not list(tmp_path.iterdir())


def test_store_follows_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(settings.CACHE_DIR, str(tmp_path / "c"))
    t = st.StoredAutotuner(_copy_kernel, _copy_kernel.arg_names, _configs(), ["n"], None, None)
    assert t.folder() == tmp_path / "c" / "autotune"


@pytest.mark.gpu
def test_gemm_autotuners_are_stored():
    from tilewise.ops.gemm import triton_kernels as tk

    if settings.triton_interpret():
        pytest.skip("the interpreter runs gemm without autotuners")
    for fn in (tk._tiled, tk._persistent, tk._tma):
        assert isinstance(fn, st.StoredAutotuner)


@pytest.mark.gpu
def test_gpu_second_process_does_not_autotune(tmp_path):
    # Two processes with the same fresh caches: the first times gemm's configs, the second must not
    # (Triton prints "Triton autotuning" for every timing when TRITON_PRINT_AUTOTUNING is set).
    code = textwrap.dedent("""
        import torch, tilewise
        torch.manual_seed(0)
        outs = []
        for m, n, k in ((1000, 1000, 1000), (777, 1536, 640)):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            for v in ("v1_tiled", "v3_tma_persistent"):
                c = tilewise.gemm(a, b, variant=v)
                ref = (a.float() @ b.float())
                assert (c.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()
                outs.append(round(c.float().sum().item(), 1))
        print("SUM", outs)
    """)
    env = settings.child_environment(tmp_path / "tw", tmp_path / "triton", TRITON_PRINT_AUTOTUNING="1")
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "Triton autotuning" in runs[0].stdout
    assert "Triton autotuning" not in runs[1].stdout, runs[1].stdout[-2000:]
    assert list((tmp_path / "tw" / "autotune").glob("*.json"))
    sums = [line for r in runs for line in r.stdout.splitlines() if line.startswith("SUM")]
    assert len(sums) == 2 and sums[0] == sums[1]
