"""transpose's tuning tables: v4_vec's configurations (``V4Config``), the default per dtype and the
ones kept for comparison, and the variant ``transpose()`` runs. Read-only; the numbers behind each
are in docs/tuning/transpose.md, under the section named in the comment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import torch

# v4_vec, at 96.8 % (fp32) and 97.6 % (bf16) of copy at 16384^2 on the H200, 1.04x / 1.20x
# torch.compile (docs/tuning/transpose.md, "V4_DEFAULT").
DEFAULT_VARIANT = "v4_vec"


@dataclass(frozen=True)
class V4Config:
    """v4_vec's compile-time shape and launch order (see transpose.cu):
    tm: tile rows (32, 64, 128); tw: 32-bit words per tile row (32 or 64: tw fp32 or 2 tw 2-byte
    columns); threads: block size; minb: minimum resident blocks per SM asked of ptxas (1 = no
    register cap); gl: store lanes along the output row (gl * 16 contiguous bytes per output row per
    store instruction; gl * 16 / itemsize = 64 costs 2-way shared conflicts); ldcs / stcs: streaming
    (evict-first) hints on the global loads / stores; group: tile rows per launch group (0 = plain
    tile-row-major order)."""

    tm: int = 64
    tw: int = 64
    threads: int = 256
    minb: int = 1
    gl: int = 8
    ldcs: bool = True
    stcs: bool = False
    group: int = 8

    def check(self, dtype: torch.dtype) -> None:
        """Raise ValueError unless the kernel's static_asserts hold for this dtype."""
        V = 16 // dtype.itemsize
        nw, wl = self.threads // 32, 32 // self.gl if self.gl in (2, 4, 8, 16) else 0
        ok = (self.tm in (32, 64, 128) and self.tw in (32, 64) and self.threads in (64, 128, 256, 512)
              and self.minb >= 1 and wl and 32 <= self.gl * V <= 64 and self.tm % (self.gl * V) == 0
              and ((self.tm // 4) * (self.tw // 32)) % nw == 0
              and ((self.tw // wl) * (self.tm // (V * self.gl))) % nw == 0 and self.group >= 0)
        if not ok:
            raise ValueError(f"transpose.v4_vec: config {self} does not fit {dtype}")


# An earlier default (streaming stores, tile-row-major order, bf16 storing 64-byte runs per output
# row), kept for reference: neither compiled nor timed. It beat V4_TRIED (fp32 3,806 / 3,750 GB/s
# against 3,651) and lost to V4_DEFAULT (docs/tuning/transpose.md, "V4_FIRST").
V4_FIRST = MappingProxyType({
    torch.float32: V4Config(gl=8, stcs=True, group=0),
    torch.float16: V4Config(gl=4, stcs=True, group=0),
    torch.bfloat16: V4Config(gl=4, stcs=True, group=0),
})
# The default: plain loads, streaming stores and tile-column-major launch order (group >= tile
# rows) won the configuration sweep at 16384^2 on the H200: fp32 64 x 64 tile, 128 threads, 16 store
# lanes 4,085 GB/s = 96.8 % of copy, 1.038x torch.compile; bf16 128 x 64 words, 512 threads, >= 2
# blocks/SM 4,018 GB/s = 97.6 % of copy, 1.198x (docs/tuning/transpose.md, "V4_DEFAULT").
V4_DEFAULT = MappingProxyType({
    torch.float32: V4Config(tm=64, tw=64, threads=128, minb=1, gl=16, ldcs=False, stcs=True, group=1 << 30),
    torch.float16: V4Config(tm=128, tw=64, threads=512, minb=2, gl=8, ldcs=False, stcs=True, group=1 << 30),
    torch.bfloat16: V4Config(tm=128, tw=64, threads=512, minb=2, gl=8, ldcs=False, stcs=True, group=1 << 30),
})
# The predicted configuration that lost (plain stores, launch groups of 8 tile rows, fp32 capped
# at 48 registers); kept compiled so the bench and the sweep time it beside the default
# (docs/tuning/transpose.md, "V4_TRIED").
V4_TRIED = MappingProxyType({
    torch.float32: V4Config(minb=5),
    torch.float16: V4Config(gl=8),
    torch.bfloat16: V4Config(gl=8),
})
# Every config compiled into the package module (and named in transpose.cu's instantiate lines).
V4_BUILT = MappingProxyType({d: tuple(dict.fromkeys(replace(c[d], group=0) for c in (V4_DEFAULT, V4_TRIED)))
                             for d in V4_DEFAULT})


def v4_tile(dtype: torch.dtype, config: V4Config | None = None) -> tuple[int, int]:
    """v4's tile (rows of x, columns of x) for ``config`` (default ``V4_DEFAULT[dtype]``)."""
    cfg = V4_DEFAULT[dtype] if config is None else config
    return cfg.tm, cfg.tw * (4 // dtype.itemsize)
