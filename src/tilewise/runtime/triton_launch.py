"""Triton launches without Triton's per-call dispatch.

``fn[grid](*args, **kwargs)`` runs, on every call, the autotuner's lookup (a dict of all arguments,
its key, the config's pre-hook), the JIT's argument binding and specialization, a cache lookup and
the grid lambda before the launcher itself. On the H200's host that is 50-130 us a GEMM call
against cuBLAS's ~12 us, so a kernel shorter than that is host-bound in eager mode
(docs/tuning/gemm.md, "Cached Triton launch").

``launch(fn, grid, *args, **kwargs)`` does the same launch; after the first call with a given
*signature* it calls the compiled kernel's launcher directly. The signature is what Triton
specializes on, taken conservatively: per positional argument its type, and for tensors the dtype
and whether the pointer is 16-byte aligned, for integers the value, for host tensor descriptors
the dtype, alignment, shape, strides and block shape; every keyword argument by value; and the
current device. Two calls with equal signatures therefore pick the same compiled kernel and the
same autotuned config (the autotuner's key is integers and dtypes, all part of the signature).

Fallbacks to the plain path: the Triton interpreter, launch hooks set (profilers), a kernel whose
arguments are not the plain types above (or a float passed positionally to a constexpr, or a
tensor by keyword), ``TILEWISE_FAST_LAUNCH=0``, and any Triton version whose objects lack what is
used here (checked once, on the first cached call). First calls of a signature (the misses) are
serialized under a lock; cached calls take none.

On the H200's host, cache off / on: gemm v1_tiled 73 -> 27 us a call at 1000^3; gemm(auto)
127 -> 82 us (docs/tuning/gemm.md, "Cached Triton launch"); the outputs are bit-identical
(tests/test_triton_launch.py).

``bind(fn, grid, *args, **kwargs)`` launches the same way and returns a ``Bound``: that kernel,
grid and constexprs, relaunched with new leading arguments and no per-call checks, for a caller
that keys its own calls (gemm()'s call plans). On Triton 3.6 it calls the compiled launcher
directly, each TMA descriptor encoded once per address (``_direct_launcher``): a planned 1000^3
gemm() call 82 -> 13 us of host time (docs/tuning/gemm.md, "Call plans and the direct launcher").
"""

from __future__ import annotations

import threading

import torch

from .. import settings

# Read once for the process: the launch path is hot (set_enabled changes the first)
_ENABLED = settings.fast_launch()
_DIRECT_ON = settings.direct_launch()  # Bound's raw-launcher path
_INTERPRET = settings.triton_interpret()
_MAX_ENTRIES = 4096  # per kernel; cleared when full (shapes of a training run are few)

_TensorDescriptor = None


def _td_type():
    global _TensorDescriptor
    if _TensorDescriptor is None:
        from triton.tools.tensor_descriptor import TensorDescriptor
        _TensorDescriptor = TensorDescriptor
    return _TensorDescriptor


_GluonTD = []


def _gluon_td_type():
    """Gluon's host descriptor class (it carries a shared-memory layout), or None without Gluon."""
    if not _GluonTD:
        try:
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
            _GluonTD.append(TensorDescriptor)
        except Exception:  # noqa: BLE001 - no Gluon in this Triton
            _GluonTD.append(None)
    return _GluonTD[0]


def cdiv(a: int, b: int) -> int:
    """Host-side ceil(a / b). ``triton.cdiv`` is a constexpr function in Triton >= 3.5: from Python
    each call goes through its wrapper (about 1.5 us on the H200's host; gemm() called it 18
    times a call)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Host-side smallest power of two >= n (0 for 0), as ``triton.next_power_of_2``."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def set_enabled(on: bool) -> None:
    """Turn the cached launch path on or off (tests compare both; off = Triton's own dispatch)."""
    global _ENABLED
    _ENABLED = bool(on)


def _sig(v):
    t = type(v)
    if t is int or t is str:
        return v
    if t is bool:
        return (bool, v)  # True == 1 as a dict key; Triton types it u1, not i32
    if t is float:
        return float  # not specialized by Triton
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    if t is _td_type():
        base = v.base
        return (base.dtype, base.data_ptr() % 16 == 0, tuple(v.shape), tuple(v.strides), tuple(v.block_shape),
                getattr(v, "padding", None), getattr(v, "round_f32_to_tf32", None))
    if t is _gluon_td_type():  # as above, plus its shared-memory layout (a frozen, hashable object)
        base = v.base
        return (t, base.dtype, base.data_ptr() % 16 == 0, tuple(v.shape), tuple(v.strides), tuple(v.block_shape),
                v.layout, getattr(v, "padding", None), getattr(v, "round_f32_to_tf32", None))
    if v is None:
        return None
    raise TypeError  # anything else: the plain path


class _Entry:
    __slots__ = ("kernel", "order", "pre_hook", "names")

    def __init__(self, kernel, order, pre_hook, names):
        self.kernel = kernel
        self.order = order  # per kernel parameter: ("a", positional index) / ("k", keyword) / ("c", value)
        self.pre_hook = pre_hook
        self.names = names


class _Cache:
    __slots__ = ("jit", "label", "names", "entries", "broken", "hits", "misses")

    def __init__(self, fn):
        jit = fn
        while not hasattr(jit, "device_caches"):  # Autotuner / Heuristics wrap a JITFunction as .fn
            jit = jit.fn
        self.jit = jit
        self.label = jit.__name__ + ("" if fn is jit else f" [{type(fn).__name__}]")
        self.names = list(jit.arg_names)
        self.entries: dict = {}
        self.broken = False
        self.hits = 0
        self.misses = 0


_CACHES: dict = {}
_MISS_LOCK = threading.RLock()
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)


_RUNTIME_KNOBS = []


def _hooks_set() -> bool:
    """Whether a launch hook (a profiler's) is installed: then every call takes Triton's path. Triton
    3.6+ keeps the hooks as chains that are never None (empty ``calls`` = none installed)."""
    if not _RUNTIME_KNOBS:
        try:
            from triton import knobs
            _RUNTIME_KNOBS.append(knobs.runtime)
        except Exception:  # noqa: BLE001 - a Triton without knobs: no hooks to honour
            _RUNTIME_KNOBS.append(None)
    rk = _RUNTIME_KNOBS[0]
    if rk is None:
        return False
    for hook in (rk.launch_enter_hook, rk.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _grid3(grid) -> tuple:
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


def _key(args: tuple, kwargs: dict) -> tuple:
    key = (torch.cuda.current_device(), tuple(map(_sig, args)), tuple(kwargs.items()))
    hash(key)
    return key


def launch(fn, grid, *args, **kwargs):
    """``fn[grid](*args, **kwargs)``, through the cached launcher after the first call of a signature.

    fn: a ``triton.jit`` function, or one wrapped by ``triton.autotune`` / ``triton.heuristics``.
    grid: a tuple, or a callable of the kernel's meta-parameters (as for ``fn[grid]``).
    args: the kernel's leading (non-constexpr) arguments, positionally; kwargs: constexprs and
    launch options (num_warps, num_stages), as for ``fn[grid]``.
    """
    if not _ENABLED or _INTERPRET:
        return fn[grid](*args, **kwargs)
    cache = _CACHES.get(fn)
    if cache is None:
        cache = _CACHES[fn] = _Cache(fn)
    if cache.broken:
        return fn[grid](*args, **kwargs)
    try:
        key = _key(args, kwargs)
    except TypeError:
        return fn[grid](*args, **kwargs)
    entry = cache.entries.get(key)
    if entry is None or _hooks_set():
        cache.misses += 1
        if entry is not None:
            return fn[grid](*args, **kwargs)
        # One thread at a time from the launch to the record: the autotuner's best_config, read
        # after the launch, must be the config of that launch.
        with _MISS_LOCK:
            kernel = fn[grid](*args, **kwargs)
            if kernel is not None:
                _remember(cache, fn, key, kernel, args, kwargs)
        return kernel
    cache.hits += 1
    values = []
    for kind, x in entry.order:
        values.append(args[x] if kind == "a" else kwargs[x] if kind == "k" else x)
    if entry.pre_hook is not None or callable(grid):
        nargs = dict(zip(entry.names, values))
        if entry.pre_hook is not None:
            entry.pre_hook(nargs)
        if callable(grid):
            grid = grid(nargs)
    g0, g1, g2 = _grid3(grid)
    kernel = entry.kernel
    stream = _raw_stream(key[0])
    kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *values)
    return kernel


class Bound:
    """One kernel, one signature, one grid: ``bound(*args)`` launches it with new leading positional
    arguments, none of the checks ``launch`` makes per call. For a caller that keys its own calls
    on everything the signature holds (gemm()'s plans: shapes, strides, dtypes, pointer alignment,
    device) and passes tensors that match it; nothing here checks that they do.

    constants: the values of the kernel's other parameters (keywords, the autotuned config's
    meta-parameters, defaults), by name. Launch hooks installed (profilers) or the cached path
    turned off send a call through Triton's dispatch, as ``launch`` does. On Triton 3.6 the
    launch calls the compiled launcher under Triton's Python wrapper, with each TMA descriptor
    encoded once per address it is seen at (``_direct_launcher``; TILEWISE_DIRECT_LAUNCH=0 turns
    that off)."""

    __slots__ = ("fn", "kwargs", "grid", "kernel", "tail", "names", "pre_hook", "device", "constants", "cache",
                 "raw", "head", "descs")

    def __call__(self, *args):
        if not _ENABLED or _hooks_set():
            self.cache.misses += 1
            return self.fn[self.grid](*args, **self.kwargs)
        self.cache.hits += 1
        if self.pre_hook is not None:
            self.pre_hook(dict(zip(self.names, args + self.tail)))
        k = self.kernel
        g = self.grid
        if self.raw is None:
            k.run(g[0], g[1], g[2], _raw_stream(self.device), k.function, k.packed_metadata, None, None, None,
                  *args, *self.tail)
            return k
        vals = args + self.tail
        if self.descs:
            flat = []
            prev = 0
            for pos, meta, encoded in self.descs:
                flat.extend(vals[prev:pos])
                d = vals[pos]
                if meta is None:  # lowered without a TMA map: base pointer, shape, strides (nothing to cache)
                    flat.extend(_make_tensordesc_arg(d, None))
                    prev = pos + 1
                    continue
                key = (d.base.data_ptr(), tuple(d.shape), tuple(d.strides))
                e = encoded.get(key)
                if e is None:
                    if len(encoded) >= 64:
                        encoded.clear()
                    e = encoded[key] = tuple(_make_tensordesc_arg(d, meta))
                flat.extend(e)
                prev = pos + 1
            flat.extend(vals[prev:])
            vals = flat
        self.raw(g[0], g[1], g[2], _raw_stream(self.device), *self.head, *vals)
        return k


_DIRECT = []  # [make_tensordesc_arg] once Triton's launcher layout is recognised, [None] if not


def _make_tensordesc_arg(d, meta):
    return _DIRECT[0](d, meta)


def _direct_launcher(kernel):
    """(raw launcher, its fixed arguments after the stream, [(position, descriptor meta, encoded
    cache)]) for Triton 3.6's CUDA launcher, whose Python wrapper re-encodes every TMA descriptor
    on every call (cuTensorMapEncodeTiled, ~1.5 us each on the H200's host) and walks all
    arguments; None on other layouts (the launch then goes through ``kernel.run``). Descriptors
    are encoded once per (address, shape, strides) a position sees: a map holds nothing else that
    varies between calls of one signature (its block, swizzle and type come from the compiled
    kernel's metadata)."""
    if not _DIRECT:
        try:
            from triton.backends.nvidia import driver as nv
            ok = (getattr(nv, "_BASE_ARGS_FORMAT_LEN", None) == 13
                  and nv.make_tensordesc_arg.__code__.co_argcount == 2)
            _DIRECT.append(nv.make_tensordesc_arg if ok else None)
        except Exception:  # noqa: BLE001 - another backend or layout: no direct path
            _DIRECT.append(None)
    if _DIRECT[0] is None:
        return None
    try:
        run = kernel.run
        if run.global_scratch_size or run.profile_scratch_size or getattr(run, "num_ctas", 1) != 1:
            return None
        fn = run.launch
        descs = []
        code = getattr(fn, "__code__", None)
        if code is not None:  # the tensor-descriptor wrapper: its closure holds the raw launcher
            cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
            if code.co_name != "inner" or not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= set(cells):
                return None
            idx = sorted(cells["tensordesc_indices"])
            metas = cells["tensordesc_meta"] or [None] * len(idx)
            if len(metas) != len(idx):
                return None
            descs = [(p, m, {}) for p, m in zip(idx, metas)]
            fn = cells["launcher"]
        head = (kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None, kernel.packed_metadata,
                None, None, None)
        return fn, head, descs
    except Exception:  # noqa: BLE001 - an unexpected layout: kernel.run
        return None


def bind(fn, grid, *args, run_pre_hook: bool = True, **kwargs) -> Bound | None:
    """``launch(fn, grid, *args, **kwargs)``, then a ``Bound`` that repeats it for new arguments of
    the same signature (None where the cached path does not apply: interpreter, hooks installed,
    a kernel or argument kind ``launch`` leaves to Triton). A callable grid is evaluated once, for
    this signature's meta-parameters. run_pre_hook=False: the caller does what the autotuned
    config's pre-hook would (gemm()'s TMA plan builds its descriptors with the config's blocks)."""
    if not _ENABLED or _INTERPRET:
        launch(fn, grid, *args, **kwargs)
        return None
    try:  # before the launch: an autotuned config's pre-hook may change the descriptors' blocks
        key = _key(args, kwargs)
    except TypeError:
        key = None
    launch(fn, grid, *args, **kwargs)
    return _bound(fn, grid, key, args, kwargs, run_pre_hook) if key is not None else None


def bound_for(fn, grid, *args, **kwargs) -> Bound | None:
    """The ``Bound`` of a call ``launch`` has already made (its signature cached), without launching:
    for a caller that launched through its own launcher (attention's call plans record the ordinary
    path's launches). None where ``bind`` would give None, or where the signature is not cached (a
    launcher that did not launch, or an autotuner's pre-hook that changed the arguments)."""
    if not _ENABLED or _INTERPRET:
        return None
    try:
        key = _key(args, kwargs)
    except TypeError:
        return None
    return _bound(fn, grid, key, args, kwargs, True)


def _bound(fn, grid, key, args, kwargs, run_pre_hook) -> Bound | None:
    cache = _CACHES.get(fn)
    if cache is None or cache.broken:
        return None
    entry = cache.entries.get(key)
    n = len(args)
    if entry is None or tuple(entry.order[:n]) != tuple(("a", i) for i in range(n)):
        return None
    tail = tuple(kwargs[x] if kind == "k" else x for kind, x in entry.order[n:])
    names = entry.names
    if callable(grid):
        grid = grid(dict(zip(names, args + tail)))
    b = Bound()
    b.fn, b.kwargs, b.kernel, b.tail, b.names, b.device, b.cache = (fn, dict(kwargs), entry.kernel, tail, names,
                                                                     key[0], cache)
    b.grid = _grid3(grid)
    b.pre_hook = entry.pre_hook if run_pre_hook else None
    b.constants = dict(zip(names[n:], tail))
    direct = _direct_launcher(entry.kernel) if _DIRECT_ON else None
    b.raw, b.head, b.descs = direct if direct is not None else (None, (), [])
    return b


def _remember(cache: _Cache, fn, key, kernel, args: tuple, kwargs: dict) -> None:
    """After a plain launch: record where each kernel parameter's value comes from. Calls the
    signature cannot tell apart send the kernel to the plain path for good: a float passed
    positionally to a constexpr (the signature keys floats by type), a tensor passed by keyword
    (the key would hold it alive)."""
    nargs = len(args)
    try:
        if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise TypeError("tensor keyword argument")
        if fn is not cache.jit and not hasattr(fn, "configs"):
            raise TypeError  # triton.heuristics: values computed per call, not cached here
        if fn is not cache.jit and fn.fn is not cache.jit:
            raise TypeError  # an autotuner over heuristics: left to Triton
        config = fn.best_config if fn is not cache.jit else None
        fixed = dict(config.all_kwargs()) if config is not None else {}
        params = cache.jit.params
        order = []
        for i, (name, p) in enumerate(zip(cache.names, params)):
            if i < nargs:
                if p.is_constexpr and type(args[i]) is float:
                    raise TypeError(f"float constexpr {name} passed positionally")
                order.append(("a", i))
            elif name in kwargs:
                order.append(("k", name))
            elif name in fixed:
                order.append(("c", fixed[name]))
            elif p.has_default:
                order.append(("c", p.default))
            else:
                raise TypeError(f"no value for {name}")
        # Check what the direct call uses exists on this Triton (once per kernel).
        kernel.run, kernel.function, kernel.packed_metadata  # noqa: B018
        pre = config.pre_hook if config is not None else None
        if len(cache.entries) >= _MAX_ENTRIES:
            cache.entries.clear()
        cache.entries[key] = _Entry(kernel, tuple(order), pre, cache.names)
    except Exception:  # noqa: BLE001 - an unexpected Triton layout: this kernel keeps the plain path
        cache.broken = True


def stats() -> dict:
    """Per launched function (a kernel's name, ``[Autotuner]`` for an autotuned one): calls through the
    cached launcher (hits), through Triton's dispatch
    (misses: first calls of a signature, or hooks installed), and whether the kernel fell back
    for good (broken: this Triton's objects lack what the cached path uses)."""
    out = {}
    for c in _CACHES.values():
        label = c.label if c.label not in out else f"{c.label} #{len(out)}"
        out[label] = {"hits": c.hits, "misses": c.misses, "signatures": len(c.entries), "broken": c.broken}
    return out
