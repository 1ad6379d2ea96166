"""verified.json and `tilewise verify-status` on a package tree of their own (CPU)."""

import json

from tilewise import verify


def _package(tmp_path):
    pkg = tmp_path / "src" / "tilewise"
    (pkg / "ops" / "include").mkdir(parents=True)
    (pkg / "runtime").mkdir()
    (pkg / "ops" / "k.cu").write_text("__global__ void k() {}\n")
    (pkg / "ops" / "include" / "h.cuh").write_text("// header\n")
    (pkg / "ops" / "k.py").write_text("X = 1\n")
    (pkg / "runtime" / "launch.py").write_text("Y = 2\n")
    (pkg / "cli.py").write_text("not a GPU source\n")
    (tmp_path / "pyproject.toml").write_text("")
    return pkg


def test_record_then_status(tmp_path):
    pkg = _package(tmp_path)
    assert [p.name for p in verify.gpu_sources(pkg)] == ["h.cuh", "k.cu", "k.py", "launch.py"]
    record = tmp_path / "bench" / "results" / "verified.json"
    code, msg = verify.status(None, pkg)
    assert code == 2 and "scripts/gpu-check" in msg
    quick = dict(passed=10, failed=0, skipped=1, errors=0, seconds=61.5, workers=12)
    rec = verify.write_record(record, commit="abc1234", device="NVIDIA H200", quick=quick,
                              steps={"quick": 61.5}, package=pkg)
    assert rec["ok"] and json.loads(record.read_text())["source_digest"] == verify.digest(verify.source_hashes(pkg))
    code, msg = verify.status(None, pkg)
    assert code == 0 and "abc1234" in msg and "10 passed" in msg
    (pkg / "cli.py").write_text("changed, still not a GPU source\n")
    assert verify.status(None, pkg)[0] == 0
    (pkg / "ops" / "k.cu").write_text("__global__ void k() { int changed = 1; }\n")
    (pkg / "ops" / "new.py").write_text("Z = 3\n")
    code, msg = verify.status(None, pkg)
    assert code == 1 and "changed ops/k.cu" in msg and "new     ops/new.py" in msg


def test_failed_run_and_bad_record(tmp_path):
    pkg = _package(tmp_path)
    record = tmp_path / "v.json"
    verify.write_record(record, commit="abc", device="d", quick=dict(passed=3, failed=1), steps={}, package=pkg)
    code, msg = verify.status(record, pkg)
    assert code == 1 and "that run failed" in msg
    record.write_text("{not json")
    assert verify.status(record, pkg)[0] == 2


def test_installed_copy_has_no_record(tmp_path):
    pkg = tmp_path / "site-packages" / "tilewise"
    (pkg / "ops").mkdir(parents=True)
    code, msg = verify.status(None, pkg)
    assert code == 2 and "installed copy" in msg


def test_fingerprint_is_of_the_code_not_its_comments(tmp_path):
    py, cu = tmp_path / "a.py", tmp_path / "a.cu"
    py.write_text('"""Module doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # why\n')
    cu.write_text('// tilewise-instantiate: k<float>\n// note\ntemplate <typename T> __global__ void k(T* p) {\n'
                  '  p[0] = 1;  /* a\n  b */\n  const char* s = "// not a comment";\n}\n')
    base = verify.fingerprint(py), verify.fingerprint(cu)
    py.write_text('"""Another doc,\nlonger."""\n\n\ndef f(x):\n    """Other."""\n'
                  '    # a comment line\n    return x + 1\n')
    cu.write_text('// tilewise-instantiate: k<float>\n// a different note\n'
                  'template <typename T>  __global__ void k(T* p) {\n'
                  '\n    p[0] = 1;\n  const char* s = "// not a comment";  // why\n}\n')
    assert (verify.fingerprint(py), verify.fingerprint(cu)) == base
    for path, old, new in ((py, "x + 1", "x + 2"), (cu, "k<float>", "k<double>"),
                           (cu, '"// not a comment"', '"// not a comment!"'), (cu, "p[0] = 1", "p[0] = 2")):
        text = path.read_text()
        path.write_text(text.replace(old, new))
        assert verify.fingerprint(path) not in base, (old, new)
        path.write_text(text)


def test_record_of_another_hash_scheme_is_not_compared(tmp_path):
    pkg = _package(tmp_path)
    record = tmp_path / "v.json"
    verify.write_record(record, commit="abc", device="d", quick=dict(passed=3), steps={}, package=pkg)
    rec = json.loads(record.read_text())
    del rec["source_hash"]  # a record of byte hashes
    record.write_text(json.dumps(rec))
    code, msg = verify.status(record, pkg)
    assert code == 2 and "'bytes'" in msg


def test_fingerprint_does_not_depend_on_the_python_version():
    """Python 3.12 added fields (``type_params``) that ``ast.dump`` prints even when empty, so the
    GPU machine's 3.12 and a 3.11 checkout hashed the same code differently. Empty fields are left out."""
    import ast

    src = "def f(x: int) -> int:\n    return x + 1\n\nclass C:\n    pass\n"
    plain = verify._canonical(ast.parse(src))
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            node._fields = tuple(node._fields) + ("type_params",)
            node.type_params = []
    assert verify._canonical(tree) == plain
    assert "type_params" not in plain and "decorator_list" not in plain
    assert verify._canonical(ast.parse(src.replace("x + 1", "x + 2"))) != plain
