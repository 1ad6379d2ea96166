"""The GPU suite's tiers, shards and kernel ledger, checked on the CPU.

``test_every_kernel_build_ran_in_the_quick_tier`` is the coverage rule: every CUDA C instantiation a
``.cu`` declares, every entry of every ``*VARIANTS`` table, every Triton / Gluon kernel of
``tilewise.ops`` (the jit functions named ``*_kernel``) and every entry of their tile tables
(``config_entries``: attention's, the Gluon kernels', the GEMM autotuner's) must have run on a GPU
in a test that the quick tier still collects, according to
the ledger that ``scripts/gpu-check`` recorded (``bench/results/gpu-coverage.json``). Dropping a
variant's last quick-tier test, or adding a kernel build without a GPU run, fails here.
"""

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpu_ledger
import gpu_tiers

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
LEDGER = ROOT / "bench" / "results" / "gpu-coverage.json"

GAPS = TESTS / "gpu_coverage_gaps.txt"


def known_gaps() -> dict[str, str]:
    """{"kind build": reason} from tests/gpu_coverage_gaps.txt: builds the ledger has not seen run
    in the quick tier, each under a "## reason" line. The list may only shrink: the test fails when
    an entry runs after all or is no longer declared."""
    gaps, reason = {}, None
    for line in GAPS.read_text().splitlines() if GAPS.exists() else []:
        line = line.strip()
        if line.startswith("## "):
            reason = line[3:]
        elif line and not line.startswith("#"):
            assert reason, f"{GAPS}: {line!r} has no '## reason' line above it"
            gaps[line] = reason
    return gaps


def _collect(*args, cwd=ROOT, env=None) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         cwd=cwd, capture_output=True, text=True, env=env)
    assert out.returncode in (0, 5), out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


# --------------------------------------------------------------------------- tiers and shards


def _fake_suite(tmp_path: Path) -> dict:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["gpu_tiers"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: gpu\n")
    (tmp_path / "test_fake.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.gpu
        @pytest.mark.parametrize("n", [1, 33, 4097])
        @pytest.mark.parametrize("variant", ["a", "b", "c", "d"])
        @pytest.mark.quick(rotate="n")
        def test_rotated(variant, n):
            pass

        @pytest.mark.gpu
        @pytest.mark.parametrize("n", [1, 33, 4097])
        @pytest.mark.parametrize("variant", ["a", "b"])
        @pytest.mark.quick(rotate="n", per=2)
        def test_two_each(variant, n):
            pass

        @pytest.mark.gpu
        @pytest.mark.parametrize("D", [64, 128])
        @pytest.mark.quick(where=lambda D: D == 128)
        def test_where(D):
            pass

        @pytest.mark.gpu
        @pytest.mark.slow
        def test_slow():
            pass

        @pytest.mark.gpu
        def test_plain():
            pass

        def test_cpu():
            pass
        """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return env


def test_tiers_split_every_test_once(tmp_path):
    env = _fake_suite(tmp_path)
    quick = _collect("--tier", "quick", cwd=tmp_path, env=env)
    full = _collect("--tier", "full", cwd=tmp_path, env=env)
    every = _collect("--tier", "all", cwd=tmp_path, env=env)
    gpu_quick = [i for i in quick if "test_cpu" not in i]
    assert sorted(gpu_quick + full) == sorted(i for i in every if "test_cpu" not in i)
    assert "test_fake.py::test_cpu" in quick and "test_fake.py::test_cpu" not in full
    rotated = [i for i in gpu_quick if "test_rotated" in i]
    assert 4 <= len(rotated) <= 4 + 3  # each variant at one n (plus an n no variant drew) ...
    assert {i.split("[")[1].split("-")[0] for i in rotated} == {"a", "b", "c", "d"}
    assert {i.split("-")[1].rstrip("]") for i in rotated} == {"1", "33", "4097"}  # ... every n somewhere
    two = [i for i in gpu_quick if "test_two_each" in i]
    assert all(sum(v in i for i in two) >= 2 for v in ("[a-", "[b-")) and len(two) <= 5
    assert {i.split("-")[1].rstrip("]") for i in two} == {"1", "33", "4097"}
    assert [i for i in gpu_quick if "test_where" in i] == ["test_fake.py::test_where[128]"]
    assert "test_fake.py::test_slow" in full and "test_fake.py::test_plain" in gpu_quick


def test_rotation_choices_depend_on_the_values_alone():
    """A value added to a parameter that is not rotated keeps every other choice (a numbering by
    collection order would shift the later combinations' values)."""
    from types import SimpleNamespace

    def items(variants):
        mark = SimpleNamespace(args=(), kwargs={"rotate": "n"})
        group = [SimpleNamespace(nodeid=f"t[{v}-{n}]", callspec=SimpleNamespace(params={"variant": v, "n": n}))
                 for v in variants for n in (1, 33, 4097, 65537)]
        return mark, group

    before = gpu_tiers._quick_ids(*items(["a", "c", "d", "e", "f"]))
    after = gpu_tiers._quick_ids(*items(["a", "b", "c", "d", "e", "f"]))
    assert {i for i in after if not i.startswith("t[b-")} == before
    assert len({i for i in after if i.startswith("t[b-")}) == 1


def test_shards_partition_and_balance():
    ids = [f"t{i}" for i in range(50)]
    seconds = {f"t{i}": float((i * 7) % 13 + 1) for i in range(45)}  # five without a record
    for n in (1, 2, 3, 5):
        where = gpu_tiers.shard_of(ids, n, seconds)
        assert sorted(set(where)) == list(range(n)) and len(where) == len(ids)
        default = sorted(seconds.values())[len(seconds) // 2]
        load = [sum(seconds.get(i, default) for i, s in zip(ids, where) if s == k) for k in range(n)]
        assert max(load) - min(load) <= max(seconds.values())
        assert gpu_tiers.shard_of(ids, n, seconds) == where  # deterministic


def test_shard_option_selects_disjoint_parts(tmp_path):
    env = _fake_suite(tmp_path)
    every = _collect("--tier", "all", "-m", "gpu", cwd=tmp_path, env=env)
    parts = [_collect("--tier", "all", "-m", "gpu", "--shard", f"{k}/3", cwd=tmp_path, env=env) for k in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(every)
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--shard", "4/3"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "K must be between 1 and N" in out.stderr


def test_recorded_durations_cover_the_gpu_suite():
    """Shards balance on recorded seconds: most GPU tests must have one (new tests count as the median)."""
    seconds = gpu_tiers.recorded_durations()
    every = _collect("--tier", "all", "-m", "gpu", "tests")
    known = sum(i in seconds for i in every)
    assert known >= 0.9 * len(every), f"only {known} of {len(every)} GPU tests have a recorded duration"


# --------------------------------------------------------------------------- the coverage rule


def declared_builds() -> dict[str, set[str]]:
    """What the sources declare: CUDA C instantiations, VARIANTS entries, Triton / Gluon kernels."""
    from tilewise.runtime import cuda
    import tilewise.ops as ops

    builds = {"cuda": set(), "variants": set(), "triton": set(), "config": set()}
    for src in cuda.package_sources():
        builds["cuda"].update(cuda.name_expressions_for(src))
    for info in pkgutil.walk_packages(ops.__path__, "tilewise.ops."):
        mod = importlib.import_module(info.name)
        for name, table in vars(mod).items():
            if name.endswith("VARIANTS") and isinstance(table, dict):
                builds["variants"].update(f"{mod.__name__}.{name}[{k}]" for k, v in table.items() if callable(v))
    # launched kernels are named *_kernel; the other jit functions are device helpers they inline
    builds["triton"] = {q for q, _ in gpu_ledger.jit_functions()
                        if q.startswith("tilewise.ops.") and q.endswith("_kernel")}
    builds["config"] = set(config_entries())
    return builds


_AK = "tilewise.ops.attention.triton_kernels."
# attention's configs.TABLES kinds -> the kernels that take that table's tile, with the constexprs that say
# the kind (the forward table serves the pointer and the TMA kernel alike).
_ATTENTION_KINDS = {
    "fwd": [(_AK + "_attn_fwd_kernel", {"HAS_BIAS": False}), (_AK + "_attn_fwd_tma_kernel", {"HAS_BIAS": False})],
    "fwd_bias": [(_AK + "_attn_fwd_kernel", {"HAS_BIAS": True})],
    "fwd_tma_bias": [(_AK + "_attn_fwd_tma_kernel", {"HAS_BIAS": True})],
    "fwd_bias_pair": [(_AK + "_attn_fwd_bias_pair_kernel", {})],
    "dkdv": [(_AK + "_attn_bwd_dkdv_kernel", {})],
    "dq": [(_AK + "_attn_bwd_dq_kernel", {"BIAS_GRAD": False})],
    "dq_bias": [(_AK + "_attn_bwd_dq_kernel", {"BIAS_GRAD": True})],
    "atomic": [(_AK + "_attn_bwd_atomic_kernel", {"BIAS_GRAD": False, "DQ_TMA": False})],
    "atomic_bias": [(_AK + "_attn_bwd_atomic_kernel", {"BIAS_GRAD": True, "DQ_TMA": False})],
    "atomic_tma": [(_AK + "_attn_bwd_atomic_kernel", {"BIAS_GRAD": False, "DQ_TMA": True})],
    "atomic_tma_bias": [(_AK + "_attn_bwd_atomic_kernel", {"BIAS_GRAD": True, "DQ_TMA": True})],
}


def config_entries() -> dict[str, list[tuple[str, dict]]]:
    """Each entry of the Triton / Gluon config tables -> the (kernel, constexprs) specializations
    that would show it ran. Attention's tables are keyed by head dim (matched through HEAD_DIM); the
    Gluon kernels take the head dim from their descriptors, so their entries match on the tile and
    stages alone; the GEMM autotuner's configs match on the tile, group, stages and warps."""
    from tilewise.ops.attention import configs as ac
    from tilewise.ops.gemm import configs as gc

    out = {}
    assert set(ac.TABLES) == set(_ATTENTION_KINDS), "attention's configs.TABLES changed: update _ATTENTION_KINDS"
    c = "tilewise.ops.attention.configs."
    for tname, tables in (("TABLES", ac.TABLES), ("TABLES_2BYTE", ac.TABLES_2BYTE)):
        for kind, table in tables.items():
            for key, (bm, bn, warps, stages) in table.items():
                need = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "@D": key}
                out[f"{c}{tname}[{kind}][{key}]"] = [(k, {**cx, **need}) for k, cx in _ATTENTION_KINDS[kind]]
    g = "tilewise.ops.attention.gluon_fwd."
    for (D, bias), (bn, stages) in ac.WS_FWD_TILES.items():
        out[f"{c}WS_FWD_TILES[{D},{bias}]"] = [(g + "attn_fwd_ws_kernel",
                                                {"HAS_BIAS": bias, "BLOCK_N": bn, "STAGES": stages})]
    g = "tilewise.ops.attention.gluon_bwd."
    for D, (bm, stages) in ac.WS_BWD_DKDV_TILES.items():
        out[f"{c}WS_BWD_DKDV_TILES[{D}]"] = [(g + "attn_bwd_dkdv_ws_kernel", {"BLOCK_M": bm, "STAGES": stages})]
    for D, (bn, stages) in ac.WS_BWD_DQ_TILES.items():
        out[f"{c}WS_BWD_DQ_TILES[{D}]"] = [(g + "attn_bwd_dq_ws_kernel", {"BLOCK_N": bn, "STAGES": stages})]
    k = "tilewise.ops.gemm.triton_kernels."
    for t in gc.AUTOTUNE:
        need = {**t.meta(), "num_stages": t.stages, "num_warps": t.warps}
        label = ",".join(f"{n}={v}" for n, v in need.items())
        out[f"tilewise.ops.gemm.configs.AUTOTUNE[{label}]"] = [
            (k + name, need) for name in ("_gemm_kernel", "_gemm_persistent_kernel", "_gemm_tma_persistent_kernel")]
    return out


def _head_dim_key(d: int) -> int:
    """attention's configs.table_key for head dim d."""
    return min(max(16, 1 << (d - 1).bit_length(), 32), 256)


def _spec_matches(constexprs: dict, need: dict) -> bool:
    for k, v in need.items():
        if k == "@D":
            if "HEAD_DIM" not in constexprs or _head_dim_key(constexprs["HEAD_DIM"]) != v:
                return False
        elif constexprs.get(k, object()) != v:
            return False
    return True


def covered(ledger: dict, quick: set[str]) -> dict[str, set[str]]:
    """Builds the ledger saw run in a test the quick tier still collects."""
    out = {}
    for kind, builds in ledger.items():
        names = {b for b, tests in builds.items() if quick.intersection(tests)}
        if kind == "triton":
            specs = [(b.split(" ", 1)[0], json.loads(b.split(" ", 1)[1]) if " " in b else {}) for b in names]
            out["config"] = {label for label, alts in config_entries().items()
                             if any(k == name and _spec_matches(cx, need) for k, need in alts for name, cx in specs)}
            names = {b.split(" ", 1)[0] for b in names}
        out[kind] = names
    return out


def test_every_kernel_build_ran_in_the_quick_tier():
    assert LEDGER.is_file(), f"{LEDGER} is missing: run scripts/gpu-check on a GPU and commit what it writes"
    ledger = json.loads(LEDGER.read_text())
    quick = set(_collect("-m", "gpu", "tests"))
    done = covered(ledger, quick)
    declared = declared_builds()
    gaps = known_gaps()
    missing = [f"{kind} {b}" for kind, names in declared.items() for b in sorted(names - done.get(kind, set()))]
    new = [m for m in missing if m not in gaps]
    assert not new, ("kernel builds no quick-tier GPU test ran (bench/results/gpu-coverage.json); add or "
                     "widen a quick-tier test and run scripts/gpu-check:\n  " + "\n  ".join(new))
    stale = sorted(set(gaps) - set(missing))
    assert not stale, (f"{GAPS.name} lists builds that ran in the quick tier or are no longer declared; "
                       "take them out:\n  " + "\n  ".join(stale))


def test_coverage_rule_fails_when_a_variant_loses_its_tests():
    """The rule above, on the real ledger, with the quick-tier tests of one variant taken away."""
    if not LEDGER.is_file():
        pytest.skip("no ledger yet (test_every_kernel_build_ran_in_the_quick_tier says so)")
    ledger = json.loads(LEDGER.read_text())
    quick = set(_collect("-m", "gpu", "tests"))
    done = covered(ledger, quick)["variants"]

    def its_own(k):  # the quick-tier tests that ran entry k, if every one names its variant
        v = k.split("[")[1].rstrip("]")
        ran = quick.intersection(ledger["variants"][k])
        return ran if all(f"[{v}" in i or f"-{v}" in i for i in ran) else None

    # softmax's v7 where the ledger allows, else the first entry whose tests all name it
    key = next((k for k in ["tilewise.ops.rowwise.softmax.VARIANTS[v7_cluster_tma]", *sorted(done)]
                if k in done and its_own(k)), None)
    assert key is not None, "the ledger shows no VARIANTS entry run by tests that name it"
    assert key not in covered(ledger, quick - its_own(key))["variants"]


def test_long_first_puts_the_longest_tests_at_the_chunk_starts():
    assert gpu_tiers.chunk_starts(10, 3) == [0, 3, 6]  # xdist's first split: 3, 3, 4
    ids = [f"t{i}" for i in range(10)]
    seconds = {"t9": 50.0, "t5": 40.0, "t3": 30.0, "t4": 20.0, "t0": 1.0}
    out = gpu_tiers.long_first(ids, 3, seconds)
    assert sorted(out) == sorted(ids)
    assert [out[p] for p in (0, 3, 6)] == ["t9", "t5", "t3"]
    assert [i for i in out if i not in ("t9", "t5", "t3")] == [i for i in ids if i not in ("t9", "t5", "t3")]
    assert gpu_tiers.long_first(ids[:2], 3, seconds) == ids[:2]  # fewer tests than workers: as collected
