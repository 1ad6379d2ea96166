"""reduce: sum / max / mean of a tensor along one dimension (keepdim or not, any strides), and the
masked mean of padded sequences (mean pooling), forward and backward.

Versions (``reduce.cu``; rows are the outputs, each a walk of length R with stride rs in x):
    v1_thread:  one thread per output, a serial loop over its row. Coalesced only when neighbouring
                outputs are neighbours in memory (a leading dim), and then only n_out threads run.
                bound: latency (too few loads in flight) unless n_out is in the millions.
    v2_smem:    one 256-thread block per row; threads stride the row, shared-memory tree.
                bound: copy bandwidth for long contiguous rows; short rows leave threads idle.
    v3_warp:    1, 2, 4 or 8 warps per row (8, 4, 2 or 1 rows per block, picked from R), 16-byte
                loads when the row is contiguous and aligned, warp shuffles then one smem step.
                bound: copy bandwidth (n x itemsize read) for the last dim.
    v4_columns: for a reduced dim that is not innermost: 32 adjacent outputs per block (coalesced),
                the row split over 8 thread rows and over grid.y blocks (float workspace + a small
                finishing kernel). bound: copy bandwidth for the first dim.
    v5_columns: v4 with 16-byte loads: x seen as (B, R, C) with the kept dims collapsed to (B, C)
                and C contiguous; a (TX, TY) block owns TX x 16 bytes of adjacent columns and a
                chunk of rows, U vector loads in flight per thread (``ColumnsConfig``), the row
                split over grid.y in about ``waves`` full waves of resident blocks; partials in a
                float workspace folded by the finishing kernel in a fixed order (deterministic).
                Needs C, the row stride and B's stride multiples of 16 / itemsize and a 16-byte
                aligned x; other layouts run v4_columns. bound: copy bandwidth.

The public ``reduce`` takes v3_warp when the reduced dim is innermost in memory (rs == 1) or the
outputs are not adjacent in memory, else v5_columns where its layout applies, else v4_columns.
Accumulation in fp32; max propagates NaN.
"""

from __future__ import annotations

import functools
from pathlib import Path
from dataclasses import replace

import torch

from ...cost import Cost
from ...runtime import cuda as rt
from ...runtime.lazy import LazyModule, load_lazy
from .._checks import runs_reference
from .configs import COLUMNS_DEFAULT, COLUMNS_VERSION, ColumnsConfig
from .layout import check_inputs, collapse, compiling, layout_tensor, layout_words, out_tensor

_SRC = Path(__file__).with_name("reduce.cu")
_THREADS = 256
OPS = ("sum", "max", "mean")
_FUNCTOR = {"sum": "Sum", "mean": "Sum", "max": "Max"}


def reference(x: torch.Tensor, dim: int, op: str = "sum", keepdim: bool = False) -> torch.Tensor:
    """PyTorch: reads x once (n x itemsize bytes), writes n / R outputs."""
    f = {"sum": torch.sum, "max": torch.amax, "mean": torch.mean}[op]
    return f(x, dim, keepdim=keepdim)


def cost(shape: tuple[int, ...], dim: int, dtype: torch.dtype = torch.float32) -> Cost:
    """One add (or max) per input element; x read once, the output written once."""
    n = 1
    for s in shape:
        n *= s
    n_out = n // shape[dim] if shape[dim] else 0
    itemsize = dtype.itemsize
    return Cost(flops=n, bytes=(n + n_out) * itemsize)


def _reduce_name(version, functor, dtype):
    return f"reduce_{version}<{rt.ctype(dtype)},rd::{functor}>"


def _mm_name(kind, dtype, ltype):
    return f"masked_mean_{kind}<{rt.ctype(dtype)},{'int' if ltype == torch.int32 else 'i64'}>"


@functools.cache
def _module(dtype: torch.dtype, device_index: int) -> LazyModule:
    # Each kernel of reduce.cu compiled on its first use (runtime/lazy.py).
    return load_lazy(_SRC, module_names(dtype), device_index=device_index)


def module_names(dtype: torch.dtype) -> list[str]:
    """Every kernel of reduce.cu for one dtype (the CPU tests compile this list for sm_90)."""
    names = [_reduce_name(v, f, dtype) for v in ("v1_thread", "v2_smem", "v3_warp", "v4_columns", "finish")
             for f in ("Sum", "Max")]
    names += [columns_name(f, dtype, COLUMNS_DEFAULT[dtype]) for f in ("Sum", "Max")]
    return names + [_mm_name(k, dtype, lt) for k in ("fwd", "bwd") for lt in (torch.int32, torch.int64)]


_kernels: dict[tuple, rt.Kernel] = {}


def _kernel(version, functor, dtype, dev):
    key = (version, functor, dtype, dev)
    k = _kernels.get(key)
    if k is None:
        name = _reduce_name(version, functor, dtype)
        x = rt.Tensor("x", (dtype,), contiguous=False)
        out = rt.Tensor("out", (dtype,))
        meta = rt.Tensor("meta", (torch.int64,))
        row = (rt.Scalar("R", "i64"), rt.Scalar("rs", "i64"), rt.Scalar("scale", "f32"))
        if version == "v3_warp":
            params = (x, out, meta, *row, rt.Scalar("wpr", "i32"))
        elif version == "v4_columns":
            params = (x, out, rt.Tensor("ws", (torch.float32,)), meta, *row)
        elif version == "finish":
            params = (rt.Tensor("ws", (torch.float32,)), out, rt.Scalar("n", "i64"), rt.Scalar("splits", "i32"),
                      rt.Scalar("scale", "f32"))
        else:
            params = (x, out, meta, *row)
        k = _kernels[key] = _module(dtype, dev).kernel(name, params)
    return k


def _prepare(what, x, dim, op, keepdim, out, cuda=True):
    """Checks; then the row walk (length R, stride rs), the other dims with x's strides, and out."""
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"{what}: unknown op {op!r} (argument 'op'); choose from {list(OPS)}")
    if not isinstance(keepdim, bool):  # "no" would keep the dim
        raise ValueError(f"{what}: 'keepdim' must be a bool, got {keepdim!r}")
    check_inputs(what, {"x": x}, cuda=cuda)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ValueError(f"{what}: 'dim' must be an int, got {type(dim).__name__}")
    nd = max(x.dim(), 1)
    if not -nd <= dim < nd:
        raise ValueError(f"{what}: 'dim' = {dim} is out of range for 'x' of {x.dim()} dims")
    dim %= nd
    shape = tuple(x.shape) or (1,)
    strides = tuple(x.stride()) or (1,)
    R, rs = shape[dim], strides[dim]
    other = shape[:dim] + shape[dim + 1:]
    other_strides = strides[:dim] + strides[dim + 1:]
    out_shape = shape[:dim] + (1,) + shape[dim + 1:] if keepdim else other
    if x.dim() == 0:
        out_shape = ()
    if R == 0 and op == "max":
        raise ValueError(f"{what}: max over an empty dim (dim {dim} has size 0) has no identity")
    out = out_tensor(what, out, out_shape, x)
    return dim, R, rs, other, other_strides, out


@functools.lru_cache(maxsize=4096)
def _layout_words(other, other_strides):
    return layout_words(other or (1,), [other_strides or (0,)])


def _layout(other, other_strides, dev):
    return layout_tensor(_layout_words(tuple(other), tuple(other_strides)), dev)


def _trivial(op, R, out):
    """Empty outputs or an empty reduced dim (sum 0, mean NaN as in PyTorch)."""
    if out.numel() == 0:
        return True
    if R == 0:
        out.fill_(0.0 if op == "sum" else float("nan"))
        return True
    return False


def _scale(op, R):
    return 1.0 / R if op == "mean" else 1.0


def _v1(x, dim, op, keepdim, out, version="v1_thread"):
    dim, R, rs, other, ost, out = _prepare(f"reduce.{version}", x, dim, op, keepdim, out)
    if _trivial(op, R, out):
        return out
    dev = x.get_device()
    meta = _layout(other, ost, dev)
    k = _kernel(version, _FUNCTOR[op], x.dtype, dev)
    n = out.numel()
    grid = (n + _THREADS - 1) // _THREADS if version == "v1_thread" else min(n, 2**31 - 1)
    k(grid, _THREADS, x, out, meta, R, rs, _scale(op, R))
    return out


def v1_thread(x, dim, op="sum", keepdim=False, out=None):
    return _v1(x, dim, op, keepdim, out, "v1_thread")


def v2_smem(x, dim, op="sum", keepdim=False, out=None):
    return _v1(x, dim, op, keepdim, out, "v2_smem")


def _run_v3(x, op, R, rs, other, ost, out):
    dev = x.get_device()
    meta = _layout(other, ost, dev)
    k = _kernel("v3_warp", _FUNCTOR[op], x.dtype, dev)
    wpr = 1
    while wpr < 8 and R > 1024 * wpr:  # about 32+ elements per lane before adding warps
        wpr *= 2
    rows = 8 // wpr
    k((out.numel() + rows - 1) // rows, _THREADS, x, out, meta, R, rs, _scale(op, R), wpr)
    return out


def v3_warp(x, dim, op="sum", keepdim=False, out=None):
    dim, R, rs, other, ost, out = _prepare("reduce.v3_warp", x, dim, op, keepdim, out)
    if _trivial(op, R, out):
        return out
    return _run_v3(x, op, R, rs, other, ost, out)


_empty_ws: dict[torch.device, torch.Tensor] = {}


def _no_workspace(device):
    """A placeholder for the workspace argument when the kernel does not split rows."""
    t = _empty_ws.get(device)
    if t is None:
        t = _empty_ws[device] = torch.empty(1, dtype=torch.float32, device=device)
    return t


def _run_v4(x, op, R, rs, other, ost, out):
    dev = x.get_device()
    meta = _layout(other, ost, dev)
    k = _kernel("v4_columns", _FUNCTOR[op], x.dtype, dev)
    n = out.numel()
    cols = (n + 31) // 32
    sms = rt.sm_count(dev)
    # Enough blocks for about 8 per SM, each thread row still walking >= 64 elements.
    splits = max(1, min(-(-8 * sms // cols), R // (8 * 64), 65535))
    scale = _scale(op, R)
    if splits == 1:
        k((cols, 1), (32, 8), x, out, _no_workspace(x.device), meta, R, rs, scale)
        return out
    ws = torch.empty((splits, n), dtype=torch.float32, device=x.device)
    k((cols, splits), (32, 8), x, out, ws, meta, R, rs, scale)
    fin = _kernel("finish", _FUNCTOR[op], x.dtype, dev)
    fin((n + _THREADS - 1) // _THREADS, _THREADS, ws, out, n, splits, scale)
    return out


def columns_name(functor: str, dtype: torch.dtype, cfg: ColumnsConfig) -> str:
    return f"reduce_v5_columns<{rt.ctype(dtype)},rd::{functor},{cfg.tx},{cfg.ty},{cfg.unroll},{cfg.minb}>"


_V5_PARAMS = ("B", "R", "C", "sb", "rs", "col_blocks", "chunk")


def _v5_kernel(functor, dtype, dev, cfg):
    name = columns_name(functor, dtype, cfg)  # waves / min_rows are launch knobs: not in the key
    key = ("v5_columns", dtype, dev, name)
    k = _kernels.get(key)
    if k is None:
        mod = _module(dtype, dev)
        if name not in mod:  # a config outside the package module: Sum and Max
            columns_prepare(dtype, [replace(cfg, waves=1, min_rows=1, fold="pass")], ("Sum", "Max"), dev)
            return _kernels[key]
        k = _kernels[key] = mod.kernel(name, _v5_params(dtype))
    return k


def _v5_params(dtype):
    # counters: the address of an int32 array (read as unsigned: the same bits) or 0, a null pointer
    # (fold="pass"); a Scalar, because a Tensor parameter cannot be null.
    return (rt.Tensor("x", (dtype,), contiguous=False), rt.Tensor("out", (dtype,)),
            rt.Tensor("ws", (torch.float32,)), rt.Scalar("counters", "i64"),
            *(rt.Scalar(n, "i64") for n in _V5_PARAMS), rt.Scalar("scale", "f32"))


_counters: dict[tuple, torch.Tensor] = {}


def _fold_counters(device: torch.device, blocks: int) -> torch.Tensor:
    """Zeroed int32 counters for fold="last", at least ``blocks`` of them, one array per (device,
    stream): the kernel leaves them at zero after each launch."""
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    t = _counters.get(key)
    if t is None or t.numel() < blocks:
        t = _counters[key] = torch.zeros(max(blocks, 1024), dtype=torch.int32, device=device)
    return t


def columns_prepare(dtype: torch.dtype, configs, functors=("Sum",), device_index: int | None = None) -> rt.Module:
    """Compile v5_columns for many configs in one NVRTC module (sweeps); launches then use them."""
    dev = torch.cuda.current_device() if device_index is None else device_index
    configs = list(dict.fromkeys(configs))
    for c in configs:
        c.check(dtype)
    mod = rt.load(_SRC, [columns_name(f, dtype, c) for f in functors for c in configs], device_index=dev)
    for f in functors:
        for c in configs:
            name = columns_name(f, dtype, c)
            if ("v5_columns", dtype, dev, name) not in _kernels:
                _kernels[("v5_columns", dtype, dev, name)] = mod.kernel(name, _v5_params(dtype))
    return mod


def columns_layout(x: torch.Tensor, R: int, rs: int, other, ost) -> tuple[int, int, int] | None:
    """(B, C, sb) when v5_columns can read x: the kept dims collapse to (C,) or (B, C) with C
    contiguous in x, and C, sb, rs are multiples of 16 / itemsize with a 16-byte aligned x (every
    16-byte load aligned); else None."""
    if R < 1 or rs == 1 or not other:
        return None
    shape, (st,) = collapse(tuple(other), [tuple(ost)])
    if len(shape) > 2 or st[-1] != 1:
        return None
    C = shape[-1]
    B, sb = (shape[0], st[0]) if len(shape) == 2 else (1, 0)
    vec = 16 // x.element_size()
    if C % vec or sb % vec or rs % vec or rs < 0 or sb < 0 or x.data_ptr() % 16:
        return None
    return B, C, sb


def columns_grid(B: int, R: int, C: int, itemsize: int, cfg: ColumnsConfig, resident: int) -> tuple[int, int, int, int]:
    """(column blocks, splits, chunk rows, grid.x) of v5_columns for x seen as (B, R, C);
    ``resident``: how many blocks of the kernel fit on the GPU at once (``Kernel.resident_grid``)."""
    vec = 16 // itemsize
    col_blocks = -(-C // (cfg.tx * vec))
    want = -(-cfg.waves * resident // (col_blocks * B))
    splits = max(1, min(want, R // cfg.min_rows, 65535))
    chunk = -(-R // splits)
    splits = -(-R // chunk)  # no empty split
    return col_blocks, splits, chunk, col_blocks * B


_resident: dict[tuple, int] = {}


def _resident_blocks(k, cfg, key):
    r = _resident.get(key)
    if r is None:
        r = _resident[key] = k.resident_grid(cfg.tx * cfg.ty)
    return r


def _run_v5(x, op, R, rs, other, ost, out, layout, config=None):
    B, C, sb = layout
    dev = x.get_device()
    cfg = config or COLUMNS_DEFAULT[x.dtype]
    k = _v5_kernel(_FUNCTOR[op], x.dtype, dev, cfg)
    resident = _resident_blocks(k, cfg, (_FUNCTOR[op], x.dtype, dev, cfg.tx, cfg.ty, cfg.unroll, cfg.minb))
    col_blocks, splits, chunk, gx = columns_grid(B, R, C, x.element_size(), cfg, resident)
    if gx >= 2**31:
        raise ValueError(f"reduce.v5_columns: {B} x {C} outputs need {gx} blocks, past the grid limit")
    scale = _scale(op, R)
    block = (cfg.tx, cfg.ty)
    if splits == 1:
        k((gx, 1), block, x, out, _no_workspace(x.device), 0, B, R, C, sb, rs, col_blocks, chunk, scale)
        return out
    n = out.numel()
    ws = torch.empty((splits, n), dtype=torch.float32, device=x.device)
    if cfg.fold == "last":
        cnt = _fold_counters(x.device, gx)
        k((gx, splits), block, x, out, ws, cnt.data_ptr(), B, R, C, sb, rs, col_blocks, chunk, scale)
        return out
    k((gx, splits), block, x, out, ws, 0, B, R, C, sb, rs, col_blocks, chunk, scale)
    fin = _kernel("finish", _FUNCTOR[op], x.dtype, dev)
    fin((n + _THREADS - 1) // _THREADS, _THREADS, ws, out, n, splits, scale)
    return out


def v5_columns(x, dim, op="sum", keepdim=False, out=None, config: ColumnsConfig | None = None):
    """``config``: a ``ColumnsConfig`` (default ``COLUMNS_DEFAULT[x.dtype]``). Layouts v5 cannot
    read with aligned 16-byte loads (see ``columns_layout``) run v4_columns."""
    dim, R, rs, other, ost, out = _prepare("reduce.v5_columns", x, dim, op, keepdim, out)
    if config is not None:
        if not isinstance(config, ColumnsConfig):
            raise ValueError(f"reduce.v5_columns: 'config' must be a ColumnsConfig, got {type(config).__name__}")
        config.check(x.dtype)
    if _trivial(op, R, out):
        return out
    layout = columns_layout(x, R, rs, other, ost)
    if layout is None:
        return _run_v4(x, op, R, rs, other, ost, out)
    return _run_v5(x, op, R, rs, other, ost, out, layout, config)


def v4_columns(x, dim, op="sum", keepdim=False, out=None):
    dim, R, rs, other, ost, out = _prepare("reduce.v4_columns", x, dim, op, keepdim, out)
    if _trivial(op, R, out):
        return out
    return _run_v4(x, op, R, rs, other, ost, out)


VARIANTS = {"v1_thread": v1_thread, "v2_smem": v2_smem, "v3_warp": v3_warp, "v4_columns": v4_columns,
            "v5_columns": v5_columns}


def _outputs_adjacent(other, ost):
    """The innermost non-trivial output dim has stride 1 in x: neighbouring outputs coalesce."""
    for s, st in zip(reversed(other), reversed(ost)):
        if s != 1:
            return st == 1
    return False


def reduce(x: torch.Tensor, dim: int, op: str = "sum", *, keepdim: bool = False,
           out: torch.Tensor | None = None, variant: str | None = None) -> torch.Tensor:
    """``op`` of x along ``dim`` on the GPU (no autograd; see ``sum``/``amax``/``mean`` for that).

    x:       CUDA tensor, float32/float16/bfloat16, any shape (other dims up to 8 after merging)
             and strides; a CPU tensor runs the PyTorch reference (any variant).
    dim:     the dim to reduce (negative counts from the end).
    op:      "sum" (default), "max" (NaN-propagating, like torch.amax) or "mean".
    keepdim: keep ``dim`` with size 1 (default False).
    out:     optional contiguous output of the result's shape and x's dtype.
    variant: None (v3_warp when ``dim`` is innermost in memory or the outputs are not adjacent,
             else v5_columns when its 16-byte layout applies, else v4_columns) or a key of
             ``VARIANTS``.
    Returns x's shape without ``dim`` (or with size 1), x's dtype. Sum over an empty dim is 0, mean
    NaN; max over an empty dim raises.
    """
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"reduce: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    if runs_reference("reduce", {"x": x, "out": out}):  # the one CPU rule
        dim, *_, out = _prepare("reduce", x, dim, op, keepdim, out, cuda=False)
        return out.copy_(reference(x, dim, op, keepdim))
    if variant is not None:
        return VARIANTS[variant](x, dim, op, keepdim, out)
    dim, R, rs, other, ost, out = _prepare("reduce", x, dim, op, keepdim, out)
    if _trivial(op, R, out):
        return out
    version, layout = choose(x, R, rs, other, ost)
    if version == "v5_columns":
        return _run_v5(x, op, R, rs, other, ost, out, layout)
    if version == "v4_columns":
        return _run_v4(x, op, R, rs, other, ost, out)
    return _run_v3(x, op, R, rs, other, ost, out)


def choose(x, R, rs, other, ost) -> tuple[str, tuple | None]:
    """The version ``reduce`` runs for _prepare's row walk (and v5's (B, C, sb) layout); for columns
    v5 can read, ``configs.COLUMNS_VERSION`` says v5_columns or v4_columns."""
    if rs != 1 and R > 1 and _outputs_adjacent(other, ost):
        layout = columns_layout(x, R, rs, other, ost)
        if layout is not None and COLUMNS_VERSION == "v5_columns":
            return "v5_columns", layout
        return "v4_columns", None
    return "v3_warp", None


# --------------------------------------------------------------------------- masked mean


def masked_mean_reference(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """PyTorch: mean over t < lengths[b] of x[b, t, :]; 0 where the length is 0; lengths clamped
    to [0, T]. Reads x (B*T*E) once and writes B*E."""
    B, T, E = x.shape
    lens = lengths.to(x.device).long().clamp(0, T)
    mask = torch.arange(T, device=x.device)[None, :] < lens[:, None]
    s = torch.where(mask[:, :, None], x, 0).sum(1)  # padding is not read: a NaN there does not count
    return s / lens.clamp(min=1).to(x.dtype)[:, None]


def masked_mean_cost(B: int, T: int, E: int, dtype: torch.dtype = torch.float32,
                     lengths: torch.Tensor | None = None) -> Cost:
    """The rows t < lengths[b] of x read once, the (B, E) mean written once, the lengths read.

    The padding rows need not be read, so the floor depends on the data: pass ``lengths`` for it.
    Without them this is the upper bound of full rows.
    """
    itemsize = dtype.itemsize
    rows = B * T if lengths is None else int(lengths.long().clamp(0, T).sum())
    return Cost(flops=rows * E, bytes=(rows * E + B * E) * itemsize + B * lengths_itemsize(lengths))


def lengths_itemsize(lengths: torch.Tensor | None) -> int:
    return 8 if lengths is None else lengths.element_size()


def _check_masked(what, x, lengths, cuda=True):
    check_inputs(what, {"x": x}, cuda=cuda)
    if x.dim() != 3:
        raise ValueError(f"{what}: 'x' must be (B, T, E), got shape {tuple(x.shape)}")
    if not isinstance(lengths, torch.Tensor) or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{what}: 'lengths' must be an int32 or int64 tensor of shape (B,)")
    if tuple(lengths.shape) != (x.shape[0],):
        raise ValueError(f"{what}: 'lengths' has shape {tuple(lengths.shape)}; 'x' of shape {tuple(x.shape)} "
                         f"needs ({x.shape[0]},)")
    if lengths.device != x.device:
        raise ValueError(f"{what}: 'lengths' is on {lengths.device} but 'x' is on {x.device}")


def _mm_kernel(kind, dtype, ltype, dev):
    key = (kind, dtype, ltype, dev)
    k = _kernels.get(key)
    if k is None:
        name = _mm_name(kind, dtype, ltype)
        dims = (rt.Scalar("B", "i64"), rt.Scalar("T", "i64"), rt.Scalar("E", "i64"))
        if kind == "fwd":
            params = (rt.Tensor("x", (dtype,), contiguous=False), rt.Tensor("lengths", (ltype,)),
                      rt.Tensor("out", (dtype,)), *dims,
                      rt.Scalar("sb", "i64"), rt.Scalar("st", "i64"), rt.Scalar("se", "i64"))
        else:
            params = (rt.Tensor("grad", (dtype,), contiguous=False), rt.Tensor("lengths", (ltype,)),
                      rt.Tensor("grad_x", (dtype,)), *dims, rt.Scalar("sgb", "i64"), rt.Scalar("sge", "i64"))
        k = _kernels[key] = _module(dtype, dev).kernel(name, params)
    return k


def masked_mean_forward(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The forward kernel: x (B, T, E) CUDA float32/float16/bfloat16, any strides; lengths (B,)
    int32/int64 contiguous on x's device. Returns (B, E) contiguous, x's dtype."""
    _check_masked("masked_mean", x, lengths)
    B, T, E = x.shape
    out = torch.empty((B, E), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    if B > 65535:
        raise ValueError(f"masked_mean: B = {B} exceeds the grid's y limit (65535)")
    k = _mm_kernel("fwd", x.dtype, lengths.dtype, x.get_device())
    k(((E + _THREADS - 1) // _THREADS, B), _THREADS, x, lengths, out, B, T, E, *x.stride())
    return out


def masked_mean_backward(grad: torch.Tensor, lengths: torch.Tensor, T: int) -> torch.Tensor:
    """The backward kernel: grad (B, E) -> grad_x (B, T, E) contiguous, grad / len[b] on the first
    len[b] steps and 0 on the padding."""
    B, E = grad.shape
    gx = torch.empty((B, T, E), dtype=grad.dtype, device=grad.device)
    if gx.numel() == 0:
        return gx
    k = _mm_kernel("bwd", grad.dtype, lengths.dtype, grad.get_device())
    blocks = max(1, min(k.resident_grid(_THREADS), (gx.numel() + _THREADS - 1) // _THREADS))
    k(blocks, _THREADS, grad, lengths, gx, B, T, E, *grad.stride())
    return gx


class MaskedMeanFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lengths):
        ctx.save_for_backward(lengths)
        ctx.T = x.shape[1]
        if x.is_cuda:
            return masked_mean_forward(x, lengths)
        return masked_mean_reference(x, lengths)

    @staticmethod
    def backward(ctx, g):
        (lengths,) = ctx.saved_tensors
        T = ctx.T
        if g.is_cuda:
            return masked_mean_backward(g, lengths, T), None
        return _masked_mean_backward_cpu(g, lengths, T), None


def masked_mean(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Mean pooling of padded sequences, differentiable in x.

    x:       (B, T, E) float tensor, any strides: CUDA float32/float16/bfloat16 (the kernels) or CPU
             (the PyTorch reference, any float dtype).
    lengths: (B,) int32/int64 on x's device: the valid steps of each row; values are clamped to
             [0, T] (checking them would cost a device sync); a row of length 0 gives zeros.
    Returns (B, E), x's dtype: ``out[b] = x[b, :lengths[b]].mean(0)``. Under torch.compile it runs
    as the custom op ``tilewise::masked_mean``.
    """
    if compiling():
        return torch.ops.tilewise.masked_mean(x, lengths)
    # The CPU path checks as much (a non-tensor or meta x used to fail on x.is_cuda or in the reference).
    _check_masked("masked_mean", x, lengths, cuda=isinstance(x, torch.Tensor) and x.is_cuda)
    return MaskedMeanFunction.apply(x, lengths)


def _masked_mean_backward_cpu(g, lengths, T):
    lens = lengths.long().clamp(0, T)
    mask = (torch.arange(T, device=g.device)[None, :] < lens[:, None]).to(g.dtype)
    return g[:, None, :] * mask[:, :, None] / lens.clamp(min=1).to(g.dtype)[:, None, None]


@torch.library.custom_op("tilewise::masked_mean", mutates_args=())
def masked_mean_op(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return masked_mean_forward(x, lengths) if x.is_cuda else masked_mean_reference(x, lengths)


@masked_mean_op.register_fake
def _masked_mean_fake(x, lengths):
    return torch.empty((x.shape[0], x.shape[2]), dtype=x.dtype, device=x.device)


@torch.library.custom_op("tilewise::masked_mean_backward", mutates_args=())
def masked_mean_backward_op(grad: torch.Tensor, lengths: torch.Tensor, T: int) -> torch.Tensor:
    return masked_mean_backward(grad, lengths, T) if grad.is_cuda else _masked_mean_backward_cpu(grad, lengths, T)


@masked_mean_backward_op.register_fake
def _masked_mean_backward_fake(grad, lengths, T):
    return torch.empty((grad.shape[0], T, grad.shape[1]), dtype=grad.dtype, device=grad.device)


def _mm_setup(ctx, inputs, output):
    x, lengths = inputs
    ctx.T = x.shape[1]
    ctx.save_for_backward(lengths)


def _mm_op_backward(ctx, g):
    (lengths,) = ctx.saved_tensors
    return torch.ops.tilewise.masked_mean_backward(g, lengths, ctx.T), None


masked_mean_op.register_autograd(_mm_op_backward, setup_context=_mm_setup)


# --------------------------------------------------------------------------- autograd reductions


class ReduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, op, keepdim):
        out = reduce(x, dim, op, keepdim=keepdim) if x.is_cuda else reference(x, dim, op, keepdim)
        ctx.dim, ctx.op, ctx.keepdim = dim % max(x.dim(), 1), op, keepdim
        ctx.shape = tuple(x.shape)
        if op == "max":
            ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        if len(ctx.shape) == 0:
            gx = g.expand(ctx.shape)
        else:
            gk = g if ctx.keepdim else g.unsqueeze(ctx.dim)
            R = ctx.shape[ctx.dim]
            if ctx.op == "sum":
                gx = gk.expand(ctx.shape)
            elif ctx.op == "mean":
                gx = (gk / R).expand(ctx.shape)
            else:
                x, out = ctx.saved_tensors
                ok = out if ctx.keepdim else out.unsqueeze(ctx.dim)
                hit = (x == ok).to(g.dtype)  # ties share the gradient, as torch.amax does
                gx = gk * hit / hit.sum(ctx.dim, keepdim=True)
        return gx, None, None, None


def _reduce_fn(op):
    def f(x, dim, keepdim=False):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{op}: 'x' must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_cuda:
            check_inputs(op, {"x": x}, cuda=False)
            nd = max(x.dim(), 1)
            if not isinstance(dim, int) or not -nd <= dim < nd:
                raise ValueError(f"{op}: 'dim' = {dim} is out of range for 'x' of {x.dim()} dims")
        if op == "max" and isinstance(dim, int) and x.dim() and -x.dim() <= dim < x.dim() and x.shape[dim] == 0:
            raise ValueError(f"amax: 'x' has size 0 along dim {dim}: the max of nothing is undefined")
        if compiling():  # Inductor writes its own reductions; ours would break the graph
            return reference(x, dim, op, keepdim)
        return ReduceFunction.apply(x, dim, op, keepdim)

    f.__name__ = op
    f.__doc__ = (f"``{op}`` of x along ``dim`` (keepdim default False), differentiable. x: CUDA "
                 f"float32/float16/bfloat16 (the kernels) or a CPU float tensor (the PyTorch reference).")
    return f


sum = _reduce_fn("sum")  # noqa: A001
mean = _reduce_fn("mean")
amax = _reduce_fn("max")
amax.__name__ = "amax"


def sum_to_shape(g: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Reduce a broadcast gradient back to an input's ``shape`` (sum over the dims it was expanded
    along), with the reduce kernels on CUDA and torch.sum on CPU or under torch.compile."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.dim() - len(shape)
    dims = list(range(lead)) + [lead + d for d, s in enumerate(shape) if s == 1 and g.shape[lead + d] != 1]
    use_kernel = g.is_cuda and not compiling()
    for d in sorted(dims, reverse=True):
        g = reduce(g, d, "sum", keepdim=True) if use_kernel else g.sum(d, keepdim=True)
    return g.reshape(shape)
