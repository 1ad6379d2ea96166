"""Proof that the GPU sources ran on a GPU: ``bench/results/verified.json`` and ``tilewise verify-status``.

``scripts/gpu-check`` (the quick tier, the quick bench and the compile check, on a GPU) writes the
record: the commit, a SHA-256 per GPU source and one over all of them, the quick tier's counts and
duration. ``tilewise verify-status`` hashes the working tree's GPU sources and says whether they
are the ones the record verified, and which files differ when they are not.

GPU sources: every ``.py``, ``.cu`` and ``.cuh`` under ``ops/`` (kernels, launchers, routing,
configs), ``runtime/`` (compile, cache, launch) and ``nn/`` (the modules that call them).

A file's hash is of its code, not its bytes (``fingerprint``): Python by its syntax tree without
docstrings, CUDA C with comments removed (but the ``// tilewise-`` directives, which choose what
compiles) and whitespace runs collapsed. A comment or docstring edit keeps the record valid; any
change to what runs does not.
"""

from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import json
import re
from pathlib import Path

from ._files import write_atomic

PACKAGE = Path(__file__).resolve().parent
GPU_DIRS = ("ops", "runtime", "nn", "integrations")
SUFFIXES = (".py", ".cu", ".cuh")
RECORD = Path("bench") / "results" / "verified.json"


def gpu_sources(package: Path = PACKAGE) -> list[Path]:
    """The GPU-relevant source files, sorted by their path inside the package."""
    out = [p for d in GPU_DIRS for p in (package / d).rglob("*")
           if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return sorted(out, key=lambda p: p.relative_to(package).as_posix())


HASH_SCHEME = "code-v2"  # what ``fingerprint`` hashes; a record of another scheme cannot be compared


def _canonical(node) -> str:
    """The syntax tree as text, with empty and None fields left out: ``ast.dump`` differs between
    Python versions (3.12 added ``type_params``), this does not, so a record made on the GPU
    machine's Python compares with a checkout on another."""
    if isinstance(node, ast.AST):
        fields = (f"{f}={_canonical(v)}" for f in node._fields
                  if (v := getattr(node, f, None)) is not None and v != [])
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_canonical(v) for v in node) + "]"
    return repr(node)


def _python_code(text: str) -> str:
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return _canonical(tree)


# a string or char literal, a // comment to the end of the line, or a /* */ comment
_C_TOKENS = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


def _c_code(text: str) -> str:
    def keep(m: re.Match) -> str:
        t = m.group(0)
        if t.startswith("/*"):
            return " " + "\n" * t.count("\n")
        if t.startswith("//"):
            return t if t.startswith("// tilewise-") else ""
        return t

    lines = (" ".join(line.split()) for line in _C_TOKENS.sub(keep, text).splitlines())
    return "\n".join(line for line in lines if line)


def fingerprint(path: Path) -> str:
    """SHA-256 of a source's code: comments, docstrings and layout left out (see the module's doc)."""
    text = path.read_text()
    try:
        code = _python_code(text) if path.suffix == ".py" else _c_code(text)
    except SyntaxError:
        code = text  # not parseable: every byte counts
    return hashlib.sha256(code.encode()).hexdigest()


def source_hashes(package: Path = PACKAGE) -> dict[str, str]:
    """{path inside the package: ``fingerprint``} for every GPU source."""
    return {p.relative_to(package).as_posix(): fingerprint(p) for p in gpu_sources(package)}


def digest(hashes: dict[str, str]) -> str:
    """One SHA-256 over every (path, hash) pair, in path order."""
    h = hashlib.sha256()
    for path in sorted(hashes):
        h.update(f"{path}\0{hashes[path]}\n".encode())
    return h.hexdigest()


def repo_root(package: Path = PACKAGE) -> Path | None:
    """The checkout holding this package (src/tilewise), or None for an installed copy."""
    root = package.parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "src" / package.name).is_dir() else None


def write_record(path: Path, *, commit: str, device: str, quick: dict, steps: dict[str, float],
                 package: Path = PACKAGE) -> dict:
    """Write the record atomically; ``quick``: passed / failed / skipped / errors / seconds / workers."""
    hashes = source_hashes(package)
    record = {
        "commit": commit,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device,
        "ok": quick.get("failed", 0) == 0 and quick.get("errors", 0) == 0 and quick.get("passed", 0) > 0,
        "quick_tier": quick,
        "steps_seconds": {k: round(v, 1) for k, v in steps.items()},
        "source_digest": digest(hashes),
        "source_hash": HASH_SCHEME,
        "sources": hashes,
    }
    write_atomic(Path(path), (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return record


def status(record_path: Path | None = None, package: Path = PACKAGE) -> tuple[int, str]:
    """(exit code, message): 0 the GPU sources are the verified ones, 1 they differ or the record
    says the run failed, 2 there is no record to compare with."""
    if record_path is None:
        root = repo_root(package)
        if root is None:
            return 2, "no verification record: this is an installed copy, not a checkout (pass --record)"
        record_path = root / RECORD
    record_path = Path(record_path)
    if not record_path.is_file():
        return 2, f"no verification record at {record_path}: run scripts/gpu-check on a GPU"
    try:
        rec = json.loads(record_path.read_text())
        want = dict(rec["sources"])
        quick = rec["quick_tier"]
    except (ValueError, KeyError, TypeError) as e:
        return 2, f"{record_path} is not a verification record ({e})"
    if rec.get("source_hash", "bytes") != HASH_SCHEME:
        return 2, (f"{record_path} hashes sources as {rec.get('source_hash', 'bytes')!r}, this tilewise as "
                   f"{HASH_SCHEME!r}: run scripts/gpu-check on a GPU")
    have = source_hashes(package)
    where = f"commit {rec.get('commit', '?')} on {rec.get('device', '?')}, {rec.get('date', '?')}"
    counts = (f"quick tier {quick.get('passed', 0)} passed, {quick.get('failed', 0)} failed, "
              f"{quick.get('skipped', 0)} skipped in {quick.get('seconds', 0):.0f} s")
    changed = sorted(p for p in have.keys() & want.keys() if have[p] != want[p])
    added = sorted(have.keys() - want.keys())
    removed = sorted(want.keys() - have.keys())
    if changed or added or removed:
        lines = [f"GPU sources differ from the last verified run ({where}):"]
        lines += [f"  changed {p}" for p in changed] + [f"  new     {p}" for p in added]
        lines += [f"  removed {p}" for p in removed]
        lines.append("Run scripts/gpu-check on a GPU before this lands (README, Contributing).")
        return 1, "\n".join(lines)
    if not rec.get("ok"):
        return 1, f"the GPU sources are the ones verified ({where}), but that run failed: {counts}"
    return 0, f"verified: the GPU sources ({len(have)} files) are the ones that ran at {where}; {counts}"
