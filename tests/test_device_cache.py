"""scripts/device_cache.py on the CPU: a device run's kernel caches packed as seed parts and unpacked into fresh
folders for the next run, with Triton's group files pointed at the new folder, timing data and IR dumps left
out, parts under the device tool's file size, and archives that reach outside refused."""

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from conftest import load_script


def _triton_entry(root: Path, key: str, name: str, cubin: bytes):
    """A Triton cache entry as Triton 3.6 writes it: the files and a group file of absolute paths."""
    d = root / key
    d.mkdir(parents=True)
    files = {f"{name}.json": b'{"name": "%s"}' % name.encode(), f"{name}.cubin": cubin,
             f"{name}.ptx": b"// ptx", f"{name}.ttgir": b"// ttgir", f"{name}.llir": b"; llir " * 100,
             f"{name}.source": b"source"}
    for f, data in files.items():
        (d / f).write_bytes(data)
    (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {f: str(d / f) for f in files}}))


def test_seed_round_trip_points_triton_groups_at_the_new_folder(tmp_path):
    dc = load_script("device_cache")
    tri, tw = tmp_path / "run1" / "triton", tmp_path / "run1" / "tilewise"
    _triton_entry(tri, "KEYA", "attn_fwd", os.urandom(5000))
    _triton_entry(tri, "KEYB", "add", os.urandom(300))
    (tri / "LAUNCHER").mkdir()
    (tri / "LAUNCHER" / "cuda_utils.so").write_bytes(b"\x7fELF" + os.urandom(100))
    (tw / "autotune").mkdir(parents=True)
    (tw / "autotune" / "picks.json").write_text("{}")
    (tw / "abc123.cubin").write_bytes(b"cubin")
    (tw / "abc123.json").write_text("{}")
    (tw / "fused").mkdir()
    (tw / "fused" / "k.cu").write_text("// fused")
    assert dc.main(["export", "--triton", str(tri), "--tilewise", str(tw), "--out", str(tmp_path / "seed")]) == 0

    new_tri, new_tw = tmp_path / "run2" / "triton", tmp_path / "run2" / "tilewise"
    assert dc.main(["restore", "--seed", str(tmp_path / "seed"), "--triton", str(new_tri),
                    "--tilewise", str(new_tw)]) == 0
    grp = json.loads((new_tri / "KEYA" / "__grp__attn_fwd.json").read_text())["child_paths"]
    assert sorted(grp) == ["attn_fwd.cubin", "attn_fwd.json", "attn_fwd.ptx", "attn_fwd.ttgir"]
    for name, path in grp.items():
        assert Path(path) == new_tri.resolve() / "KEYA" / name and Path(path).is_file()
    assert (new_tri / "KEYA" / "attn_fwd.cubin").read_bytes() == (tri / "KEYA" / "attn_fwd.cubin").read_bytes()
    assert not (new_tri / "KEYA" / "attn_fwd.llir").exists() and not (new_tri / "KEYA" / "attn_fwd.source").exists()
    assert (new_tri / "LAUNCHER" / "cuda_utils.so").is_file()
    assert (new_tw / "abc123.cubin").read_bytes() == b"cubin" and (new_tw / "fused" / "k.cu").is_file()
    assert not (new_tw / "autotune").exists()  # picks timed on another machine are not carried
    assert (new_tw.stat().st_mode & 0o777) == 0o700  # tilewise loads cubins only from a private folder


def test_an_entry_missing_its_binary_is_dropped_so_triton_compiles_it(tmp_path):
    dc = load_script("device_cache")
    tri = tmp_path / "triton"
    _triton_entry(tri, "KEYA", "k", b"cubin")
    seed = tmp_path / "seed"
    dc.main(["export", "--triton", str(tri), "--tilewise", str(tmp_path / "none"), "--out", str(seed)])
    # the same part without the cubin
    with tarfile.open(seed / "seed-1.tgz") as t:
        members = [(m, t.extractfile(m).read()) for m in t.getmembers() if not m.name.endswith(".cubin")]
    with tarfile.open(seed / "seed-1.tgz", "w:gz") as t:
        for m, data in members:
            t.addfile(m, io.BytesIO(data))
    new = tmp_path / "new"
    dc.main(["restore", "--seed", str(seed), "--triton", str(new), "--tilewise", str(tmp_path / "tw")])
    assert not (new / "KEYA" / "__grp__k.json").exists()


@pytest.mark.parametrize("bad", ["../evil", "/etc/evil", "triton/../../evil", "other/x", "link"])
def test_restore_refuses_members_outside_the_caches(tmp_path, bad):
    dc = load_script("device_cache")
    seed = tmp_path / "seed"
    seed.mkdir()
    with tarfile.open(seed / "seed-1.tgz", "w:gz") as t:
        info = tarfile.TarInfo(bad)
        if bad == "link":
            info.name, info.type, info.linkname = "triton/K/x", tarfile.SYMTYPE, "/etc/passwd"
            t.addfile(info)
        else:
            info.size = 4
            t.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(ValueError, match="refusing archive member"):
        dc.main(["restore", "--seed", str(seed), "--triton", str(tmp_path / "t"), "--tilewise", str(tmp_path / "w")])
    assert not (tmp_path / "evil").exists() and not (tmp_path / "t" / "K" / "x").exists()


def test_export_keeps_parts_under_the_size_and_the_largest_entries_within_the_budget(tmp_path, monkeypatch):
    dc = load_script("device_cache")
    monkeypatch.setattr(dc, "PART_BYTES", 300_000)
    monkeypatch.setattr(dc, "MARGIN", 60_000)
    tri = tmp_path / "triton"
    for i in range(40):  # incompressible cubins of 10-49 KB
        _triton_entry(tri, f"K{i:02d}", "k", os.urandom(10_000 + 1000 * i))
    out = tmp_path / "seed"
    dc.export(tri, tmp_path / "none", out, budget_bytes=700_000)
    parts = sorted(out.glob("seed-*.tgz"))
    assert len(parts) >= 2
    assert all(p.stat().st_size <= 300_000 for p in parts)
    assert sum(p.stat().st_size for p in parts) <= 700_000
    kept = set()
    for p in parts:
        with tarfile.open(p) as t:
            kept |= {m.name.split("/")[1] for m in t.getmembers()}
    assert "K39" in kept and "K00" not in kept  # the largest kernels first; the budget cut the smallest


def test_seed_script_shares_one_seeded_cache_and_exports_it(tmp_path):
    """scripts/_seed.sh sourced in a call: the caches unpacked from .cache/device-seed, the seed named for
    gpu-check's record, and seed_export writing $OUT/seed; with no seed, empty caches said so; on a machine
    still warm from a call, its caches kept."""
    import shutil
    import subprocess

    dc = load_script("device_cache")
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("_seed.sh", "device_cache.py"):
        shutil.copy(Path(__file__).resolve().parents[1] / "scripts" / name, repo / "scripts" / name)
    tri = tmp_path / "made" / "triton"
    _triton_entry(tri, "KEYA", "k", b"cubin")
    env = dict(os.environ, TILEWISE_SEED_ROOT=str(tmp_path / "seeded"), OUT=str(tmp_path / "out"))
    script = 'source scripts/_seed.sh; echo "T=$TRITON_CACHE_DIR"; echo "S=$TILEWISE_CACHE_SEED"; seed_export'

    none = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, check=True)
    assert "S=emptied first (no seed carried)" in none.stdout

    dc.export(tri, tmp_path / "none", repo / ".cache" / "device-seed", budget_bytes=1 << 20)
    shutil.rmtree(tmp_path / "seeded")  # a fresh machine
    run = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, check=True)
    assert f"T={tmp_path / 'seeded' / 'triton'}" in run.stdout
    assert "S=seeded (device_cache restore: 1 parts; Triton 1 entries (0 dropped)" in run.stdout
    assert (tmp_path / "seeded" / "triton" / "KEYA" / "k.cubin").read_bytes() == b"cubin"
    assert (tmp_path / "out" / "seed" / "seed-1.tgz").is_file()
    # a second call on the same (warm) machine keeps the caches it finds
    (tmp_path / "seeded" / "triton" / "KEYB").mkdir()
    again = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, check=True)
    assert "then kept from the machine's last call" in again.stdout
    assert (tmp_path / "seeded" / "triton" / "KEYB").is_dir()


def test_a_damaged_part_is_skipped_and_the_others_restored(tmp_path, capsys):
    dc = load_script("device_cache")
    tri = tmp_path / "triton"
    _triton_entry(tri, "KEYA", "k", b"cubin")
    seed = tmp_path / "seed"
    dc.main(["export", "--triton", str(tri), "--tilewise", str(tmp_path / "none"), "--out", str(seed)])
    (seed / "seed-2.tgz").write_bytes((seed / "seed-1.tgz").read_bytes()[:40])  # truncated
    new = tmp_path / "new"
    assert dc.main(["restore", "--seed", str(seed), "--triton", str(new), "--tilewise", str(tmp_path / "tw")]) == 0
    assert "2 parts (1 damaged); Triton 1 entries" in capsys.readouterr().out
    assert (new / "KEYA" / "k.cubin").read_bytes() == b"cubin"
