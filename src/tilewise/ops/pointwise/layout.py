"""Shapes, strides and launch geometry shared by the pointwise kernels (``include/strided.cuh``), and
the checks of their inputs and outputs.

``elementwise``, ``fusion`` and ``reduce`` all read operands through strides with broadcasting
(stride 0), so they share the layout words of strided.cuh, the 2-D (rows, columns) view that picks
the rows kernels, and the 16-byte vector grids. This module imports none of them.
"""

from __future__ import annotations

import functools
import math

import torch

from ...runtime import cuda as rt

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_DIMS = 8  # dims of a layout after merging (MAX_DIMS in strided.cuh)
ROWS_THREADS = 256  # elementwise zip_v5_rows' block (its __launch_bounds__)
ROWS_PER_THREAD = 8  # rows per thread in zip_v5_rows (ROWS in elementwise.cu)


# --------------------------------------------------------------------------- shapes and strides


def magic(d: int) -> tuple[int, int]:
    """(mul, shr) with ``x // d == (x * mul >> 32) >> shr`` for 0 <= x, d < 2^31 (mul 0: d == 1)."""
    if d < 1:
        raise ValueError(f"magic: divisor must be >= 1, got {d} (empty tensors launch nothing)")
    if d == 1:
        return 0, 0
    lg = (d - 1).bit_length()  # ceil(log2 d)
    p = 31 + lg
    return -(-(1 << p) // d), p - 32


def broadcast_shape(*shapes: tuple[int, ...], names: tuple[str, ...] | None = None) -> tuple[int, ...]:
    """NumPy/PyTorch broadcasting of ``shapes``; ValueError naming the inputs that disagree."""
    names = names or tuple(f"input {i}" for i in range(len(shapes)))
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(nd):
        size = 1
        for s in shapes:
            k = d - (nd - len(s))
            if k < 0 or s[k] == 1:
                continue
            if size != 1 and s[k] != size:
                desc = ", ".join(f"'{n}' {tuple(s)}" for n, s in zip(names, shapes))
                raise ValueError(f"shapes cannot broadcast: {desc} (dim {d - nd} is {size} vs {s[k]})")
            size = s[k]
        out.append(size)
    return tuple(out)


def collapse(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dims and merge neighbours that every tensor walks as one (stride[d-1] ==
    stride[d] * shape[d]), so a contiguous or bias-row pattern costs one or two divisions."""
    dims = [(s, [st[d] for st in strides]) for d, s in enumerate(shape) if s != 1]
    merged: list[tuple[int, list[int]]] = []
    for s, st in dims:
        if merged and all(p == q * s for p, q in zip(merged[-1][1], st)):
            merged[-1] = (merged[-1][0] * s, st)
        else:
            merged.append((s, st))
    if not merged:
        merged = [(1, [0] * len(strides))]
    return tuple(m[0] for m in merged), [tuple(m[1][k] for m in merged) for k in range(len(strides))]


def expanded_strides(t: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...]:
    """t's strides seen from the broadcast ``shape``: 0 on dims t lacks or has as size 1."""
    return _expanded(tuple(t.shape), tuple(t.stride()), shape)


def _expanded(tshape, tstride, shape):
    pad = len(shape) - len(tshape)
    return tuple(0 if d < pad or tshape[d - pad] == 1 else tstride[d - pad] for d in range(len(shape)))


def layout_words(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The meta array of strided.cuh for output ``shape`` and the inputs' ``strides``."""
    shape, strides = collapse(shape, strides)
    if len(shape) > MAX_DIMS:
        raise ValueError(f"tensors with more than {MAX_DIMS} non-mergeable dimensions are not supported "
                         f"(shape {shape}); make the input contiguous first")
    n = math.prod(shape)
    pad = MAX_DIMS - len(shape)
    muls, shrs = zip(*(magic(s) if s < 2**31 else (0, 0) for s in shape))
    words = [len(shape), n, *shape, *([1] * pad), *muls, *([0] * pad), *shrs, *([0] * pad)]
    for st in strides:
        words += [*st, *([0] * pad)]
    return tuple(words)


_meta_cache: dict[tuple, torch.Tensor] = {}


def layout_tensor(words: tuple[int, ...], device_index: int) -> torch.Tensor:
    """A cached int64 device copy of ``words`` (built once per layout; build it before a CUDA graph
    capture, since building does a host-to-device copy)."""
    key = (device_index, words)
    t = _meta_cache.get(key)
    if t is None:
        if len(_meta_cache) > 4096:
            _meta_cache.clear()
        t = _meta_cache[key] = torch.tensor(words, dtype=torch.int64, device=f"cuda:{device_index}")
    return t


@functools.lru_cache(maxsize=4096)
def _plan(shape: tuple[int, ...], specs: tuple) -> tuple:
    """Per (output shape, inputs' (shape, stride)): the layout words, and (R, C, 2-D strides) when
    the layout collapses to 2 dims (else None). Cached: working it out costs ~40 us of Python, more
    than a launch."""
    shape = shape or (1,)
    strides = [_expanded(ts, st, shape) for ts, st in specs]
    words = layout_words(shape, strides)
    cshape, cstrides = collapse(shape, strides)
    if len(cshape) == 1:
        two = (1, cshape[0], tuple((0, st[0]) for st in cstrides))
    elif len(cshape) == 2:
        two = (cshape[0], cshape[1], tuple((st[0], st[1]) for st in cstrides))
    else:
        two = None
    return words, two


def _specs(inputs) -> tuple:
    return tuple((tuple(t.shape), tuple(t.stride())) for t in inputs)


def strided_words(inputs, out: torch.Tensor) -> tuple[int, ...]:
    """The layout words of ``inputs`` broadcast to ``out``'s shape (cached per layout)."""
    return _plan(tuple(out.shape), _specs(inputs))[0]


def layout_2d(inputs, out: torch.Tensor):
    """(R, C, [(row stride, col stride) per input]) when the collapsed layout has at most 2 dims."""
    return _plan(tuple(out.shape), _specs(inputs))[1]


# --------------------------------------------------------------------------- which kernel layout applies


def contiguous_ok(inputs, out: torch.Tensor) -> bool:
    """Every input contiguous and of out's shape, all 16-byte aligned: the blocked vector kernels."""
    return (all(t.is_contiguous() and t.shape == out.shape for t in inputs) and rt.aligned16(*inputs, out))


def transposed(strides_2d) -> bool:
    """Some input walks rows faster than columns: v1's reads of it would not coalesce."""
    return any(sr != 0 and sc != 0 and abs(sr) < abs(sc) for sr, sc in strides_2d)


def rows_ok(inputs, out: torch.Tensor, layout) -> bool:
    """The rows kernels apply: every operand walks a row with stride 1 (its start and row stride
    keeping 16-byte loads aligned) or 0 (read as a scalar per row), and output rows are whole vectors."""
    if layout is None:
        return False
    R, C, strides = layout
    vec = 16 // out.element_size()
    if C % vec or out.data_ptr() % 16:
        return False
    for t, (sr, sc) in zip(inputs, strides):
        if sc not in (0, 1) or sr < 0:
            return False
        if sc == 1 and (t.data_ptr() % 16 or sr % vec):
            return False
    return rows_grid(R, C, out.element_size())[0] < 2**31


def rows_layout(layout, itemsize: int):
    """The rows kernels' layout: a single row (a 1-D tensor, maybe with a scalar) is cut into rows of
    at most 1024 vectors, so that each thread gets its rows' vectors to keep in flight instead of one
    (operands walk it with stride 1 or 0, so the cut is exact)."""
    R, C, strides = layout
    vec = 16 // itemsize
    if R != 1:
        return layout
    k = next(k for k in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1) if C % (k * vec) == 0)
    c2 = k * vec
    return C // c2, c2, tuple((sc * c2, sc) for _, sc in strides)


def rows_grid(R: int, C: int, itemsize: int, threads: int = ROWS_THREADS,
              rows: int = ROWS_PER_THREAD) -> tuple[int, tuple[int, int]]:
    """(blocks, (TX, TY)) of a rows kernel: TX threads across a row's 16-byte vectors (a power of two,
    at most ``threads``), TY = threads / TX rows, each thread ``rows`` rows TY apart."""
    cv = C // (16 // itemsize)
    tx = min(threads, 1 << max(0, cv - 1).bit_length())
    ty = threads // tx
    return -(-cv // tx) * -(-R // (ty * rows)), (tx, ty)


def blocked_grid(n: int, itemsize: int, config) -> int:
    """Blocks of a blocked kernel (``config.threads`` x ``config.unroll`` 16-byte vectors a block)
    for n elements, at least one (an empty vector chunk still does the scalar tail)."""
    return max(1, -(-n // (config.threads * config.unroll * (16 // itemsize))))


# --------------------------------------------------------------------------- inputs and outputs


def check_inputs(what: str, inputs: dict[str, torch.Tensor], *, cuda: bool = True) -> torch.Tensor:
    """Type, device, dtype agreement of named inputs; returns the first. ValueError naming the arg."""
    first_name, first = next(iter(inputs.items()))
    for name, t in inputs.items():  # what each argument is, before where it lives
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what}: '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{what}: '{name}' has dtype {t.dtype}; a floating-point tensor is needed "
                             f"(float32, float16 or bfloat16)")
    for name, t in inputs.items():
        if t.device.type not in ("cpu", "cuda"):  # a meta tensor has no values to compute with
            raise ValueError(f"{what}: '{name}' is on {t.device}; tilewise takes CUDA tensors (the kernels) "
                             f"or CPU tensors (the PyTorch reference)")
        if cuda and not t.is_cuda:
            raise ValueError(f"{what}: '{name}' is on {t.device}; tilewise kernels need CUDA tensors "
                             f"(on CPU tensors, tilewise.sum / amax / mean and the elementwise functions run "
                             f"the PyTorch reference)")
        if t.device != first.device:
            raise ValueError(f"{what}: '{name}' is on {t.device} but '{first_name}' is on {first.device}")
        if t.dtype != first.dtype:
            raise ValueError(f"{what}: '{name}' has dtype {t.dtype} but '{first_name}' has {first.dtype}; "
                             f"cast one of them")
        if cuda and t.dtype not in DTYPES:
            raise ValueError(f"{what}: '{name}' has dtype {t.dtype}; supported: float32, float16, bfloat16")
    return first


def out_tensor(what: str, out: torch.Tensor | None, shape, like: torch.Tensor) -> torch.Tensor:
    """``out`` checked to be contiguous, of ``shape`` and of like's dtype and device; a new tensor when None."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape):
        raise ValueError(f"{what}: 'out' must be a tensor of shape {tuple(shape)}")
    if out.dtype != like.dtype or out.device != like.device:
        raise ValueError(f"{what}: 'out' must be {like.dtype} on {like.device}, got {out.dtype} on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{what}: 'out' must be contiguous (strides {tuple(out.stride())})")
    return out


def compiling() -> bool:
    """True while torch.compile traces: kernels launched from Python cannot be traced, so the
    differentiable ops switch to their ``torch.library`` custom ops (``tilewise::map`` ...)."""
    try:
        return bool(torch.compiler.is_compiling())
    except AttributeError:  # older PyTorch
        return False
