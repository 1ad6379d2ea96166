"""Launchers of ``cluster.cu``: softmax / log-softmax forward and backward and
cross-entropy (loss and gradient in one pass) for rows too long for one CTA's registers.

A row is split over a thread-block cluster (sm_90) of ``cl`` CTAs of ``nt`` threads, each thread
holding ``ch`` 16-byte vectors of it in registers; the row's max / sum / dot are reduced in each
block and then across the cluster through distributed shared memory. The input is read once and
the output written once, so the bound is the bytes floor at copy bandwidth (forward 2, backward 3,
cross-entropy with gradient 2 passes over the row), where the two-pass Triton kernels (v3_online)
re-read the row and reach 62-66 % of it at 131072 columns on the H200.

A configuration ``(cl, nt, ch)`` holds rows of up to ``cl * nt * ch * (16 / itemsize)`` elements.
``configs.pick(dtype, N, kind)`` takes the smallest listed configuration that holds the row (the
tables, with the TMA and one-exp ones, are in ``configs``). The layout
must allow 16-byte vectors: unit stride along the row, N, the row stride and the base pointer
multiples of 16 bytes (``unsupported_reason`` says what is missing).

The softmax and cross-entropy modules expose these as their ``v5_cluster_cuda`` variants.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import torch

from ...runtime import cuda as rt
from ...runtime.lazy import LazyModule, load_lazy
from .configs import CONFIGS, EXTRA_BF16, EXTRA_FP32, ONE_EXP_CONFIGS, PIPE_KINDS, SHMEM_LIMIT, TMA_CONFIGS, \
    TMA_DEFAULT, capacity, max_row, one_exp_default, pick, pipe_configs, pipe_shmem, tma_shmem

_SRC = Path(__file__).with_name("cluster.cu")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_NAMES = {"fwd": "rc_softmax_fwd", "bwd": "rc_softmax_bwd", "ce": "rc_cross_entropy",
          "fwd_pipe": "rc_softmax_fwd_pipe", "ce_pipe": "rc_cross_entropy_pipe",
          "fwd_tma": "rc_softmax_fwd_tma", "ce_tma": "rc_cross_entropy_tma"}
_TMA_TYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}


def pipe_unsupported_reason(*ts: torch.Tensor, kind: str = "fwd") -> str | None:
    """As ``unsupported_reason``, for the pipelined (v6) kernels, whose two row slices must fit in
    one block's shared memory (rows up to 131072 for 2-byte types and fp32)."""
    why = unsupported_reason(*ts, kind=kind)
    if why:
        return why
    t0 = ts[0]
    if kind not in PIPE_KINDS:
        return f"no pipelined kernel for {kind!r}"
    if pipe_shmem(pick(t0.dtype, t0.shape[-1], kind)) > SHMEM_LIMIT:
        return f"rows of {t0.shape[-1]} {t0.dtype} need more shared memory than a block has"
    return None


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


@functools.cache
def _cc_ok(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def unsupported_reason(*ts: torch.Tensor, kind: str = "fwd") -> str | None:
    """None when the cluster kernels take these (N, row-stride) 2-D tensors, else why not."""
    t0 = ts[0]
    if not t0.is_cuda:
        return "needs CUDA tensors"
    if not _cc_ok(_device_index(t0)):
        return "thread-block clusters need compute capability 9.0 (Hopper) or newer"
    if t0.dtype not in _DTYPES:
        return f"dtype {t0.dtype} is not float32/float16/bfloat16"
    N = t0.shape[-1]
    v = 16 // t0.dtype.itemsize
    if N > max_row(t0.dtype, kind):
        return f"rows of {N} exceed {max_row(t0.dtype, kind)} elements"
    for t in ts:
        if t.dim() != 2 or t.stride(1) != 1 or t.shape[1] % v or t.stride(0) % v or t.data_ptr() % 16:
            return (f"needs unit-stride rows whose length ({N}), stride and start are multiples of "
                    f"16 bytes ({v} elements)")
    return None


@functools.cache
def _module(device_index: int) -> LazyModule:
    # each kernel compiled on its first use (runtime/lazy.py): all 77 at once take ~13 s on the CI host
    return load_lazy(_SRC, module_names(), device_index=device_index)


def module_names() -> list[str]:
    """Every kernel of cluster.cu the launchers use (duplicates dropped, first kept)."""
    names = []
    for (kind, size), cfgs in CONFIGS.items():
        types = ("__nv_bfloat16", "__half") if size == 2 else ("float",)
        for ty in types:
            extra = EXTRA_BF16[kind] if ty == "__nv_bfloat16" else EXTRA_FP32[kind] if ty == "float" else ()
            for cl, nt, ch in tuple(cfgs) + tuple(extra):
                names.append(f"{_NAMES[kind]}<{ty},{cl},{nt},{ch}>")
    for (kind, size), cfgs in ONE_EXP_CONFIGS.items():
        for ty in (("__nv_bfloat16",) if size == 2 else ("float",)):
            for cl, nt, ch in cfgs:
                names.append(f"{_NAMES[kind]}<{ty},{cl},{nt},{ch},true>")
    for kind in PIPE_KINDS:
        for size, types in ((2, ("__nv_bfloat16", "__half")), (4, ("float",))):
            for ty in types:
                for cl, nt, ch in pipe_configs(kind, size):
                    names.append(f"{_NAMES[kind + '_pipe']}<{ty},{cl},{nt},{ch}>")
    for (kind, size), cfgs in TMA_CONFIGS.items():
        for cl, nt, ch, st, mb in cfgs:
            names.append(f"{_NAMES[kind + '_tma']}<__nv_bfloat16,{cl},{nt},{ch},{st},{mb}>")
        cl, nt, ch, st, mb = TMA_DEFAULT[(kind, size)]
        names.append(f"{_NAMES[kind + '_tma']}<__half,{cl},{nt},{ch},{st},{mb}>")
    return list(dict.fromkeys(names))


def _params(kind: str, dtype: torch.dtype):
    T = rt.Tensor
    if kind == "fwd":
        return (T("x", (dtype,)), T("y", (dtype,)), rt.Scalar("M", "i64"), rt.Scalar("N", "i64"),
                rt.Scalar("sx", "i64"), rt.Scalar("sy", "i64"), rt.Scalar("log", "i32"))
    if kind == "bwd":
        return (T("y", (dtype,)), T("dy", (dtype,)), T("dx", (dtype,)), rt.Scalar("M", "i64"),
                rt.Scalar("N", "i64"), rt.Scalar("sy", "i64"), rt.Scalar("sdy", "i64"),
                rt.Scalar("sdx", "i64"), rt.Scalar("log", "i32"))
    return (T("x", (dtype,)), T("target", (torch.int64,)), T("loss", (torch.float32,)), T("dx", (dtype,)),
            rt.Scalar("M", "i64"), rt.Scalar("N", "i64"), rt.Scalar("sx", "i64"), rt.Scalar("sdx", "i64"),
            rt.Scalar("ignore_index", "i64"), rt.Scalar("smoothing", "f32"), rt.Scalar("grad_scale", "f32"),
            T("scale_dev", (torch.float32,), nullable=True), rt.Scalar("grad", "i32"))


def _strided_params(kind: str, dtype: torch.dtype) -> tuple:
    """The kernel's parameters for tensors of unit-stride rows: the kernels take row strides, so the
    tensors need not be contiguous."""
    return tuple(dataclasses.replace(p, contiguous=False) if isinstance(p, rt.Tensor) else p
                 for p in _params(kind, dtype))


@functools.cache
def _kernel(kind: str, dtype: torch.dtype, config: tuple[int, int, int], device_index: int,
            one_exp: bool = False) -> rt.Kernel:
    cl, nt, ch = config
    name = f"{_NAMES[kind]}<{rt.ctype(dtype)},{cl},{nt},{ch}{',true' if one_exp else ''}>"
    k = _module(device_index).kernel(name, _strided_params(kind.replace("_pipe", ""), dtype))
    if kind.endswith("_pipe") and pipe_shmem(config) > 48 * 1024:
        k.set_max_dynamic_shared(pipe_shmem(config))
    return k


def _resident(k: rt.Kernel, cl: int, nt: int, shmem: int, device_index: int) -> int:
    """Clusters of kernel k (cl CTAs of nt threads, shmem bytes of dynamic shared memory) that run
    at once: the size of a persistent grid (rows are dealt out statically, so a cluster that
    waited for a free GPC would double the tail)."""
    try:
        import cuda.core as cc

        lc = cc.LaunchConfig(grid=1, cluster=cl, block=nt, shmem_size=shmem)
        n = int(k.handle.occupancy.max_active_clusters(lc, stream=cc.Device(device_index).default_stream))
        if n > 0:
            return n
    except Exception:  # an older cuda.core: estimate from blocks per SM, GPC packing aside
        pass
    return max(1, rt.sm_count(device_index) * k.max_active_blocks_per_sm(nt, shmem) // cl * 3 // 4)


@functools.cache
def _resident_clusters(kind: str, dtype: torch.dtype, config: tuple[int, int, int], device_index: int) -> int:
    """Resident clusters of the pipelined (v6) kernel: its persistent grid."""
    cl, nt, _ = config
    return _resident(_kernel(kind, dtype, config, device_index), cl, nt, pipe_shmem(config), device_index)


@functools.cache
def _tma_kernel(kind: str, dtype: torch.dtype, config: tuple[int, ...], device_index: int):
    """(kernel, resident clusters) of a TMA-pipelined kernel: the grid is persistent."""
    cl, nt, ch, st, mb = config
    name = f"{_NAMES[kind + '_tma']}<{rt.ctype(dtype)},{cl},{nt},{ch},{st},{mb}>"
    k = _module(device_index).kernel(name, _strided_params(kind, dtype))
    shmem = tma_shmem(config)
    if shmem > 48 * 1024:
        k.set_max_dynamic_shared(shmem)
    return k, _resident(k, cl, nt, shmem, device_index)


def tma_unsupported_reason(*ts: torch.Tensor, kind: str = "fwd", config=None) -> str | None:
    """None when the TMA-pipelined (v7) kernel takes these tensors, else why not."""
    why = unsupported_reason(*ts, kind=kind)
    if why:
        return why
    t0 = ts[0]
    cfgs = TMA_CONFIGS.get((kind, t0.dtype.itemsize), ())
    if t0.dtype not in _TMA_TYPES or not cfgs:
        return f"the TMA-pipelined kernel is built for bfloat16 / float16 {kind} only, got {t0.dtype}"
    cfg = TMA_DEFAULT[(kind, 2)] if config is None else tuple(config)
    if t0.dtype == torch.float16:
        cfgs = (TMA_DEFAULT[(kind, 2)],)
    if cfg not in cfgs:
        return f"config {cfg} is not built for {t0.dtype} (built: {cfgs})"
    if capacity(t0.dtype, cfg[:3]) < t0.shape[1]:
        return f"rows of {t0.shape[1]} exceed the {capacity(t0.dtype, cfg[:3])} elements config {cfg} holds"
    if tma_shmem(cfg) > SHMEM_LIMIT:
        return f"config {cfg} needs {tma_shmem(cfg)} bytes of shared memory"
    return None


def _tma_launch(kind: str, t0: torch.Tensor, config, args: tuple) -> None:
    """Launch the checked TMA-pipelined kernel of ``kind`` on t0's rows: a persistent grid of as
    many clusters as run at once (at most one a row)."""
    M = t0.shape[0]
    if not M:
        return
    cfg = TMA_DEFAULT[(kind, 2)] if config is None else tuple(config)
    k, clusters = _tma_kernel(kind, t0.dtype, cfg, _device_index(t0))
    k((min(M, clusters) * cfg[0],), (cfg[1],), *args, shmem=tma_shmem(cfg))


def softmax_fwd_tma(x2: torch.Tensor, y2: torch.Tensor, log: bool, config=None) -> None:
    """y2 = (log_)softmax(x2) along rows by the TMA-pipelined (v7) kernel; bf16 / fp16 (M, N), N up to
    the config's capacity (131072 at (8, 256, 8, *)); ``tma_unsupported_reason`` says what it takes."""
    why = tma_unsupported_reason(x2, y2, kind="fwd", config=config)
    if why:
        raise ValueError(f"rowwise_cluster.softmax_fwd_tma: {why}")
    M, N = x2.shape
    _tma_launch("fwd", x2, config, (x2, y2, M, N, x2.stride(0), y2.stride(0), int(log)))


def cross_entropy_tma(x: torch.Tensor, target: torch.Tensor, loss_rows: torch.Tensor, dx: torch.Tensor | None,
                      ignore_index: int, smoothing: float, grad_scale: float, config=None,
                      scale_dev: torch.Tensor | None = None) -> None:
    """As ``cross_entropy``, by the TMA-pipelined (v7) kernel: bf16 / fp16 logits (M, N), N up to the
    config's capacity; ``tma_unsupported_reason(x, kind="ce")`` says what it takes. ``dx`` may be
    ``x`` itself (the gradient written over the logits: each row is read whole before any CTA of its
    cluster writes)."""
    ts = (x,) if dx is None else (x, dx)
    why = tma_unsupported_reason(*ts, kind="ce", config=config)
    if why:
        raise ValueError(f"rowwise_cluster.cross_entropy_tma: {why}")
    M, N = x.shape
    grad = dx is not None
    d = dx if grad else x  # never written without grad
    _tma_launch("ce", x, config, (x, target, loss_rows, d, M, N, x.stride(0), d.stride(0) if grad else 0,
                                  int(ignore_index), float(smoothing), float(grad_scale), scale_dev, int(grad)))


def _launch(kind, t0, config, M, args, pipe=False, one_exp=None):
    cfg = pick(t0.dtype, t0.shape[1], kind) if config is None else tuple(config)
    if capacity(t0.dtype, cfg) < t0.shape[1]:
        raise ValueError(f"rowwise_cluster: config {cfg} holds {capacity(t0.dtype, cfg)} < {t0.shape[1]} elements")
    cl, nt, _ = cfg
    dev = _device_index(t0)
    if one_exp is None:  # the default: one exp wherever it is built
        one_exp = one_exp_default(kind, t0.dtype, cfg, pipe)
    if one_exp:
        built = ONE_EXP_CONFIGS.get((kind, t0.dtype.itemsize), ())
        if pipe or t0.dtype == torch.float16 or cfg not in built:
            raise ValueError(f"rowwise_cluster: one_exp is built for {kind} {t0.dtype} only at {built} "
                             f"(bf16 / fp32, not pipelined), got {cfg}")
        _kernel(kind, t0.dtype, cfg, dev, True)((M * cl,), (nt,), *args)
        return
    if pipe:
        if cfg not in pipe_configs(kind, t0.dtype.itemsize):
            raise ValueError(f"rowwise_cluster: the pipelined {kind} kernel is built for "
                             f"{pipe_configs(kind, t0.dtype.itemsize)} "
                             f"({t0.dtype}), got {cfg}: two slices of it need {pipe_shmem(cfg)} B of shared memory")
        kk = kind + "_pipe"
        k = _kernel(kk, t0.dtype, cfg, dev)
        clusters = min(M, _resident_clusters(kk, t0.dtype, cfg, dev))
        k((clusters * cl,), (nt,), *args, shmem=pipe_shmem(cfg))
        return
    k = _kernel(kind, t0.dtype, cfg, dev)
    # One row per cluster: the grid counts blocks, a multiple of the compile-time cluster size.
    k((M * cl,), (nt,), *args)


def softmax_fwd(x2: torch.Tensor, y2: torch.Tensor, log: bool, config=None, pipe: bool = False,
                one_exp: bool | None = None) -> None:
    """y2 = (log_)softmax(x2) along rows; x2, y2 (M, N) of one dtype (see unsupported_reason).
    ``pipe``: the persistent, cp.async double-buffered kernel (v6). ``one_exp``: one exp an
    element (the sum pass keeps exp(x - block max) in place of x; ONE_EXP_CONFIGS only; None = where
    built)."""
    M, N = x2.shape
    if M:
        _launch("fwd", x2, config, M, (x2, y2, M, N, x2.stride(0), y2.stride(0), int(log)), pipe, one_exp)


def softmax_bwd(y2: torch.Tensor, g2: torch.Tensor, dx2: torch.Tensor, log: bool, config=None) -> None:
    """dx2 = softmax backward from y2 (probabilities, or log-probabilities when log) and g2."""
    M, N = y2.shape
    if M:
        _launch("bwd", y2, config, M, (y2, g2, dx2, M, N, y2.stride(0), g2.stride(0), dx2.stride(0), int(log)))


def cross_entropy(x: torch.Tensor, target: torch.Tensor, loss_rows: torch.Tensor, dx: torch.Tensor | None,
                  ignore_index: int, smoothing: float, grad_scale: float, config=None, pipe: bool = False,
                  one_exp: bool | None = None, scale_dev: torch.Tensor | None = None) -> None:
    """loss_rows[i] (fp32) and, when dx is given, dx = dL/dx scaled by grad_scale (times the
    device scalar ``scale_dev``, a float32 tensor of one element, when given), for logits x (M, N)
    and int64 targets (M,) already range-checked (or ignore_index)."""
    M, N = x.shape
    if M:
        grad = dx is not None
        d = dx if grad else x  # never written without grad
        _launch("ce", x, config, M, (x, target, loss_rows, d, M, N, x.stride(0), d.stride(0) if grad else 0,
                                     int(ignore_index), float(smoothing), float(grad_scale), scale_dev, int(grad)),
                pipe, one_exp)
