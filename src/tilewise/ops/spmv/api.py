"""spmv: ``y = alpha * A @ x + beta * y`` for a sparse fp32 matrix A (M x N, int32 indices).

Formats (small classes holding device tensors, built on the GPU with torch ops):
    CSR: row_ptr (M + 1), col (nnz), val (nnz); columns sorted within each row (duplicates are
         summed). From a torch sparse CSR tensor, a SciPy CSR matrix (SciPy optional), or dense.
    ELL: (K, M) column-major col/val, K = longest row, padding col = -1: a warp's loads coalesce;
         costs K * M slots, refused past ``max_fill`` times nnz.
    JDS: rows sorted by length (perm), stored as jagged diagonals (jd_ptr): coalesced like ELL
         with no padding, y written through perm.
    Panels: rows cut into panels of R rows, each panel's nonzeros in column order as 32-entry
         chunks of (16-bit column in a 65536-column block, 16-bit row in the panel) keys and values:
         8 bytes a nonzero like CSR, but x is walked in order, so the gathers of neighbouring
         nonzeros share sectors instead of costing one 32-byte L2 sector each.

Kernels (``spmv.cu``), each bound by the bytes it must read: val + col (8 B per nonzero), row_ptr,
x (once if it stays in cache, up to once per nonzero if not) and y:
    csr_scalar:  a thread per row (the lecture's kernel): uncoalesced once rows pass a few entries.
    csr_vector:  SUB = 2..32 lanes per row (SUB ~ mean row length / 4), shuffle reduction;
                 wastes lanes on rows shorter than SUB, starves the GPU when a few rows hold most
                 of the nonzeros.
    csr_split:   load-balanced CSR by row splitting: csr_vector over the rows of at most
                 ``long_len`` nonzeros, then one warp per 512-nonzero chunk of the longer rows,
                 added with atomicAdd (the chunk plan is built once per matrix and cached).
    csr_merge:   load-balanced CSR by merge path: the rows' ends and the nonzeros form one path of
                 M + nnz items, cut into equal tiles of NT x IPT items (NT threads x IPT items each)
                 whatever the row lengths; start points found once per matrix by a binary search on
                 row_ptr (``merge_plan``, cached); products and row ends staged in shared memory
                 with coalesced loads; rows that straddle tiles fixed up by a second, tiny kernel
                 over the tiles' carry-outs (no atomics: the same sum order on every run).
    csr_stream:  for short rows: a block per ~1024 nonzeros (or 256 rows) computes its products into
                 shared memory with coalesced loads, then a thread per row sums them there
                 (CSR-stream; the block plan is built once per matrix and cached).
    ell, jds:    a thread per row over the formats above.
    panels:      the Panels format (below): a cluster of CTAs per panel of rows, nonzeros in column
                 order, y of the panel accumulated in shared memory; for randomly spread columns.

``spmv(A, x)`` picks from the row-length statistics kept with the CSR (see ``choose``; the measured
table behind each threshold: docs/tuning/spmv.md, "choose rules"); for a CSR it may build an
ELL, JDS or Panels copy once and keep it with the matrix.

This module holds the public ``spmv``, its checks and the launchers; ``formats`` the containers,
their builders and the per-matrix plans; ``configs`` the tables and the rules that pick a kernel;
``kernels`` the loading of ``spmv.cu``.
"""

from __future__ import annotations

import numbers

import torch

from ...cost import Cost
from .._checks import runs_reference
from .configs import JDS_CONFIGS, JDS_DEFAULT, MERGE_CONFIGS, MERGE_DEFAULT, PANEL_CONFIGS, PANEL_DEFAULT, SUBS, \
    choose, split_len, sub_width
from .formats import CSR, ELL, INT32_MAX, JDS, Panels, RowStats, _need, as_csr, converted, merge_plan, stream_plan
from .kernels import THREADS, blocks, kernel, panel_kernel

__all__ = ["CSR", "ELL", "JDS", "Panels", "RowStats", "VARIANTS", "FORMAT_OF", "spmv", "reference", "cost",
           "csr_scalar", "csr_vector", "csr_split", "csr_merge", "csr_stream", "ell", "jds", "panels"]


# --------------------------------------------------------------------------- reference + cost


def reference(row_ptr, col, val, x, y=None, alpha: float = 1.0, beta: float = 0.0):
    """Dense-free PyTorch reference in float64: reads each nonzero, x per nonzero and y once."""
    M = row_ptr.numel() - 1
    rows = torch.repeat_interleave(torch.arange(M, device=row_ptr.device), (row_ptr[1:] - row_ptr[:-1]).long())
    prod = val.double() * x.double()[col.long()]
    out = torch.zeros(M, dtype=torch.float64, device=row_ptr.device).index_add_(0, rows, prod)
    out = alpha * out
    if beta != 0.0:
        out = out + beta * y.double()
    return out


def cost(M: int, N: int, nnz: int, beta: float = 0.0) -> Cost:
    """The fewest bytes: val + col (4 + 4 per nonzero), row_ptr (M + 1), x once, y written once
    (and read once when beta != 0); 2 FLOPs per nonzero. The same floor for every format."""
    b = 8 * nnz + 4 * (M + 1) + 4 * N + 4 * M + (4 * M if beta != 0.0 else 0)
    return Cost(flops=2 * nnz, bytes=b)




# --------------------------------------------------------------------------- checks and launchers


def _check(A, x, y, beta, cpu=False):
    """x and y checked against A (ValueError naming the argument at fault). Returns (y, M): y, a new
    one when None, and A's row count, which every launcher sizes its grid by."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"spmv: 'x' must be a torch.Tensor, got {type(x).__name__}")
    M, N = A.shape
    dev = A.val.device
    if x.device != dev:
        raise ValueError(f"spmv: 'x' is on {x.device} but the matrix 'A' is on {dev}; put both on one device")
    if dev.type != "cuda" and not (cpu and dev.type == "cpu"):
        raise ValueError(f"spmv: 'A' (the matrix) is on {dev}; tilewise kernels need it on CUDA (tilewise.spmv "
                         f"runs a CSR on the CPU through the reference)")
    if x.dtype != torch.float32:
        raise ValueError(f"spmv: 'x' has dtype {x.dtype}; expected float32")
    if tuple(x.shape) != (N,):
        raise ValueError(f"spmv: 'x' has shape {tuple(x.shape)}; the matrix 'A' is {M} x {N}, so x must be ({N},)")
    if y is None:
        if beta != 0.0:
            raise ValueError(f"spmv: 'beta' = {beta} needs a 'y' to read (beta != 0)")
        return torch.empty(M, dtype=torch.float32, device=dev), M
    if not isinstance(y, torch.Tensor):
        raise ValueError(f"spmv: 'y' must be a torch.Tensor, got {type(y).__name__}")
    if y.device != dev or y.dtype != torch.float32 or tuple(y.shape) != (M,):
        raise ValueError(
            f"spmv: 'y' must be float32 of shape ({M},) on {dev}; got {y.dtype} {tuple(y.shape)} on {y.device}")
    return y, M


def csr_scalar(A: CSR, x, y=None, alpha: float = 1.0, beta: float = 0.0):
    _need(A, CSR, "csr_scalar")
    y, M = _check(A, x, y, beta)
    if M:
        kernel("spmv_csr_scalar", x.get_device())(blocks(M), THREADS, A.row_ptr, A.col, A.val, x, y, M, alpha, beta)
    return y


def csr_vector(A: CSR, x, y=None, alpha: float = 1.0, beta: float = 0.0, sub: int | None = None,
               long_len: int = INT32_MAX):
    _need(A, CSR, "csr_vector")
    y, M = _check(A, x, y, beta)
    sub = sub_width(A.stats.mean) if sub is None else sub
    if sub not in SUBS:
        raise ValueError(f"spmv.csr_vector: sub must be one of {SUBS}, got {sub}")
    if M:
        kernel(f"spmv_csr_vector<{sub}>", x.get_device())(blocks(M * sub), THREADS, A.row_ptr, A.col, A.val,
                                                          x, y, M, alpha, beta, long_len)
    return y


def csr_split(A: CSR, x, y=None, alpha: float = 1.0, beta: float = 0.0, long_len: int | None = None):
    """Row splitting: csr_vector on rows of at most ``long_len`` nonzeros (default
    ``split_len(A.stats.mean)``; SUB from their mean), then one warp per 512-nonzero chunk of the
    longer rows (atomicAdd into y)."""
    _need(A, CSR, "csr_split")
    y, M = _check(A, x, y, beta)
    if not M:
        return y
    if long_len is None:
        long_len = split_len(A.stats.mean)
    chunk_row, chunk_start = A.split_plan(long_len)
    n_chunks = chunk_row.numel()
    key = ("short_mean", long_len)
    short_mean = A._plans.get(key)
    if short_mean is None:
        lengths = A.row_lengths()
        short = lengths[lengths <= long_len]
        short_mean = A._plans[key] = float(short.double().mean()) if short.numel() else 0.0
    sub = sub_width(short_mean)
    dev = x.get_device()
    kernel(f"spmv_csr_vector<{sub}>", dev)(blocks(M * sub), THREADS, A.row_ptr, A.col, A.val, x, y, M,
                                           alpha, beta, long_len)
    if n_chunks:
        kernel("spmv_csr_chunks", dev)(blocks(32 * n_chunks), THREADS, A.row_ptr, A.col, A.val, x, y,
                                       chunk_row, chunk_start, n_chunks, alpha)
    return y


def csr_merge(A: CSR, x, y=None, alpha: float = 1.0, beta: float = 0.0, nt: int | None = None,
              ipt: int | None = None):
    """Merge-path CSR: every block takes nt x ipt items of the merged (row ends, nonzeros) path
    (default ``MERGE_DEFAULT``; (nt, ipt) one of ``MERGE_CONFIGS``), so a 100k-nonzero row is
    spread over many blocks and a run of empty rows costs one item each. Two launches: the tiles,
    then (when a row straddles tiles) the fix-up of their carry-outs. The plan is cached with A."""
    _need(A, CSR, "csr_merge")
    nt = MERGE_DEFAULT[0] if nt is None else nt
    ipt = MERGE_DEFAULT[1] if ipt is None else ipt
    if (nt, ipt) not in MERGE_CONFIGS:
        raise ValueError(f"spmv.csr_merge: (nt, ipt) must be one of {MERGE_CONFIGS}, got {(nt, ipt)}")
    y, M = _check(A, x, y, beta)
    if not M:
        return y
    P = merge_plan(A, nt * ipt)
    dev = x.get_device()
    # A fresh carry buffer per call: a shared one would race between calls on different streams.
    carry = torch.empty(P.n_tiles, dtype=torch.float32, device=y.device)
    kernel(f"spmv_csr_merge<{nt},{ipt}>", dev)(P.n_tiles, nt, A.row_ptr, A.col, A.val, x, y, P.plan_row,
                                                 P.plan_nz, carry, alpha, beta)
    if P.n_seg:
        kernel("spmv_csr_merge_fixup", dev)(blocks(32 * P.n_seg), THREADS, carry, P.seg_row, P.seg_b0,
                                            P.seg_b1, y, P.n_seg, alpha)
    return y


def csr_stream(A: CSR, x, y=None, alpha: float = 1.0, beta: float = 0.0):
    _need(A, CSR, "csr_stream")
    y, M = _check(A, x, y, beta)
    if M:
        plan = stream_plan(A)
        kernel("spmv_csr_stream", x.get_device())(plan.numel() - 1, THREADS, A.row_ptr, A.col, A.val, x, y,
                                                  plan, alpha, beta)
    return y


def ell(A: ELL, x, y=None, alpha: float = 1.0, beta: float = 0.0):
    _need(A, ELL, "ell")
    y, M = _check(A, x, y, beta)
    if M:
        kernel("spmv_ell", x.get_device())(blocks(M), THREADS, A.col, A.val, x, y, M, A.width, alpha, beta)
    return y


def jds(A: JDS, x, y=None, alpha: float = 1.0, beta: float = 0.0, *, config: tuple[int, int] | None = None):
    """``config``: (threads a block, rows a thread), one of JDS_CONFIGS (default JDS_DEFAULT)."""
    _need(A, JDS, "jds")
    cfg = JDS_DEFAULT if config is None else tuple(config)
    if cfg not in JDS_CONFIGS:
        raise ValueError(f"jds: config {config!r} is not built; choose from {JDS_CONFIGS}")
    y, M = _check(A, x, y, beta)
    if M:
        nt, r = cfg
        kernel(f"spmv_jds<{nt},{r}>", x.get_device())(-(-M // (nt * r)), nt, A.perm, A.len_sorted, A.jd_ptr,
                                                    A.col, A.val, x, y, M, alpha, beta)
    return y


def panels(A: Panels, x, y=None, alpha: float = 1.0, beta: float = 0.0, *, config: tuple[int, int, int] | None = None):
    """``config``: (threads a block, CTAs a cluster, chunks a warp loads at once), one of
    PANEL_CONFIGS whose cluster size is ``A.cluster`` (default PANEL_DEFAULT[A.cluster]).
    A panel's rounds are added in a fixed order; its tail (``Panels``) with shared-memory atomics in
    no fixed order, so where a panel has a tail the last bits of y may differ between runs."""
    _need(A, Panels, "panels")
    cfg = PANEL_DEFAULT[A.cluster] if config is None else tuple(config)
    if cfg not in PANEL_CONFIGS or cfg[1] != A.cluster:
        ok = [c for c in PANEL_CONFIGS if c[1] == A.cluster]
        raise ValueError(f"panels: config {config!r} is not built for clusters of {A.cluster}; choose from {ok}")
    y, M = _check(A, x, y, beta)
    if M:
        nt, cl, u = cfg
        k = panel_kernel(f"spmv_panels<{nt},{cl},{u},{A.round_chunks}>", x.get_device())
        k(A.panels * cl, nt, A.key, A.val, A.chunk_col0, A.panel_chunk, A.panel_tail, x, y, M, A.rows, alpha, beta,
          shmem=min(A.rows, M) * 4)
    return y


VARIANTS = {"csr_scalar": csr_scalar, "csr_vector": csr_vector, "csr_split": csr_split, "csr_merge": csr_merge,
            "csr_stream": csr_stream, "ell": ell, "jds": jds, "panels": panels}
FORMAT_OF = {"csr_scalar": CSR, "csr_vector": CSR, "csr_split": CSR, "csr_merge": CSR, "csr_stream": CSR,
             "ell": ELL, "jds": JDS, "panels": Panels}


def _cpu_spmv(A, x, y, alpha, beta):
    """The one CPU rule: a CSR on the CPU through the float64 reference (the other formats are GPU
    layouts: built from a CSR on the GPU, or pass the CSR itself)."""
    if not isinstance(A, CSR) or A.device.type != "cpu":
        raise ValueError(f"spmv: 'x' is on cpu but 'A' is a {type(A).__name__} on {getattr(A, 'device', '?')}; "
                         f"on CPU tensors spmv takes a CSR on the CPU (the PyTorch reference)")
    for name, s in (("alpha", alpha), ("beta", beta)):
        if not isinstance(s, numbers.Real) or isinstance(s, bool):
            raise ValueError(f"spmv: '{name}' must be a number, got {s!r}")
    out, _ = _check(A, x, y, beta, cpu=True)
    return out.copy_(reference(A.row_ptr, A.col, A.val, x, y, float(alpha), float(beta)))


def spmv(A, x: torch.Tensor, y: torch.Tensor | None = None, *, alpha: float = 1.0, beta: float = 0.0,
         variant: str | None = None, convert: bool = True) -> torch.Tensor:
    """``y = alpha * A @ x + beta * y``.

    A:       a ``CSR``, ``ELL``, ``JDS`` or ``Panels`` (built once, reused), or anything ``as_csr`` takes (a torch
             sparse CSR / COO or dense tensor, a SciPy sparse matrix), converted on each call.
             M x N, float32 values, int32 indices, on a CUDA device; a CSR on the CPU with CPU x
             and y runs the float64 PyTorch reference (any variant).
    x:       float32 (N,) on A's device.
    y:       float32 (M,) on A's device; written in place and returned. Needed when beta != 0; with
             beta == 0 it is not read. Default None: a new tensor.
    alpha, beta: scalars (defaults 1 and 0).
    variant: None picks ``choose(A.stats, convert)`` for a CSR (ELL and JDS run their own kernel), or
             a key of ``VARIANTS`` whose format matches A.
    convert: with variant None and a CSR, allow ``choose`` to pick ELL or JDS; the converted copy is
             built on the first call and kept with A (``converted``). Default True; False for
             one-shot products or when memory is short.
    Returns y, (M,) float32.
    """
    if not isinstance(A, (CSR, ELL, JDS, Panels)):
        A = as_csr(A, device=x.device if isinstance(x, torch.Tensor) else None)
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"spmv: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    if runs_reference("spmv", {"x": x, "y": y}):
        return _cpu_spmv(A, x, y, alpha, beta)
    if variant is None:
        if isinstance(A, (ELL, JDS, Panels)):
            variant = {ELL: "ell", JDS: "jds", Panels: "panels"}[type(A)]
        else:
            variant = choose(A.stats, convert)
            if FORMAT_OF[variant] is not CSR:
                F = converted(A, FORMAT_OF[variant])
                if F is None:
                    variant = choose(A.stats, convert=False)
                else:
                    A = F
    if variant not in VARIANTS:
        raise ValueError(f"spmv: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    return VARIANTS[variant](A, x, y, alpha, beta)
