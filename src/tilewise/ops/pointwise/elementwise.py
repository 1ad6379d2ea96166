"""elementwise: ``map`` (unary) and ``zip`` (binary, NumPy/PyTorch broadcasting) over any strides.

Versions (``elementwise.cu``; the op is a template functor from ``include/elementwise_ops.cuh``):
    v1_strided:    one thread per output element; the flat index is decomposed through the
                   (collapsed) shape with magic-number division and each input is read through its
                   strides (stride 0 on broadcast dims, ``include/strided.cuh``); output contiguous.
                   bound: copy bandwidth when the reads coalesce (last dim contiguous); a transposed
                   input reads 32-byte sectors for 4-byte elements, so about 1/2 to 1/4 of it.
    v2_contiguous: contiguous same-shape operands, 16-byte aligned: 16-byte loads and stores, a
                   grid-stride loop over one resident wave, 4 vectors in flight (zip: 2 per
                   operand); plain loads (the ld.cs/st.cs hints measured ~6 % slower on the H200).
                   bound: copy bandwidth ((k inputs + 1) x n x itemsize bytes).
    v3_tiled:      (zip) layouts that collapse to 2 dims with a transposed operand: 32 x 32
                   tiles staged through shared memory, each input read along its own fast dim.
                   bound: copy bandwidth (every read and write coalesced).
    v4_blocked:    v2 without the grid-stride loop: block k owns one contiguous chunk of NT x
                   UNROLL vectors, each thread UNROLL of them NT apart, all loads before the first
                   use, so the blocks in flight touch one window of memory (vector_add v3_blocked:
                   the grid-stride loop measured ~5 % slower). NT, UNROLL and the register cap
                   (min blocks per SM) are template parameters (``configs.BlockedConfig``, default
                   ``configs.blocked_default(kind, functor, dtype)``: per kind and dtype, with its
                   own entry for one-instruction ops). bound: copy bandwidth.
    v5_rows:       (zip) layouts that collapse to 2 dims (R, C) in which every operand walks a row
                   with stride 1 or 0 (a bias row, a bias column, a scalar, padded rows): 16-byte
                   loads along the row, a row-broadcast operand loaded once per 8 rows, a
                   column-broadcast one as one scalar per row; no index division per element.
                   Needs rows of whole 16-byte vectors and 16-byte aligned row starts; one long
                   row (a 1-D tensor and a scalar) is cut into rows of at most 1024 vectors.
                   bound: copy bandwidth (the broadcast operand stays in L1/L2).

fp16 and bf16 compute in fp32 and round once. Ops: unary ``MAP_OPS``, binary ``ZIP_OPS`` (``ops_table``);
layouts, broadcasting and the input checks are in ``layout``.
``map``/``zip`` are the raw kernels (no autograd, optional ``out``); ``neg, relu, ... add, ...``
below are differentiable (``torch.autograd.Function``), run the kernels on CUDA tensors and the
PyTorch reference on CPU tensors (any float dtype, so gradcheck runs in float64 there), and are what
``tilewise.fuse`` traces. Under torch.compile they run as the custom ops ``tilewise::map`` and
``tilewise::zip`` (fake implementations registered), so a compiled model keeps one graph.
``divergence`` (end of file) measures warp divergence: a branch against its branch-free form.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from ...cost import Cost
from ...runtime import cuda as rt
from ...runtime.lazy import LazyModule, load_lazy
from .configs import BlockedConfig, blocked_built, blocked_default
from .layout import (blocked_grid, broadcast_shape, check_inputs, compiling, contiguous_ok, layout_2d, layout_tensor,
                     out_tensor, rows_grid, rows_layout, rows_ok, strided_words, transposed)
from .ops_table import MAP_OPS, ZIP_OPS, check_op
from .reduce import sum_to_shape

_SRC = Path(__file__).with_name("elementwise.cu")
_THREADS = 256


# --------------------------------------------------------------------------- reference, cost


def reference(op: str, *inputs: torch.Tensor) -> torch.Tensor:
    """PyTorch: reads each input once (broadcast inputs once per distinct element), writes once."""
    if len(inputs) == 1:
        return MAP_OPS[check_op(op, MAP_OPS, "map")][1](inputs[0])
    return ZIP_OPS[check_op(op, ZIP_OPS, "zip")][1](*inputs)


def cost(op: str, out_numel: int, input_numels: tuple[int, ...] | int, dtype: torch.dtype = torch.float32) -> Cost:
    """Each input read once (a broadcast input: its own numel), the output written once."""
    itemsize = dtype.itemsize
    if isinstance(input_numels, int):
        input_numels = (input_numels,)
    table = MAP_OPS if len(input_numels) == 1 else ZIP_OPS
    flops = table[op][2] * out_numel
    return Cost(flops=flops, bytes=(sum(input_numels) + out_numel) * itemsize)


# --------------------------------------------------------------------------- launchers


@functools.cache
def _module(dtype: torch.dtype, device_index: int) -> LazyModule:
    # Each kernel compiled on its first use: a step that launches a few of them compiles those few
    # (~0.1 s each), not the dtype's 62-73 (4-5 s on the CI host).
    return load_lazy(_SRC, module_names(dtype), device_index=device_index)


def module_names(dtype: torch.dtype) -> list[str]:
    """Every kernel of elementwise.cu for one dtype (the CPU tests compile this list for sm_90)."""
    names = [_name(v, kind, table[op][0], dtype) for v in ("v1_strided", "v2_contiguous")
             for kind, table in (("map", MAP_OPS), ("zip", ZIP_OPS)) for op in table]
    names += [blocked_name(kind, table[op][0], dtype, cfg) for kind, table in (("map", MAP_OPS), ("zip", ZIP_OPS))
              for cfg in blocked_built(kind, dtype) for op in table]
    names += [_name(v, "zip", ZIP_OPS[op][0], dtype) for v in ("v3_tiled", "v5_rows") for op in ZIP_OPS]
    if dtype == torch.float32:
        names += [f"divergence_{v}" for v in DIVERGENCE_VARIANTS]
    return names


def _name(version, kind, functor, dtype):
    return f"{kind}_{version}<{rt.ctype(dtype)},ew::{functor}>"


_kernels: dict[tuple, rt.Kernel] = {}


def _kernel(version: str, kind: str, functor: str, dtype: torch.dtype, device_index: int,
            config: "BlockedConfig | None" = None) -> rt.Kernel:
    key = (version, kind, functor, dtype, device_index, config)
    k = _kernels.get(key)
    if k is None and version == "v4_blocked":
        name = blocked_name(kind, functor, dtype, config)
        mod = _module(dtype, device_index)
        if name not in mod:
            # A config outside blocked_built(): one module with every op of this kind for it.
            blocked_prepare(kind, list(MAP_OPS if kind == "map" else ZIP_OPS), dtype, [config], device_index)
            return _kernels[key]
        ins = [rt.Tensor(n, (dtype,)) for n in (("x",) if kind == "map" else ("a", "b"))]
        k = _kernels[key] = mod.kernel(name, (*ins, rt.Tensor("out", (dtype,)), rt.Scalar("n", "i64")))
    if k is None:
        strided = version not in ("v2_contiguous", "v4_blocked")
        ins = [rt.Tensor(n, (dtype,), contiguous=not strided) for n in (("x",) if kind == "map" else ("a", "b"))]
        if version in ("v3_tiled", "v5_rows"):
            tail = [rt.Scalar(n, "i64") for n in ("R", "C", "sar", "sac", "sbr", "sbc")]
        else:
            tail = [rt.Tensor("meta", (torch.int64,))] if strided else [rt.Scalar("n", "i64")]
        params = (*ins, rt.Tensor("out", (dtype,)), *tail)
        k = _module(dtype, device_index).kernel(_name(version, kind, functor, dtype), params)
        _kernels[key] = k
    return k


_grid: dict[tuple, int] = {}


def _wave(k: rt.Kernel, key) -> int:
    w = _grid.get(key)
    if w is None:
        w = _grid[key] = k.resident_grid(_THREADS)
    return w


def _launch_flat(version, kind, functor, inputs, out):
    """v1_strided (a thread an element, the inputs read through the layout words) or v2_contiguous
    (16-byte vectors, a grid-stride loop over one resident wave) over out's elements."""
    n = out.numel()
    if n == 0:
        return out
    dev = out.get_device()
    k = _kernel(version, kind, functor, out.dtype, dev)
    if version == "v1_strided":
        meta = layout_tensor(strided_words(inputs, out), dev)
        k((n + _THREADS - 1) // _THREADS, _THREADS, *inputs, out, meta)
    else:
        wave = _wave(k, ("v2", kind, functor, out.dtype, dev))
        per_vec = 16 // out.element_size()
        k(max(1, min(wave, -(-(n // per_vec) // _THREADS))), _THREADS, *inputs, out, n)
    return out


def _check_blocked(config) -> None:
    if not isinstance(config, BlockedConfig):
        raise ValueError(f"v4_blocked: 'config' must be a BlockedConfig, got {type(config).__name__}")
    config.check()


def blocked_name(kind: str, functor: str, dtype: torch.dtype, config: BlockedConfig | None = None) -> str:
    cfg = config or blocked_default(kind, functor, dtype)
    return f"{kind}_v4_blocked<{rt.ctype(dtype)},ew::{functor},{cfg.unroll},{cfg.threads},{cfg.minb}>"


def blocked_prepare(kind: str, ops, dtype: torch.dtype, configs, device_index: int | None = None) -> rt.Module:
    """Compile v4_blocked for many (op, config) pairs in one NVRTC module (for sweeps such as
    research/elementwise_variants.py); later launches with those configs use it."""
    dev = torch.cuda.current_device() if device_index is None else device_index
    table = MAP_OPS if kind == "map" else ZIP_OPS
    configs = list(dict.fromkeys(configs))
    for c in configs:
        c.check()
    names = [blocked_name(kind, table[op][0], dtype, c) for op in ops for c in configs]
    mod = rt.load(_SRC, names, device_index=dev)
    ins = [rt.Tensor(n, (dtype,)) for n in (("x",) if kind == "map" else ("a", "b"))]
    params = (*ins, rt.Tensor("out", (dtype,)), rt.Scalar("n", "i64"))
    for op in ops:
        for c in configs:
            key = ("v4_blocked", kind, table[op][0], dtype, dev, c)
            if key not in _kernels:
                _kernels[key] = mod.kernel(blocked_name(kind, table[op][0], dtype, c), params)
    return mod


def _launch_blocked(kind, functor, inputs, out, config: BlockedConfig | None = None):
    n = out.numel()
    if n == 0:
        return out
    cfg = config or blocked_default(kind, functor, out.dtype)
    if not isinstance(cfg, BlockedConfig):
        raise ValueError(f"v4_blocked: 'config' must be a BlockedConfig, got {type(cfg).__name__}")
    k = _kernel("v4_blocked", kind, functor, out.dtype, out.get_device(), cfg)
    k(blocked_grid(n, out.element_size(), cfg), cfg.threads, *inputs, out, n)
    return out


def _launch_tiled(functor, a, b, out, layout):
    R, C, ((sar, sac), (sbr, sbc)) = layout
    if out.numel() == 0:
        return out
    dev = out.get_device()
    k = _kernel("v3_tiled", "zip", functor, out.dtype, dev)
    tiles = -(-R // 32) * -(-C // 32)
    k(max(1, min(tiles, _wave(k, ("v3", functor, out.dtype, dev)))), (32, 8), a, b, out, R, C, sar, sac, sbr, sbc)
    return out


def _launch_rows(functor, a, b, out, layout):
    if out.numel() == 0:
        return out
    R, C, ((sar, sac), (sbr, sbc)) = rows_layout(layout, out.element_size())
    k = _kernel("v5_rows", "zip", functor, out.dtype, out.get_device())
    blocks, block = rows_grid(R, C, out.element_size())
    k(blocks, block, a, b, out, R, C, sar, sac, sbr, sbc)
    return out


def _map_prepare(op, x, out):
    check_op(op, MAP_OPS, "map")
    check_inputs(f"map({op})", {"x": x})
    return MAP_OPS[op][0], out_tensor(f"map({op})", out, x.shape, x)


def _zip_prepare(op, a, b, out):
    check_op(op, ZIP_OPS, "zip")
    check_inputs(f"zip({op})", {"a": a, "b": b})
    shape = broadcast_shape(tuple(a.shape), tuple(b.shape), names=("a", "b"))
    return ZIP_OPS[op][0], out_tensor(f"zip({op})", out, shape, a)


def map_v1_strided(op: str, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    functor, out = _map_prepare(op, x, out)
    return _launch_flat("v1_strided", "map", functor, (x,), out)


def map_v2_contiguous(op: str, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    functor, out = _map_prepare(op, x, out)
    if not contiguous_ok((x,), out):
        raise ValueError("map.v2_contiguous: x and out must be contiguous and start on 16-byte boundaries; "
                         "use v1_strided or map()")
    return _launch_flat("v2_contiguous", "map", functor, (x,), out)


def map_v4_blocked(op: str, x: torch.Tensor, out: torch.Tensor | None = None,
                   config: BlockedConfig | None = None) -> torch.Tensor:
    """``config``: a ``BlockedConfig`` (default ``blocked_default("map", functor, x.dtype)``: relu
    and neg have their own in fp32); others are compiled on first use."""
    functor, out = _map_prepare(op, x, out)
    if not contiguous_ok((x,), out):
        raise ValueError("map.v4_blocked: x and out must be contiguous and start on 16-byte boundaries; "
                         "use v1_strided or map()")
    if config is not None:
        _check_blocked(config)
    return _launch_blocked("map", functor, (x,), out, config)


def zip_v1_strided(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    functor, out = _zip_prepare(op, a, b, out)
    return _launch_flat("v1_strided", "zip", functor, (a, b), out)


def zip_v2_contiguous(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    functor, out = _zip_prepare(op, a, b, out)
    if not contiguous_ok((a, b), out):
        raise ValueError("zip.v2_contiguous: a, b and out must be contiguous, of one shape (no broadcasting) "
                         "and start on 16-byte boundaries; use v1_strided or zip()")
    return _launch_flat("v2_contiguous", "zip", functor, (a, b), out)


def zip_v3_tiled(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    functor, out = _zip_prepare(op, a, b, out)
    if out.numel() == 0:
        return out
    layout = layout_2d((a, b), out)
    if layout is None:
        raise ValueError("zip.v3_tiled: the operands' layout does not collapse to 2 dims; use v1_strided or zip()")
    return _launch_tiled(functor, a, b, out, layout)


def zip_v4_blocked(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
                   config: BlockedConfig | None = None) -> torch.Tensor:
    """``config``: a ``BlockedConfig`` (default ``BLOCKED_DEFAULT[("zip", a.dtype)]``)."""
    functor, out = _zip_prepare(op, a, b, out)
    if not contiguous_ok((a, b), out):
        raise ValueError("zip.v4_blocked: a, b and out must be contiguous, of one shape (no broadcasting) "
                         "and start on 16-byte boundaries; use v1_strided or zip()")
    if config is not None:
        _check_blocked(config)
    return _launch_blocked("zip", functor, (a, b), out, config)


def zip_v5_rows(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    functor, out = _zip_prepare(op, a, b, out)
    if out.numel() == 0:
        return out
    layout = layout_2d((a, b), out)
    if not rows_ok((a, b), out, layout):
        raise ValueError("zip.v5_rows: needs a layout that collapses to 2 dims (rows, columns) in which each "
                         "operand walks a row with stride 1 or 0, rows a multiple of 16 bytes long and "
                         "16-byte aligned (e.g. a (R, C) tensor plus a (C,) bias row); use v1_strided or zip()")
    return _launch_rows(functor, a, b, out, layout)


MAP_VARIANTS = {"v1_strided": map_v1_strided, "v2_contiguous": map_v2_contiguous, "v4_blocked": map_v4_blocked}
ZIP_VARIANTS = {"v1_strided": zip_v1_strided, "v2_contiguous": zip_v2_contiguous, "v3_tiled": zip_v3_tiled,
                "v4_blocked": zip_v4_blocked, "v5_rows": zip_v5_rows}
DIVERGENCE_VARIANTS = ("v1_branch", "v2_select")
VARIANTS = {"map_" + k: v for k, v in MAP_VARIANTS.items()} | {"zip_" + k: v for k, v in ZIP_VARIANTS.items()}


def _pick(variants, what, variant):
    if variant not in variants:
        raise ValueError(f"{what}: unknown variant {variant!r}; choose from {sorted(variants)}")
    return variants[variant]


def map(op: str, x: torch.Tensor, *, out: torch.Tensor | None = None, variant: str | None = None) -> torch.Tensor:  # noqa: A001
    """``op(x)`` elementwise on the GPU (no autograd; see ``relu``, ``exp``... for that).

    op:      a key of ``MAP_OPS``: neg relu exp log sigmoid tanh gelu (exact, erf) sin cos.
    x:       CUDA tensor, any shape (up to 8 non-mergeable dims) and strides, float32/float16/bfloat16.
    out:     optional contiguous tensor of x's shape and dtype.
    variant: None (v4_blocked when x and out are contiguous and 16-byte aligned, else
             v1_strided) or a key of ``MAP_VARIANTS``.
    Returns ``out`` (new and contiguous when not given), x's shape and dtype; fp32 arithmetic.
    """
    if variant is not None:
        return _pick(MAP_VARIANTS, "map", variant)(op, x, out)
    functor, out = _map_prepare(op, x, out)
    if contiguous_ok((x,), out):
        return _launch_blocked("map", functor, (x,), out)
    return _launch_flat("v1_strided", "map", functor, (x,), out)


def zip(op: str, a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,  # noqa: A001
        variant: str | None = None) -> torch.Tensor:
    """``op(a, b)`` elementwise with NumPy/PyTorch broadcasting on the GPU (no autograd).

    op:      a key of ``ZIP_OPS``: add sub mul div max (NaN-propagating, torch.maximum) pow
             relu_backward (``(grad, x) -> grad if x > 0 else 0``).
    a, b:    CUDA tensors of one float dtype (float32/float16/bfloat16), broadcastable shapes, any
             strides.
    out:     optional contiguous tensor of the broadcast shape and the inputs' dtype.
    variant: None (v4_blocked when a, b, out are contiguous, same shape and 16-byte aligned;
             v5_rows when the layout collapses to 2 dims, each operand walks rows with stride 1 or
             0 and rows are whole aligned 16-byte vectors (a bias row or column, a scalar);
             v3_tiled when the layout collapses to 2 dims and an operand is transposed; else
             v1_strided) or a key of ``ZIP_VARIANTS``.
    Returns ``out``: the broadcast shape, the inputs' dtype.
    """
    if variant is not None:
        return _pick(ZIP_VARIANTS, "zip", variant)(op, a, b, out)
    functor, out = _zip_prepare(op, a, b, out)
    if out.numel() == 0:
        return out
    choice, layout = _zip_choice(a, b, out)
    if choice == "v4_blocked":
        return _launch_blocked("zip", functor, (a, b), out)
    if choice == "v5_rows":
        return _launch_rows(functor, a, b, out, layout)
    if choice == "v3_tiled":
        return _launch_tiled(functor, a, b, out, layout)
    return _launch_flat("v1_strided", "zip", functor, (a, b), out)


def _zip_choice(a, b, out) -> tuple[str, tuple | None]:
    """The version zip() runs for these operands and output (and the 2-D layout, when any)."""
    if contiguous_ok((a, b), out):
        return "v4_blocked", None
    layout = layout_2d((a, b), out)
    if rows_ok((a, b), out, layout):
        return "v5_rows", layout
    if layout is not None and transposed(layout[2]):
        return "v3_tiled", layout
    return "v1_strided", layout


# --------------------------------------------------------------------------- autograd


def _run_map(op, x):
    if compiling():
        return torch.ops.tilewise.map(op, x)
    return map(op, x) if x.is_cuda else MAP_OPS[op][1](x).contiguous()


def _run_zip(op, a, b):
    if compiling():
        return torch.ops.tilewise.zip(op, a, b)
    return zip(op, a, b) if a.is_cuda else ZIP_OPS[op][1](a, b).contiguous()


def map_backward(op: str, x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """d op(x) / dx applied to ``g`` (y = op(x)); relu through the relu_backward kernel."""
    if op == "relu":
        return _run_zip("relu_backward", g, x)
    if op == "neg":
        return -g
    if op == "exp":
        return g * y
    if op == "log":
        return g / x
    if op == "sigmoid":
        return g * y * (1 - y)
    if op == "tanh":
        return g * (1 - y * y)
    if op == "sin":
        return g * torch.cos(x)
    if op == "cos":
        return -g * torch.sin(x)
    if op == "gelu":
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        pdf = torch.exp(-0.5 * xf * xf) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + torch.erf(xf / math.sqrt(2)))
        return (g * (cdf + xf * pdf)).to(x.dtype)
    raise NotImplementedError(op)


def zip_backward(op: str, a, b, out, g, need_a: bool, need_b: bool):
    """Gradients of op(a, b) for ``g``, summed back over the dims a or b was broadcast along."""
    if op == "add":
        ga, gb = g, g
    elif op == "sub":
        ga, gb = g, -g
    elif op == "mul":
        ga = _run_zip("mul", g, b) if need_a else None
        gb = _run_zip("mul", g, a) if need_b else None
    elif op == "div":
        ga = g / b
        gb = -g * a / (b * b)
    elif op == "max":
        # torch.maximum's rule: the gradient goes to the larger, split in half on ties.
        wa = (a > b).to(g.dtype) + 0.5 * (a == b).to(g.dtype)
        ga, gb = g * wa, g * (1 - wa)
    elif op == "pow":
        ga = g * b * torch.pow(a, b - 1)
        gb = torch.where(a == 0, torch.zeros_like(out), g * out * torch.log(a)) if need_b else None
    elif op == "relu_backward":
        ga = _run_zip("relu_backward", g, b)
        gb = torch.zeros_like(b) if need_b else None
    else:
        raise NotImplementedError(op)
    ga = sum_to_shape(ga, tuple(a.shape)) if need_a else None
    gb = sum_to_shape(gb, tuple(b.shape)) if need_b else None
    return ga, gb


class MapFunction(torch.autograd.Function):
    """``op(x)`` with its derivative (``map_backward``)."""

    @staticmethod
    def forward(ctx, op, x):
        check_inputs(op, {"x": x}, cuda=False)
        y = _run_map(op, x)
        ctx.op = op
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return None, map_backward(ctx.op, x, y, g)


class ZipFunction(torch.autograd.Function):
    """``op(a, b)`` with broadcasting; gradients of broadcast inputs are summed back to their shapes
    with tilewise's reduce (``zip_backward``)."""

    @staticmethod
    def forward(ctx, op, a, b):
        check_inputs(op, {"a": a, "b": b}, cuda=False)
        broadcast_shape(tuple(a.shape), tuple(b.shape), names=("a", "b"))
        out = _run_zip(op, a, b)
        ctx.op = op
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b, out = ctx.saved_tensors
        ga, gb = zip_backward(ctx.op, a, b, out, g, ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return None, ga, gb


# The same ops as torch.library custom ops with fake (shape-only) implementations, so that
# torch.compile traces through them instead of breaking the graph at a cuda.core launch.


@torch.library.custom_op("tilewise::map", mutates_args=())
def map_op(op: str, x: torch.Tensor) -> torch.Tensor:
    return map(op, x) if x.is_cuda else MAP_OPS[op][1](x).contiguous()


@map_op.register_fake
def _map_fake(op, x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _map_setup(ctx, inputs, output):
    ctx.op = inputs[0]
    ctx.save_for_backward(inputs[1], output)


def _fresh(t: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """A custom op's output may not alias its inputs: copy when a backward formula passed one through."""
    ptr = t.untyped_storage().data_ptr()
    return t.clone() if any(ptr == i.untyped_storage().data_ptr() for i in inputs) else t


# The backward passes are custom ops too: under torch.compile the autograd graph is traced with
# fake tensors, and a kernel launch inside a plain Python backward would ask a fake for its pointer.
@torch.library.custom_op("tilewise::map_backward", mutates_args=())
def map_backward_op(op: str, x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return _fresh(map_backward(op, x, y, g), x, y, g)


@map_backward_op.register_fake
def _map_backward_fake(op, x, y, g):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _map_op_backward(ctx, g):
    x, y = ctx.saved_tensors
    return None, torch.ops.tilewise.map_backward(ctx.op, x, y, g)


map_op.register_autograd(_map_op_backward, setup_context=_map_setup)


@torch.library.custom_op("tilewise::zip", mutates_args=())
def zip_op(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return zip(op, a, b) if a.is_cuda else ZIP_OPS[op][1](a, b).contiguous()


@zip_op.register_fake
def _zip_fake(op, a, b):
    shape = broadcast_shape(tuple(a.shape), tuple(b.shape), names=("a", "b"))
    return torch.empty(shape, dtype=a.dtype, device=a.device)


def _zip_setup(ctx, inputs, output):
    ctx.op = inputs[0]
    ctx.save_for_backward(inputs[1], inputs[2], output)


@torch.library.custom_op("tilewise::zip_backward", mutates_args=())
def zip_backward_op(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, g: torch.Tensor,
                    need_a: bool, need_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ga, gb = zip_backward(op, a, b, out, g, need_a, need_b)
    # Custom ops return tensors, not None: a gradient nobody asked for comes back as zeros.
    ga = _fresh(ga, a, b, out, g) if ga is not None else torch.zeros(a.shape, dtype=a.dtype, device=a.device)
    gb = _fresh(gb, a, b, out, g) if gb is not None else torch.zeros(b.shape, dtype=b.dtype, device=b.device)
    if ga.untyped_storage().data_ptr() == gb.untyped_storage().data_ptr():
        gb = gb.clone()
    return ga, gb


@zip_backward_op.register_fake
def _zip_backward_fake(op, a, b, out, g, need_a, need_b):
    return (torch.empty(a.shape, dtype=a.dtype, device=a.device),
            torch.empty(b.shape, dtype=b.dtype, device=b.device))


def _zip_op_backward(ctx, g):
    a, b, out = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    ga, gb = torch.ops.tilewise.zip_backward(ctx.op, a, b, out, g, need_a, need_b)
    return None, (ga if need_a else None), (gb if need_b else None)


zip_op.register_autograd(_zip_op_backward, setup_context=_zip_setup)


def _unary(op):
    def f(x):
        if getattr(x, "_tw_trace", False):
            return x._unary(op)
        if compiling():
            return torch.ops.tilewise.map(op, x)
        return MapFunction.apply(op, x)

    f.__name__ = op
    f.__doc__ = (f"``{op}(x)`` elementwise, differentiable. x: CUDA float32/float16/bfloat16 tensor (the "
                 f"kernels) or a CPU float tensor (the PyTorch reference), any shape and strides; "
                 f"returns x's shape and dtype. Traced by ``tilewise.fuse``.")
    return f


def _as_tensor_like(v, like, what: str, name: str):
    if isinstance(v, torch.Tensor):
        return v
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{what}: '{name}' must be a tensor or a Python number, got {type(v).__name__}")
    return torch.full((), float(v), dtype=like.dtype, device=like.device)


def _binary(op):
    def f(a, b):
        if getattr(a, "_tw_trace", False) or getattr(b, "_tw_trace", False):  # tilewise.fuse's placeholder
            return (a if getattr(a, "_tw_trace", False) else b)._binary(op, a, b)
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            raise ValueError(f"{op}: 'a' or 'b' must be a torch.Tensor, got {type(a).__name__} and "
                             f"{type(b).__name__}")
        if not isinstance(a, torch.Tensor):
            a = _as_tensor_like(a, b, op, "a")
        b = _as_tensor_like(b, a, op, "b")
        if compiling():
            return torch.ops.tilewise.zip(op, a, b)
        return ZipFunction.apply(op, a, b)

    f.__name__ = op
    f.__doc__ = (f"``{op}(a, b)`` elementwise with broadcasting, differentiable. a, b: tensors of one "
                 f"float dtype on one device (CUDA: the kernels; CPU: the PyTorch reference), or one of "
                 f"them a Python number; returns the broadcast shape. Traced by ``tilewise.fuse``.")
    return f


neg, relu, exp, log, sigmoid, tanh, gelu, sin, cos = (_unary(o) for o in MAP_OPS)
add, sub, mul, div, maximum, pow, relu_backward = (_binary(o) for o in ZIP_OPS)  # noqa: A001
maximum.__name__ = "maximum"


# --------------------------------------------------------------------------- warp divergence, measured


def divergence_inputs(n: int, pattern: str, device="cuda", generator=None) -> torch.Tensor:
    """n fp32 values, half positive: ``"split"`` alternates the sign every element (every warp
    holds both signs), ``"uniform"`` every 32 elements (each warp sees one sign)."""
    if pattern not in ("split", "uniform"):
        raise ValueError(f"divergence_inputs: 'pattern' must be 'split' or 'uniform', got {pattern!r}")
    mag = torch.rand(n, device=device, generator=generator) + 0.5
    idx = torch.arange(n, device=device)
    sign = (idx % 2 if pattern == "split" else (idx // 32) % 2) * 2 - 1
    return mag * sign


def divergence_reference(x: torch.Tensor, work: int) -> torch.Tensor:
    """The two chains in float64: x > 0: ``work`` times v = 0.999 v + 0.5; else v = 0.998 v - 0.25."""
    v = x.double()
    p, q = v.clone(), v.clone()
    for _ in range(work):
        p = p * 0.999 + 0.5
        q = q * 0.998 - 0.25
    return torch.where(v > 0, p, q).to(x.dtype)


def divergence_cost(n: int, work: int) -> Cost:
    """The useful work: one chain of ``work`` FMAs (2 FLOPs each) per element; read + write fp32."""
    return Cost(flops=2 * work * n, bytes=8 * n)


def divergence(x: torch.Tensor, variant: str = "v1_branch", work: int = 64,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The divergence experiment: x contiguous CUDA float32 (any shape); ``variant`` "v1_branch"
    (an if/else per element) or "v2_select" (both chains, then a select); ``work``: FMAs per chain
    (0 to 2^20). Returns ``out`` (new when not given), x's shape, equal to divergence_reference."""
    if variant not in DIVERGENCE_VARIANTS:
        raise ValueError(f"divergence: unknown variant {variant!r}; choose from {list(DIVERGENCE_VARIANTS)}")
    if not isinstance(work, int) or not 0 <= work <= 2**20:
        raise ValueError(f"divergence: 'work' must be an int in [0, 2^20], got {work!r}")
    check_inputs("divergence", {"x": x})
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("divergence: 'x' must be a contiguous float32 tensor")
    out = out_tensor("divergence", out, x.shape, x)
    n = x.numel()
    if n == 0:
        return out
    dev = x.get_device()
    key = ("divergence", variant, dev)
    k = _kernels.get(key)
    if k is None:
        params = (rt.Tensor("x", (torch.float32,)), rt.Tensor("out", (torch.float32,)), rt.Scalar("n", "i64"),
                  rt.Scalar("work", "i32"))
        k = _kernels[key] = _module(torch.float32, dev).kernel(f"divergence_{variant}", params)
    wave = _wave(k, key)
    k(max(1, min(wave, -(-n // _THREADS))), _THREADS, x, out, n, work)
    return out
