"""ruff over src/ and tests/ (pyproject.toml's [tool.ruff]): part of the README's test command; and no
comment or docstring in src/ that tells history (a log file, a commit, a session) instead of why."""

import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    exe = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    p = subprocess.run([exe, "check", "src", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


# a log file, the logs folder, a commit-like hex word (7+ hex digits with a letter and a digit), a session
_HISTORY = re.compile(r"\b[\w.-]+\.log\b|bench/results/logs|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"
                      r"|\bsession\s*\d+", re.I)


def _comments(path: Path):
    """(line, text) of every comment and docstring-like string of a .py, .cu or .cuh file."""
    text = path.read_text()
    if path.suffix == ".py":
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING
                                                and tok.string.lstrip("rbuRBU").startswith(('"""', "'''"))):
                yield tok.start[0], tok.string
    else:
        for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S):
            yield text.count("\n", 0, m.start()) + 1, m.group(0)


def test_no_history_in_source_comments():
    """Measurement history lives in docs/tuning/<family>.md; comments in src/ point there."""
    found = [f"{p.relative_to(ROOT)}:{line}: {m.group(0)}"
             for p in sorted((ROOT / "src" / "tilewise").rglob("*"))
             if p.suffix in (".py", ".cu", ".cuh") and "__pycache__" not in p.parts
             for line, text in _comments(p) for m in _HISTORY.finditer(text)]
    assert not found, "history in comments (move it to docs/tuning):\n  " + "\n  ".join(found)


def test_history_rule_catches_what_it_should(tmp_path):
    f = tmp_path / "k.py"
    f.write_text('"""Tiles from gemm-sm90-configs-154a553.log."""\nx = 1  # measured at 2a40fd4 in session 11\n'
                 "y = 0xFFFFFFFF  # 1048576 rows, the first pass does not wait\n")
    hits = [m.group(0) for _, t in _comments(f) for m in _HISTORY.finditer(t)]
    assert hits == ["gemm-sm90-configs-154a553.log", "2a40fd4", "session 11"]


_ENV_READ = re.compile(r"\bos\.(environ|getenv|putenv)\b|\bfrom os import [^\n]*\b(environ|getenv)\b")


def env_reads(root: Path) -> list[str]:
    """Places under ``root`` that read the environment, outside ``settings.py``."""
    return [f"{p.relative_to(root)}:{text.count(chr(10), 0, m.start()) + 1}"
            for p in sorted(root.rglob("*.py")) if p.name != "settings.py" and "__pycache__" not in p.parts
            for text in [p.read_text()] for m in _ENV_READ.finditer(text)]


def test_the_environment_is_read_in_settings_alone():
    """Every variable tilewise reads is in one table (settings.py), not found by grepping modules."""
    found = env_reads(ROOT / "src" / "tilewise")
    assert not found, "read the environment through tilewise.settings:\n  " + "\n  ".join(found)


def test_env_rule_catches_what_it_should(tmp_path):
    (tmp_path / "a.py").write_text("import os\nx = os.environ.get('A')\n")
    (tmp_path / "b.py").write_text("from os import getenv\n")
    (tmp_path / "settings.py").write_text("import os\nos.environ\n")
    (tmp_path / "c.py").write_text("import os\nos.path.join('a')\n")
    assert env_reads(tmp_path) == ["a.py:2", "b.py:1"]
