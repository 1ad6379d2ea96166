"""gemm_sm90 (CUDA C, Hopper only): ``C = A @ B`` with warpgroup MMA, TMA and cluster multicast.

A is (M, K) with unit-stride rows, B is (K, N) with unit-stride rows (``kTransB = 1``) or the
transpose of an (N, K) matrix with unit-stride rows (a weight's ``w.T``); fp16 or bf16, fp32
accumulate, C in the input dtype. The kernel (``sm90.cu``) is what Triton cannot express on sm_90:
a thread-block cluster whose CTAs share each A (or B) block through TMA multicast, so a tile's bytes
from L2 fall by the cluster's width. Tiles BM x BN (BM = 64 per consumer warpgroup), clusters
CM x CN, persistent over cluster tiles; see the .cu for the pipeline.

    gemm_sm90(a, b, out=None, config=None, ...) -> C (M, N)

``config`` names an entry of ``configs.SM90_CONFIGS`` (or ``SM90_EXTRA_CONFIGS``); None takes
``configs.sm90_config_for(M, N, K)``, the wave-time model. Needs compute capability 9.0 (sm_90a
instructions), cuda-bindings (TMA descriptors, launch), and 16-byte aligned rows (M, N, K >= 1; K
and N multiples of 8). ``applies(a, b)`` says whether a call would be taken. Cost: ``api.cost``.

    gemm_tf32(a, b, out=None, bm=None, cluster=None) -> C (M, N), fp32

tf32 for fp32 A and a row-major B with no transposing copy of B (``sm90_tf32.cu``: wgmma on C's
transposed tile, B's block read into registers as the A operand); BM x 128 tiles, CTA pairs sharing
A's blocks where C is large (``configs.tf32_bm_for``, ``configs.tf32_cluster_for``);
``tf32_applies(a, b, out)``.

The tile tables and rules (instantiations, the wave model, the stream-K tail and split-K rules)
are in ``configs``; this module compiles, loads and launches.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from ...runtime import cuda as rt
from .._memory import may_overlap
from .configs import (SM90_CONFIGS, SM90_CTYPES, SM90_EXTRA_CONFIGS, SM90_KMAJOR_CONFIG, TF32_CONFIGS, TF32_PAIRS,
                      Operand, Sm90Config, cdiv, sm90_config_for, sm90_split_k, sm90_tail_splits, sm90_takes,
                      sm90_out_rows_ok, tf32_bm_for, tf32_cluster_for, tf32_out_rows_ok, tf32_takes)

SRC = Path(__file__).with_suffix(".cu")
# NVRTC options of the module; an experiment passes its own per call (compile_options) to compare -D
# variants.
DEFAULT_COMPILE_OPTIONS: tuple[str, ...] = ("-std=c++17",)


@functools.cache
def _instantiated() -> frozenset[str]:
    return frozenset(rt.name_expressions_for(SRC))


def available(device_index: int | None = None) -> bool:
    """Whether this process can run the kernel: a CUDA device of compute capability 9.0 and the
    driver bindings for tensor maps."""
    if not torch.cuda.is_available():
        return False
    return _available(torch.cuda.current_device() if device_index is None else device_index)


@functools.cache
def _available(idx: int) -> bool:
    if torch.cuda.get_device_capability(idx) != (9, 0):
        return False
    try:
        _driver()
    except ImportError:
        return False
    return True

def _rows_ok(t: torch.Tensor, unit_dim: int) -> bool:
    return Operand.of(t).rows_ok(unit_dim)


def b_layout(b: torch.Tensor) -> int | None:
    """1 for unit-stride rows of (K, N), 0 for unit-stride columns (w.T), None for neither."""
    if _rows_ok(b, 1):
        return 1
    if _rows_ok(b, 0):
        return 0
    return None


def applies(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether gemm_sm90 takes these operands (dtype, device, layout); sizes are not judged."""
    return (a.is_cuda and b.is_cuda and a.dim() == 2 and b.dim() == 2 and a.device == b.device
            and sm90_takes(Operand.of(a), Operand.of(b)) and available(a.get_device()))


def out_problem(out: torch.Tensor, dtype: torch.dtype, device: torch.device, M: int, N: int) -> str | None:
    """Why ``out`` cannot take the (M, N) result (None when it can): shape, dtype and device, then
    the epilogue's 16-byte chunks (unit-stride rows, a row stride that is a multiple of 8, 16-byte
    alignment)."""
    if tuple(out.shape) != (M, N) or out.dtype != dtype or out.device != device:
        return (f"out must be ({M}, {N}) {dtype} on {device}, got {tuple(out.shape)} {out.dtype} on "
                f"{out.device}")
    if not sm90_out_rows_ok(Operand.of(out), N):
        return (f"out needs unit-stride rows, a row stride that is a multiple of 8 and 16-byte alignment "
                f"(strides {out.stride()}, address % 16 = {out.data_ptr() % 16})")
    return None


# --------------------------------------------------------------------------- host side


def _driver():
    from cuda.bindings import driver

    return driver


def _check_cu(res, what: str):
    err = res[0]
    if int(err) != 0:
        raise rt.KernelLaunchError(f"gemm_sm90: {what} failed: {err}")
    return res[1] if len(res) == 2 else res[1:]


_DT_ENUM = {torch.bfloat16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", torch.float16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
            torch.float32: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}
_maps: OrderedDict = OrderedDict()
_MAPS_KEPT = 64


def tensor_map(t: torch.Tensor, box_inner: int, box_outer: int, swizzle_bytes: int):
    """A TMA descriptor of the 2-D matrix ``t`` (unit-stride rows: dims (cols, rows) inner first)
    with a (box_outer x box_inner) box and 128- or 64-byte swizzle; out-of-range reads give zeros.
    The last 64 descriptors are kept by (address, shape, stride, box, swizzle)."""
    rows, cols = t.shape
    key = (t.data_ptr(), rows, cols, t.stride(0), t.dtype, box_inner, box_outer, swizzle_bytes)
    m = _maps.pop(key, None)  # pop + reinsert: most recent last, and no KeyError if another
    if m is not None:          # thread evicted the key in between
        _maps[key] = m
        return m
    d = _driver()
    swz = {128: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, 64: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B}
    m = _check_cu(d.cuTensorMapEncodeTiled(
        getattr(d.CUtensorMapDataType, _DT_ENUM[t.dtype]), d.cuuint32_t(2), t.data_ptr(),
        [d.cuuint64_t(cols), d.cuuint64_t(rows)], [d.cuuint64_t(t.stride(0) * t.element_size())],
        [d.cuuint32_t(box_inner), d.cuuint32_t(box_outer)], [d.cuuint32_t(1), d.cuuint32_t(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swz[swizzle_bytes],
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    _maps[key] = m
    while len(_maps) > _MAPS_KEPT:
        try:
            _maps.popitem(last=False)
        except KeyError:
            break
    return m


@dataclass
class _Loaded:
    func: object
    clusters: int  # clusters resident at once


@functools.cache
def _library_names() -> tuple[str, ...]:
    """The .cu's instantiations less SM90_EXTRA_CONFIGS' and the stream-K tail's (what gemm() and the
    tile rule pick for every shape): one module; an experiment's config and a tail kernel compile
    as a module of their own when first needed, so the library's first call does not compile
    kernels most shapes never run."""
    extra = {c.name(d) for c in SM90_EXTRA_CONFIGS.values() for d in SM90_CTYPES}
    tails = {dataclasses.replace(c, tail=1).name(d) for c in SM90_CONFIGS.values() for d in SM90_CTYPES}
    return tuple(sorted(set(rt.name_expressions_for(SRC)) - extra - tails))


@functools.cache
def _loaded(name: str, device_index: int, cluster: int, threads: int, shmem: int,
            options: tuple[str, ...] = DEFAULT_COMPILE_OPTIONS) -> _Loaded:
    lib = _library_names()
    mod = rt.load(SRC, lib if name in lib else (name,), options=options, device_index=device_index)
    k = mod.kernel(name, [])
    k.set_max_dynamic_shared(shmem)
    d = _driver()
    func = _check_cu(d.cuKernelGetFunction(k.handle.handle), "cuKernelGetFunction")
    try:
        clusters = k.max_active_clusters(cluster, threads, shmem) if cluster > 1 else \
            rt.sm_count(device_index) * max(1, k.max_active_blocks_per_sm(threads, shmem))
    except Exception:  # an occupancy API this cuda.core lacks: one CTA an SM, clusters in TPC pairs
        clusters = rt.sm_count(device_index) // cluster
    return _Loaded(func, max(1, int(clusters)))


def _bulk_store(cfg: Sm90Config, options: tuple[str, ...] = DEFAULT_COMPILE_OPTIONS) -> bool:
    """Whether the kernel writes C with TMA stores (and needs C's tensor map): with two or more
    consumer warpgroups, unless an experiment's -DTW_TMA_STORE=0 / 1 says otherwise (the .cu's rule);
    never for C's transposed tile (swap), which stages and stores per thread."""
    if cfg.swap:
        return False
    for opt in options:
        if opt.startswith("-DTW_TMA_STORE"):
            return opt != "-DTW_TMA_STORE=0"
    return cfg.consumers > 1



@functools.cache
def _tail_name(cfg: Sm90Config, dtype: torch.dtype) -> str | None:
    """The stream-K tail kernel of ``cfg`` (its TAIL = 1 instantiation), None where there is none."""
    name = dataclasses.replace(cfg, tail=1).name(dtype)
    return name if name in _instantiated() else None


_ARG_TYPES = (None, None, None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)


def _check_operands(fn: str, a, b, dtypes: tuple, dtype_words: str) -> tuple[int, int, int]:
    """The checks gemm_sm90 and gemm_tf32 share (tensors, 2-D, inner dimensions, one dtype of
    ``dtypes`` for both, one CUDA device, nothing empty); returns (M, N, K)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"{fn}: a and b must be tensors")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{fn}: a and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{fn}: inner dimensions differ: a {tuple(a.shape)} @ b {tuple(b.shape)}")
    if a.dtype not in dtypes or b.dtype != a.dtype:
        raise ValueError(f"{fn}: a and b must {dtype_words}, got {a.dtype} and {b.dtype}")
    if not (a.is_cuda and b.is_cuda) or a.device != b.device:
        raise ValueError(f"{fn}: a and b must be on one CUDA device, got {a.device} and {b.device}")
    (M, K), N = a.shape, b.shape[1]
    if min(M, N, K) < 1:
        raise ValueError(f"{fn}: empty operand ({M} x {K} @ {K} x {N}); use torch.matmul")
    return M, N, K


def gemm_sm90(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
              config: str | Sm90Config | None = None, clusters: int | None = None, tail_splits: int | None = None,
              pdl: bool = True, compile_options: tuple[str, ...] = DEFAULT_COMPILE_OPTIONS) -> torch.Tensor:
    """C (M, N) = A (M, K) @ B (K, N) in A's dtype (fp16 / bf16), fp32 accumulation; see the module
    docstring for layouts; N a multiple of 8. ``out``: an (M, N) tensor of A's dtype with
    unit-stride rows, a row stride that is a multiple of 8 and 16-byte alignment. For experiments:
    ``clusters``, how many clusters to launch (default: as many as are resident at once, from the
    occupancy API); ``tail_splits``, the stream-K tail's K ranges (None: ``configs.sm90_tail_splits``
    and ``sm90_split_k``; 1: no tail split; k > 1: k where the kernel can take it);
    ``compile_options``, NVRTC's options (-D variants). ``pdl``: programmatic dependent launch."""
    M, N, K = _check_operands("gemm_sm90", a, b, tuple(SM90_CTYPES), "both be float16 or bfloat16")
    if N % 8:
        raise ValueError(f"gemm_sm90: N = {N} must be a multiple of 8 (C is written in 16-byte chunks)")
    if not available(a.get_device()):
        raise RuntimeError("gemm_sm90 needs a compute capability 9.0 GPU (sm_90a) and cuda-bindings")
    if not _rows_ok(a, 1):
        raise ValueError("gemm_sm90: a needs unit-stride rows, 16-byte aligned start and row stride "
                         f"(shape {tuple(a.shape)}, strides {a.stride()}, address % 16 = {a.data_ptr() % 16})")
    trans_b = b_layout(b)
    if trans_b is None:
        raise ValueError("gemm_sm90: b needs unit-stride rows (K, N) or unit-stride columns (w.T), with "
                         f"16-byte aligned start and stride (strides {b.stride()})")
    if config is None:
        cfg = SM90_CONFIGS[sm90_config_for(M, N, K, rt.sm_count(a.get_device()))] if trans_b else SM90_KMAJOR_CONFIG
    elif isinstance(config, Sm90Config):
        cfg = config
    else:
        cfg = SM90_CONFIGS.get(config) or SM90_EXTRA_CONFIGS.get(config)
        if cfg is None:
            raise ValueError(f"gemm_sm90: unknown config {config!r}; one of "
                             f"{sorted(SM90_CONFIGS) + sorted(SM90_EXTRA_CONFIGS)}")
    if cfg.trans_b != trans_b:
        cfg = dataclasses.replace(cfg, trans_b=trans_b)
    name = cfg.name(a.dtype)
    if name not in _instantiated():
        raise ValueError(f"gemm_sm90: {name} is not instantiated in {SRC.name}")
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    else:
        problem = out_problem(out, a.dtype, a.device, M, N)
        if problem is not None:
            raise ValueError(f"gemm_sm90: {problem}")
    return _launch(a, b, out, cfg, clusters, tail_splits=tail_splits, pdl=pdl, compile_options=compile_options)


# Launch with programmatic dependent launch (the kernel's griddepcontrol instructions): the next
# kernel's CTAs are placed and set up while this one drains: back to back 1000^3 fp16 8.32 -> 7.71
# us, 0.14-0.17 us slower after a kernel that does not trigger early
# (docs/tuning/gemm.md, "sm90 programmatic dependent launch"); pdl=False (gemm()'s
# GemmPolicy(pdl=False)) launches plainly.


@functools.lru_cache(maxsize=256)
def _pdl_config(grid: int, threads: int, shmem: int, stream: int):
    """The launch configuration with programmatic stream serialization allowed (built once per
    grid, block, shared memory and stream)."""
    d = _driver()
    attr = d.CUlaunchAttribute()
    attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    c = d.CUlaunchConfig()
    c.gridDimX, c.gridDimY, c.gridDimZ = grid, 1, 1
    c.blockDimX, c.blockDimY, c.blockDimZ = threads, 1, 1
    c.sharedMemBytes = shmem
    c.hStream = d.CUstream(stream)
    c.attrs = [attr]
    c.numAttrs = 1
    return c


def _launch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: Sm90Config, clusters: int | None = None, *,
            tail_splits: int | None = None, pdl: bool = True,
            compile_options: tuple[str, ...] = DEFAULT_COMPILE_OPTIONS):
    """gemm_sm90's launch without its checks, for operands they accepted (gemm()'s plans call it
    for a layout whose key the checked call has seen: dtype, shapes, strides, 16-byte alignment,
    device); ``cfg`` with B's layout already in trans_b. Returns out."""
    M, K = a.shape
    N = b.shape[1]
    trans_b = cfg.trans_b
    dev = a.get_device()
    ld = _loaded(cfg.name(a.dtype), dev, cfg.cluster, cfg.threads, cfg.shmem, compile_options)
    map_a = tensor_map(a, 64, cfg.bm // cfg.cn, 128)
    if trans_b:
        bch = 64 if cfg.bn % 64 == 0 else 32
        map_b = tensor_map(b, bch, 64 // cfg.cm, 2 * bch)
    else:
        map_b = tensor_map(b.t(), 64, cfg.bn // cfg.cm, 128)
    if _bulk_store(cfg, compile_options):  # the epilogue's TMA stores: boxes of 64 rows x cw columns
        cw = 64 if cfg.epi_n % 64 == 0 else 32
        map_c = tensor_map(out, cw, 64, 2 * cw)
    else:  # not read by the kernel
        map_c = map_a
    cluster_tiles = cfg.cluster_tiles(M, N)
    cap = clusters or ld.clusters  # clusters resident at once
    resident = min(cluster_tiles, cap)
    kt = -(-K // 64)
    # The tail kernel of this config (none for SWAP, K-major B and the experiments' tiles) splits
    # the tiles of a partial last wave after whole ones (stream-K tail), or, with fewer tiles than
    # resident clusters, every tile (split-K: cluster_tiles x sk clusters launched).
    tail_name = _tail_name(cfg, a.dtype)
    tail = cluster_tiles % cap if cluster_tiles > cap else cluster_tiles
    if tail_name is None or tail == 0:
        sk = 1
    elif tail_splits is None:
        sk = sm90_tail_splits(cluster_tiles, cap, kt) if cluster_tiles > cap else sm90_split_k(cluster_tiles, cap, kt)
    else:  # forced: at most one unit a resident cluster, one K block a unit
        sk = max(1, min(tail_splits, kt, cap // tail))
    if sk > 1 and cluster_tiles <= cap:
        resident = cluster_tiles * sk
    grid = resident * cfg.cluster
    ws_ptr = flags_ptr = 0
    if sk > 1:
        ld = _loaded(tail_name, dev, cfg.cluster, cfg.threads, cfg.shmem, compile_options)
        # per call from the caching allocator (stream-ordered, and a graph capture's own pool):
        # concurrent calls on other streams never share a workspace; the counters start at zero
        ws = torch.empty(tail * sk * cfg.cluster * cfg.bm * cfg.bn, dtype=torch.float32, device=a.device)
        flags = torch.zeros(tail * cfg.cluster * cfg.consumers, dtype=torch.int32, device=a.device)
        ws_ptr, flags_ptr = ws.data_ptr(), flags.data_ptr()
    d = _driver()
    stream = torch.cuda.current_stream(dev).cuda_stream
    args = ((map_a, map_b, map_c, out.data_ptr(), M, N, K, out.stride(0), ws_ptr, flags_ptr, sk), _ARG_TYPES)
    if pdl:
        _cu_launch(d.cuLaunchKernelEx, (_pdl_config(grid, cfg.threads, cfg.shmem, stream), ld.func, args, 0), dev)
    else:
        _cu_launch(d.cuLaunchKernel, (ld.func, grid, 1, 1, cfg.threads, 1, 1, cfg.shmem, d.CUstream(stream), args, 0),
                   dev)
    return out


def _cu_launch(fn, launch: tuple, dev: int) -> None:
    """``fn(*launch)`` (cuLaunchKernel or cuLaunchKernelEx) with dev's context current (the
    function handle belongs to it), its error raised; synchronized under TILEWISE_DEBUG_SYNC."""
    if torch.cuda.current_device() == dev:
        err = fn(*launch)[0]
    else:
        with torch.cuda.device(dev):
            err = fn(*launch)[0]
    _check_cu((err, None), fn.__name__)
    if rt.debug_sync():
        torch.cuda.synchronize(dev)



# --------------------------------------------------------------------------- tf32, row-major B

SRC_TF32 = SRC.with_name("sm90_tf32.cu")
_TF32_ARGS = (None, None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong)


def tf32_applies(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> bool:
    """Whether gemm_tf32 takes these operands: fp32 A and B on one sm_90 device, A with unit-stride
    rows and B with unit-stride rows (row-major (K, N)), 16-byte aligned starts and row strides
    (TMA), M, N, K >= 1; an ``out`` of fp32 (M, N) with unit-stride rows. Sizes are not judged."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    ok = (a.is_cuda and b.is_cuda and a.dim() == 2 and b.dim() == 2 and a.device == b.device
          and tf32_takes(Operand.of(a), Operand.of(b)))
    if ok and out is not None:
        ok = (isinstance(out, torch.Tensor) and _tf32_out_problem(out, a.device, a.shape[0], b.shape[1]) is None)
    return ok and available(a.get_device())


def _tf32_out_problem(out: torch.Tensor, device: torch.device, M: int, N: int) -> str | None:
    if tuple(out.shape) != (M, N) or out.dtype != torch.float32 or out.device != device:
        return f"out must be ({M}, {N}) float32 on {device}, got {tuple(out.shape)} {out.dtype} on {out.device}"
    if not tf32_out_rows_ok(Operand.of(out), N):
        return f"out needs unit-stride rows (strides {out.stride()})"
    return None


def _tf32_name(bm: int, cluster: int) -> str:
    return f"gemm_sm90_tf32<{bm},{TF32_CONFIGS[bm]}>" if cluster == 1 else \
        f"gemm_sm90_tf32<{bm},{TF32_CONFIGS[bm]},{cluster}>"


@functools.cache
def _tf32_func(bm: int, cluster: int, device_index: int):
    """(the kernel's function handle, CTAs resident at once)."""
    names = tuple(rt.name_expressions_for(SRC_TF32))
    mod = rt.load(SRC_TF32, names, options=("-std=c++17",), device_index=device_index)
    k = mod.kernel(_tf32_name(bm, cluster), [])
    k.set_max_dynamic_shared(_tf32_shmem(bm))
    func = _check_cu(_driver().cuKernelGetFunction(k.handle.handle), "cuKernelGetFunction")
    sms = rt.sm_count(device_index)
    if cluster == 1:
        return func, sms
    try:
        resident = k.max_active_clusters(cluster, 384, _tf32_shmem(bm)) * cluster
    except Exception:  # an occupancy API this cuda.core lacks: clusters in SM pairs
        resident = sms // cluster * cluster
    return func, max(cluster, min(int(resident), sms // cluster * cluster))


def _tf32_shmem(bm: int) -> int:
    return TF32_CONFIGS[bm] * (bm * 32 * 4 + 32 * 128 * 4) + 1024  # the ring, + 1 KiB to align it


def gemm_tf32(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
              bm: int | None = None, cluster: int | None = None) -> torch.Tensor:
    """C (M, N) = A (M, K) @ B (K, N) on tensor cores in tf32, fp32 in and out, fp32 accumulate,
    with B row-major as given (no transposing copy; see gemm_sm90_tf32.cu). A and B: unit-stride
    rows, 16-byte aligned starts and row strides (K and N multiples of 4 for contiguous tensors).
    ``out``: fp32 (M, N) with unit-stride rows (any row stride >= N). ``bm``: 256, 192, 128 or 64
    C rows a tile (default ``tf32_bm_for``). ``cluster``: 1, or 2 for CTA pairs along N that share
    A's blocks by TMA multicast (BM 256, 192 or 128; default ``tf32_cluster_for``). Rounding: the
    tensor cores read the top 19 bits of each fp32 operand (tf32), as cuBLAS's TF32 kernels do."""
    M, N, K = _check_operands("gemm_tf32", a, b, (torch.float32,), "be float32")
    for name, t in (("a", a), ("b", b)):
        if not _rows_ok(t, 1):
            raise ValueError(f"gemm_tf32: {name} needs unit-stride rows, 16-byte aligned start and row stride "
                             f"(shape {tuple(t.shape)}, strides {t.stride()}, address % 16 = {t.data_ptr() % 16})")
    if not available(a.get_device()):
        raise RuntimeError("gemm_tf32 needs a compute capability 9.0 GPU (sm_90a) and cuda-bindings")
    if bm is None:
        bm = tf32_bm_for(M, N, rt.sm_count(a.get_device()))
    elif bm not in TF32_CONFIGS:
        raise ValueError(f"gemm_tf32: bm must be one of {sorted(TF32_CONFIGS)}, got {bm}")
    if cluster is not None and (cluster not in (1, 2) or (cluster == 2 and bm not in TF32_PAIRS)):
        raise ValueError(f"gemm_tf32: no cluster {cluster} kernel for bm {bm}")
    if out is not None:
        problem = _tf32_out_problem(out, a.device, M, N)
        if problem is not None:
            raise ValueError(f"gemm_tf32: {problem}")
        if may_overlap(out, a) or may_overlap(out, b):
            raise ValueError("gemm_tf32: out shares memory with a or b (tiles would read overwritten inputs)")
    return _tf32_launch(a, b, out, bm, cluster)


def _tf32_launch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, bm: int | None = None,
                 cluster: int | None = None) -> torch.Tensor:
    """gemm_tf32's launch without its checks, for operands they (or ``tf32_applies`` and an
    overlap test, as gemm() does) accepted; bm and cluster None take the rules. Returns out."""
    (M, K), N = a.shape, b.shape[1]
    dev = a.get_device()
    if bm is None:
        bm = tf32_bm_for(M, N, rt.sm_count(dev))
    if cluster is None:
        cluster = tf32_cluster_for(M, N, bm)
    if out is None:
        out = torch.empty((M, N), dtype=torch.float32, device=a.device)
    func, resident = _tf32_func(bm, cluster, dev)
    ma, mb = tensor_map(a, 32, bm // cluster, 128), tensor_map(b, 32, 32, 128)
    ctas = cdiv(M, bm) * cdiv(cdiv(N, 128), cluster) * cluster  # one a tile, in whole clusters
    grid = min(ctas, resident)
    d = _driver()
    args = ((ma, mb, out.data_ptr(), M, N, K, out.stride(0)), _TF32_ARGS)
    stream = torch.cuda.current_stream(dev).cuda_stream
    _cu_launch(d.cuLaunchKernel, (func, grid, 1, 1, 384, 1, 1, _tf32_shmem(bm), d.CUstream(stream), args, 0), dev)
    return out
