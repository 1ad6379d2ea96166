"""CPU runs (CI) test references, the compile check, the harness and the CLI; `pytest -m gpu` runs
the kernels on a GPU (the quick tier; tiers, shards and the kernel ledger: gpu_tiers.py,
gpu_ledger.py). Without a GPU, Triton kernels run in the interpreter."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

pytest_plugins = ["gpu_tiers", "gpu_ledger"]

HAS_CUDA = torch.cuda.is_available()
# The CLI called in-process must not move this process's bytecode (tests/test_bytecode.py turns it on)
os.environ.setdefault("TILEWISE_BYTECODE_CACHE", "0")
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_attention_plans():
    """No attention call plan (ops/attention/plans.py) carried from one test to the next: a test that
    changes a route or a table must not replay a call planned before it."""
    from tilewise.ops.attention import plans

    plans.clear()
    yield
    plans.clear()


CACHED_BYTES_KEPT = 2 << 30  # per test process, between GPU tests


@pytest.fixture(autouse=True)
def _return_cached_gpu_memory():
    """After a test, a worker that keeps over 2 GiB in PyTorch's caching allocator gives it back: under
    pytest-xdist each of 16 workers kept what its largest test had reserved (up to 12.5 GiB), and on an
    80 GB H100 two tests then failed with out-of-memory that pass alone (quick tier at def20c4,
    bench/results/logs/gpu-check-quick-def20c4.log)."""
    yield
    if HAS_CUDA and torch.cuda.is_initialized() and torch.cuda.memory_reserved() > CACHED_BYTES_KEPT:
        torch.cuda.empty_cache()


@pytest.fixture
def one_thread():
    """One CPU thread for the test: the CI machine's cores are shared, and more threads only contend
    on tiny matrices."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty kernel cache for this test only."""
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def compiles_for_sm90_without_spills(src, names) -> None:
    """The kernel names a launcher asks for (not only the instantiate lines) compile from ``src`` for
    sm_90 (NVRTC, no GPU needed), each using registers and spilling none."""
    from tilewise.runtime import cuda as rt

    m = rt.compile_file(src, arch="sm_90", name_expressions=names)
    assert sorted(m.symbol_mapping) == sorted(names)
    for r in m.resources:
        assert r.registers > 0 and not r.spills, r


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so that an element the kernel never wrote fails the comparison."""
    return t.fill_(float("nan"))


def load_script(name: str):
    """The module ``scripts/<name>.py`` (scripts are not a package), freshly executed."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
