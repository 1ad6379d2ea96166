"""How a CUDA C kernel reaches the GPU.

    .cu file --NVRTC (cuda.core.Program)--> cubin --disk cache--> module --> Kernel(grid, block, *args)

* ``compile_source`` / ``compile_file``: NVRTC through ``cuda.core`` for the current device's
  architecture or a named one (``arch="sm_90"`` works on a machine with no GPU). Templates are
  instantiated through name expressions (``"vector_add_v1_naive<float>"``). The ptxas resource
  report (registers, shared memory, spills) is kept with the cubin.
* Disk cache: one cubin + one JSON per (source and included headers, options, arch, NVRTC
  version, name expressions), under ``$TILEWISE_CACHE_DIR`` or ``$XDG_CACHE_HOME/tilewise``
  (``~/.cache/tilewise``), so a second process loads without compiling. The directory must be
  this user's alone (``private_cache_dir``): a cached cubin is code that runs.
* ``Kernel``: a loaded kernel with a declared parameter list (``Tensor``/``Scalar``); a call
  checks every tensor (CUDA, dtype, contiguity) and raises ``ValueError`` naming the argument,
  then launches on PyTorch's current stream, so launches order with PyTorch's work and can be
  captured in a ``torch.cuda.CUDAGraph``.
* ``TILEWISE_DEBUG_SYNC=1``: synchronize after every launch and name the kernel that failed.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .. import settings
from .._files import write_atomic

OPS_DIR = Path(__file__).resolve().parent.parent / "ops"
INCLUDE_DIRS = (OPS_DIR, OPS_DIR / "include")

ENV_CACHE_DIR = settings.CACHE_DIR
ENV_DEBUG_SYNC = settings.DEBUG_SYNC
ENV_CUDA_INCLUDE = settings.CUDA_INCLUDE

# Bump when the cached file format or the default options change.
_CACHE_FORMAT = 1
_DEFAULT_OPTIONS = ("-std=c++17",)


class CompileError(RuntimeError):
    """NVRTC rejected a source; the message holds the file name and the full compiler log."""


class KernelLaunchError(RuntimeError):
    """A launch failed, or (with TILEWISE_DEBUG_SYNC=1) the kernel faulted while running."""


def _import_cuda_core():
    try:
        import cuda.core as cc

        cc.Program  # noqa: B018 - cuda.core >= 1.0 exports at top level
        return cc
    except (ImportError, AttributeError):  # cuda.core 0.x
        import cuda.core.experimental as cc

        return cc


_cuda_core_lock = threading.Lock()
_cuda_core_module = None


def _cuda_core():
    """cuda.core's namespace, imported once under a lock. Threads that compiled at once in a fresh
    process saw a half-initialized ``cuda.core`` (no ``Program`` yet), took it for 0.x and failed
    importing ``cuda.core.experimental``, which 1.x does not have."""
    global _cuda_core_module
    cc = _cuda_core_module
    if cc is None:
        with _cuda_core_lock:
            if _cuda_core_module is None:
                _cuda_core_module = _import_cuda_core()
            cc = _cuda_core_module
    return cc


# --------------------------------------------------------------------------- debug switch

_debug_sync = settings.debug_sync()  # the process's initial value; set_debug_sync changes it


def set_debug_sync(on: bool) -> None:
    """Turn synchronize-after-every-launch on or off (the env var sets the initial value)."""
    global _debug_sync
    _debug_sync = bool(on)


def debug_sync() -> bool:
    return _debug_sync


# --------------------------------------------------------------------------- compiler facts


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if int(err) != 0:
        raise RuntimeError(f"nvrtcVersion failed: {err}")
    return int(major), int(minor)


def current_arch() -> str:
    """``sm_XY`` of the current CUDA device; raises if there is none."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: pass arch='sm_90' (or another) to compile without one")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@functools.cache
def cuda_include_dir() -> str | None:
    """A directory holding cuda_fp16.h / cuda_bf16.h for NVRTC, or None to use bundled headers."""
    candidates = settings.cuda_include_candidates()
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            candidates.append(found)
    except Exception:  # pathfinder missing or finds nothing: fall through
        pass
    candidates.append("/usr/local/cuda/include")
    try:  # Triton's wheel carries the CUDA headers it compiles against
        import triton

        candidates.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "include"))
    except ImportError:
        pass
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "cuda_fp16.h")):
            return c
    return None


def cache_dir() -> Path:
    """Where the kernel cache lives (not created here; ``private_cache_dir`` creates and checks it)."""
    return settings.cache_dir()


class CacheDirError(RuntimeError):
    """The kernel cache directory is not private to this user (see ``private_cache_dir``)."""


def private_cache_dir() -> Path:
    """``cache_dir()``, created with mode 0700 when missing, once it is known that only this user can
    write there.

    A cubin in the cache is code this process loads and runs, and a planted one whose hash matches
    its JSON would load like our own; so a directory that another user owns, or that group or others
    may write to, is refused: ``CacheDirError`` names it and ``TILEWISE_CACHE_DIR`` (we raise rather
    than skip the cache with a warning, so a shared cache never silently costs every compile). Only
    the directory itself is checked, not its parents. A directory that cannot be created is returned
    as is: reads then miss and writes fail, which costs a recompile and nothing else.
    """
    d = cache_dir()
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = d.stat()
    except OSError:
        return d
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        problem, fix = f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})", ""
    elif st.st_mode & 0o022:
        problem, fix = f"is writable by group or others (mode {st.st_mode & 0o777:o})", f"chmod 700 {d}, or "
    else:
        return d
    raise CacheDirError(f"kernel cache directory {d} {problem}; a cached kernel is code this process runs: "
                        f"{fix}set {ENV_CACHE_DIR} to a private directory")


# --------------------------------------------------------------------------- resource report

_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_RE_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True)
class KernelResources:
    """ptxas' report for one kernel of a compiled module."""

    name: str  # the name expression (or the mangled name when there was none)
    mangled: str
    arch: str
    registers: int
    shared_bytes: int  # static shared memory
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


def parse_ptxas_log(log: str, symbol_mapping: dict[str, str]) -> list[KernelResources]:
    """Parse ``ptxas -v`` output into one record per kernel entry."""
    demangled = {v: k for k, v in symbol_mapping.items()}
    out: list[KernelResources] = []
    cur: dict[str, Any] | None = None

    def flush():
        if cur is not None:
            out.append(KernelResources(**cur))

    for line in log.splitlines():
        m = _RE_ENTRY.search(line)
        if m:
            flush()
            mangled, arch = m.group(1), m.group(2)
            cur = dict(name=demangled.get(mangled, mangled), mangled=mangled, arch=arch, registers=0,
                       shared_bytes=0, stack_bytes=0, spill_store_bytes=0, spill_load_bytes=0)
            continue
        if cur is None:
            continue
        m = _RE_FRAME.search(line)
        if m:
            cur["stack_bytes"], cur["spill_store_bytes"], cur["spill_load_bytes"] = map(int, m.groups())
        m = _RE_USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            s = _RE_SMEM.search(line)
            cur["shared_bytes"] = int(s.group(1)) if s else 0
    flush()
    return out


# --------------------------------------------------------------------------- compile + cache


@dataclass
class CompiledModule:
    """A cubin with its kernels' names; ``from_cache`` says whether NVRTC ran in this process."""

    name: str
    arch: str
    cubin: bytes
    symbol_mapping: dict[str, str]
    log: str
    from_cache: bool
    key: str
    resources: list[KernelResources] = field(default_factory=list)


def _headers_digest() -> str:
    """Content hash of every header our sources can include, so an edited .cuh misses the cache."""
    h = hashlib.sha256()
    for d in INCLUDE_DIRS:
        if d.is_dir():
            for p in sorted(d.glob("*.cuh")):
                h.update(p.name.encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def _cache_key(source: str, name: str, options: Sequence[str], arch: str,
               name_expressions: Sequence[str]) -> str:
    h = hashlib.sha256()
    for part in (str(_CACHE_FORMAT), source, os.path.basename(name), "\0".join(options), arch,
                 "%d.%d" % nvrtc_version(), "\0".join(name_expressions), _headers_digest(),
                 str(cuda_include_dir())):
        h.update(part.encode())
        h.update(b"\x00\x01")
    return h.hexdigest()[:40]


def _program_options(name: str, arch: str, options: Sequence[str]):
    cc = _cuda_core()
    inc = [str(d) for d in INCLUDE_DIRS if d.is_dir()]
    kw: dict[str, Any] = {}
    cuda_inc = cuda_include_dir()
    if cuda_inc:
        inc.append(cuda_inc)
    else:
        kw["use_bundled_headers"] = True
    defines: list[Any] = []
    std = "c++17"
    extra_ptxas: list[str] = ["-v"]
    for opt in options:
        if opt.startswith("-std="):
            std = opt[len("-std="):]
        elif opt.startswith("-D"):
            k, _, v = opt[2:].partition("=")
            defines.append((k, v) if v else k)
        elif opt.startswith("-Xptxas="):
            extra_ptxas.append(opt[len("-Xptxas="):])
        else:
            raise ValueError(f"unsupported compile option {opt!r} (use -std=, -D, -Xptxas=)")
    if nvrtc_version() >= (12, 9):
        # NVRTC's own compile cache (12.9+) skips ptxas on a hit, and with it the -v report that
        # resources and the check read; our cache (cache_dir) already keeps the cubin.
        kw["no_cache"] = True
    return cc.ProgramOptions(name=name, arch=arch, std=std, include_path=inc,
                             define_macro=defines or None, ptxas_options=extra_ptxas, **kw)


_ARCH_MARK = re.compile(r"^//\s*tilewise-arch:\s*(sm_\d+a)\s*$", re.M)
# Sources that use features of an architecture and its successors (clusters: sm_90) say so in a line
# ``// tilewise-min-arch: sm_90``; they build for that architecture or a later one.
_MIN_ARCH_MARK = re.compile(r"^//\s*tilewise-min-arch:\s*sm_(\d+)\s*$", re.M)


def _unbuildable(source: str, arch: str) -> str | None:
    """What ``source`` needs that ``arch`` is not ("sm_90a", "sm_90 or later"), or None."""
    m = _ARCH_MARK.search(source)
    if m is not None and arch not in (m.group(1), m.group(1)[:-1]):
        return m.group(1)
    m = _MIN_ARCH_MARK.search(source)
    if m is not None and int(re.sub(r"\D", "", arch)) < int(m.group(1)):
        return f"sm_{m.group(1)} or later"
    return None


def source_arch(source: str, arch: str, name: str = "kernel.cu") -> str:
    """The architecture to compile ``source`` for on a device of ``arch``.

    A source that uses architecture-specific instructions (sm_90a's wgmma, setmaxnreg) says so in a
    line ``// tilewise-arch: sm_90a``: it compiles for that target when ``arch`` is its base
    (sm_90), and raises ``CompileError`` on any other device rather than fail at load time.
    """
    want = _unbuildable(source, arch)
    if want is not None:
        raise CompileError(f"{name} needs {want}; this device is {arch}")
    m = _ARCH_MARK.search(source)
    return arch if m is None else m.group(1)


def compile_source(source: str, *, name: str = "kernel.cu", name_expressions: Iterable[str] = (),
                   arch: str | None = None, options: Sequence[str] = _DEFAULT_OPTIONS,
                   use_cache: bool = True) -> CompiledModule:
    """Compile CUDA C++ ``source`` to a cubin for ``arch`` (default: the current device's).

    ``name`` appears in error messages (pass the file's path). ``name_expressions`` lists the
    template instantiations (or plain kernel names) to keep, e.g. ``["add<float>", "add<__half>"]``.
    ``options``: ``-std=c++17``, ``-DNAME=VALUE``, ``-Xptxas=FLAG``.
    Raises ``CompileError`` with the NVRTC log when the source does not compile, and (``use_cache``)
    ``CacheDirError`` when the cache directory is not private (``private_cache_dir``).
    """
    arch = source_arch(source, arch or current_arch(), name)
    name_expressions = tuple(name_expressions)
    options = tuple(options)
    key = _cache_key(source, name, options, arch, name_expressions)
    cdir = private_cache_dir() if use_cache else cache_dir()
    cubin_path, meta_path = cdir / f"{key}.cubin", cdir / f"{key}.json"
    if use_cache and cubin_path.is_file() and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            cubin = cubin_path.read_bytes()
            if hashlib.sha256(cubin).hexdigest() == meta["cubin_sha256"]:
                return CompiledModule(name=name, arch=arch, cubin=cubin,
                                      symbol_mapping=meta["symbol_mapping"], log=meta["log"],
                                      from_cache=True, key=key,
                                      resources=[KernelResources(**r) for r in meta["resources"]])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a broken entry is recompiled and overwritten

    cc = _cuda_core()
    logs = io.StringIO()
    popts = _program_options(os.path.basename(name), arch, options)
    try:
        prog = cc.Program(source, "c++", options=popts)
        obj = prog.compile("cubin", name_expressions=name_expressions, logs=logs)
    except Exception as e:  # NVRTCError carries the log in its message
        msg = str(e)
        raise CompileError(f"NVRTC could not compile {name} for {arch}:\n{msg}\n{logs.getvalue()}") from None
    symbol_mapping = {k: (v.decode() if isinstance(v, bytes) else str(v))
                      for k, v in (obj.symbol_mapping or {}).items()}
    log = logs.getvalue()
    resources = parse_ptxas_log(log, symbol_mapping)
    cubin = bytes(obj.code)
    if use_cache:
        try:
            meta = dict(symbol_mapping=symbol_mapping, log=log, name=name, arch=arch,
                        nvrtc="%d.%d" % nvrtc_version(), cubin_sha256=hashlib.sha256(cubin).hexdigest(),
                        resources=[asdict(r) for r in resources])
            # Each file is renamed into place whole, so processes or threads writing one entry at
            # once never leave a torn file (no lock needed: they write the same bytes for one key);
            # a reader between the two renames sees a hash mismatch and recompiles.
            write_atomic(cubin_path, cubin)
            write_atomic(meta_path, json.dumps(meta).encode())
        except OSError:
            pass  # a read-only cache costs a recompile, nothing else
    return CompiledModule(name=name, arch=arch, cubin=cubin, symbol_mapping=symbol_mapping, log=log,
                          from_cache=False, key=key, resources=resources)


def compile_file(path: str | os.PathLike, **kw) -> CompiledModule:
    """``compile_source`` on a .cu file (relative paths are looked up in ``tilewise/ops``)."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = OPS_DIR / p
    return compile_source(p.read_text(), name=str(p), **kw)


def package_sources() -> list[Path]:
    return sorted(OPS_DIR.rglob("*.cu"))


def name_expressions_for(path: Path) -> list[str]:
    """The instantiations a .cu file declares for the compile check.

    A source lists them in comment lines ``// tilewise-instantiate: name<float> name<__half>``;
    a source without such lines compiles its non-template ``extern "C"`` kernels only.
    """
    names: list[str] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("// tilewise-instantiate:"):
            names.extend(line.split(":", 1)[1].split())
    return names


def _check_one(src: Path, arch: str) -> tuple[list[KernelResources], list[str]]:
    """The resources ptxas reported for a source's declared kernels, and the declared names it did
    not report. Uncached: the report is of this NVRTC, not of whichever compiled the cached cubin."""
    names = name_expressions_for(src)
    res = compile_file(src, arch=arch, name_expressions=names, use_cache=False).resources
    return res, sorted(set(names) - {r.name for r in res})


def arch_only_sources(arch: str) -> dict[Path, str]:
    """Package sources that do not build for ``arch`` (their ``tilewise-arch`` or ``tilewise-min-arch``
    line): {path: what it needs}. ``check_package`` leaves them out."""
    needs = {src: _unbuildable(src.read_text(), arch) for src in package_sources()}
    return {src: want for src, want in needs.items() if want is not None}


def check_package(arch: str = "sm_90", jobs: int | None = None) -> list[KernelResources]:
    """Compile every .cu in the package for ``arch`` (but those built for another architecture only:
    ``arch_only_sources``); return each kernel's resources (in source order). ``jobs``: compiles at
    once, each in its own process (default: one per source, up to the CPU count; 1 compiles here, in
    order). Raises CompileError when a declared kernel has no report."""
    other = arch_only_sources(arch)
    srcs = [s for s in package_sources() if s not in other]
    jobs = min(len(srcs), os.cpu_count() or 1) if jobs is None else jobs
    if jobs <= 1:
        results = [_check_one(src, arch) for src in srcs]
    else:
        import concurrent.futures
        import multiprocessing

        # spawn: NVRTC in fresh processes, whatever CUDA state the caller holds
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_check_one, srcs, [arch] * len(srcs)))
    out: list[KernelResources] = []
    for src, (res, missing) in zip(srcs, results):
        if missing:  # a kernel the check cannot see is a kernel it cannot pass
            raise CompileError(f"{src.name}: ptxas reported no resources for {', '.join(missing)}")
        out += res
    return out


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Tensor:
    """A pointer parameter fed from a CUDA ``torch.Tensor``.

    ``dtypes``: accepted dtypes (None: any); ``contiguous``: reject non-contiguous tensors
    (kernels that walk strides themselves set False); ``nullable``: None is accepted and passed as
    a null pointer (for optional inputs the kernel tests against nullptr).
    """

    name: str
    dtypes: tuple | None = None
    contiguous: bool = True
    nullable: bool = False


_SCALAR_TYPES = {"i32": np.int32, "i64": np.int64, "u32": np.uint32, "f32": np.float32, "f64": np.float64}


@dataclass(frozen=True)
class Scalar:
    """A by-value parameter: ``ctype`` one of i32, i64, u32, f32, f64."""

    name: str
    ctype: str

    def __post_init__(self):
        if self.ctype not in _SCALAR_TYPES:
            raise ValueError(f"Scalar {self.name!r}: ctype must be one of {sorted(_SCALAR_TYPES)}")


def _tensor_converter(kernel: str, p: Tensor, device_index: int):
    """Check one tensor argument and return its data pointer.

    The hot path is four C calls (get_device, dtype, is_contiguous, data_ptr); the wording of the
    error is worked out only when a check fails.
    """
    import torch

    dtypes = p.dtypes
    single = dtypes[0] if dtypes is not None and len(dtypes) == 1 else None
    want = ", ".join(str(d).replace("torch.", "") for d in dtypes) if dtypes else ""
    contiguous = p.contiguous

    def fail(x):
        if not isinstance(x, torch.Tensor):
            return ValueError(f"{kernel}: argument '{p.name}' must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_cuda:
            return ValueError(f"{kernel}: argument '{p.name}' is on {x.device}; it must be a CUDA tensor "
                              f"(move it with .cuda())")
        if x.get_device() != device_index:
            return ValueError(f"{kernel}: argument '{p.name}' is on cuda:{x.get_device()} but the kernel "
                              f"runs on cuda:{device_index}")
        if dtypes is not None and x.dtype not in dtypes:
            return ValueError(f"{kernel}: argument '{p.name}' has dtype {x.dtype}; expected {want}")
        return ValueError(f"{kernel}: argument '{p.name}' is not contiguous (strides {tuple(x.stride())}); "
                          f"pass x.contiguous()")

    nullable = p.nullable

    def conv(x):
        if x is None and nullable:
            return 0
        try:
            ok = x.get_device() == device_index
            if single is not None:
                ok = ok and x.dtype is single
            elif dtypes is not None:
                ok = ok and x.dtype in dtypes
            if contiguous:
                ok = ok and x.is_contiguous()
        except AttributeError:
            ok = False
        if not ok:
            raise fail(x)
        return x.data_ptr()

    return conv


def _scalar_converter(kernel: str, p: Scalar):
    t = _SCALAR_TYPES[p.ctype]
    if p.ctype in ("i32", "i64", "u32"):
        info = np.iinfo(t)
        lo, hi = int(info.min), int(info.max)

        def conv(v):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ValueError(f"{kernel}: argument '{p.name}' must be an integer, got {type(v).__name__}")
            if not lo <= v <= hi:
                raise ValueError(f"{kernel}: argument '{p.name}' = {v} does not fit in {p.ctype}")
            return t(v)
    else:
        def conv(v):
            if not isinstance(v, (int, float, np.number)) or isinstance(v, bool):
                raise ValueError(f"{kernel}: argument '{p.name}' must be a number, got {type(v).__name__}")
            return t(v)
    return conv


_CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double",
           "int32": "int", "int64": "long long", "uint8": "unsigned char", "bool": "bool"}


def ctype(dtype) -> str:
    """The CUDA C type name of a torch dtype, for template name expressions."""
    key = str(dtype).replace("torch.", "")
    try:
        return _CTYPES[key]
    except KeyError:
        raise ValueError(f"no CUDA C type for dtype {dtype}") from None


# Dynamic shared memory one block may opt into on sm_90 (H100 / H200): 227 KiB of the SM's 228.
SM90_SHARED_OPT_IN = 227 * 1024


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (looked up once)."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def aligned16(*ts) -> bool:
    """Whether every tensor starts on a 16-byte boundary (what 16-byte vector accesses need)."""
    return all(t.data_ptr() % 16 == 0 for t in ts)


# --------------------------------------------------------------------------- launch

_streams: dict[int, Any] = {}
_configs: dict[tuple, Any] = {}


def _raw_stream_getter():
    import torch

    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return get
    return lambda idx: torch.cuda.current_stream(idx).cuda_stream


def _stream_for(handle: int):
    s = _streams.get(handle)
    if s is None:
        cc = _cuda_core()
        # PyTorch's default stream is the legacy default stream, handle 0.
        s = cc.LEGACY_DEFAULT_STREAM if handle == 0 else cc.Stream.from_handle(handle)
        _streams[handle] = s
    return s


def _as_dim3(v) -> tuple[int, int, int]:
    if isinstance(v, int):
        v = (v,)
    v = tuple(int(x) for x in v)
    if not 1 <= len(v) <= 3 or any(x < 1 for x in v):
        raise ValueError(f"grid/block must be 1 to 3 positive ints, got {v}")
    return v + (1,) * (3 - len(v))


def _config_for(grid, block, shmem: int):
    key = (grid, block, shmem)
    cfg = _configs.get(key)
    if cfg is None:
        g, b = _as_dim3(grid), _as_dim3(block)
        if b[0] * b[1] * b[2] > 1024:
            raise ValueError(f"block {b} has more than 1024 threads")
        if g[1] > 65535 or g[2] > 65535 or g[0] > 2**31 - 1:
            raise ValueError(f"grid {g} exceeds the CUDA limits (x < 2^31, y and z <= 65535)")
        cfg = _cuda_core().LaunchConfig(grid=g, block=b, shmem_size=shmem)
        _configs[key] = cfg
    return cfg


class Kernel:
    """A loaded kernel with a declared parameter list.

    ``kernel(grid, block, *args, shmem=0)`` checks and converts ``args`` against ``params`` and
    launches on PyTorch's current stream of the kernel's device.
    """

    def __init__(self, name: str, handle: Any, params: Sequence[Tensor | Scalar], device_index: int,
                 resources: KernelResources | None = None):
        self.name = name
        self.handle = handle  # cuda.core Kernel
        self.params = tuple(params)
        self.device_index = device_index
        self.resources = resources
        self._convert = tuple(
            _tensor_converter(name, p, device_index) if isinstance(p, Tensor) else _scalar_converter(name, p)
            for p in self.params)
        self._raw_stream = _raw_stream_getter()
        self._launch = _cuda_core().launch

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, params={[p.name for p in self.params]})"

    def __call__(self, grid, block, *args, shmem: int = 0) -> None:
        if len(args) != len(self._convert):
            raise ValueError(f"{self.name}: expected {len(self._convert)} arguments "
                             f"({', '.join(p.name for p in self.params)}), got {len(args)}")
        cargs = [c(a) for c, a in zip(self._convert, args)]
        cfg = _configs.get((grid, block, shmem)) or _config_for(grid, block, shmem)
        handle = self._raw_stream(self.device_index)
        stream = _streams.get(handle) or _stream_for(handle)
        try:
            self._launch(stream, cfg, self.handle, *cargs)
        except Exception as e:  # the retry stays off the launch's path
            try:
                self._retry_in_context(e, self._launch, stream, cfg, self.handle, *cargs)
            except Exception as e2:
                raise KernelLaunchError(f"launch of kernel {self.name} (grid={grid}, block={block}, "
                                        f"shmem={shmem}) failed: {e2}") from e2
        if _debug_sync:
            self._sync_and_check()

    def _in_context(self, fn, *args):
        """``fn(*args)``, once more after binding the device's primary context if the driver says
        this thread has none: PyTorch's autograd device thread has made no CUDA runtime call when
        no PyTorch kernel ran before ours in a backward (masked_mean's backward queries occupancy
        first)."""
        try:
            return fn(*args)
        except Exception as e:
            return self._retry_in_context(e, fn, *args)

    def _retry_in_context(self, error: Exception, fn, *args):
        """After ``fn(*args)`` raised ``error``: raise it again, or run ``fn`` once more with the
        primary context bound when the error was the driver's INVALID_CONTEXT."""
        if "INVALID_CONTEXT" not in str(error):
            raise error
        _cuda_core().Device(self.device_index).set_current()
        return fn(*args)

    def max_active_blocks_per_sm(self, block_size: int, dynamic_shmem: int = 0) -> int:
        """Occupancy: how many blocks of this kernel fit on one SM at once."""
        occ = self.handle.occupancy
        return int(self._in_context(occ.max_active_blocks_per_multiprocessor, block_size, dynamic_shmem))

    def resident_grid(self, block_size: int, dynamic_shmem: int = 0) -> int:
        """Blocks that are all resident at once: the grid of a grid-stride kernel (one full wave)."""
        return sm_count(self.device_index) * max(1, self.max_active_blocks_per_sm(block_size, dynamic_shmem))

    def max_active_clusters(self, cluster: int, block_size: int, dynamic_shmem: int = 0) -> int:
        """Occupancy of a cluster kernel: how many clusters of ``cluster`` CTAs can be resident at
        once on the device (clusters live inside one GPC, so this can be below sm_count // cluster
        when the GPCs' SM counts are not multiples of it). Call set_max_dynamic_shared first when
        dynamic_shmem is over 48 KiB."""
        cc = _cuda_core()
        cfg = cc.LaunchConfig(grid=1, cluster=int(cluster), block=int(block_size), shmem_size=int(dynamic_shmem))
        occ = self.handle.occupancy

        def query():
            try:
                return occ.max_active_clusters(cfg, stream=cc.Device(self.device_index).default_stream)
            except TypeError:  # cuda.core releases whose stream argument is optional / positional
                return occ.max_active_clusters(cfg)
        return int(self._in_context(query))

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow more than 48 KiB of dynamic shared memory per block (up to the device's opt-in limit)."""
        from cuda.bindings import driver

        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        err, dev = driver.cuDeviceGet(self.device_index)
        (err,) = driver.cuKernelSetAttribute(attr, int(nbytes), self.handle.handle, dev)
        if int(err) != 0:
            raise KernelLaunchError(f"{self.name}: could not allow {nbytes} B of dynamic shared memory: {err}")

    def _sync_and_check(self) -> None:
        import torch

        try:
            torch.cuda.synchronize(self.device_index)
        except Exception as e:
            raise KernelLaunchError(f"kernel {self.name} failed while running ({ENV_DEBUG_SYNC}=1 "
                                    f"synchronized after it): {e}") from e


class Module:
    """A compiled module loaded on one device; ``kernel(expr, params)`` returns a ``Kernel``."""

    def __init__(self, compiled: CompiledModule, device_index: int):
        cc = _cuda_core()
        dev = cc.Device(device_index)
        dev.set_current()
        self.compiled = compiled
        self.device_index = device_index
        # cuda.core wants the mangled names as bytes, as its own compile returns them.
        mapping = {k: v.encode() for k, v in compiled.symbol_mapping.items()}
        self._obj = cc.ObjectCode.from_cubin(compiled.cubin, name=os.path.basename(compiled.name),
                                             symbol_mapping=mapping)
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, name: str, params: Sequence[Tensor | Scalar]) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            res = next((r for r in self.compiled.resources if r.name == name), None)
            k = Kernel(name, self._obj.get_kernel(name), params, self.device_index, res)
            self._kernels[name] = k
        return k


_modules: dict[tuple, Module] = {}


def load(path: str | os.PathLike, name_expressions: Iterable[str] = (),
         options: Sequence[str] = _DEFAULT_OPTIONS, device_index: int | None = None) -> Module:
    """Compile (or fetch from the caches) a .cu file and load it on the current CUDA device."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("tilewise CUDA kernels need a CUDA GPU; none is available")
    if device_index is None:
        device_index = torch.cuda.current_device()
    key = (str(path), tuple(name_expressions), tuple(options), device_index)
    mod = _modules.get(key)
    if mod is None:
        torch.cuda.init()
        major, minor = torch.cuda.get_device_capability(device_index)
        compiled = compile_file(path, name_expressions=tuple(name_expressions), options=options,
                                arch=f"sm_{major}{minor}")
        mod = Module(compiled, device_index)
        _modules[key] = mod
    return mod
