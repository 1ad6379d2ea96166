"""GEMM tuning tables and routing rules: the per-call policy, the Triton kernels' tiles (the
autotuner's list and the fixed ones), the sm_90a CUDA C kernels' instantiations and tile rules, and
``route``, the pure function that picks gemm()'s path and tile for a call described by its layouts
(``Problem``). Nothing here launches or reads the environment: the kernels' modules
(``triton_kernels``, ``sm90``) and the dispatch (``api``, ``route``) take their choices from here.
Each rule keeps a one-line reason; the measurements behind it are in docs/tuning/gemm.md, in the
section the comment names.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ...runtime import cuda as rt

FP8 = torch.float8_e4m3fn
TWO_BYTE = (torch.float16, torch.bfloat16)
IN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, FP8)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_out_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp8 products come out in bf16 (fp8 outputs would lose what the fp32 accumulator kept)."""
    return torch.bfloat16 if dtype == FP8 else dtype


# --------------------------------------------------------------------------- per-call policy


@dataclass(frozen=True)
class GemmPolicy:
    """Choices a caller makes per call (``gemm(..., policy=)``), none of which changes a result's bits.

    plans: reuse the call plan a layout's first call left (checks, route and launch arguments kept;
           docs/tuning/gemm.md, "Call plans and the direct launcher"); False checks and routes every call.
    pdl:   gemm_sm90 launches with programmatic dependent launch (docs/tuning/gemm.md, "sm90
           programmatic dependent launch"); False launches plainly."""

    plans: bool = True
    pdl: bool = True


DEFAULT_POLICY = GemmPolicy()


# --------------------------------------------------------------------------- Triton tiles


@dataclass(frozen=True)
class Tile:
    """A Triton launch config: BLOCK_M x BLOCK_N output tile, BLOCK_K, pipeline stages, warps and
    GROUP_M (tile rows that share B's columns in L2)."""

    bm: int
    bn: int
    bk: int
    stages: int
    warps: int
    group: int = 8

    def meta(self) -> dict:
        return {"BLOCK_M": self.bm, "BLOCK_N": self.bn, "BLOCK_K": self.bk, "GROUP_M": self.group}


# The autotuner's list for H200 (228 KiB smem/SM): large tiles for big squares, 128 x 128 / 64-wide for
# small or skinny problems where the big tiles leave SMs idle. Each dtype class keeps only its own K
# tile (BK_FOR_ITEMSIZE), so a shape times 4 or 5 configs; the order counts (the pruning's fallback
# is the last kept).
AUTOTUNE = (
    # 16-bit inputs: K tile 64
    Tile(128, 256, 64, 3, 8), Tile(256, 128, 64, 3, 8), Tile(128, 128, 64, 4, 8),
    Tile(128, 128, 64, 4, 4), Tile(64, 128, 64, 4, 4),
    # fp8: K tile 128
    Tile(128, 256, 128, 3, 8), Tile(256, 128, 128, 3, 8), Tile(128, 128, 128, 4, 8), Tile(64, 128, 128, 4, 4),
    # fp32 (tf32 / ieee): K tile 32
    Tile(128, 256, 32, 3, 8), Tile(128, 128, 32, 4, 8), Tile(128, 128, 32, 3, 4), Tile(64, 128, 32, 4, 4),
)
BK_FOR_ITEMSIZE = {1: 128, 2: 64, 4: 32}
# At most this many FLOPs (e.g. 512 x 512 x 1024) a problem runs in a few microseconds whichever tile
# it takes, so the smallest kept tile is launched without timing the others (saves the first call's
# autotune, see docs/tuning/gemm.md).
TINY_FLOPS = 2**29
SMEM_LIMIT = rt.SM90_SHARED_OPT_IN  # opt-in shared memory per block on H100 / H200

# The one config the interpreter runs (CPU tests): small, so odd sizes cross several tiles.
INTERP_TILE = Tile(16, 16, 16, 1, 4, group=2)

# v4_streamk's fixed tile per input itemsize; gemm() never routes to it (docs/tuning/gemm.md,
# "v4_streamk: not the default").
STREAMK_TILE = {1: Tile(128, 128, 128, 3, 8), 2: Tile(128, 128, 64, 4, 8), 4: Tile(128, 128, 32, 3, 8)}


@dataclass(frozen=True)
class SplitTile:
    """v3_tma_split's tile: BLOCK_M x (BLOCK_N + BLOCK_N2), a width Triton cannot give one tensor."""

    bm: int
    bn: int
    bn2: int
    bk: int
    stages: int
    warps: int


SPLIT_TILE = SplitTile(128, 128, 64, 64, 4, 8)
SPLIT_TILE_INTERP = SplitTile(16, 16, 16, 16, 1, 4)  # keeps a split, so odd sizes cross both halves


@dataclass(frozen=True)
class WaveTile:
    """A tile the TMA route weighs: BLOCK_M x BLOCK_N and its throughput at equal wave fill
    relative to 128 x 128."""

    bm: int
    bn: int
    rate: float


# Each rate measured graph-replayed (bf16, H200) at a size where the tile and 128 x 128 fill the last
# wave alike (docs/tuning/gemm.md, "TMA tile choice (TMA_TILES, tma_tile_for)").
TMA_TILES = {"64x128": WaveTile(64, 128, 0.83), "128x128": WaveTile(128, 128, 1.0),
             "128x192": WaveTile(128, 192, 0.98), "128x256": WaveTile(128, 256, 1.03)}
TMA_64x128 = Tile(64, 128, 64, 4, 4)  # gemm()'s fixed launch where tma_tile_for says "64x128"


def tma_tile_for(M: int, N: int, sms: int) -> str:
    """The key of ``TMA_TILES`` whose wave fill x relative throughput is highest for an (M, N)
    output on ``sms`` SMs (fill: tiles / (ceil(tiles / sms) * sms)). gemm() runs "64x128" as one
    fixed config, "128x192" as v3_tma_split, the others through v3_tma_persistent's autotuner. On
    132 SMs: 768-1000 -> 64 x 128; 1536^2 and 3072^2 -> 128 x 192; 1280, 2048, 2304, 4096 -> the
    autotuner (docs/tuning/gemm.md, "TMA tile choice (TMA_TILES, tma_tile_for)")."""
    def score(name):
        t = TMA_TILES[name]
        tiles = cdiv(M, t.bm) * cdiv(N, t.bn)
        return t.rate * tiles / (cdiv(tiles, sms) * sms) if tiles else 0.0

    return max(TMA_TILES, key=score)


# Small problems (at most 16 tiles of 128 x 128): the persistent kernel with a fixed 64 x 64 tile, no
# autotuner, ahead of the TMA path up to 512^3 and behind at 768 (docs/tuning/gemm.md, "Small
# problems: fixed 64 x 64 tile").
SMALL_TILE = Tile(64, 64, 64, 4, 4)
SMALL_MAX_TILES = 16

# 16-bit outputs at least this large go to v1_tiled, ahead of v3 at 8192^3 (docs/tuning/gemm.md,
# "Large 16-bit squares: v1_tiled (V1_FROM_MN)").
V1_FROM_MN = 7168 * 7168

SPLITK_TILE = 64  # gemm_splitk's output tile (64 x 64)


def split_k_for(M: int, N: int, K: int) -> int:
    """K slices for a problem whose output has too few 64 x 64 tiles to fill the GPU and a long K
    (the weight gradient of a linear layer: (out, in) from K = tokens); 1 = no split. Each slice
    keeps at least 128 of K; slices x tiles aims at two CTAs an SM of the H200."""
    tiles = cdiv(M, SPLITK_TILE) * cdiv(N, SPLITK_TILE)
    if tiles >= 64 or K < 1024:
        return 1
    return max(1, min(64, cdiv(K, 128), 264 // tiles))


# Rows that are not whole 16-byte multiples rule out TMA: gemm() copies the operands into zero-padded
# buffers with aligned rows where the modelled time (the measured rates below; fp8 and tf32 scaled
# by their tensor-core peaks) is at most PAD_PAYS of v1_tiled's on the rows as given
# (docs/tuning/gemm.md, "Unaligned rows: padded route").
V1_UNALIGNED_TFLOPS = 130.0
TMA_TFLOPS = {1: 1200.0, 2: 600.0, 4: 300.0}
COPY_GBPS = 2500.0
COPY_LAUNCH_US = 4.0
PAD_PAYS = 0.8


def padded_time_ratio(M: int, N: int, K: int, itemsize: int, out_itemsize: int, pad) -> float:
    """Modelled time of the padded route over v1_tiled's on unaligned rows (pad: which of a, b,
    out are copied)."""
    copy_bytes = 2 * (pad[0] * M * K * itemsize + pad[1] * K * N * itemsize + pad[2] * M * N * out_itemsize)
    flops = 2.0 * M * N * K
    t_v1 = flops / (V1_UNALIGNED_TFLOPS * 1e12)
    t_pad = (flops / (TMA_TFLOPS[itemsize] * 1e12) + copy_bytes / (COPY_GBPS * 1e9)
             + sum(pad) * COPY_LAUNCH_US * 1e-6)
    return t_pad / t_v1


# tf32 with a row-major B that gemm_tf32 does not take (an epilogue): B is transposed first (wgmma takes
# tf32 operands K-major only), from this many elements of B (docs/tuning/gemm.md, "tf32 row-major
# B: transposing copy").
TF32_KMAJOR_FROM = 1 << 16


# --------------------------------------------------------------------------- sm_90a CUDA C kernels

SM90_CTYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}  # the .cu's element types


@dataclass(frozen=True)
class Sm90Config:
    """A gemm_sm90 instantiation: tile BM x BN, cluster CM x CN (CM along M shares B, CN along N
    shares A), STAGES ring slots, trans_b: 1 for a B with unit-stride rows (K, N), 0 for B = w.T;
    wn: consumer warpgroups along N (each BN / wn columns of its 64 rows); swap: 1 computes C's
    transposed tile (wgmma's M along N, one consumer warpgroup a 64-column B chunk, its N the tile's
    BM rows, any multiple of 8); tail: the stream-K tail's instantiation (``sm90_tail_splits``)."""

    bm: int
    bn: int
    cm: int
    cn: int
    stages: int
    trans_b: int = 1
    wn: int = 1
    swap: int = 0
    tail: int = 0

    @property
    def consumers(self) -> int:
        return self.bn // 64 if self.swap else self.bm // 64 * self.wn

    @property
    def cluster(self) -> int:
        return self.cm * self.cn

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    @property
    def shmem(self) -> int:
        # the ring, the consumers' C staging buffers (64 rows x up to 128 columns each; with swap
        # BM rows x 64 columns), plus 1 KiB so the kernel can align the ring to 1024 bytes (128-byte
        # swizzle)
        staging = self.bm * 64 if self.swap else 64 * self.epi_n
        return self.stages * (self.bm + self.bn) * 64 * 2 + self.consumers * staging * 2 + 1024

    def tiles(self, M: int, N: int) -> int:
        """BM x BN tiles of an (M, N) output."""
        return cdiv(M, self.bm) * cdiv(N, self.bn)

    def cluster_tiles(self, M: int, N: int) -> int:
        """Cluster tiles of an (M, N) output: what the persistent kernel's clusters share out."""
        return cdiv(cdiv(M, self.bm), self.cm) * cdiv(cdiv(N, self.bn), self.cn)

    @property
    def epi_n(self) -> int:
        """C columns a consumer warpgroup stages at a time."""
        bnw = self.bn // self.wn
        return bnw if bnw <= 128 else bnw // 2

    def name(self, dtype: torch.dtype) -> str:
        if self.tail:
            wn = f",{self.wn},{self.swap},1"
        else:
            wn = f",{self.wn},1" if self.swap else (f",{self.wn}" if self.wn != 1 else "")
        return (f"gemm_sm90<{SM90_CTYPES[dtype]},{self.bm},{self.bn},{self.cm},{self.cn},{self.stages},"
                f"{self.trans_b}{wn}>")


SM90_CONFIGS = {
    # one consumer warpgroup (256 threads); ahead of 128 x 64 so the fill rule's tie goes to it
    # (docs/tuning/gemm.md, "sm90 config order")
    "64x128_c2x1": Sm90Config(64, 128, 2, 1, 8),
    "128x64_c1x2": Sm90Config(128, 64, 1, 2, 8),
    "128x128_c2x1": Sm90Config(128, 128, 2, 1, 6),
    "128x128_c1x1": Sm90Config(128, 128, 1, 1, 6),
    "128x192_c2x1": Sm90Config(128, 192, 2, 1, 5),
    "128x192_c1x2": Sm90Config(128, 192, 1, 2, 5),
    "128x256_c2x1": Sm90Config(128, 256, 2, 1, 4),
    "192x96_c1x2": Sm90Config(192, 96, 1, 2, 5),
}
# Instantiated configs outside the tile rule, for experiments (docs/tuning/gemm.md, "sm90 experiment
# configs").
SM90_EXTRA_CONFIGS: dict[str, Sm90Config] = {
    # the 64 x 128 tile with two consumer warpgroups on its 64-column halves: correct, slower than one
    "64x128w2_c2x1": Sm90Config(64, 128, 2, 1, 8, wn=2),
    # C's transposed tile, 72 rows x 128 columns (two consumer warpgroups on the column halves), B
    # shared by 2 x 1 clusters: correct, slower than 64 x 128 at 1000^3
    "72x128t_c2x1": Sm90Config(72, 128, 2, 1, 8, swap=1),
}
# B given as w.T (K-major): only this tile is instantiated for it.
SM90_KMAJOR_CONFIG = Sm90Config(128, 128, 2, 1, 6, trans_b=0)

# A tile's throughput relative to 128 x 256 once the K loop runs: 128 x 192 and 128 x 128 from large
# squares, the one-warpgroup tiles from no-load clock stamps, 192 x 96 set so that it keeps the
# one-wave 1536^2 and loses 2560^2 (docs/tuning/gemm.md, "sm90 tile rule").
SM90_TILE_RATE = {"64x128_c2x1": 0.5, "128x64_c1x2": 0.5, "128x128_c2x1": 0.9, "128x128_c1x1": 0.87,
                  "128x192_c2x1": 0.96, "128x192_c1x2": 0.93, "128x256_c2x1": 1.0, "192x96_c1x2": 0.8}


def wave_time(tiles: int, sms: int, area: int, rate: float) -> float:
    """Waves of ``tiles`` over ``sms`` (rounded up: a persistent CTA's last tile takes as long as a
    full one) x a tile's ``area`` / its ``rate``."""
    return cdiv(tiles, sms) * area / rate


def sm90_tile_time(name: str, M: int, N: int, sms: int = 132) -> float:
    """The wave model's time of an (M, N) output in ``name``'s tiles, in units of a 1 x 1 output
    cell at 128 x 256's rate; K scales every tile alike."""
    cfg = SM90_CONFIGS[name]
    return wave_time(cfg.tiles(M, N), sms, cfg.bm * cfg.bn, SM90_TILE_RATE.get(name, 0.5))


def sm90_config_for(M: int, N: int, K: int, sms: int = 132, names=None) -> str:
    """The config (of ``names``, default all of ``SM90_CONFIGS``) with the least ``sm90_tile_time``,
    ties to the earlier entry: the fastest tile or one within 3.5 % of it at 2304^2-8192^2 and five
    rectangles (docs/tuning/gemm.md, "sm90 tile rule")."""
    best, best_t = None, float("inf")
    for name in SM90_CONFIGS if names is None else names:
        t = sm90_tile_time(name, M, N, sms)
        if t < best_t:
            best, best_t = name, t
    return best


# gemm() sends problems at least this large to gemm_sm90: level with Triton's gemm() at 2048^3, 0-12 %
# ahead above (docs/tuning/gemm.md, "sm90 route rule").
SM90_ROUTE_MIN_MN, SM90_ROUTE_MIN_K = 2048, 1024


def sm90_route_for(M: int, N: int, K: int, sms: int = 132, ldb: int | None = None) -> str | None:
    """The config gemm() sends a plain 16-bit (M, N, K) product with row-major B to gemm_sm90 with,
    or None to keep it on the Triton kernels; ``ldb``: B's row stride in elements (default N). Each
    rule is where gemm_sm90 measured ahead of Triton's gemm() (docs/tuning/gemm.md, "sm90 route
    rule"):

    - long K (at least SM90_SPLIT_K_MIN_BLOCKS blocks of 64) over at most half a wave of 128 x 128
      cluster tiles: that tile, split in K;
    - 64 x 128 tiles filling 90-100 % of a wave when B's rows are not whole 128-byte lines;
    - every problem with M, N >= SM90_ROUTE_MIN_MN and K >= SM90_ROUTE_MIN_K, in sm90_config_for's tile;
    - 192 x 96 tiles filling one wave (1536^2);
    - 128 x 192 tiles in two to three waves (3072^2)."""
    ldb = N if ldb is None else ldb
    c128 = SM90_CONFIGS["128x128_c2x1"]
    if sm90_split_k(c128.cluster_tiles(M, N), sms // c128.cluster, cdiv(K, 64)) > 1:
        return "128x128_c2x1"
    if (2 * ldb) % 128 and 0.9 * sms <= SM90_CONFIGS["64x128_c2x1"].tiles(M, N) <= sms:
        return "64x128_c2x1"
    name = sm90_config_for(M, N, K, sms, [n for n in SM90_CONFIGS if n != "64x128_c2x1"])
    if min(M, N) >= SM90_ROUTE_MIN_MN and K >= SM90_ROUTE_MIN_K:
        return name
    tiles = SM90_CONFIGS[name].tiles(M, N)
    if name == "192x96_c1x2" and 0.9 * sms <= tiles <= sms:
        return name
    if name.startswith("128x192") and 2 * sms < tiles <= 3 * sms:
        return name
    return None


# A partial's round trip (written by one unit, read back by the last) in K blocks of the tile's own
# MMA time: about 2 whatever the tile (L2 bandwidth an SM against its MMA rate).
SM90_PARTIAL_BLOCKS = 2.0


def sm90_tail_splits(cluster_tiles: int, clusters: int, kt: int, swap: bool = False) -> int:
    """How many K ranges the stream-K tail cuts each tile of the last, partial wave into (1: no
    tail split). When the last wave holds r < clusters / 2 tiles, the others idle through a whole
    tile's time; cut in s ranges the tail takes about kt / s + (s + 1) x SM90_PARTIAL_BLOCKS blocks:
    s near sqrt(kt / 2), at most clusters / r units a tile, taken when it saves a fifth of the tail
    (docs/tuning/gemm.md, "sm90 stream-K tail")."""
    if swap or cluster_tiles < clusters or clusters < 2:
        return 1
    r = cluster_tiles % clusters
    if r == 0:
        return 1
    s = min(clusters // r, kt, max(1, round(math.sqrt(kt / SM90_PARTIAL_BLOCKS))))
    if s < 2 or kt / s + (s + 1) * SM90_PARTIAL_BLOCKS >= 0.8 * kt:
        return 1
    return s


# Split-K pays only for long K: a partial's round trip and the counters' fill cost 3-5 us a call
# against ~0.3-0.4 us a K block (docs/tuning/gemm.md, "sm90 split-K").
SM90_SPLIT_K_MIN_BLOCKS = 128


def sm90_split_k(cluster_tiles: int, clusters: int, kt: int) -> int:
    """How many K ranges each tile is cut into when ``cluster_tiles`` tiles of ``kt`` K blocks
    fill at most half a wave of ``clusters`` (1: none): as many as the resident clusters take, at
    least 32 K blocks a range, for kt >= SM90_SPLIT_K_MIN_BLOCKS (docs/tuning/gemm.md, "sm90 split-K")."""
    if kt < SM90_SPLIT_K_MIN_BLOCKS or 2 * cluster_tiles > clusters:
        return 1
    return max(1, min(clusters // cluster_tiles, kt // 32))


# gemm_tf32: BM (C rows a tile; the tile is BM x 128) -> ring stages (4 x 48 KiB, 5 x 40, 6 x 32,
# 8 x 24 in 227 KiB).
TF32_CONFIGS = {256: 4, 192: 5, 128: 6, 64: 8}
TF32_PAIRS = (256, 192, 128)  # BMs with a CTA-pair kernel (pairs along N share A's blocks)
# A tile's rate relative to BM = 256, fitted so that the wave model picks the best BM measured over
# a 15-shape sweep (docs/tuning/gemm.md, "tf32 tile rule").
TF32_RATE = {256: 1.0, 192: 0.95, 128: 0.85, 64: 0.6}
# CTA pairs are ahead where both sides of C are large, behind below (docs/tuning/gemm.md, "tf32 CTA
# pairs").
TF32_PAIRS_FROM = 2560


def tf32_bm_for(M: int, N: int, sms: int = 132) -> int:
    """BM for an (M, N) output: the fewest waves of BM x 128 tiles times the tile's rows over its
    rate; ties to the larger tile."""
    def t(bm):
        return wave_time(cdiv(M, bm) * cdiv(N, 128), sms, bm, TF32_RATE[bm])
    return min(TF32_CONFIGS, key=lambda bm: (t(bm), -bm))


def tf32_cluster_for(M: int, N: int, bm: int) -> int:
    """2 (CTA pairs sharing A's blocks) where both sides of C are at least TF32_PAIRS_FROM and BM
    has a pair kernel, else 1."""
    return 2 if bm in TF32_PAIRS and min(M, N) >= TF32_PAIRS_FROM else 1


def sm90_takes(a: Operand, b: Operand) -> bool:
    """gemm_sm90's operands: one 16-bit dtype, inner dimensions equal, nothing empty, N a multiple
    of 8 (C is written in 16-byte chunks), A with unit-stride rows, B with unit-stride rows or
    columns (TMA's alignment)."""
    M, K = a.shape
    N = b.shape[1]
    return (a.dtype in SM90_CTYPES and b.dtype == a.dtype and K == b.shape[0] and min(M, K, N) >= 1
            and N % 8 == 0 and a.rows_ok(1) and (b.rows_ok(1) or b.rows_ok(0)))


def sm90_out_rows_ok(out: Operand, N: int) -> bool:
    """gemm_sm90's epilogue writes 16-byte chunks: unit-stride rows, a row stride that is a multiple
    of 8, 16-byte alignment."""
    return out.strides[1] == 1 and out.strides[0] % 8 == 0 and out.aligned and out.strides[0] >= N


def tf32_takes(a: Operand, b: Operand) -> bool:
    """gemm_tf32's operands: fp32 A and B with unit-stride rows (TMA's alignment), inner
    dimensions equal, nothing empty."""
    M, K = a.shape
    N = b.shape[1]
    return (a.dtype == torch.float32 and b.dtype == torch.float32 and K == b.shape[0] and min(M, K, N) >= 1
            and a.rows_ok(1) and b.rows_ok(1))


def tf32_out_rows_ok(out: Operand, N: int) -> bool:
    return out.strides[1] == 1 and out.strides[0] >= max(N, 1)


# --------------------------------------------------------------------------- gemm()'s route


@dataclass(frozen=True)
class Operand:
    """A 2-D tensor's layout as the routes see it."""

    shape: tuple[int, int]
    strides: tuple[int, int]
    dtype: torch.dtype
    aligned: bool  # base address a multiple of 16 bytes
    contiguous: bool

    @classmethod
    def of(cls, t: torch.Tensor) -> Operand:
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, t.data_ptr() % 16 == 0, t.is_contiguous())

    def tma_ok(self, unit_dim: int) -> bool:
        """TMA's layout: unit stride along ``unit_dim``, the other stride and the base 16-byte aligned."""
        other = 1 - unit_dim
        return (self.strides[unit_dim] == 1 and (self.strides[other] * self.dtype.itemsize) % 16 == 0
                and self.aligned and self.shape[other] >= 1)

    def rows_ok(self, unit_dim: int) -> bool:
        """gemm_sm90's layout: TMA's, with lines that do not overlap."""
        other = 1 - unit_dim
        return (self.strides[unit_dim] == 1 and (self.strides[other] * self.dtype.itemsize) % 16 == 0
                and self.aligned and self.strides[other] >= self.shape[unit_dim])

    def vector_ok(self) -> bool:
        """Unit stride along either dimension with 16-byte alignment: 16-byte vector loads."""
        return self.tma_ok(1) or self.tma_ok(0)


def tma_loads_ok(a: Operand, b: Operand) -> bool:
    """A K-contiguous, B N- or K-contiguous, 16-byte aligned: both load through TMA descriptors."""
    return a.tma_ok(1) and (b.tma_ok(1) or b.tma_ok(0))


def tma_applies(a: Operand, b: Operand, out_dtype: torch.dtype | None, out: Operand | None) -> bool:
    """Whether v3_tma_persistent takes these operands: TMA loads, and an output with 16-byte rows
    (``out`` if given, else a contiguous (M, N) of out_dtype)."""
    if out is not None:
        return tma_loads_ok(a, b) and out.tma_ok(1)
    ot = (out_dtype or default_out_dtype(a.dtype)).itemsize
    return tma_loads_ok(a, b) and (b.shape[1] * ot) % 16 == 0


def pad_plan(a: Operand, b: Operand, out: Operand | None, out_dtype: torch.dtype | None):
    """Which of (a, b, out) the padded route copies into buffers with 16-byte rows, or None where
    it cannot help (non-unit strides of the operands are left to v1_tiled)."""
    K = a.shape[1]
    a_ok = a.tma_ok(1)
    b_kmajor = b.strides[0] == 1 and b.strides[1] != 1
    b_ok = b.tma_ok(0 if b_kmajor else 1)
    if not (a.strides[1] == 1 or a_ok) or not (b.strides[1] == 1 or b.strides[0] == 1):
        return None
    pad_k = K % (16 // a.dtype.itemsize) != 0
    od = out.dtype if out is not None else (out_dtype or default_out_dtype(a.dtype))
    out_ok = out.tma_ok(1) if out is not None else (b.shape[1] * od.itemsize) % 16 == 0
    return (not a_ok or pad_k, not b_ok or pad_k, not out_ok)


@dataclass(frozen=True)
class Target:
    """The device a call runs on, as the routes see it: its SM count, whether the sm_90a CUDA C
    kernels run there (compute capability 9.0 and cuda-bindings), and whether the Triton kernels
    are the interpreter's (CPU tests: Triton paths only)."""

    sms: int
    sm90: bool
    interpret: bool


H200 = Target(sms=132, sm90=True, interpret=False)


@dataclass(frozen=True)
class Problem:
    """Everything gemm()'s route depends on, without the tensors: the operands' layouts (None for
    an argument that is not a 2-D tensor: the checks will say what is wrong), the epilogue, and
    facts of the call (a and b on one CUDA device, out on it, out sharing bytes with a or b) and
    the device's (``target``; the default, an H200, is for descriptions written by hand)."""

    a: Operand | None
    b: Operand | None
    out: Operand | None = None
    out_given: bool = False
    aux: Operand | None = None
    aux_given: bool = False
    out_dtype: torch.dtype | None = None
    bias: bool = False
    activation: str | None = None
    scales: bool = False
    precision: str = "tf32"
    cuda: bool = True
    out_on_device: bool = True
    out_meets_a: bool = False
    out_meets_b: bool = False
    target: Target = H200


@dataclass(frozen=True)
class Route:
    """gemm()'s path for a call: kind is "tf32_sm90" (gemm_tf32, B as given), "splitk"
    (gemm_splitk), "small" (the persistent kernel, SMALL_TILE), "sm90" (gemm_sm90 in ``config``),
    "padded" (copies with 16-byte rows, ``pad`` says which, then gemm() again), "tma_64x128" (the
    TMA kernel, TMA_64x128), "tma_split" (v3_tma_split), "tma" (v3_tma_persistent, autotuned) or
    "v1" (v1_tiled, autotuned); transpose_b: B is copied K-major first."""

    kind: str
    transpose_b: bool = False
    config: str | None = None
    pad: tuple[bool, bool, bool] | None = None


def route(p: Problem) -> Route:
    """gemm()'s route for a call without a named variant. The rules, in order (each one's
    measurements: docs/tuning/gemm.md, the section named):
    "tf32 row-major B: gemm_tf32 route", "tf32 row-major B: transposing copy", split-K
    (``split_k_for``), "Small problems: fixed 64 x 64 tile", "sm90 route rule", "Unaligned rows:
    padded route", "Large 16-bit squares: v1_tiled (V1_FROM_MN)", "TMA tile choice (TMA_TILES,
    tma_tile_for)"."""
    if p.a is None or p.b is None or (p.out_given and p.out is None):
        return Route("v1")  # the checked path names what is wrong
    if _tf32_sm90(p):
        return Route("tf32_sm90")
    if _wants_kmajor(p):
        b = p.b
        copy = Operand(b.shape, (1, b.shape[0]), b.dtype, aligned=True, contiguous=False)
        return dataclasses.replace(_route(dataclasses.replace(p, b=copy, out_meets_b=False)), transpose_b=True)
    return _route(p)


def _tf32_sm90(p: Problem) -> bool:
    # fp32 with a row-major B and no epilogue: gemm_tf32 takes B as given, ahead of the transposing
    # copy + Triton at every shape measured; not where split_k_for splits K.
    a, b, out = p.a, p.b, p.out
    M, K = a.shape
    N = b.shape[1]
    if (p.target.interpret or p.bias or p.activation is not None or p.aux_given or p.scales or p.precision != "tf32"
            or p.out_dtype not in (None, torch.float32)):
        return False
    if not (p.cuda and p.target.sm90 and tf32_takes(a, b)):
        return False
    if out is not None and not (out.shape == (M, N) and out.dtype == torch.float32 and p.out_on_device
                                and tf32_out_rows_ok(out, N) and not (p.out_meets_a or p.out_meets_b)):
        return False
    return split_k_for(M, N, K) == 1


def _wants_kmajor(p: Problem) -> bool:
    # tf32 takes operands K-major only: a row-major fp32 B is transposed first, from TF32_KMAJOR_FROM
    # elements.
    a, b = p.a, p.b
    return (not p.target.interpret and a.dtype == torch.float32 and b.dtype == torch.float32
            and p.precision == "tf32" and not p.scales and p.cuda and a.shape[1] == b.shape[0] and b.contiguous
            and b.shape[0] * b.shape[1] >= TF32_KMAJOR_FROM and min(b.shape) > 1
            and not (p.out is not None and p.out_meets_b))


def _route(p: Problem) -> Route:
    a, b, out, t = p.a, p.b, p.out, p.target
    M, K = a.shape
    N = b.shape[1]
    plain = not p.aux_given and not p.scales
    # outputs too small to fill the GPU with a long K: K in slices
    if plain and a.dtype != FP8 and split_k_for(M, N, K) > 1:
        return Route("splitk")
    if _small(p):
        return Route("small")
    if plain and not t.interpret:
        config = _sm90_config(p)
        if config is not None:
            return Route("sm90", config=config)
    ok = (a.dtype in IN_DTYPES and tma_applies(a, b, p.out_dtype, out)
          and (not p.aux_given or (p.aux is not None and p.aux.tma_ok(1))))
    if not ok:
        pad = _padding(p)
        if pad is not None:
            return Route("padded", pad=pad)
    two_byte = a.dtype in TWO_BYTE
    if not ok or (two_byte and M * N >= V1_FROM_MN):
        return Route("v1")
    od = out.dtype if out is not None else (p.out_dtype or a.dtype)
    if two_byte and od.itemsize == 2:
        tile = tma_tile_for(M, N, t.sms)
        if tile == "128x192":
            return Route("tma_split")
        if tile == "64x128":
            return Route("tma_64x128")
    return Route("tma")


def _small(p: Problem) -> bool:
    a, b, out = p.a, p.b, p.out
    M, K = a.shape
    N = b.shape[1]
    return (not p.target.interpret and p.cuda and a.dtype in TWO_BYTE and b.dtype == a.dtype and not p.scales
            and not p.aux_given and K == b.shape[0] and M != 0 and N != 0 and K != 0
            and cdiv(M, 128) * cdiv(N, 128) <= SMALL_MAX_TILES
            and a.vector_ok() and b.vector_ok() and (out is None or out.vector_ok()))


def _sm90_config(p: Problem) -> str | None:
    # plain 16-bit products with row-major B (the rule was measured on it; w.T stays on Triton)
    a, b, out = p.a, p.b, p.out
    M, K = a.shape
    N = b.shape[1]
    if p.bias or p.activation not in (None, "none") or (p.out_dtype is not None and p.out_dtype != a.dtype):
        return None
    if not (p.cuda and p.target.sm90 and sm90_takes(a, b) and b.rows_ok(1)):
        return None
    if out is not None and not (out.shape == (M, N) and out.dtype == a.dtype and p.out_on_device
                                and sm90_out_rows_ok(out, N)):
        return None
    return sm90_route_for(M, N, K, p.target.sms, b.strides[0])


def _padding(p: Problem):
    a, b, out = p.a, p.b, p.out
    M, K = a.shape
    N = b.shape[1]
    if p.target.interpret or p.aux_given or not p.cuda or a.dtype not in IN_DTYPES or b.dtype != a.dtype:
        return None
    if K != b.shape[0] or min(M, N, K) == 0 or (out is not None and out.shape != (M, N)):
        return None
    pad = pad_plan(a, b, out, p.out_dtype)
    if pad is None or not any(pad):
        return None
    od = out.dtype if out is not None else (p.out_dtype or default_out_dtype(a.dtype))
    return pad if padded_time_ratio(M, N, K, a.dtype.itemsize, od.itemsize, pad) <= PAD_PAYS else None
