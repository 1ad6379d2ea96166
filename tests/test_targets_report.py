"""``tilewise report --targets``: issue 30's grid (flash_attention x SDPA's cuDNN) and the issues' other targets."""

import csv

import pytest

from tilewise import cli
from tilewise.bench import targets as G
from tilewise.bench import harness, report

GPU = "Test GPU"


def _pair(shape, ours_ms, cudnn_ms, *, op="attention_fwd", dtype="bfloat16", sha="aaa", date="2026-12-01T00:00:00",
          device=GPU):
    """One run's flash_attention row and its sdpa_cudnn row (cudnn_ms None: no cuDNN row in that run)."""
    rows = [harness.make_row(op, "flash_attention", shape, dtype, ours_ms, None, device=device, sha=sha,
                             date=date).as_csv()]
    if cudnn_ms is not None:
        rows.append(harness.make_row(op, "sdpa_cudnn", shape, dtype, cudnn_ms, None, device=device, sha=sha,
                                     date=date).as_csv())
    return rows


@pytest.mark.parametrize("shape, want", [
    ("B=4,H=32,Hkv=8,S=4096,D=64,causal", {"B": 4, "H": 32, "Hkv": 8, "S": 4096, "D": 64, "causal": True}),
    ("B=8,H=16,S=2048,D=128", {"B": 8, "H": 16, "Hkv": 16, "S": 2048, "D": 128, "causal": False}),
    ("B=8,H=16,S=2048,D=128,bias", None),
    ("B=8,H=16,S=2048,D=128,window=1024", None),
    ("B=8,H=16,S=2048,D=128,causal,causal", None),
    ("B=8,H=16,D=128", None),
    ("B=8,H=16,S=2048,S=4096,D=128", None),
    ("docs=8,max=2048,H=16,D=64", None),
])
def test_parse_shape_takes_grid_shapes_only(shape, want):
    assert G.parse_shape(shape) == want


def test_grid_takes_each_points_newest_pair_of_one_run():
    """A point's cell is the newest run with both rows; a newer flash_attention row without its run's cuDNN row,
    off-grid shapes (bias, B x S != 16384, another D) and other variants are left out; devices and dtypes apart."""
    rows = (_pair("B=8,H=16,S=2048,D=128", 2.0, 1.8, date="2026-12-01T00:00:00", sha="old")
            + _pair("B=8,H=16,S=2048,D=128", 1.0, 1.1, date="2026-12-02T00:00:00", sha="new")
            + _pair("B=8,H=16,S=2048,D=128", 0.5, None, date="2026-12-03T00:00:00", sha="lone")
            + _pair("B=8,H=16,S=2048,D=128,bias", 1.0, 2.0)
            + _pair("B=4,H=16,S=2048,D=128", 1.0, 2.0)
            + _pair("B=8,H=16,S=2048,D=96", 1.0, 2.0)
            + _pair("B=8,H=16,S=2048,D=128", 1.0, 0.9, dtype="float16")
            + _pair("B=8,H=16,S=2048,D=128", 1.0, 1.3, device="Other GPU"))
    rows.append(harness.make_row("attention_fwd", "v5_flash2_ws", "B=8,H=16,S=2048,D=128", "bfloat16", 0.1, None,
                                 device=GPU, sha="new", date="2026-12-02T00:00:00").as_csv())
    g = G.grid(rows)
    assert set(g) == {(GPU, "bfloat16"), (GPU, "float16"), ("Other GPU", "bfloat16")}
    key = ("attention_fwd", (16, 16), 128, False, 2048)
    assert list(g[(GPU, "bfloat16")]) == [key]
    cell = g[(GPU, "bfloat16")][key]
    assert cell.git_sha == "new" and cell.ratio == pytest.approx(1.1)
    assert g[(GPU, "float16")][key].ratio == pytest.approx(0.9)
    assert g[("Other GPU", "bfloat16")][key].ratio == pytest.approx(1.3)


def test_markdown_marks_points_under_the_issues_targets():
    """Forward: 1.05x from S 2048, 1.0x at 1024; forward + backward 1.0x. Under target in bold, '-' unmeasured."""
    rows = (_pair("B=16,H=16,S=1024,D=64", 1.0, 1.0)  # fwd S 1024 at 1.0: met
            + _pair("B=8,H=16,S=2048,D=64", 1.0, 1.04)  # fwd S 2048 at 1.04: under 1.05
            + _pair("B=4,H=32,Hkv=8,S=4096,D=128,causal", 1.0, 1.2)
            + _pair("B=1,H=16,S=16384,D=64", 1.0, 0.99, op="attention_fwd_bwd")
            + _pair("B=2,H=16,S=8192,D=64", 1.0, 1.0, op="attention_fwd_bwd"))
    md = G.markdown(G.grid(rows))
    lines = md.splitlines()
    fwd_16_64 = next(line for line in lines if line.startswith("| fwd | 16 | 64 | no |"))
    assert fwd_16_64 == "| fwd | 16 | 64 | no | 1.000 | **1.040** | - | - | - |"
    assert "| fwd | 32 / 8 | 128 | yes | - | - | 1.200 | - | - |" in lines
    assert "| fwd+bwd | 16 | 64 | no | - | - | - | 1.000 | **0.990** |" in lines
    assert sum(line.startswith("| fwd") for line in lines) == 16
    assert "At target: forward 2 of 3 measured points, forward + backward 1 of 2." in md
    assert "**Test GPU, bfloat16**" in md
    assert "No grid rows" in G.markdown({})


def test_readme_grid_section_is_its_own(tmp_path):
    """The targets rewrite only the text between their markers; the results table's section is left as it is; a
    README without their markers is refused, naming them, and not changed."""
    readme = tmp_path / "README.md"
    before = f"intro\n{report.README_START}\nresults\n{report.README_END}\nmiddle\n"
    readme.write_text(before + f"{G.TARGETS_START}\nold grid\n{G.TARGETS_END}\nend\n")
    g = G.grid(_pair("B=8,H=16,S=2048,D=64", 1.0, 1.2))
    assert G.update_readme(readme, g)
    text = readme.read_text()
    assert text.startswith(before + G.TARGETS_START + "\n**Test GPU, bfloat16**")
    assert text.endswith(G.TARGETS_END + "\nend\n")
    assert "old grid" not in text and "| fwd | 16 | 64 | no | - | 1.200 |" in text
    assert not G.update_readme(readme, g)
    bare = tmp_path / "BARE.md"
    bare.write_text(before)
    with pytest.raises(harness.BenchFileError, match="targets:start"):
        G.update_readme(bare, g)
    assert bare.read_text() == before


def test_plot_writes_a_png(tmp_path):
    g = G.grid(_pair("B=8,H=16,S=2048,D=64", 1.0, 1.2) + _pair("B=8,H=16,S=2048,D=64", 1.0, 0.9, dtype="float16"))
    out = G.plot(g, tmp_path / "grid.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    with pytest.raises(ValueError, match="no grid rows"):
        G.plot({}, tmp_path / "none.png")


def test_cli_report_targets(tmp_path, capsys):
    csv_path = tmp_path / "Test_GPU.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=harness.CSV_COLUMNS)
        w.writeheader()
        w.writerows(_pair("B=8,H=16,S=2048,D=64", 1.0, 1.2))
    png = tmp_path / "grid.png"
    assert cli.main(["report", "--targets", "--csv", str(csv_path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| fwd | 16 | 64 | no | - | 1.200 |" in out and png.exists()
    with pytest.raises(SystemExit, match="--targets"):
        cli.main(["report", "--csv", str(csv_path), "--png", str(png)])


def test_other_targets_pair_rows_of_one_run():
    """Packed rows against Flex and the padded dense call, the window against full causal (its shape without the
    window), host time beyond the graph's GPU time; newest run with both rows; a target missed shows in bold."""
    packed = "docs=8,tokens=16296,max=4096,H=16,D=128,causal"
    win, full = "B=1,H=16,S=16384,D=128,causal,window=1024", "B=1,H=16,S=16384,D=128,causal"
    host = "B=1,H=16,S=256,D=128,causal,host"

    def r(op, variant, shape, ms, sha="a", date="2026-12-02T00:00:00"):
        return harness.make_row(op, variant, shape, "bfloat16", ms, None, device=GPU, sha=sha, date=date).as_csv()

    rows = [r("attention_varlen_fwd", "flash_attention_varlen", packed, 1.0),
            r("attention_varlen_fwd", "flex_attention", packed, 1.25),
            r("attention_varlen_fwd", "flash_attention[padded]", packed, 4.0),
            r("attention_varlen_fwd", "flash_attention_varlen", packed, 0.5, sha="b", date="2026-12-03T00:00:00"),
            r("attention_window_fwd", "flash_attention", win, 0.2),
            r("attention_window_fwd", "flash_attention[full causal]", full, 1.0),
            r("attention_host_fwd_bwd", "flash_attention", host, 0.30),
            r("attention_graph_fwd_bwd", "flash_attention", host, 0.04)]
    others = G.other_targets(rows)
    got = {c.target.name: c for c in others[GPU]}
    assert list(got) == [G.OTHER_TARGETS[i].name for i in (0, 2, 4, 6)]  # in OTHER_TARGETS' order
    assert got[G.OTHER_TARGETS[0].name].value == pytest.approx(1.25)  # run "a": run "b" timed no Flex
    assert got[G.OTHER_TARGETS[2].name].value == pytest.approx(4.0)
    assert got[G.OTHER_TARGETS[4].name].value == pytest.approx(0.2)
    assert got[G.OTHER_TARGETS[6].name].value == pytest.approx(260.0)
    md = G.markdown({}, others)
    assert f"| {G.OTHER_TARGETS[4].name} | {win} | bfloat16 | **0.200** | at most 0.15 | a, 2026-12-02 |" in md
    assert f"| {G.OTHER_TARGETS[0].name} | {packed} | bfloat16 | 1.250 | at least 1 |" in md
    assert "| **260.0** | at most 40 |" in md


def test_llama_targets_are_issue_31s():
    """The Llama step against HF's default (1.2x) and HF + Liger (1.05x), a table of its own issue."""
    shape = "layers=16,B=1,S=16384"

    def r(variant, ms):
        return harness.make_row("llama_train_step", variant, shape, "bfloat16", ms, None, device=GPU, sha="a",
                                date="2026-12-02T00:00:00").as_csv()

    others = G.other_targets([r("hf_tilewise", 350.0), r("hf_liger", 371.0), r("hf_sdpa", 460.0)])
    vals = {c.target.name: c.value for c in others[GPU]}
    assert vals == {"Llama-3.2-1B training step, hf_tilewise x HF default (SDPA)": pytest.approx(460 / 350),
                    "Llama-3.2-1B training step, hf_tilewise x HF + Liger": pytest.approx(1.06)}
    md = G.markdown({}, others)
    assert "**Test GPU: issue 31's speed targets**" in md and "issue 30" not in md
    assert f"| {shape} | bfloat16 | 1.060 | at least 1.05 |" in md
