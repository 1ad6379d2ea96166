"""Issue 29: report / roofline on malformed inputs, results markers inside CSV cells, atomic writes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilewise import cli
from tilewise.bench import harness, report, roofline
from tilewise.cost import Cost
from tilewise.runtime.device import save_ceilings

from test_harness import CEIL

HEADER = ",".join(harness.CSV_COLUMNS) + "\n"


def _rows(n=2, **kw):
    return [harness.make_row(kw.get("op", "vector_add"), kw.get("variant", f"v{i}"), kw.get("shape", "n=1024"),
                             "float32", 1.0 + i, Cost(1024, 12 * 1024), CEIL, baseline="torch", baseline_ms=3.0,
                             device=kw.get("device", "Test GPU"), sha="abc", date="2026-01-01T00:00:00")
            for i in range(n)]


def _good_csv(tmp_path):
    p = tmp_path / "Test_GPU.csv"
    harness.append_csv(p, _rows())
    return p


# --------------------------------------------------------------------------- a. malformed inputs

MALFORMED_CSV = {
    "missing_columns": ("op,variant,shape\nvector_add,v1,n=1\n", "median_ms"),
    "non_numeric_median_ms": (HEADER + "vector_add,v1,n=1,float32,fast,,,,torch,2.0,,Test GPU,abc,2026-01-01\n",
                              "line 2: median_ms is 'fast'"),
    "empty_file": ("", "empty file"),
    "not_a_csv_binary": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "not UTF-8"),
    "not_a_csv_json": ('{"device": "H200", "copy_gbps": 4000}\n', "missing"),
    "short_row": (HEADER + "vector_add,v1,n=1,float32,1.0\n", "line 2: fewer fields"),
}


def _write(p: Path, content):
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)


@pytest.mark.parametrize("case", sorted(MALFORMED_CSV))
@pytest.mark.parametrize("cmd", ["report", "roofline"])
def test_malformed_csv_is_a_clear_error_naming_the_file(cmd, case, tmp_path, capsys):
    content, why = MALFORMED_CSV[case]
    p = tmp_path / "Test_GPU.csv"
    _write(p, content)
    save_ceilings(CEIL, tmp_path / "Test_GPU-ceilings.json")
    assert cli.main([cmd, "--csv", str(p)]) == 1
    err = capsys.readouterr().err
    assert f"tilewise {cmd}: error: {p}" in err and why in err
    assert not (tmp_path / "Test_GPU.png").exists()


@pytest.mark.parametrize("content, why", [
    ('{"device": "Test GPU", "copy_gbps": ', "not JSON"),
    ("copy_gbps = 4000\n", "not JSON"),
    ('{"device": "Test GPU", "driver": "13.0", "torch": "2.x"}', "copy_gbps missing"),
    ('{"device": "Test GPU", "driver": "13.0", "torch": "2.x", "copy_gbps": "fast"}', "copy_gbps is 'fast'"),
    ('{"device": "Test GPU", "driver": "13.0", "torch": "2.x", "copy_gbps": 1000, "peak_tflops": {"bf16": null}}',
     "peak_tflops"),
    ("[1, 2]", "expected a JSON object"),
])
def test_malformed_ceilings_is_a_clear_error_naming_the_file(content, why, tmp_path, capsys):
    csv_path = _good_csv(tmp_path)
    ceil = tmp_path / "c.json"
    ceil.write_text(content)
    assert cli.main(["roofline", "--csv", str(csv_path), "--ceilings", str(ceil), "--out",
                     str(tmp_path / "r.png")]) == 1
    err = capsys.readouterr().err
    assert f"tilewise roofline: error: {ceil}" in err and why in err
    assert not (tmp_path / "r.png").exists()


def test_cli_prints_no_traceback_on_malformed_input(tmp_path):
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text(HEADER + "vector_add,v1,n=1,float32,nan?,,,,torch,2.0,,Test GPU,abc,2026-01-01\n")
    bad_ceil = tmp_path / "bad-ceilings.json"
    bad_ceil.write_text("{")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for args in (["report", "--csv", str(bad_csv)],
                 ["roofline", "--csv", str(_good_csv(tmp_path)), "--ceilings", str(bad_ceil)]):
        p = subprocess.run([sys.executable, "-m", "tilewise", *args], capture_output=True, text=True, env=env,
                           timeout=300)
        assert p.returncode != 0
        assert "Traceback" not in p.stderr + p.stdout and str(tmp_path) in p.stderr


# --------------------------------------------------------------------------- b. markers inside cells

README_HEAD = "# Title\r\n\nintro <!-- a comment -->\n"
README_TAIL = "\nafter the table\n<!-- other -->\n"


def test_markers_in_csv_cells_cannot_corrupt_the_readme(tmp_path, capsys):
    csv_path = tmp_path / "Test_GPU.csv"
    rows = _rows(1, variant=f"v1 {report.README_END}", shape=f"n=1\n{report.README_START}\nx",
                 device=f"GPU {report.README_END}")
    rows += _rows(1, op=report.README_START)
    harness.append_csv(csv_path, rows)
    readme = tmp_path / "README.md"
    readme.write_text(f"{README_HEAD}{report.README_START}\nold table\n{report.README_END}{README_TAIL}",
                      newline="")
    assert cli.main(["report", "--csv", str(csv_path), "--readme", str(readme), "--all"]) == 0
    text = readme.read_bytes().decode()
    assert text.count(report.README_START) == 1 and text.count(report.README_END) == 1
    assert text.startswith(README_HEAD + report.README_START + "\n")
    assert text.endswith(report.README_END + README_TAIL)
    section = text[len(README_HEAD + report.README_START):-len(report.README_END + README_TAIL)]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 2  # head, rule, one line per row
    assert "v1 &lt;!-- results:end --&gt;" not in section  # '>' kept as is: only '<' and '&' escaped
    assert "v1 &lt;!-- results:end -->" in section and "old table" not in section


def test_readme_with_a_second_marker_is_refused_and_left_unchanged(tmp_path):
    readme = tmp_path / "README.md"
    original = (f"{report.README_START}\nA\n{report.README_END}\nmiddle\n"
                f"{report.README_START}\nB\n{report.README_END}\n")
    readme.write_text(original)
    with pytest.raises(ValueError, match="it has 2 and 2"):  # BenchFileError is a ValueError
        report.update_readme(readme, [r.as_csv() for r in _rows()])
    assert readme.read_text() == original


# --------------------------------------------------------------------------- c. atomic writes


def _fail_replace_in(monkeypatch, directory: Path) -> list[list[str]]:
    """os.replace into ``directory`` raises (after the temporary file is complete); returns what the
    directory held at each failed call."""
    real, seen = os.replace, []

    def replace(src, dst, *a, **kw):
        if Path(dst).parent == directory:
            seen.append(sorted(p.name for p in directory.iterdir()))
            raise OSError(28, "No space left on device (simulated)")
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    return seen


def _write_readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_START}\nold\n{report.README_END}\nafter\n")
    return lambda: report.update_readme(readme, [r.as_csv() for r in _rows()]), readme


def _write_csv(tmp_path):
    p = _good_csv(tmp_path)
    return lambda: harness.append_csv(p, _rows(1, variant="new")), p


def _write_png(tmp_path):
    p = tmp_path / "r.png"
    p.write_bytes(b"\x89PNG previous picture")
    return lambda: roofline.plot([r.as_csv() for r in _rows()], CEIL, p), p


@pytest.mark.parametrize("writer", [_write_readme, _write_csv, _write_png])
def test_failure_after_the_temporary_file_keeps_the_previous_file(writer, tmp_path, monkeypatch):
    write, path = writer(tmp_path)
    before, listing = path.read_bytes(), sorted(p.name for p in tmp_path.iterdir())
    seen = _fail_replace_in(monkeypatch, tmp_path)
    with pytest.raises(OSError, match="simulated"):
        write()
    assert len(seen) == 1 and len(seen[0]) == len(listing) + 1  # the temporary file existed
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # and is gone


def test_append_csv_error_midway_through_the_rows_appends_none(tmp_path):
    p = _good_csv(tmp_path)
    before = p.read_bytes()

    class Broken:
        def as_csv(self):
            raise RuntimeError("row 2 cannot be rendered")

    with pytest.raises(RuntimeError, match="row 2"):
        harness.append_csv(p, [_rows(1, variant="new")[0], Broken()])
    assert p.read_bytes() == before


def test_roofline_savefig_failure_midway_keeps_the_previous_png(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    out = tmp_path / "r.png"
    out.write_bytes(b"\x89PNG previous picture")

    def savefig(self, fname, **kw):
        if isinstance(fname, (str, os.PathLike)):
            Path(fname).write_bytes(b"\x89PNG half")
        else:
            fname.write(b"\x89PNG half")
        raise RuntimeError("killed mid-write (simulated)")

    monkeypatch.setattr(Figure, "savefig", savefig)
    with pytest.raises(RuntimeError, match="simulated"):
        roofline.plot([r.as_csv() for r in _rows()], CEIL, out)
    assert out.read_bytes() == b"\x89PNG previous picture"
    assert [p.name for p in tmp_path.iterdir()] == ["r.png"]


def test_runner_appends_rows_as_it_goes(tmp_path, monkeypatch):
    """A bench run stopped by a time limit keeps what it measured: rows reach the CSV at most
    flush_s after they were added, and flush() writes the rest once (no row twice)."""
    p = tmp_path / "Test_GPU.csv"
    clock = [100.0]
    monkeypatch.setattr(harness.time, "monotonic", lambda: clock[0])
    r = harness.Runner(ceilings=CEIL, device="Test GPU", csv_path=p, flush_s=5.0)
    r.add("vector_add", "v1", "n=1024", "float32", 1.0, Cost(1024, 12 * 1024))
    assert not p.exists()  # within flush_s of the start: pending
    clock[0] += 6.0
    r.add("vector_add", "v2", "n=1024", "float32", 2.0, Cost(1024, 12 * 1024))
    assert [row["variant"] for row in harness.read_csv(p)] == ["v1", "v2"]
    r.add("vector_add", "v3", "n=1024", "float32", 3.0, Cost(1024, 12 * 1024))
    assert len(harness.read_csv(p)) == 2
    assert r.flush() == p and r.flush() == p
    assert [row["variant"] for row in harness.read_csv(p)] == ["v1", "v2", "v3"]
    assert harness.Runner().flush() is None  # no CSV: nothing written
