"""The kernel ledger: which GPU test ran which kernel build (a pytest plugin, loaded by conftest).

``pytest -m gpu --ledger-out FILE`` records, per test, on the GPU:

- every CUDA C kernel launched (``runtime.cuda.Kernel``, by its name expression, e.g.
  ``map_v1_strided<float,ew::Neg>``): every test that launched it; kernels an op launches through
  the driver with a handle it keeps (gemm_sm90, the cluster kernels): the tests that took the handle;
- every entry of an op's ``*VARIANTS`` table that was called (``tilewise.ops.rowwise.softmax.VARIANTS[v2_fused]``),
  through the table or through the module's own name for it (``attention.v3_flash2``): every test
  that called it;
- every Triton / Gluon kernel specialization compiled or loaded in the process (kernel, constexprs,
  warps, stages): the first test of each worker process that needed it (Triton keeps no per-launch
  record on its fast paths; first use in a process is what its caches show).

and writes FILE (``bench/results/gpu-coverage.json`` from ``scripts/gpu-check``). Recording wraps and
reads; it changes no launch. ``tests/test_gpu_tiers.py`` (CPU, CI) checks the ledger against the
builds the sources declare and the quick tier collected now, so a build no quick-tier test runs fails CI.
"""

from __future__ import annotations

import functools
import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

import pytest

MAX_TESTS = 25  # node ids kept per build: enough that dropping one test rarely drops the build


def pytest_addoption(parser):
    parser.getgroup("tilewise GPU tiers").addoption(
        "--ledger-out", metavar="FILE", default=None,
        help="record which test ran which kernel build (CUDA C, Triton/Gluon, VARIANTS) into FILE")


class Ledger:
    def __init__(self):
        self.current: str | None = None
        self.hits: dict[str, dict[str, set[str]]] = {"cuda": {}, "variants": {}, "triton": {}}
        self.seen_triton: set[tuple[str, str]] = set()
        self.names: dict[int, list[str]] = {}  # id(function) -> its "module.TABLE[key]" names
        self.wrappers: dict[int, object] = {}  # id(function) -> its one wrapper (which keeps it alive)

    def add(self, kind: str, build: str, test: str | None = None) -> None:
        test = test or self.current
        if test is not None:
            self.hits[kind].setdefault(build, set()).add(test)

    # -- CUDA C: every launch through Kernel, and every handle taken for a launch of the op's own
    # (gemm_sm90 and the cluster kernels launch through the driver with a handle they keep)
    def install_cuda(self) -> None:
        from tilewise.runtime import cuda

        call, get = cuda.Kernel.__call__, cuda.Module.kernel
        ledger = self

        @functools.wraps(call)
        def recorded_call(kernel, *args, **kwargs):
            ledger.add("cuda", kernel.name)
            return call(kernel, *args, **kwargs)

        @functools.wraps(get)
        def recorded_get(module, name, *args, **kwargs):
            ledger.add("cuda", name)
            return get(module, name, *args, **kwargs)

        cuda.Kernel.__call__ = recorded_call
        cuda.Module.kernel = recorded_get

    # -- VARIANTS tables: every call
    def install_variants(self) -> None:
        import tilewise.ops as ops

        for info in pkgutil.walk_packages(ops.__path__, "tilewise.ops."):
            mod = importlib.import_module(info.name)
            for table_name, table in list(vars(mod).items()):
                if not (table_name.endswith("VARIANTS") and isinstance(table, dict)):
                    continue
                for key, fn in list(table.items()):
                    if callable(fn):
                        table[key] = self._wrap(fn, f"{mod.__name__}.{table_name}[{key}]")
            # the module's own names for the same functions (``attention.v3_flash2``): calls by name,
            # from tests or from inside the module, go through the wrapper too
            for attr, obj in list(vars(mod).items()):
                if callable(obj) and id(getattr(obj, "__tilewise_ledger_inner__", obj)) in self.names:
                    setattr(mod, attr, self._wrap(obj, None))

    def _wrap(self, fn, name: str | None):
        inner = getattr(fn, "__tilewise_ledger_inner__", fn)
        names = self.names.setdefault(id(inner), [])
        if name is not None and name not in names:
            names.append(name)
        if inner is not fn:
            return fn
        if id(inner) in self.wrappers:
            return self.wrappers[id(inner)]
        ledger = self

        @functools.wraps(inner)
        def recorded(*args, **kwargs):
            for n in names:
                ledger.add("variants", n)
            return inner(*args, **kwargs)

        recorded.__tilewise_ledger_inner__ = inner
        self.wrappers[id(inner)] = recorded
        return recorded

    # -- Triton / Gluon: what the JIT caches hold after each test
    def scan_triton(self, test: str) -> None:
        for qualname, fn in jit_functions():
            for spec in compiled_specs(fn):
                if (qualname, spec) not in self.seen_triton:
                    self.seen_triton.add((qualname, spec))
                    self.add("triton", f"{qualname} {spec}", test)

    def as_json(self) -> dict:
        return {kind: {b: sorted(t) for b, t in sorted(builds.items())} for kind, builds in self.hits.items()}


def jit_functions():
    """(module.name, JITFunction) for every Triton / Gluon kernel defined at module level in tilewise.
    Under TRITON_INTERPRET=1 (the CPU tests) ``triton.jit`` makes InterpretedFunctions: those count
    too, so that the coverage rule sees the same kernels on the CPU as on the GPU."""
    from triton.runtime.jit import JITFunction
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # a Triton without the interpreter
        InterpretedFunction = JITFunction
    kinds = (JITFunction, InterpretedFunction)

    seen = set()
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("tilewise.") or mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            fn = obj
            while fn is not None and not isinstance(fn, kinds) and hasattr(fn, "fn"):
                fn = fn.fn  # autotune / heuristics wrappers
            if not isinstance(fn, kinds) or id(fn) in seen:
                continue
            inner = fn.fn if isinstance(fn, InterpretedFunction) and hasattr(fn, "fn") else fn
            if getattr(inner, "__module__", mod_name) == mod_name:
                seen.add(id(fn))
                yield f"{mod_name}.{inner.__name__}", fn


def compiled_specs(fn) -> list[str]:
    """One string per compiled specialization: constexpr values, warps and stages."""
    out = []
    caches = getattr(fn, "device_caches", None) or {}
    for entry in list(caches.values()):
        cache = entry[0] if isinstance(entry, tuple) else entry
        if not isinstance(cache, dict):
            continue
        for kernel in list(cache.values()):
            out.append(_spec(fn, kernel))
    return out


def _spec(fn, kernel) -> str:
    names = list(getattr(fn, "arg_names", []))
    constexpr_idx = set(getattr(fn, "constexprs", []))
    consts = {}
    for key, value in (getattr(getattr(kernel, "src", None), "constants", None) or {}).items():
        idx = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        if isinstance(idx, int) and idx in constexpr_idx and idx < len(names):
            consts[names[idx]] = value if isinstance(value, (int, float, bool, str, type(None))) else str(value)
    md = getattr(kernel, "metadata", None)
    consts["num_warps"] = getattr(md, "num_warps", None)
    consts["num_stages"] = getattr(md, "num_stages", None)
    return json.dumps(consts, sort_keys=True, separators=(",", ":"))


def spread(tests: set[str]) -> list[str]:
    """At most MAX_TESTS node ids, taken from as many test functions as there are (round robin in
    name order), so that one function's parametrizations do not crowd out the other witnesses."""
    by_fn: dict[str, list[str]] = {}
    for t in sorted(tests):
        by_fn.setdefault(t.split("[", 1)[0], []).append(t)
    out: list[str] = []
    queues = list(by_fn.values())
    while queues and len(out) < MAX_TESTS:
        for q in queues:
            if q and len(out) < MAX_TESTS:
                out.append(q.pop(0))
        queues = [q for q in queues if q]
    return sorted(out)


_LEDGER: dict = {}


def _path(config) -> Path | None:
    p = config.getoption("ledger_out")
    return Path(p) if p else None


def pytest_sessionstart(session):
    config = session.config
    if _path(config) is None or xdist_controller(config):
        return
    import torch

    if not torch.cuda.is_available():
        raise pytest.UsageError("--ledger-out records GPU launches: it needs a CUDA GPU")
    ledger = _LEDGER["ledger"] = Ledger()
    for what, install in (("recording CUDA C launches", ledger.install_cuda),
                          ("recording VARIANTS calls", ledger.install_variants)):
        try:
            install()
        except Exception as e:  # noqa: BLE001 - the tests still run; the ledger says what it misses
            _warn_once(what, e)


def _warn_once(what: str, e: Exception) -> None:
    if what not in _LEDGER.setdefault("warned", set()):
        _LEDGER["warned"].add(what)
        print(f"\ngpu_ledger: {what} failed, the ledger misses it: {type(e).__name__}: {e}", file=sys.stderr)


def xdist_controller(config) -> bool:
    return config.pluginmanager.hasplugin("dsession") and not hasattr(config, "workerinput")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    ledger = _LEDGER.get("ledger")
    if ledger is not None:
        ledger.current = item.nodeid
    yield
    if ledger is not None:
        ledger.current = None
        try:
            ledger.scan_triton(item.nodeid)
        except Exception as e:  # noqa: BLE001 - a Triton whose caches look otherwise: say so, keep testing
            _warn_once("reading Triton's kernel caches", e)


def pytest_sessionfinish(session):
    config = session.config
    path = _path(config)
    if path is None:
        return
    worker = getattr(config, "workerinput", {}).get("workerid")
    ledger = _LEDGER.get("ledger")
    if ledger is not None:
        part = path.with_name(f"{path.name}.{worker or 'main'}.part")
        part.write_text(json.dumps(ledger.as_json()))
    if worker is not None:
        return  # the controller (or the one process) merges
    merged: dict[str, dict[str, set[str]]] = {"cuda": {}, "variants": {}, "triton": {}}
    workers = int(getattr(config.option, "numprocesses", 0) or 0) if xdist_controller(config) else 1
    for _ in range(300):  # the workers' parts: written as each worker finishes
        parts = sorted(path.parent.glob(f"{path.name}.*.part"))
        if len(parts) >= workers:
            break
        time.sleep(0.1)
    for part in parts:
        for kind, builds in json.loads(part.read_text()).items():
            for build, tests in builds.items():
                merged[kind].setdefault(build, set()).update(tests)
        part.unlink()
    from tilewise._files import write_atomic as _write_atomic

    out = {kind: {b: spread(t) for b, t in sorted(builds.items())} for kind, builds in merged.items()}
    _write_atomic(path, (json.dumps(out, indent=1, sort_keys=True) + "\n").encode())
