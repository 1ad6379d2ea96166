"""The package's shape, checked on the CPU: no import cycle between tilewise modules, no oversized file.

The import graph is read from the source (``ast``), so an import inside a function counts as much as
one at the top of a module: hiding a cycle in a function defers it, it does not remove it.
"""

import ast
import pkgutil
from pathlib import Path

import tilewise

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tilewise"
MAX_LINES = 800

# Files over MAX_LINES that are being split in other branches right now. The list may only shrink:
# a listed file that is back under the limit (or gone) fails the test until it is taken out.


def modules() -> dict[str, Path]:
    """Every module of the package: its dotted name -> its source file."""
    assert Path(tilewise.__file__).resolve().parent == SRC, (
        f"tilewise is imported from {tilewise.__file__}, not from this checkout's {SRC} (set PYTHONPATH=src)")
    out = {"tilewise": SRC / "__init__.py"}
    for info in pkgutil.walk_packages(tilewise.__path__, "tilewise."):
        out[info.name] = Path(info.module_finder.find_spec(info.name).origin)
    return out


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The tilewise modules ``name`` imports anywhere in its source (top level and in functions)."""
    is_package = path.name == "__init__.py"
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    # imports under `if TYPE_CHECKING:` never run, so they cannot make a cycle
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "tilewise")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "tilewise":
                continue
            for a in node.names:  # `from pkg import mod` imports the module mod, `from mod import f` mod
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    out.discard(name)
    return {m for m in out if m in known}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imported(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_sees_imports_in_functions_and_relative_imports(tmp_path):
    pkg = tmp_path / "tilewise" / "ops"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    src = ("from typing import TYPE_CHECKING\nfrom . import b as bb\nfrom ..cost import Cost\nif TYPE_CHECKING:\n"
           "    from .e import T\ndef f():\n    from .c import g\n    import tilewise.ops.d\n")
    (pkg / "a.py").write_text(src)
    known = {"tilewise", "tilewise.cost", "tilewise.ops", "tilewise.ops.a", "tilewise.ops.b", "tilewise.ops.c",
             "tilewise.ops.d", "tilewise.ops.e"}
    assert imported("tilewise.ops.a", pkg / "a.py", known) == {
        "tilewise.ops.b", "tilewise.cost", "tilewise.ops.c", "tilewise.ops.d"}
    (pkg / "__init__.py").write_text("from .a import f\nfrom .. import cost\n")
    assert imported("tilewise.ops", pkg / "__init__.py", known) == {"tilewise.ops.a", "tilewise.cost"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    graph["c"].discard("a")
    assert find_cycle(graph) is None


def test_no_import_cycles():
    graph = import_graph()
    assert "tilewise.ops.pointwise.elementwise" in graph and graph["tilewise.ops.pointwise.fusion"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle (break it with a module both sides import): " + " -> ".join(cycle)


def test_no_file_over_the_line_limit():
    long = {}
    for p in sorted(SRC.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            n = p.read_bytes().count(b"\n")
            if n > MAX_LINES:
                long[p.relative_to(ROOT).as_posix()] = n
    assert not long, f"files over {MAX_LINES} lines (split them): {long}"
