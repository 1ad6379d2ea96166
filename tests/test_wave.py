"""The wave-quantization suite: wave arithmetic, plot data and plot from synthetic rows, the pinned
launcher under the interpreter (CPU); the launcher and the suite's files on the GPU."""

import csv
import math

import pytest
import torch

from tilewise.bench import harness
from tilewise.bench.suites import wave
from tilewise.cost import Cost

from conftest import poison


# --------------------------------------------------------------------------- arithmetic


def test_tiles_count_partial_edge_tiles():
    assert wave.tiles(2048, 2048, 128, 128) == 256
    assert wave.tiles(2056, 2048, 128, 128) == 17 * 16
    assert wave.tiles(2056, 2056, 128, 256) == 17 * 9
    assert wave.tiles(1, 1, 128, 256) == 1
    with pytest.raises(ValueError, match="M=0"):
        wave.tiles(0, 5, 128, 128)


@pytest.mark.parametrize("n,bm,bn,expected", [
    (1408, 128, 128, 1),   # 121 tiles <= 132
    (1416, 128, 128, 2),   # 144
    (2048, 128, 128, 2),   # 256 <= 264
    (2056, 128, 128, 3),   # 289
    (2048, 128, 256, 1),   # 128
    (2056, 128, 256, 2),   # 153
    (2304, 128, 128, 3),   # 324 <= 396
    (2312, 128, 128, 3),   # 361 <= 396
])
def test_waves_on_132_sms(n, bm, bn, expected):
    assert wave.waves(n, n, bm, bn) == expected


def test_waves_scale_with_resident_ctas():
    # 289 tiles: 3 rounds of 132, 2 rounds of 264 (2 CTAs per SM), 1 round of 396.
    assert [wave.waves(2056, 2056, 128, 128, 132, c) for c in (1, 2, 3)] == [3, 2, 1]
    with pytest.raises(ValueError, match="ctas_per_sm"):
        wave.waves(10, 10, 8, 8, 132, 0)


def test_resident_ctas_per_sm_limits():
    # The pinned config: 4 stages x (128 + 128) x 64 x 2 B + a 128 x 128 bf16 C tile = 160 KiB -> 1.
    assert wave.resident_ctas_per_sm(160 * 1024, 8) == 1
    assert wave.resident_ctas_per_sm(96 * 1024, 4) == 2          # shared memory binds
    assert wave.resident_ctas_per_sm(0, 4) == 16                 # threads bind: 2048 / 128
    assert wave.resident_ctas_per_sm(0, 1) == 32                 # the 32-block cap
    assert wave.resident_ctas_per_sm(0, 8, regs_per_thread=255) == 1   # 8192 regs per warp x 8
    assert wave.resident_ctas_per_sm(0, 4, regs_per_thread=128) == 4
    with pytest.raises(ValueError):
        wave.resident_ctas_per_sm(0, 0)


def test_wave_time_and_prediction():
    # 10 SMs x one 100 x 100 tile x 2 x 1000 FLOPs = 2e8 FLOP at 2 TFLOP/s = 0.1 ms.
    assert wave.wave_time_ms(1000, 100, 100, 2.0, sms=10) == pytest.approx(0.1)
    assert wave.wave_time_ms(1000, 100, 100, 2.0, sms=10, block_k=64) == pytest.approx(0.1024)
    assert wave.wave_time_ms(1000, 100, 100, 2.0, sms=10, ctas_per_sm=2) == pytest.approx(0.2)
    # Crossing 2048 -> 2056 with 128 x 128 x 64: 2 -> 3 waves and K padded 2048 -> 2112.
    t0 = wave.predicted_ms(2048, 2048, 2048, 128, 128, 700.0, block_k=64)
    t1 = wave.predicted_ms(2056, 2056, 2056, 128, 128, 700.0, block_k=64)
    assert t1 / t0 == pytest.approx(1.5 * 2112 / 2048)
    # A full last wave at peak predicts exactly the FLOP floor: 264 tiles of 128 x 128 = n 2112 ... use
    # 132 tiles of 128 x 128 on 132 SMs: M = 128 x 12, N = 128 x 11.
    t = wave.predicted_ms(128 * 12, 128 * 11, 640, 128, 128, 500.0, block_k=64)
    assert t == pytest.approx(2 * 128 * 12 * 128 * 11 * 640 / 500e12 * 1e3)
    with pytest.raises(ValueError, match="peak"):
        wave.wave_time_ms(10, 8, 8, 0.0)


# --------------------------------------------------------------------------- plot data and plot


def _rows():
    r = harness.Runner(device="Fake GPU")
    for n, cub, auto, pinned in [(1408, 0.010, 0.012, 0.013), (2048, 0.025, 0.026, 0.027),
                                 (2056, 0.030, 0.038, 0.040)]:
        cost = Cost(flops=2 * n ** 3, bytes=6 * n * n)
        r.add("wave", "cublas", f"{n}x{n}x{n}", torch.bfloat16, cub, cost)
        r.add("wave", "gemm(auto)", f"{n}x{n}x{n}", torch.bfloat16, auto, cost, baseline="cublas", baseline_ms=cub)
        r.add("wave", wave.PINNED_NAME, f"{n}x{n}x{n}", torch.bfloat16, pinned, cost, baseline="cublas",
              baseline_ms=cub)
    r.add("gemm", "cublas", "4096x4096x4096", torch.bfloat16, 0.2, None)  # another op: ignored
    return [row.as_csv() for row in r.rows]


def _tiles():
    auto = {1408: (128, 128, 64), 2048: (128, 256, 64), 2056: (128, 256, 64)}
    pinned = {n: (128, 128, 64) for n in (1408, 2048, 2056)}
    return {"gemm(auto)": auto, wave.PINNED_NAME: pinned}


def test_wave_points_from_rows():
    pts = wave.wave_points(_rows(), _tiles(), peak_tflops=700.0)
    assert len(pts) == 9
    by = {(p["variant"], p["n"]): p for p in pts}
    cub = by[("cublas", 2048)]
    assert cub["waves"] is None and cub["predicted_ms"] is None
    assert cub["tflops"] == pytest.approx(2 * 2048 ** 3 / 0.025e-3 / 1e12)
    assert by[("gemm(auto)", 2048)]["waves"] == 1 and by[("gemm(auto)", 2056)]["waves"] == 2
    assert by[(wave.PINNED_NAME, 2056)]["tiles"] == 289 and by[(wave.PINNED_NAME, 2056)]["waves"] == 3
    p = by[(wave.PINNED_NAME, 1408)]
    assert p["predicted_ms"] == pytest.approx(wave.predicted_ms(1408, 1408, 1408, 128, 128, 700.0, block_k=64))
    # predicted TFLOP/s = peak x useful share of the computed tiles (here K is a multiple of 64)
    assert p["predicted_tflops"] == pytest.approx(700.0 * 1408 ** 2 / (132 * 128 * 128))
    assert [q["n"] for q in pts if q["variant"] == "cublas"] == [1408, 2048, 2056]


def test_write_points_and_plot(tmp_path):
    pts = wave.wave_points(_rows(), _tiles(), peak_tflops=700.0)
    data = wave.write_points(pts, tmp_path / "sub" / "Fake_GPU-wave.csv")
    with data.open() as f:
        got = list(csv.DictReader(f))
    assert tuple(got[0].keys()) == wave.POINT_COLUMNS and len(got) == 9
    row = next(g for g in got if g["variant"] == wave.PINNED_NAME and g["n"] == "2056")
    assert row["waves"] == "3" and row["block_m"] == "128"
    assert next(g for g in got if g["variant"] == "cublas")["waves"] == ""
    png = wave.plot(pts, tmp_path / "Fake_GPU-wave.png", title="test")
    head = png.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no points"):
        wave.plot([], tmp_path / "empty.png")


def test_runner_out_dir_is_optional(tmp_path):
    assert harness.Runner().out_dir is None
    assert harness.Runner(out_dir=str(tmp_path)).out_dir == tmp_path


def test_sizes_cross_a_wave_boundary_of_the_pinned_tile():
    for sizes in (wave.SIZES, wave.QUICK_SIZES):
        w = [wave.waves(n, n, wave.PINNED["BLOCK_M"], wave.PINNED["BLOCK_N"]) for n in sizes]
        assert len(set(w)) >= 3, w
        # every size takes the TMA kernel: rows are 16-byte multiples in bf16
        assert all((n * 2) % 16 == 0 for n in sizes)
    assert len(wave.SIZES) >= 10 and len(wave.QUICK_SIZES) < len(wave.SIZES)


# --------------------------------------------------------------------------- the pinned launcher


_SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_stages": 2, "num_warps": 4}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(40, 24, 40), (33, 8, 24)])  # K: 16-byte rows for TMA
def test_run_pinned_interpreter(dtype, m, n, k):
    if torch.cuda.is_available():
        pytest.skip("interpreter test")
    g = torch.Generator().manual_seed(m * n + k)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    out = poison(torch.empty(m, n, dtype=dtype))
    wave.run_pinned(a, b, out, _SMALL)
    ref = a.double() @ b.double()
    assert not torch.isnan(out).any()
    assert harness.rel_error(out, ref) < 1e-2


def test_run_pinned_rejects_bad_input():
    a = torch.zeros(16, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="16-bit dtype"):
        wave.run_pinned(a.float(), a.float(), a.float(), _SMALL)
    with pytest.raises(ValueError, match="shapes"):
        wave.run_pinned(a, torch.zeros(8, 16, dtype=torch.float16), a, _SMALL)
    with pytest.raises(ValueError, match="TMA"):
        wave.run_pinned(torch.zeros(16, 15, dtype=torch.float16)[:, :15], torch.zeros(15, 16, dtype=torch.float16),
                        a, _SMALL)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1416, 2056])
def test_run_pinned_gpu(n):
    g = torch.Generator(device="cuda").manual_seed(n)
    a = torch.randn(n, n + 8, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n + 8, n - 8, device="cuda", generator=g).to(torch.bfloat16)
    out = poison(torch.empty(n, n - 8, device="cuda", dtype=torch.bfloat16))
    wave.run_pinned(a, b, out)
    assert harness.rel_error(out, a.double() @ b.double()) < 1e-2


@pytest.mark.gpu
def test_suite_writes_rows_data_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(wave, "QUICK_SIZES", [1408, 2056])
    r = harness.Runner(device="NVIDIA H200", quick=True, out_dir=tmp_path)
    wave.run(r)
    variants = [(row.variant, row.shape) for row in r.rows]
    for n in (1408, 2056):
        for v in ("cublas", "gemm(auto)", wave.PINNED_NAME):
            assert (v, f"{n}x{n}x{n}") in variants
    with (tmp_path / "NVIDIA_H200-wave.csv").open() as f:
        pts = list(csv.DictReader(f))
    auto = [p for p in pts if p["variant"] == "gemm(auto)"]
    assert auto and all(p["waves"] != "" for p in auto)  # the autotuned tile was read back
    assert (tmp_path / "NVIDIA_H200-wave.png").stat().st_size > 10_000
    assert not math.isnan(float(pts[0]["tflops"]))


_COMPILE_PINNED = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tilewise.bench.suites import wave
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import triton_kernels as tk

c = wave.PINNED
bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": c["GROUP_M"], "B_KMAJOR": False,
        "HAS_BIAS": False, "HAS_SCALES": False, "STORE_AUX": False, "ACTIVATION": 0, "PRECISION": "tf32",
        "UPCAST": False}
sig = {"a_desc": f"tensordesc<bf16[{bm}, {bk}]>", "b_desc": f"tensordesc<bf16[{bk}, {bn}]>",
       "c_desc": f"tensordesc<bf16[{bm}, {bn}]>", "aux_desc": f"tensordesc<bf16[{bm}, {bn}]>",
       "bias_ptr": "*bf16", "scale_a_ptr": "*bf16", "scale_b_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
       "NUM_SMS": "i32", "dtype_tag": "i32", **{k: "constexpr" for k in meta}}
names = list(sig)
attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("M", "N", "K")}
k = triton.compile(ASTSource(fn=tk._gemm_tma_persistent_kernel, signature=sig, constexprs=meta, attrs=attrs),
                   target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": c["num_warps"], "num_stages": c["num_stages"]})
ptx = k.asm["ptx"]
print(json.dumps({"smem": k.metadata.shared, "wgmma": "wgmma.mma_async" in ptx,
                  "tma": "cp.async.bulk.tensor" in ptx, "limit": gc.SMEM_LIMIT}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel runs for real")
def test_pinned_config_compiles_for_sm90_and_holds_one_cta_per_sm():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, don't interpret
    p = subprocess.run([sys.executable, "-c", _COMPILE_PINNED], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["wgmma"] and r["tma"]
    # 4 stages of 128 x 64 A and 64 x 128 B bf16 tiles (128 KiB) + the staged C tile: fits one block, not two.
    assert 4 * (128 + 128) * 64 * 2 <= r["smem"] <= r["limit"]
    assert wave.resident_ctas_per_sm(r["smem"], wave.PINNED["num_warps"]) == 1
