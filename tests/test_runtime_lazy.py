"""runtime/lazy.py: kernels compiled one at a time on first use, the whole module where it is cached.

CPU: the load path with a recording stand-in for ``cuda.load``; ``is_cached`` against real NVRTC
compiles for sm_90; every lazily loaded file's first and last kernels compile alone for sm_90."""

import pytest
import torch

from tilewise.runtime import cuda as rt
from tilewise.runtime import lazy

SRC = "pointwise/vector_add.cu"


class _FakeModule:
    def __init__(self, names):
        self.names = names

    def kernel(self, name, params):
        return (self.names, name, params)


@pytest.fixture
def loads(monkeypatch):
    """cuda.load replaced: records each (names) it is asked for, returns a module of those names."""
    calls = []

    def fake_load(path, names, options, device_index):
        calls.append(tuple(names))
        return _FakeModule(tuple(names))

    monkeypatch.setattr(lazy, "load", fake_load)
    return calls


def _module(cached: bool, monkeypatch):
    monkeypatch.setattr(lazy, "is_cached", lambda *a, **k: cached)
    return lazy.LazyModule(SRC, ["a<float>", "b<float>", "a<float>", "c<float>"], ("-std=c++17",), 0, "sm_90")


def test_first_use_compiles_that_kernel_alone(loads, monkeypatch):
    mod = _module(False, monkeypatch)
    assert mod.names == ("a<float>", "b<float>", "c<float>")  # order kept, duplicates dropped
    assert "b<float>" in mod and "d<float>" not in mod
    assert mod.kernel("b<float>", ("p",)) == (("b<float>",), "b<float>", ("p",))
    assert mod.kernel("a<float>", ()) == (("a<float>",), "a<float>", ())
    assert loads == [("b<float>",), ("a<float>",)]


def test_a_cached_whole_module_is_loaded_once_instead(loads, monkeypatch):
    mod = _module(True, monkeypatch)
    assert mod.kernel("c<float>", ())[0] == mod.names
    assert mod.kernel("a<float>", ())[0] == mod.names
    assert loads == [mod.names]


def test_compile_all_loads_the_whole_module_and_kernels_come_from_it(loads, monkeypatch):
    mod = _module(False, monkeypatch)
    mod.compile_all()
    assert mod.kernel("b<float>", ())[0] == mod.names
    assert loads == [mod.names]


def test_a_name_outside_the_module_is_a_key_error(loads, monkeypatch):
    with pytest.raises(KeyError, match="vector_add.cu has no kernel 'd<float>'"):
        _module(False, monkeypatch).kernel("d<float>", ())
    assert loads == []


def test_load_lazy_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        lazy.load_lazy(SRC, ["vector_add_v1_naive<float>"])


def test_is_cached_follows_the_disk_cache(fresh_cache):
    names = ("vector_add_v1_naive<float>",)
    assert not lazy.is_cached(SRC, names, arch="sm_90")
    rt.compile_file(SRC, name_expressions=names, arch="sm_90")
    assert lazy.is_cached(SRC, names, arch="sm_90")
    assert not lazy.is_cached(SRC, names + ("vector_add_v1_naive<__half>",), arch="sm_90")  # another name set
    assert not lazy.is_cached(SRC, names, arch="sm_80")  # another arch
    assert not lazy.is_cached(SRC, names, options=("-std=c++17", "-DX=1"), arch="sm_90")  # other options


def _lazy_files():
    from tilewise.ops.embedding import api as emb
    from tilewise.ops.pointwise import elementwise, reduce
    from tilewise.ops.rowwise import cluster

    names = {"rowwise/cluster.cu": cluster.module_names()}
    names["embedding/embedding.cu"] = emb.module_names(False)
    for dt in (torch.float32, torch.bfloat16):
        names[f"pointwise/elementwise.cu {dt}"] = elementwise.module_names(dt)
        names[f"pointwise/reduce.cu {dt}"] = reduce.module_names(dt)
    return names


@pytest.mark.parametrize("label", sorted(_lazy_files()))
def test_lazily_loaded_kernels_compile_alone(label, fresh_cache):
    """What a first call compiles (one kernel a program) builds: the first and last of each list."""
    names = _lazy_files()[label]
    src = label.split()[0]
    for n in dict.fromkeys((names[0], names[len(names) // 2], names[-1])):
        m = rt.compile_file(src, name_expressions=(n,), arch="sm_90")
        # (a file's plain extern "C" kernels come with any name: elementwise.cu's divergence demo)
        assert n in m.symbol_mapping and n in {r.name for r in m.resources}
