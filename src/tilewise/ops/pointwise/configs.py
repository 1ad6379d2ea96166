"""The pointwise kernels' tuning: the template and launch parameters of elementwise v4_blocked,
reduce v5_columns and the fused kernels, the measured defaults the ops pick when the caller gives
none, and the block size of the recompute kernels. Each default names its section of
docs/tuning/pointwise.md (or rowwise.md), which holds the numbers; research/elementwise_variants.py
sweeps the configs and prints the entries that would replace them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import DTYPES

# --------------------------------------------------------------------------- elementwise v4_blocked


@dataclass(frozen=True)
class BlockedConfig:
    """v4_blocked's template parameters (elementwise.cu): unroll = 16-byte vectors per thread (1, 2,
    4, 8, 16; all loaded before the first use, fp32 sigmoid in batches of 4), threads = block size
    (64 to 1024, a multiple of 32), minb = minimum resident blocks per SM asked of ptxas
    (``__launch_bounds__(threads, minb)``: a register cap; 1 = none). One block owns
    threads x unroll consecutive vectors."""

    unroll: int = 8
    threads: int = 256
    minb: int = 1

    def check(self) -> None:
        if (self.unroll not in (1, 2, 4, 8, 16) or self.threads % 32 or not 64 <= self.threads <= 1024
                or not 1 <= self.minb <= 2048 // self.threads):
            raise ValueError(f"v4_blocked: config {self} is not valid (unroll 1/2/4/8/16, threads a multiple "
                             f"of 32 in [64, 1024], 1 <= minb <= 2048 / threads)")


# Fewer vectors a thread in 128-thread blocks keep more blocks resident (docs/tuning/pointwise.md, "BLOCKED_DEFAULT").
_MEASURED_BLOCKED = {
    ("map", torch.float32): BlockedConfig(unroll=2, threads=128, minb=12),
    ("zip", torch.float32): BlockedConfig(unroll=1, threads=128, minb=1),
    ("map", torch.bfloat16): BlockedConfig(unroll=1, threads=128, minb=1),
    ("zip", torch.bfloat16): BlockedConfig(unroll=1, threads=128, minb=1),
    ("map", torch.float16): BlockedConfig(unroll=1, threads=128, minb=1),
    ("zip", torch.float16): BlockedConfig(unroll=1, threads=128, minb=1),
}
# v4_blocked's config per (kind, dtype) when the caller gives none; BlockedConfig() where nothing was measured.
BLOCKED_DEFAULT: dict[tuple[str, torch.dtype], BlockedConfig] = {
    (kind, d): _MEASURED_BLOCKED.get((kind, d), BlockedConfig()) for kind in ("map", "zip") for d in DTYPES}

# neg and relu run fastest at 1 vector x 256 threads in fp32 (docs/tuning/pointwise.md, "Light ops: _MEASURED_LIGHT").
_LIGHT_FUNCTORS = frozenset({"Neg", "Relu"})
_MEASURED_LIGHT = {("map", torch.float32): BlockedConfig(unroll=1, threads=256, minb=1)}


def blocked_default(kind: str, functor: str, dtype: torch.dtype) -> BlockedConfig:
    """v4_blocked's config for one op (functor name, e.g. "Relu") when the caller gives none."""
    if functor in _LIGHT_FUNCTORS:
        c = _MEASURED_LIGHT.get((kind, dtype))
        if c is not None:
            return c
    return BLOCKED_DEFAULT[(kind, dtype)]


def blocked_built(kind: str, dtype: torch.dtype) -> tuple[BlockedConfig, ...]:
    """The v4 configs compiled into the package module (the defaults: BLOCKED_DEFAULT's and the
    light ops' one)."""
    light = [c for (k, d), c in _MEASURED_LIGHT.items() if k == kind and d == dtype]
    return tuple(dict.fromkeys((BLOCKED_DEFAULT[(kind, dtype)], *light)))


# --------------------------------------------------------------------------- reduce v5_columns


@dataclass(frozen=True)
class ColumnsConfig:
    """v5_columns' template and launch parameters (reduce.cu): tx = threads across columns (each
    one 16-byte vector), ty = thread rows, unroll = vector loads in flight per thread, minb =
    minimum resident blocks per SM asked of ptxas (1 = no register cap); waves = how many full
    waves of resident blocks the row split aims for (grid.y, the number of splits, is about waves x
    the kernel's resident blocks (SMs x blocks per SM at its register and smem use) / column
    blocks), min_rows = the fewest rows one split walks (short columns split less); fold = how the
    split partials meet: "pass" (a second small kernel) or "last" (the last split block of each
    column block folds them, counted with an atomic: one launch fewer; counters are cached per
    device and stream, so two streams never share them)."""

    tx: int = 32
    ty: int = 8
    unroll: int = 4
    minb: int = 1
    waves: int = 2
    min_rows: int = 256
    fold: str = "pass"

    def check(self, dtype: torch.dtype = torch.float32) -> None:
        nt = self.tx * self.ty
        smem = self.ty * (16 // dtype.itemsize) * self.tx * 4
        if (self.tx not in (8, 16, 32, 64, 128) or self.ty not in (1, 2, 4, 8, 16, 32) or not 32 <= nt <= 1024
                or self.unroll not in (1, 2, 4, 8) or not 1 <= self.minb <= 2048 // nt or smem > 48 * 1024
                or self.waves < 1 or self.min_rows < 1 or self.fold not in ("pass", "last")):
            raise ValueError(f"reduce.v5_columns: config {self} is not valid for {dtype}")


# Sum along dim 0: 93.5 % of copy, 1.06x torch.sum in fp32; fp16 as bf16 (docs/tuning/pointwise.md, "COLUMNS_DEFAULT").
COLUMNS_DEFAULT: dict[torch.dtype, ColumnsConfig] = {
    torch.float32: ColumnsConfig(tx=16, ty=16, unroll=8, minb=1, waves=2, min_rows=256, fold="pass"),
    torch.bfloat16: ColumnsConfig(tx=16, ty=4, unroll=8, minb=1, waves=1, min_rows=256, fold="pass"),
    torch.float16: ColumnsConfig(tx=16, ty=4, unroll=8, minb=1, waves=1, min_rows=256, fold="pass"),
}

# reduce()'s leading-dim sums: v5 1.06x torch.sum, v4 0.88x, kept to time (docs/tuning/pointwise.md, "COLUMNS_VERSION").
COLUMNS_VERSION = "v5_columns"


# --------------------------------------------------------------------------- fusion

# How sin and cos are computed (template parameter MODE of every generated kernel):
#   "libm":   sinf / cosf, each with its own full-range argument reduction;
#   "sincos": one sincosf where sin(v) and cos(v) of the same v are both live (one reduction for
#             both; the same accuracy class as sinf/cosf), sinf / cosf otherwise;
#   "fast":   the __sinf / __cosf (__sincosf) intrinsics: a few instructions, but their error grows
#             with |x| (about 2^-21 absolute in [-pi, pi]); not for inputs of large magnitude.
TRIG_MODES = {"libm": 0, "sincos": 1, "fast": 2}


@dataclass(frozen=True)
class FuseConfig:
    """The generated kernels' template and launch parameters.

    trig: a key of ``TRIG_MODES``. blocked path (contiguous same-shape inputs): unroll = 16-byte
    vectors per thread and operand (1, 2, 4, 8, 16), threads = block size, minb = minimum resident
    blocks per SM (``__launch_bounds__``; 1 = no register cap). rows path (inputs that walk rows with
    stride 1 or 0: a bias row or column, a scalar): rows = rows per thread (1, 2, 4, 8),
    rows_threads = block size (TX x TY with TX the next power of two of the row's vectors).
    """

    trig: str = "sincos"
    unroll: int = 8
    threads: int = 256
    minb: int = 1
    rows: int = 8
    rows_threads: int = 256

    def check(self) -> None:
        ok = (self.trig in TRIG_MODES and self.unroll in (1, 2, 4, 8, 16) and self.rows in (1, 2, 4, 8)
              and all(t % 32 == 0 and 64 <= t <= 1024 for t in (self.threads, self.rows_threads))
              and 1 <= self.minb <= 2048 // self.threads)
        if not ok:
            raise ValueError(f"tilewise.fuse: config {self} is not valid")


# sin^2 + cos^2 at 98.9 % of copy (1.10x torch.compile), a bias row 1.00x (docs/tuning/pointwise.md, "FUSE_DEFAULT").
FUSE_DEFAULT = FuseConfig(trig="sincos", unroll=4, threads=512, minb=1, rows=2, rows_threads=256)


# --------------------------------------------------------------------------- recompute

# 8 elements a thread at 8 warps: two 16-byte bf16 loads per tensor in flight (the sigmoid3 kernels' BLOCK).
RECOMPUTE_BLOCK = 2048

# SwiGLU's elementwise kernel (swiglu.py): elements a program and warps; 16-byte accesses per thread
# at 4 warps x 32 lanes x 8 elements. Not yet measured on the H200 (docs/tuning/pointwise.md).
SWIGLU_BLOCK = 1024
SWIGLU_WARPS = 4
# swiglu_packed: columns of one row a program (Llama's I = 8192 .. 14336 is 8 .. 14 programs a row).
SWIGLU_PACKED_BLOCK = 1024
# Wider blocks where one divides I: at (16384, 2 x 8192) on the H100 the backward with y took 574 us at 1024,
# 570 at 2048 and 562 at 4096, the forward 289 / 287 / 287 (docs/tuning/pointwise.md, "swiglu_packed's block").
SWIGLU_PACKED_WIDE = (4096, 2048)


def swiglu_packed_block(i: int) -> int:
    """Columns a program for swiglu_packed's intermediate size ``i``: the widest of ``SWIGLU_PACKED_WIDE``
    that divides it (no masked tail), else ``SWIGLU_PACKED_BLOCK``."""
    return next((b for b in SWIGLU_PACKED_WIDE if i % b == 0), SWIGLU_PACKED_BLOCK)
