import csv
import math

import pytest
import torch

from tilewise.bench import harness, report
from tilewise.cost import Cost
from tilewise.runtime.device import Ceilings, load_ceilings, save_ceilings

CEIL = Ceilings(device="Test GPU", driver="13.0", torch="2.x", copy_gbps=1000.0,
                peak_tflops={"fp32": 50.0, "bf16": 500.0, "tf32": 200.0, "fp16": 500.0, "fp8": 1000.0})


def test_cost_intensity_and_sum():
    c = Cost(flops=2e9, bytes=1e9)
    assert c.intensity == 2.0
    assert (c + Cost(1e9, 1e9)) == Cost(3e9, 2e9)
    assert Cost(0, 8).intensity == 0.0


def test_row_rates_and_roofline_memory_bound():
    # 1 GB moved in 2 ms -> 500 GB/s; the floor is 1 GB / 1000 GB/s = 1 ms -> 50 % of roofline.
    r = harness.make_row("op", "v1", "n", "float32", 2.0, Cost(1e6, 1e9), CEIL, baseline="torch",
                         baseline_ms=3.0)
    assert r.gbps == pytest.approx(500.0)
    assert r.tflops == pytest.approx(1e6 / 2e-3 / 1e12)
    assert r.roofline_pct == pytest.approx(50.0)
    assert r.speedup == pytest.approx(1.5)


def test_row_roofline_compute_bound_uses_dtype_peak():
    # 1e12 FLOP, 1e9 B: bf16 floor = max(1 ms, 2 ms) = 2 ms; at 4 ms -> 50 %.
    r = harness.make_row("gemm", "v", "s", "bfloat16", 4.0, Cost(1e12, 1e9), CEIL)
    assert r.roofline_pct == pytest.approx(50.0)
    # The same work in fp32: floor = 1e12 / 50e12 = 20 ms; at 40 ms -> 50 %.
    r = harness.make_row("gemm", "v", "s", "float32", 40.0, Cost(1e12, 1e9), CEIL)
    assert r.roofline_pct == pytest.approx(50.0)
    r = harness.make_row("gemm", "v", "s", "float32", 20.0, Cost(1e12, 1e9), CEIL, ceiling_dtype="tf32")
    assert r.roofline_pct == pytest.approx(25.0)


def test_ceilings_ridge_and_roundtrip(tmp_path):
    assert CEIL.ridge("bf16") == pytest.approx(500.0)
    assert CEIL.attainable_tflops(1.0, "bf16") == pytest.approx(1.0)
    save_ceilings(CEIL, tmp_path / "c.json")
    assert load_ceilings(tmp_path / "c.json") == CEIL


def test_csv_has_exactly_the_design_columns_and_appends(tmp_path):
    p = tmp_path / "dev.csv"
    rows = [harness.make_row("op", f"v{i}", "n=1", "float32", 1.0 + i, Cost(1, 12), CEIL, device="Test GPU",
                             sha="abc", date="2026-01-01T00:00:00") for i in range(2)]
    harness.append_csv(p, rows[:1])
    harness.append_csv(p, rows[1:])
    with p.open() as f:
        lines = list(csv.reader(f))
    assert lines[0] == ["op", "variant", "shape", "dtype", "median_ms", "gbps", "tflops", "roofline_pct",
                        "baseline", "baseline_ms", "speedup", "device", "git_sha", "date"]
    assert len(lines) == 3
    back = harness.read_csv(p)
    assert [r["variant"] for r in back] == ["v0", "v1"]
    assert float(back[1]["median_ms"]) == 2.0 and back[0]["baseline"] == ""


def test_csv_with_other_columns_is_refused(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="expected"):
        harness.append_csv(p, [])


def test_check_catches_nan_and_error():
    ref = torch.randn(1000)
    out = ref.clone()
    assert harness.check("same", out, ref) == 0.0
    out[17] = float("nan")
    with pytest.raises(harness.CheckError):
        harness.check("nan", out, ref)
    with pytest.raises(harness.CheckError, match="relative error"):
        harness.check("off", ref * 1.01, ref)
    harness.check("bf16", ref.bfloat16(), ref, dtype=torch.bfloat16)
    assert math.isinf(harness.rel_error(torch.tensor([float("inf")]), torch.tensor([1.0])))


def test_latest_run_and_markdown(tmp_path):
    rows = [harness.make_row("op", "v1", "n", "float32", ms, Cost(1, 12), CEIL, device="Test GPU", sha=s,
                             date=d).as_csv()
            for ms, s, d in ((2.0, "old", "2026-01-01T00:00:00"), (1.0, "new", "2026-02-01T00:00:00"))]
    latest = report.latest_run(rows)
    assert len(latest) == 1 and latest[0]["git_sha"] == "new"
    md = report.markdown_table(latest)
    assert "| op | v1 | n | float32 |" in md and "new" in md
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_START}\nold\n{report.README_END}\nafter\n")
    assert report.update_readme(readme, latest)
    text = readme.read_text()
    assert "| op | v1 |" in text and "old\n" not in text and text.endswith("after\n")
    assert not report.update_readme(readme, latest)


def test_roofline_png(tmp_path):
    from tilewise.bench import roofline

    rows = [harness.make_row("vector_add", "v2", "n=1", "float32", 1.0, Cost(1e9, 12e9), CEIL).as_csv(),
            harness.make_row("gemm", "v1", "s", "bfloat16", 4.0, Cost(1e12, 1e9), CEIL).as_csv(),
            harness.make_row("launch", "x", "n", "float32", 0.005, None).as_csv()]
    out = roofline.plot(rows, CEIL, tmp_path / "r.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_best_of_ours_keeps_the_fastest_version_per_case():
    def row(v, ms, base, shape="n"):
        return harness.make_row("op", v, shape, "float32", ms, Cost(1, 12), CEIL, baseline=base,
                                baseline_ms=2.0 if base else None).as_csv()

    rows = [row("torch", 2.0, ""), row("v1", 1.5, "torch"), row("v2", 1.2, "torch"), row("v1", 0.9, "torch", "m")]
    best = report.best_of_ours(rows)
    assert [(r["variant"], r["shape"]) for r in best] == [("v1", "m"), ("v2", "n")]


def test_time_ms_graph_rejects_bad_counts():
    from tilewise.bench.harness import time_ms_graph

    with pytest.raises(ValueError, match="calls and repeats"):
        time_ms_graph(lambda: None, calls=0)


def test_time_ms_graphs_rejects_bad_counts():
    from tilewise.bench.harness import time_ms_graphs

    with pytest.raises(ValueError, match="rounds"):
        time_ms_graphs({"a": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="warmup_ms"):
        time_ms_graphs({"a": lambda: None}, warmup_ms=-1)


@pytest.mark.gpu
def test_gpu_time_ms_graph_matches_device_bound_timing():
    """On a device-bound op (a 256 MB copy) the graph-replayed time per call agrees with the
    event timing of eager calls; on a tiny op it is far below the eager (host-bound) time."""
    import torch

    from tilewise.bench.harness import time_ms, time_ms_graph

    x = torch.randn(1 << 26, device="cuda")
    y = torch.empty_like(x)
    eager, graph = time_ms(lambda: y.copy_(x)), time_ms_graph(lambda: y.copy_(x), calls=5)
    assert 0.7 < graph / eager < 1.4, (graph, eager)
    s = torch.zeros(1, device="cuda")
    assert time_ms_graph(lambda: s.add_(1.0), calls=50) < 0.02  # a few us a launch, host excluded


@pytest.mark.gpu
def test_gpu_time_ms_graphs_times_each_version_in_the_same_rounds():
    """Interleaved graph timing: one median per version; a copy of twice the bytes takes about
    twice as long, and a version measured alone agrees with its interleaved time."""
    import torch

    from tilewise.bench.harness import time_ms_graph, time_ms_graphs

    x = torch.randn(1 << 26, device="cuda")
    y = torch.empty_like(x)
    t = time_ms_graphs({"half": lambda: y[: 1 << 25].copy_(x[: 1 << 25]), "full": lambda: y.copy_(x)}, calls=5)
    assert set(t) == {"half", "full"}
    assert 1.6 < t["full"] / t["half"] < 2.4, t
    alone = time_ms_graph(lambda: y.copy_(x), calls=5)
    assert 0.8 < alone / t["full"] < 1.25, (alone, t)


def test_readme_baselines_compare_attention_rows_with_cudnn_of_the_same_run():
    """``report.with_readme_baselines``: an attention row naming SDPA's flash backend is shown against
    the cuDNN row of its own run (sha and date); a run without a cuDNN row, another run's cuDNN row
    and other families keep the row's own baseline; the input rows are not changed."""
    def row(op, v, ms, base="", sha="a", date="2026-12-01T00:00:00+0000", shape="s"):
        r = harness.make_row(op, v, shape, "bfloat16", ms, Cost(1, 12), CEIL, baseline=base,
                             baseline_ms=2.0 if base else None).as_csv()
        return dict(r, git_sha=sha, date=date)

    ours = row("attention_fwd", "flash_attention", 1.0, "sdpa_flash")
    other_run = row("attention_fwd", "flash_attention", 1.0, "sdpa_flash", sha="b", shape="t")
    gemm = row("gemm", "v9", 1.0, "cublas")
    every = [ours, other_run, gemm, row("attention_fwd", "sdpa_cudnn", 0.8),
             row("attention_fwd", "sdpa_cudnn", 0.5, sha="a", shape="t"), row("gemm", "sdpa_cudnn", 0.5)]
    shown = report.with_readme_baselines([ours, other_run, gemm], every)
    assert shown[0]["baseline"] == "sdpa_cudnn" and float(shown[0]["speedup"]) == pytest.approx(0.8)
    assert float(shown[0]["baseline_ms"]) == pytest.approx(0.8)
    assert shown[1] is other_run and shown[2] is gemm
    assert ours["baseline"] == "sdpa_flash"
    assert "0.80x sdpa_cudnn" in report.markdown_table(shown[:1])
