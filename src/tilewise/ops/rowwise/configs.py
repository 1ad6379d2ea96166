"""Row-wise ops' tuning tables and the rules that pick a version and its launch, shared by softmax
and cross-entropy: the Triton kernels' launch shapes, the cluster kernels' configurations
(``cluster.cu``), and ``Policy``, the per-call choice of what ``variant=None`` prefers for rows past
one CTA's registers and what the long-row versions run with.

Every table is read-only; nothing here is module state a call can change. The numbers behind each
value are in docs/tuning/rowwise.md, under the section named in the comment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

import torch

from ...runtime import cuda as rt

# --------------------------------------------------------------------------- linear_cross_entropy's chunk

# Rows of logits a chunk: as many as the op's memory beyond its inputs allows (dx, dW, db and one chunk:
# issue 31's 1.5 GiB at N 16384, H 4096, V 128256), in 1,024-row steps up to 4,096 (8,192 measured no
# faster), never under 256 MiB of logits (the old fixed chunk). docs/tuning/rowwise.md, "Chunk size sweep".
LCE_EXTRA_BYTES = 3 << 29
LCE_MIN_CHUNK_BYTES = 256 << 20
LCE_ROW_STEP, LCE_MAX_ROWS = 1024, 4096


def lce_chunk_rows(N: int, H: int, V: int, itemsize: int, dx: bool = True, dw: bool = True,
                   db: bool = False) -> int:
    """Rows a chunk for N rows of H against a (V, H) head of ``itemsize``-byte elements, with the
    gradients asked for (dx: N x H, dW: V x H, db: V fp32) held beside the chunk."""
    row = max(1, V * itemsize)
    held = (N * H * itemsize if dx else 0) + (V * H * itemsize if dw else 0) + (V * 4 if db else 0)
    least = max(128, (LCE_MIN_CHUNK_BYTES // row) // 128 * 128)
    fits = max(0, LCE_EXTRA_BYTES - held) // row // LCE_ROW_STEP * LCE_ROW_STEP
    return min(max(least, min(LCE_MAX_ROWS, fits)), max(1, N))


# --------------------------------------------------------------------------- Triton kernels

MAX_FUSED = 16384  # longest row v2_fused keeps in registers (32 fp32 values per thread at 16 warps)
CLUSTER_SLICE = 16384  # elements of a row each CTA of a v4_cluster cluster holds
MAX_CLUSTER = 8 * CLUSTER_SLICE  # 131072: 8 CTAs, the portable cluster size
# Launch parameters picked for the H200 (reasoning in research/notes/softmax.md).
FUSED_TILE = 2048          # elements per program for short rows (several rows per program)
ONLINE_CHUNK_BYTES = 32768  # bytes of one row chunk per loop iteration in v3 (16 warps x 32 B/thread)
ONLINE_WARPS = 16
L2_BUDGET = 24 << 20       # bytes of rows in flight that v3's pass 2 should find in L2 (of 60 MiB)
UNFUSED_BLOCK = 1024       # softmax v1's elements a program
SCALE_BLOCK = 4096         # cross-entropy backward's scale: elements a program a step
CAPTURABLE_BLOCK = 1024    # cross-entropy's one-program target check and loss sum


def pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def sms(t: torch.Tensor) -> int:
    """SMs of t's GPU; 4 in the interpreter, so that a few looping programs exercise the persistent loops."""
    return rt.sm_count(t.get_device()) if t.is_cuda else 4


def fused_config(N: int) -> tuple[int, int, int]:
    """(ROWS, BLOCK, num_warps) for a row held whole in registers (softmax's and cross-entropy's
    one-pass kernels)."""
    block = max(16, pow2(N))
    rows = max(1, FUSED_TILE // block)
    tile = rows * block
    # 16 fp32 values a thread up to 4096-element tiles (two 16-byte bf16 loads in flight each),
    # then 16 warps so a 16k row is 32 values a thread (two live tensors in backward: 64 regs).
    warps = 4 if tile <= 1024 else 8 if tile <= 4096 else 16
    return rows, block, warps


def online_config(x: torch.Tensor, row_bytes: int, n_rows: int, streams: int = 1) -> tuple[int, int, int]:
    """(BLOCK, num_warps, programs) for the two-pass kernels. A loop iteration loads
    ONLINE_CHUNK_BYTES over ``streams`` tensors (forward 1: 16384 bf16 elements, 32 a thread;
    backward 2: 8192 a tensor, so the prefetched next chunk fits in registers too); short rows
    take one power-of-two chunk (a 4096-long row is not padded to 16384 lanes). The persistent
    grid keeps at most L2_BUDGET of rows in flight, so that pass 2's re-read hits L2."""
    N = max(1, row_bytes // (streams * x.element_size()))
    block = min(ONLINE_CHUNK_BYTES // (streams * x.element_size()), max(16, pow2(N)))
    warps = max(4, min(ONLINE_WARPS, block // 512))
    n_sms = sms(x)
    if not x.is_cuda:
        block, warps = 16, 4  # keep interpreter tests small while exercising several chunks
    per_sm = max(1, min(4, L2_BUDGET // max(1, n_sms * row_bytes)))
    return block, warps, max(1, min(n_rows, n_sms * per_sm))


def triton_cluster_config(N: int, on_gpu: bool) -> tuple[int, int, int]:
    """(BLOCK, num_warps, num_ctas) for v4_cluster (rows up to MAX_CLUSTER): the row split over a
    cluster of CTAs, each holding CLUSTER_SLICE elements in registers; 8 CTAs is the portable
    cluster limit. The interpreter has no clusters: one CTA of 4 warps."""
    block = max(16, pow2(N))
    if not on_gpu:
        return block, 4, 1
    return block, 16 if block >= 16384 else 8, max(1, block // CLUSTER_SLICE)


def scale_programs(g: torch.Tensor) -> int:
    """Programs of the cross-entropy backward's persistent scale kernel: 4 an SM, at most one a block."""
    n = -(-g.numel() // SCALE_BLOCK)
    if not g.is_cuda:
        return max(1, min(4, n))
    return max(1, min(4 * rt.sm_count(g.get_device()), n))


# --------------------------------------------------------------------------- cluster kernels (cluster.cu)

SHMEM_LIMIT = rt.SM90_SHARED_OPT_IN

# (cl, nt, ch) per kernel kind and item size: CTAs a cluster, threads a CTA, 16-byte chunks a
# thread, smallest capacity first (each instantiated in the .cu). 2-byte types: 256 threads x 8
# chunks, the fastest split of a 131072-element row on the H200 (more resident CTAs an SM, more
# rows in flight) (docs/tuning/rowwise.md, "Cluster configs").
_TWO_BYTE = ((2, 256, 8), (4, 256, 8), (8, 256, 8), (8, 1024, 4))  # the last: rows past 131072
CONFIGS = MappingProxyType({
    ("fwd", 2): _TWO_BYTE, ("bwd", 2): _TWO_BYTE, ("ce", 2): _TWO_BYTE,
    ("fwd", 4): ((2, 512, 8), (4, 512, 8), (8, 512, 8), (8, 1024, 8)),
    ("bwd", 4): ((2, 512, 8), (4, 512, 8), (8, 512, 8)),
    ("ce", 4): ((2, 512, 8), (4, 512, 8), (8, 512, 8), (8, 1024, 8)),
})
# Also built, for research/rowwise_cluster_configs.py: other splits of a 131072-element row.
EXTRA_BF16 = MappingProxyType({"fwd": ((8, 512, 4),), "bwd": ((8, 512, 4),), "ce": ((8, 512, 4),)})
EXTRA_FP32 = MappingProxyType({"fwd": ((8, 1024, 4),), "bwd": ((8, 1024, 4),), "ce": ((8, 1024, 4),)})
# The pipelined kernels (v6) take the same configurations as their v5 kind.
PIPE_KINDS = ("fwd", "ce")
# One exp an element (X1 in the .cu), built for these (kind, itemsize) configs only: the exp unit
# is otherwise a bound (bf16 softmax forward 73.8 % of copy, not 69.7 %) (docs/tuning/rowwise.md,
# "One exp an element").
ONE_EXP_CONFIGS = MappingProxyType({("fwd", 2): ((8, 256, 8),), ("fwd", 4): ((8, 512, 8),),
                                    ("ce", 2): ((8, 256, 8),), ("ce", 4): ((8, 512, 8),)})
# TMA-pipelined kernels (v7): (cl, nt, ch, stages, min blocks an SM for __launch_bounds__), built
# for bf16 (fp16 at the default only): the default and the alternatives it beat. Resident CTAs pay,
# stages ahead do not: 128 threads x 16 chunks, 1 stage, 5 blocks an SM ran at 86.6 % of copy
# (docs/tuning/rowwise.md, "TMA configs"; cross-entropy: "Cross-entropy on the TMA pipeline").
TMA_CONFIGS = MappingProxyType({
    ("fwd", 2): ((8, 256, 8, 2, 3), (8, 256, 8, 1, 4), (8, 256, 8, 2, 4), (8, 512, 4, 1, 3), (8, 512, 4, 2, 3),
                 (8, 128, 16, 1, 5)),
    ("ce", 2): ((8, 128, 16, 1, 5), (8, 256, 8, 1, 4)),
})
TMA_DEFAULT = MappingProxyType({("fwd", 2): (8, 128, 16, 1, 5), ("ce", 2): (8, 128, 16, 1, 5)})


def capacity(dtype: torch.dtype, config: tuple[int, int, int]) -> int:
    """Elements of a row config (cl, nt, ch) holds in registers."""
    cl, nt, ch = config
    return cl * nt * ch * (16 // dtype.itemsize)


def max_row(dtype: torch.dtype, kind: str = "fwd") -> int:
    """Longest row the listed configurations hold (262144 for 2-byte types; fp32 backward 131072)."""
    return capacity(dtype, CONFIGS[(kind, dtype.itemsize)][-1])


def pick(dtype: torch.dtype, N: int, kind: str = "fwd") -> tuple[int, int, int]:
    """The smallest listed configuration that holds a row of N elements."""
    for cfg in CONFIGS[(kind, dtype.itemsize)]:
        if capacity(dtype, cfg) >= N:
            return cfg
    raise ValueError(f"rowwise_cluster: rows of {N} {dtype} elements exceed {max_row(dtype, kind)}")


def pipe_shmem(config: tuple[int, int, int]) -> int:
    """Dynamic shared memory of a pipelined (v6) block: two row slices of 16-byte vectors."""
    cl, nt, ch = config
    return 2 * ch * nt * 16


def pipe_configs(kind: str, itemsize: int) -> tuple:
    """The configs the pipelined (v6) kernel of ``kind`` is built for: CONFIGS' whose two row slices
    fit a block's shared memory (fp32 (8, 1024, 8) needs 256 KiB: not built)."""
    return tuple(c for c in CONFIGS[(kind, itemsize)] if pipe_shmem(c) <= SHMEM_LIMIT)


def tma_shmem(config: tuple[int, ...]) -> int:
    """Dynamic shared memory of a TMA-pipelined (v7) block: ``stages`` row slices."""
    cl, nt, ch, st = config[:4]
    return st * ch * nt * 16


def one_exp_default(kind: str, dtype: torch.dtype, config: tuple[int, int, int], pipe: bool) -> bool:
    """Whether the cluster kernel runs its one-exp build by default: wherever it is built (not
    fp16, not pipelined)."""
    return not pipe and dtype != torch.float16 and config in ONE_EXP_CONFIGS.get((kind, dtype.itemsize), ())


# --------------------------------------------------------------------------- the per-call policy


@dataclass(frozen=True)
class Policy:
    """What ``variant=None`` prefers for rows past MAX_FUSED, and what the long-row versions run
    with. Passed per call (``softmax(x, policy=...)``, ``cross_entropy(..., policy=...)``; None is
    DEFAULT_POLICY, the measured defaults below); frozen, so no choice outlives its call."""

    # v4_cluster (Triton multi-CTA) as the default up to MAX_CLUSTER: off, Triton 3.6 cannot build
    # it (docs/tuning/rowwise.md, "Triton multi-CTA v4_cluster").
    triton_cluster: bool = False
    # v7 / v5 (CUDA C clusters, one read) past MAX_FUSED where the layout allows 16-byte vectors on
    # sm_90+: 86.6 / 73 % of copy against v3_online's 66 % (docs/tuning/rowwise.md, "TMA configs").
    cuda_cluster: bool = True
    # v3_online's pass 2 walks the row backwards: off in the forward (x in flight fits L2), on in
    # the backward (y and dy do not) (docs/tuning/rowwise.md, "Online pass 2 direction").
    fwd_reverse: bool = False
    bwd_reverse: bool = True
    # v7's (cl, nt, ch, stages, min blocks an SM) for the softmax forward and cross-entropy: one of
    # TMA_CONFIGS (docs/tuning/rowwise.md, "TMA configs").
    tma_fwd: tuple[int, int, int, int, int] = TMA_DEFAULT[("fwd", 2)]
    tma_ce: tuple[int, int, int, int, int] = TMA_DEFAULT[("ce", 2)]

    def __post_init__(self):
        for name, kind in (("tma_fwd", "fwd"), ("tma_ce", "ce")):
            cfg = tuple(getattr(self, name))
            if cfg not in TMA_CONFIGS[(kind, 2)]:
                raise ValueError(f"Policy: {name}={cfg} is not built; choose from {TMA_CONFIGS[(kind, 2)]}")
            object.__setattr__(self, name, cfg)

    def pack(self) -> list[int]:
        """The policy as a list of ints, what a custom op's schema can carry (``unpack`` reverses it)."""
        return [int(self.triton_cluster), int(self.cuda_cluster), int(self.fwd_reverse), int(self.bwd_reverse),
                *self.tma_fwd, *self.tma_ce]

    @staticmethod
    def unpack(values) -> Policy:
        """The policy ``pack`` gave (an empty list: DEFAULT_POLICY)."""
        if not values:
            return DEFAULT_POLICY
        v = [int(a) for a in values]
        flags = [bool(a) for a in v[:4]]
        return Policy(*flags, tma_fwd=tuple(v[4:9]), tma_ce=tuple(v[9:14]))

    def replace(self, **changes) -> Policy:
        """A copy with ``changes`` (``DEFAULT_POLICY.replace(bwd_reverse=False)``)."""
        return dataclasses.replace(self, **changes)


DEFAULT_POLICY = Policy()


def default_variant(N: int, policy: Policy, cuda_cluster_ok: Callable[[], bool],
                    tma_ok: Callable[[], bool]) -> str:
    """The version ``variant=None`` runs on rows of N elements (softmax and cross-entropy alike):
      * N <= MAX_FUSED: v2_fused, the row in registers (one read, one write);
      * ``policy.triton_cluster`` and N <= MAX_CLUSTER: v4_cluster;
      * ``policy.cuda_cluster`` and ``cuda_cluster_ok()`` (the CUDA C cluster kernels take the
        caller's tensors): v7_cluster_tma where ``tma_ok()``, else v5_cluster_cuda;
      * else v3_online (any row length, two passes).
    The two callables are asked only when the rule reaches them."""
    if N <= MAX_FUSED:
        return "v2_fused"
    if policy.triton_cluster and N <= MAX_CLUSTER:
        return "v4_cluster"
    if policy.cuda_cluster and cuda_cluster_ok():
        return "v7_cluster_tma" if tma_ok() else "v5_cluster_cuda"
    return "v3_online"
