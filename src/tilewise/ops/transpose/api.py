"""transpose: ``out[..., n, m] = x[..., m, n]`` for a contiguous 2-D (M, N) or 3-D (B, M, N) tensor.

Versions (``transpose.cu``); all move M x N elements in and out once, so all are bound by copy
bandwidth, and they differ in how close they get:
    v1_naive:   one thread per element, reads along rows (coalesced), writes down columns: every
                lane of a warp store lands in a different 32-byte sector. bound: ~1/8 (fp32) or
                ~1/16 (2-byte) of the write bandwidth, since each stored sector carries one element.
    v2_smem:    a 32 x 32 tile through shared memory, both global sides coalesced; the column read
                from shared memory has a 32-element pitch: 32-way bank conflicts (fp32), 16-way
                (2-byte). bound: shared-memory replays, not DRAM.
    v3_padded:  v2 + one element of padding per tile row: no bank conflicts. bound: copy bandwidth,
                with 4- or 2-byte accesses (many load/store instructions per byte for 2-byte types).
    v4_vec:     16-byte loads and stores through a TM x TW-word shared tile (``V4Config``; default
                64 rows x 64 words = 64 x 64 fp32 or 64 x 128 fp16/bf16, 256 threads, 4 vectors in
                flight per thread each way); 2-byte types are kept in shared memory as pairs in
                32-bit words and swapped in registers, so every dtype has conflict-free shared loads
                and stores with one padding word (or 2-way conflicts when a store instruction is
                made to write 128-byte runs of 2-byte output rows, ``gl``). Tiles are launched in
                groups of ``group`` tile rows so that resident blocks cover a near-square patch
                (long DRAM runs on both sides); plain stores keep written lines in L2 long enough
                for neighbouring tiles to complete them. Needs M, N multiples of 16 / itemsize and
                16-byte aligned pointers for the vector path, else the same tile with element
                accesses. bound: copy bandwidth.

Inputs: contiguous CUDA tensors (non-contiguous ones are rejected: pass ``x.contiguous()``);
fp32 / fp16 / bf16; any M, N >= 0; out must not overlap x.

v4_vec's configurations (``V4Config``, ``V4_DEFAULT`` and the ones kept beside it) are in ``configs``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ...cost import Cost
from ...runtime import cuda as rt
from .._checks import check_kernel_inputs, runs_reference
from .._memory import may_overlap
from .configs import DEFAULT_VARIANT, V4_BUILT, V4_DEFAULT, V4Config, v4_tile

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("transpose.cu")
_MAX_GRID_Y = 65535
_MAX_GRID_X = 2**31 - 1


def reference(x: torch.Tensor) -> torch.Tensor:
    """PyTorch: swap the last two dims and materialize (reads and writes each element once)."""
    return x.transpose(-2, -1).contiguous()


def cost(shape, dtype: torch.dtype = torch.float32) -> Cost:
    """``shape``: (M, N) or (B, M, N). No arithmetic; each element read once and written once."""
    n = 1
    for s in shape:
        n *= int(s)
    itemsize = dtype.itemsize
    return Cost(flops=0, bytes=2 * n * itemsize)


# --------------------------------------------------------------------------- kernels

_NAMES = {
    "v1_naive": ["transpose_v1_naive<{t}>"],
    "v2_smem": ["transpose_v2_smem<{t}>"],
    "v3_padded": ["transpose_v3_padded<{t}>"],
}


@functools.cache
def _module(device_index: int) -> rt.Module:
    names = [n.format(t=rt.ctype(d)) for ns in _NAMES.values() for n in ns for d in _DTYPES]
    names += [v4_name(d, cfg, vec) for d, cfgs in V4_BUILT.items() for cfg in cfgs for vec in (True, False)]
    return rt.load(_SRC, names, device_index=device_index)


_kernels: dict[tuple, rt.Kernel] = {}
_PARAMS = (rt.Scalar("M", "i64"), rt.Scalar("N", "i64"), rt.Scalar("tiles_n", "i64"), rt.Scalar("B", "i64"))
_V4_PARAMS = (rt.Scalar("M", "i64"), rt.Scalar("N", "i64"), rt.Scalar("tiles_m", "i64"),
              rt.Scalar("tiles_n", "i64"), rt.Scalar("B", "i64"), rt.Scalar("group", "i64"))


def _kernel(name: str, dtype: torch.dtype, device_index: int) -> rt.Kernel:
    key = (name, dtype, device_index)
    k = _kernels.get(key)
    if k is None:
        p = _V4_PARAMS if name.startswith("transpose_v4_vec") else _PARAMS
        p = (rt.Tensor("x", (dtype,)), rt.Tensor("out", (dtype,))) + p
        full = name.format(t=rt.ctype(dtype))
        mod = _module(device_index)
        if full not in mod.compiled.symbol_mapping:  # a v4 config outside V4_BUILT: its own module
            mod = rt.load(_SRC, [full], device_index=device_index)
        k = mod.kernel(full, p)
        _kernels[key] = k
    return k


# --------------------------------------------------------------------------- checks


def _check(x: torch.Tensor, out: torch.Tensor | None, cpu: bool = False) -> torch.Tensor:
    check_kernel_inputs("transpose", {"x": x}, cpu=cpu)
    if x.dim() not in (2, 3):
        raise ValueError(f"transpose: 'x' must be 2-D (M, N) or 3-D (B, M, N), got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"transpose: 'x' is not contiguous (strides {tuple(x.stride())}); pass x.contiguous()")
    want = (*x.shape[:-2], x.shape[-1], x.shape[-2])
    if out is None:
        return torch.empty(want, dtype=x.dtype, device=x.device)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"transpose: 'out' must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"transpose: 'out' is {out.dtype} on {out.device}; expected {x.dtype} on {x.device}")
    if not out.is_contiguous():
        raise ValueError(f"transpose: 'out' is not contiguous (strides {tuple(out.stride())})")
    if tuple(out.shape) != want:
        raise ValueError(f"transpose: 'out' has shape {tuple(out.shape)}; expected {want}")
    if may_overlap(x, out):
        raise ValueError("transpose: 'out' overlaps 'x'; an in-place transpose is not supported")
    return out


def _dims(x: torch.Tensor) -> tuple[int, int, int]:
    if x.dim() == 2:
        return 1, x.shape[0], x.shape[1]
    return x.shape[0], x.shape[1], x.shape[2]


def _launch(name: str, tm: int, tn: int, block, x: torch.Tensor, out: torch.Tensor,
            group: int | None = None) -> torch.Tensor:
    """``group`` None: v1-v3's parameters; an int: v4's (tiles_m and the launch-order group too)."""
    B, M, N = _dims(x)
    if B * M * N == 0:
        return out
    tiles_m, tiles_n = -(-M // tm), -(-N // tn)
    if tiles_m * tiles_n > _MAX_GRID_X:
        raise ValueError(f"transpose: {M} x {N} needs {tiles_m * tiles_n} tiles, past the grid limit")
    k = _kernel(name, x.dtype, x.get_device())
    grid = (tiles_m * tiles_n, min(B, _MAX_GRID_Y))
    if group is None:
        k(grid, block, x, out, M, N, tiles_n, B)
    else:
        k(grid, block, x, out, M, N, tiles_m, tiles_n, B, group)
    return out


def v1_naive(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _launch("transpose_v1_naive<{t}>", 32, 32, (32, 8), x, _check(x, out))


def v2_smem(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _launch("transpose_v2_smem<{t}>", 32, 32, (32, 8), x, _check(x, out))


def v3_padded(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _launch("transpose_v3_padded<{t}>", 32, 32, (32, 8), x, _check(x, out))


def v4_name(dtype: torch.dtype, cfg: V4Config, vec: bool) -> str:
    """The kernel's name expression (``group`` is a launch argument, not part of the name)."""
    b = lambda v: "true" if v else "false"  # noqa: E731
    return (f"transpose_v4_vec<{rt.ctype(dtype)},{b(vec)},{cfg.tm},{cfg.tw},{cfg.threads},{cfg.minb},"
            f"{cfg.gl},{b(cfg.ldcs)},{b(cfg.stcs)}>")


def v4_prepare(dtype: torch.dtype, configs, device_index: int | None = None) -> dict[V4Config, rt.Kernel]:
    """Compile the vector-path kernels of many v4 configs in one NVRTC module (for sweeps such as
    research/transpose_variants.py) and return {config: kernel}; ``v4_vec`` then uses them."""
    dev = torch.cuda.current_device() if device_index is None else device_index
    configs = list(dict.fromkeys(configs))
    for c in configs:
        c.check(dtype)
    names = [v4_name(dtype, c, True) for c in configs]
    mod = rt.load(_SRC, names, device_index=dev)
    p = (rt.Tensor("x", (dtype,)), rt.Tensor("out", (dtype,))) + _V4_PARAMS
    for n in names:
        _kernels.setdefault((n, dtype, dev), mod.kernel(n, p))
    return {c: _kernels[(v4_name(dtype, c, True), dtype, dev)] for c in configs}


def v4_uses_vectors(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether v4 takes its 16-byte path: M and N multiples of 16 / itemsize, pointers 16-byte aligned."""
    _, M, N = _dims(x)
    v = 16 // x.element_size()
    return M % v == 0 and N % v == 0 and x.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0


def v4_vec(x: torch.Tensor, out: torch.Tensor | None = None, config: V4Config | None = None) -> torch.Tensor:
    """``config``: a ``V4Config`` (default ``V4_DEFAULT[x.dtype]``); one outside ``V4_BUILT`` (group
    aside) is compiled on first use."""
    out = _check(x, out)
    cfg = V4_DEFAULT[x.dtype] if config is None else config
    if not isinstance(cfg, V4Config):
        raise ValueError(f"transpose.v4_vec: 'config' must be a V4Config, got {type(cfg).__name__}")
    cfg.check(x.dtype)
    tm, tn = v4_tile(x.dtype, cfg)
    name = v4_name(x.dtype, cfg, v4_uses_vectors(x, out))
    return _launch(name, tm, tn, cfg.threads, x, out, group=cfg.group)


VARIANTS = {"v1_naive": v1_naive, "v2_smem": v2_smem, "v3_padded": v3_padded, "v4_vec": v4_vec}


def transpose(x: torch.Tensor, *, out: torch.Tensor | None = None, variant: str | None = None) -> torch.Tensor:
    """Transpose the last two dims of ``x`` into a new contiguous tensor.

    x:       contiguous CUDA tensor, (M, N) or (B, M, N), float32 / float16 / bfloat16; any sizes
             (empty too). A CPU tensor runs the PyTorch reference (any variant).
    out:     optional contiguous tensor of shape (N, M) or (B, N, M), x's dtype and device, not
             overlapping x.
    variant: ``None`` (the fastest: v4_vec) or a key of ``VARIANTS``.
    Returns ``out`` (a new tensor when not given).
    """
    if variant is None:
        variant = DEFAULT_VARIANT
    if variant not in VARIANTS:
        raise ValueError(f"transpose: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    if runs_reference("transpose", {"x": x, "out": out}):
        return _check(x, out, cpu=True).copy_(reference(x))
    return VARIANTS[variant](x, out)
