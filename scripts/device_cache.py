"""Carry the kernel caches of one device run into the next: a fresh device machine compiles every Triton,
Gluon and NVRTC kernel of the quick tier again (on the H200 the tier took 235 s cold and 87 s warm,
docs/design.md), out of a session's 30 minutes of device time. ``scripts/_seed.sh`` runs it in a call.

    python3 scripts/device_cache.py export --triton DIR --tilewise DIR --out DIR [--budget-mib 24]
    python3 scripts/device_cache.py restore --seed DIR --triton DIR --tilewise DIR

``export`` (on the device, after a run) writes ``seed-N.tgz`` parts of at most 15 MiB each (the device tool
returns files of at most 16 MiB, 8 a run) and no more than ``--budget-mib`` in all (the carried tree is
64 MiB), the largest kernels first (the longest compiles). Left out: Triton's LLVM IR, TTIR and source dumps
(nothing reads them back; ptx, ttgir and cubin stay: tests read them) and tilewise's timing data (autotune
picks, measured ceilings: they belong to the machine that timed them) and datasets.

``restore`` (on the device, before a run) unpacks the parts into fresh cache folders. Triton's group files
name their members by absolute path, so each is rewritten to the new folder; an entry whose files are not
all there is dropped (Triton then compiles it). Caches are content-addressed (Triton's key holds the
kernel's source, its callees, constants, options, target and Triton's own build; tilewise's the source,
headers, options, arch and NVRTC version), so a seed from an older commit only hits for unchanged kernels.
Parts are read as untrusted archives: regular files only, under ``triton/`` or ``tilewise/``, no ``..``.
"""
import argparse
import gzip
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

PRUNE = {".llir", ".ttir", ".source"}  # IR dumps nothing reads back from a cache hit
TIMING = {"autotune", "ceilings", "data"}  # tilewise cache folders that are not compiled code
PART_BYTES = 15 << 20
MARGIN = 1 << 20  # what zlib may still hold, and the next entry


def _entries(triton: Path, tilewise: Path):
    """(size, [(path, archive name)]) per Triton cache entry and per tilewise cache file."""
    out = []
    if triton.is_dir():
        for d in sorted(p for p in triton.iterdir() if p.is_dir()):
            files = [f for f in sorted(d.iterdir()) if f.is_file() and not f.is_symlink() and f.suffix not in PRUNE]
            if files:
                out.append((sum(f.stat().st_size for f in files), [(f, f"triton/{d.name}/{f.name}") for f in files]))
    if tilewise.is_dir():
        for f in sorted(tilewise.rglob("*")):
            rel = f.relative_to(tilewise)
            if f.is_file() and not f.is_symlink() and rel.parts[0] not in TIMING and not f.name.startswith("."):
                out.append((f.stat().st_size, [(f, f"tilewise/{rel.as_posix()}")]))
    # An entry larger than half a part could push its part past the device tool's 16 MiB: compiled again instead.
    return sorted((e for e in out if e[0] <= PART_BYTES // 2), key=lambda e: -e[0])


def export(triton: Path, tilewise: Path, out: Path, budget_bytes: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("seed-*.tgz"):
        old.unlink()
    entries = _entries(triton, tilewise)
    part, raw, gz, tar = 0, None, None, None
    written = kept = 0

    def close():
        nonlocal written, tar
        if tar is not None:
            tar.close()
            gz.close()
            written += raw.tell()
            raw.close()
            tar = None

    for _, files in entries:
        if tar is not None and raw.tell() > PART_BYTES - MARGIN:
            close()
        if written + (raw.tell() if tar is not None else 0) > budget_bytes - MARGIN:
            break
        if tar is None:
            part += 1
            raw = open(out / f"seed-{part}.tgz", "wb")
            gz = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0)
            tar = tarfile.open(fileobj=gz, mode="w")
        for f, name in files:
            tar.add(f, arcname=name, recursive=False)
        kept += 1
    close()
    print(f"device_cache export: {kept} of {len(entries)} entries, {part} parts, {written / 2**20:.1f} MiB in {out}")
    return 0


def extract(archive: Path, roots: dict) -> int:
    """The regular files of a .tgz ``archive`` written under ``roots[first path component]`` (folders are
    made as needed); anything else (a link, a device), an absolute path, ``..`` or another first component
    raises ValueError before a file is written. Returns the files written. Shared with record_run.py."""
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if not m.isdir()]
        for m in members:
            parts = Path(m.name).parts
            if not m.isfile() or m.name.startswith("/") or ".." in parts or len(parts) < 2 or parts[0] not in roots:
                raise ValueError(f"refusing archive member {m.name!r} of {archive.name}")
        for m in members:
            parts = Path(m.name).parts
            dest = Path(roots[parts[0]]).joinpath(*parts[1:])
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return len(members)


def restore(seed: Path, triton: Path, tilewise: Path) -> int:
    parts = sorted(seed.glob("seed-*.tgz"))
    if not parts:
        print(f"device_cache restore: no seed-*.tgz in {seed}; the caches start empty")
        return 0
    triton.mkdir(parents=True, exist_ok=True)
    tilewise.mkdir(parents=True, exist_ok=True)
    os.chmod(tilewise, 0o700)  # tilewise loads cubins only from a folder that is this user's alone
    broken = 0
    for p in parts:
        try:
            extract(p, {"triton": triton, "tilewise": tilewise})
        except (tarfile.TarError, EOFError, OSError) as e:  # a damaged part: what it held compiles again
            print(f"device_cache restore: {p.name} unreadable ({e}); going on without the rest of it")
            broken += 1
    groups = dropped = 0
    for grp in triton.glob("*/__grp__*.json"):
        data = json.loads(grp.read_text())
        children = {name: str(grp.parent / Path(path).name) for name, path in data.get("child_paths", {}).items()}
        kept = {n: p for n, p in children.items() if os.path.exists(p)}
        if any(n.endswith((".json", ".cubin")) and n not in kept for n in children):
            grp.unlink()  # an entry without its metadata or binary: Triton compiles it again
            dropped += 1
            continue
        tmp = grp.with_suffix(".tmp")
        tmp.write_text(json.dumps({"child_paths": kept}))
        tmp.replace(grp)
        groups += 1
    files = sum(1 for f in tilewise.rglob("*") if f.is_file())
    print(f"device_cache restore: {len(parts)} parts{f' ({broken} damaged)' if broken else ''}; Triton {groups} "
          f"entries ({dropped} dropped), tilewise {files} files")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--triton", type=Path, required=True)
    e.add_argument("--tilewise", type=Path, required=True)
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--budget-mib", type=float, default=24)
    r = sub.add_parser("restore")
    r.add_argument("--seed", type=Path, required=True)
    r.add_argument("--triton", type=Path, required=True)
    r.add_argument("--tilewise", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "export":
        return export(a.triton, a.tilewise, a.out, int(a.budget_mib * 2**20))
    return restore(a.seed, a.triton.resolve(), a.tilewise.resolve())  # Triton's group files hold absolute paths


if __name__ == "__main__":
    sys.exit(main())
