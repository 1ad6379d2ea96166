"""spmv's matrix formats: CSR, ELL, JDS and Panels (small classes holding device tensors, built on
the GPU with torch ops), their builders and checks, and the per-matrix plans the CSR kernels read
(csr_split's chunks, csr_stream's blocks, csr_merge's path partition), each built once and kept
with the matrix. The layouts are described in ``api``'s docstring.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field

import torch

from ...runtime import cuda as rt
from .configs import CHUNK, LONG_LEN, MERGE_DEFAULT, PANEL_COLS, PANEL_DEFAULT, PANEL_MAX_ROWS, PANEL_ROUND, \
    PANEL_ROUNDS, STREAM_NNZ, STREAM_ROWS, panel_shape
from .kernels import clusters_fit, panel_kernel

INT32_MAX = 2**31 - 1


@dataclass
class RowStats:
    """Row-length statistics, what ``choose`` reads; ``cols`` (N) and ``col_spread`` (the mean over
    non-empty rows of (last column - first column + 1) / N: about 1 when a row's columns are spread
    over all of x, small for banded matrices) say how far a row's gathers from x roam."""

    rows: int
    nnz: int
    mean: float
    max: int
    std: float
    empty_rows: int
    cols: int = 0
    col_spread: float = 0.0

    @staticmethod
    def of(lengths: torch.Tensor, row_ptr: torch.Tensor | None = None, col: torch.Tensor | None = None,
           cols: int = 0) -> "RowStats":
        if lengths.numel() == 0:
            return RowStats(0, 0, 0.0, 0, 0.0, 0, cols)
        lf = lengths.double()
        spread = 0.0
        if row_ptr is not None and col is not None and cols > 0 and col.numel():
            live = lengths > 0
            first = col[row_ptr[:-1][live].long()].double()
            last = col[row_ptr[1:][live].long() - 1].double()
            spread = float((last - first + 1).mean()) / cols
        return RowStats(rows=lengths.numel(), nnz=int(lengths.sum()), mean=float(lf.mean()), max=int(lengths.max()),
                        std=float(lf.std(unbiased=False)), empty_rows=int((lengths == 0).sum()), cols=cols,
                        col_spread=spread)


def _timed(fn):
    """Run fn on the current stream and return (result, milliseconds) from CUDA events (or wall
    time without a GPU): the conversion cost each format reports."""
    import time

    if torch.cuda.is_available():
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        out = fn()
        e.record()
        e.synchronize()
        return out, s.elapsed_time(e)
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


@dataclass
class CSR:
    """Compressed sparse rows on one device: row_ptr (M + 1,), col (nnz,) int32, val (nnz,) float32.

    Build with ``CSR.from_torch``, ``CSR.from_scipy``, ``CSR.from_dense`` or ``CSR.from_arrays``;
    each validates (``validate=True``) and records ``build_ms``, the time it took on the device.
    """

    row_ptr: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    shape: tuple[int, int]
    stats: RowStats = None
    build_ms: float = 0.0
    _plans: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        # The from_* builders pass the stats of arrays they checked. A CSR built directly goes
        # through from_arrays' conversion and checks here, so a bad matrix fails now, naming the
        # argument, not later in a kernel ("'NoneType' object has no attribute 'rows'").
        if self.stats is None:
            self.row_ptr, self.col, self.val, self.shape = _csr_arrays(self.row_ptr, self.col, self.val,
                                                                       self.shape, validate=True)
            self.stats = RowStats.of(self.row_lengths(), self.row_ptr, self.col, self.shape[1])

    @property
    def nnz(self) -> int:
        return self.col.numel()

    @property
    def device(self) -> torch.device:
        return self.val.device

    def row_lengths(self) -> torch.Tensor:
        return self.row_ptr[1:] - self.row_ptr[:-1]

    @classmethod
    def from_arrays(cls, row_ptr, col, val, shape, *, validate: bool = True) -> "CSR":
        """From the three arrays (any integer / real dtypes: converted to int32 / float32; complex values
        raise TypeError rather than lose their imaginary part)."""
        (rp, c, v, shape), ms = _timed(lambda: _csr_arrays(row_ptr, col, val, shape, validate))
        return cls(rp, c, v, shape, RowStats.of(rp[1:] - rp[:-1], rp, c, shape[1]), ms)

    @classmethod
    def from_torch(cls, A: torch.Tensor, *, validate: bool = True) -> "CSR":
        """From a 2-D ``torch.sparse_csr`` tensor (``A.to_sparse_csr()``)."""
        if not isinstance(A, torch.Tensor) or A.layout != torch.sparse_csr:
            raise ValueError("CSR.from_torch: 'A' must be a torch.sparse_csr tensor (use A.to_sparse_csr())")
        if A.dim() != 2:
            raise ValueError(f"CSR.from_torch: 'A' must be 2-D, got shape {tuple(A.shape)}")
        return cls.from_arrays(A.crow_indices(), A.col_indices(), A.values(), tuple(A.shape), validate=validate)

    @classmethod
    def from_scipy(cls, A, device="cuda", *, validate: bool = True) -> "CSR":
        """From a SciPy sparse matrix (converted to CSR with sorted indices); needs SciPy."""
        try:
            import scipy.sparse as sp
        except ImportError as e:  # SciPy is optional
            raise ImportError("CSR.from_scipy needs SciPy (pip install scipy)") from e
        if not sp.issparse(A):
            raise ValueError(f"CSR.from_scipy: 'A' must be a SciPy sparse matrix, got {type(A).__name__}")
        A = A.tocsr()
        if not A.has_sorted_indices:
            A = A.sorted_indices()
        t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
        return cls.from_arrays(t(A.indptr), t(A.indices), t(A.data.astype("float32")), A.shape, validate=validate)

    @classmethod
    def from_dense(cls, D: torch.Tensor) -> "CSR":
        """From a dense 2-D tensor of real values (zeros dropped), on D's device."""
        _check_dense(D, "CSR.from_dense", "D")

        def build():
            nz = D != 0
            counts = nz.sum(1)
            rp = torch.zeros(D.shape[0] + 1, dtype=torch.int64, device=D.device)
            rp[1:] = torch.cumsum(counts, 0)
            r, c = nz.nonzero(as_tuple=True)  # row-major order: columns sorted within each row
            return rp.int(), c.int(), D[r, c].float().contiguous()

        (rp, c, v), ms = _timed(build)
        return cls(rp, c, v, (D.shape[0], D.shape[1]), RowStats.of(rp[1:] - rp[:-1], rp, c, D.shape[1]), ms)

    def to_torch(self) -> torch.Tensor:
        """The same matrix as a torch sparse CSR tensor (int32 indices): cuSPARSE's input."""
        return torch.sparse_csr_tensor(self.row_ptr, self.col, self.val, self.shape, check_invariants=False)

    def to_dense(self) -> torch.Tensor:
        return self.to_torch().to_dense()

    def split_plan(self, long_len: int = LONG_LEN) -> tuple[torch.Tensor, torch.Tensor]:
        """(chunk_row, chunk_start) for csr_split: each row longer than ``long_len`` cut into chunks
        of CHUNK nonzeros. Built on the device once per long_len and cached."""
        plan = self._plans.get(long_len)
        if plan is None:
            lengths = self.row_lengths().long()
            long_rows = torch.nonzero(lengths > long_len).flatten()
            nch = (lengths[long_rows] + CHUNK - 1) // CHUNK
            chunk_row = torch.repeat_interleave(long_rows, nch)
            first = torch.cumsum(nch, 0) - nch  # each row's first chunk index
            within = torch.arange(chunk_row.numel(), device=self.device) - torch.repeat_interleave(first, nch)
            chunk_start = self.row_ptr.long()[chunk_row] + within * CHUNK
            plan = self._plans[long_len] = (chunk_row.int().contiguous(), chunk_start.int().contiguous())
        return plan


def _on_data_device(t: torch.Tensor, what: str, name: str) -> None:
    if t.device.type not in ("cpu", "cuda"):  # a meta tensor has no values to check or convert
        raise ValueError(f"{what}: '{name}' is on {t.device}; a matrix is built on the CPU or a CUDA device")


def _check_dense(D, what: str, name: str) -> None:
    if not isinstance(D, torch.Tensor) or D.dim() != 2:
        got = tuple(D.shape) if isinstance(D, torch.Tensor) else type(D).__name__
        raise ValueError(f"{what}: '{name}' must be a 2-D torch.Tensor, got {got}")
    if D.is_complex():
        raise TypeError(f"{what}: '{name}' is {D.dtype}; SpMV takes real values (float32 would drop the "
                        f"imaginary part)")
    _on_data_device(D, what, name)


def _csr_shape(shape) -> tuple[int, int]:
    try:
        M, N = (operator.index(s) for s in shape)
    except (TypeError, ValueError):  # not a sequence, not of two items, or not of ints
        raise TypeError(f"CSR: 'shape' must be (M, N), two ints, got {shape!r}") from None
    if M < 0 or N < 0:
        raise ValueError(f"CSR: 'shape' must be (M, N) with M, N >= 0, got {tuple(shape)}")
    return M, N


def _csr_arrays(row_ptr, col, val, shape, validate: bool):
    """from_arrays' conversion (int32 indices, float32 values) and checks; also what a CSR built
    directly goes through. Returns (row_ptr, col, val, shape)."""
    rp, c = _as_index(row_ptr, "row_ptr"), _as_index(col, "col")
    if not isinstance(val, torch.Tensor):
        raise ValueError(f"CSR: 'val' must be a torch.Tensor, got {type(val).__name__}")
    if val.is_complex():
        raise TypeError(f"CSR: 'val' is {val.dtype}; SpMV takes real values (float32 would drop the imaginary part)")
    if val.dim() != 1:
        raise ValueError(f"CSR: 'val' must be 1-D, got shape {tuple(val.shape)}")
    _on_data_device(val, "CSR", "val")
    shape = _csr_shape(shape)
    v = val.to(torch.float32).contiguous()
    if validate:
        _validate_csr(rp, c, v, shape)
    return rp, c, v, shape


def _need(A, cls, name):
    if not isinstance(A, cls):
        where = name if "." in name else f"spmv.{name}"
        raise ValueError(f"{where}: 'A' must be a {cls.__name__} (build one with {cls.__name__}.from_...), "
                         f"got {type(A).__name__}")


def _as_index(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"CSR: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    _on_data_device(t, "CSR", name)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"CSR: '{name}' must hold integers, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"CSR: '{name}' must be 1-D, got shape {tuple(t.shape)}")
    if t.numel() and (int(t.max()) > INT32_MAX or int(t.min()) < -INT32_MAX - 1):
        raise ValueError(f"CSR: '{name}' has values past int32; tilewise's SpMV uses int32 indices")
    return t.to(torch.int32).contiguous()


def stream_plan(A: "CSR") -> torch.Tensor:
    """csr_stream's block boundaries (n_blocks + 1 rows, int32): a new block wherever
    max(row_ptr[r] // STREAM_NNZ, r // STREAM_ROWS) steps up, so a block starts its nonzeros within
    one STREAM_NNZ window and spans at most STREAM_ROWS rows of the row term. Cached on A."""
    plan = A._plans.get("stream")
    if plan is None:
        M = A.shape[0]
        r = torch.arange(M, device=A.device)
        key = torch.maximum(A.row_ptr[:-1].long() // STREAM_NNZ, r // STREAM_ROWS)
        change = torch.ones(M, dtype=torch.bool, device=A.device)
        change[1:] = key[1:] != key[:-1]
        starts = torch.nonzero(change).flatten()
        plan = torch.cat([starts, torch.tensor([M], device=A.device)]).int().contiguous()
        A._plans["stream"] = plan
    return plan


def merge_coords(row_ptr: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each tile of the merge path starts: (rows, nzs), int64, n_tiles + 1 entries each.

    The path merges the rows' ends row_ptr[1:] with the nonzeros 0 .. nnz - 1: at (i rows closed, j
    nonzeros taken) the next item closes row i if row_ptr[i + 1] <= j, else takes nonzero j. Row k
    therefore closes at item k + row_ptr[k + 1], a strictly increasing key, and after d items
    i = #{k : k + row_ptr[k + 1] < d} (one ``searchsorted``), j = d - i. Tile t starts at
    d = t * tile (the last entry is the path's end, (M, nnz))."""
    if tile <= 0:
        raise ValueError(f"merge_coords: tile must be positive, got {tile}")
    M = row_ptr.numel() - 1
    total = M + int(row_ptr[-1])
    n_tiles = -(-total // tile)
    d = (torch.arange(n_tiles + 1, device=row_ptr.device, dtype=torch.int64) * tile).clamp_(max=total)
    key = torch.arange(M, device=row_ptr.device, dtype=torch.int64) + row_ptr[1:].long()
    rows = torch.searchsorted(key, d)  # side="left": the count of keys < d
    return rows, d - rows


def merge_segments(row_ptr: torch.Tensor, rows: torch.Tensor, nzs: torch.Tensor):
    """The rows that straddle tiles, for csr_merge's fix-up: (seg_row, seg_b0, seg_b1), int64.

    Tile b ends with row rows[b + 1] open; it holds part of that row (a nonzero carry) when the row
    exists (< M) and the tile's end nzs[b + 1] lies past the row's start. The tiles carrying one row
    are consecutive: seg_b0 .. seg_b1 - 1. Rows that fit in one tile need no fix-up."""
    M = row_ptr.numel() - 1
    r_end, z_end = rows[1:], nzs[1:]
    if M == 0 or r_end.numel() == 0:
        e = torch.zeros(0, dtype=torch.int64, device=rows.device)
        return e, e, e
    has = (r_end < M) & (z_end > row_ptr.long()[r_end.clamp(max=M - 1)])
    blocks = torch.nonzero(has).flatten()
    seg_row, counts = torch.unique_consecutive(r_end[blocks], return_counts=True)
    b0 = blocks[torch.cumsum(counts, 0) - counts]
    return seg_row, b0, b0 + counts


@dataclass
class MergePlan:
    """csr_merge's partition of one matrix for one tile size, int32 device tensors: plan_row /
    plan_nz (n_tiles + 1,) where each tile starts on the path (``merge_coords``); seg_row / seg_b0 /
    seg_b1 (n_seg,) the rows that straddle tiles and their tiles (``merge_segments``); ``build_ms``
    the time it took (the conversion cost, reported like ELL's and JDS's)."""

    tile: int
    plan_row: torch.Tensor
    plan_nz: torch.Tensor
    seg_row: torch.Tensor
    seg_b0: torch.Tensor
    seg_b1: torch.Tensor
    build_ms: float = 0.0

    @property
    def n_tiles(self) -> int:
        return self.plan_row.numel() - 1

    @property
    def n_seg(self) -> int:
        return self.seg_row.numel()


def merge_plan(A: "CSR", tile: int = MERGE_DEFAULT[0] * MERGE_DEFAULT[1]) -> MergePlan:
    """csr_merge's plan for A and ``tile`` = NT x IPT items per block: built on A's device with
    torch ops (a ``searchsorted`` over M keys, about the cost of reading row_ptr twice) on first
    use and cached with A."""
    key = ("merge", tile)
    plan = A._plans.get(key)
    if plan is None:
        def build():
            rows, nzs = merge_coords(A.row_ptr, tile)
            seg = merge_segments(A.row_ptr, rows, nzs)
            return [t.int().contiguous() for t in (rows, nzs, *seg)]

        arrays, ms = _timed(build)
        plan = A._plans[key] = MergePlan(tile, *arrays, build_ms=ms)
    return plan


def _validate_csr(rp: torch.Tensor, col: torch.Tensor, val: torch.Tensor, shape) -> None:
    """Everything a kernel relies on, checked on the device; raises ValueError naming what is wrong."""
    M, N = _csr_shape(shape)
    if M > INT32_MAX - 1 or N > INT32_MAX:
        raise ValueError(f"CSR: 'shape' {tuple(shape)} is past int32 indexing")
    if not (rp.device == col.device == val.device):
        raise ValueError(f"CSR: 'row_ptr', 'col', 'val' on different devices ({rp.device}, {col.device}, "
                         f"{val.device})")
    if rp.numel() != M + 1:
        raise ValueError(f"CSR: 'row_ptr' has {rp.numel()} entries; 'shape' {tuple(shape)} needs M + 1 = {M + 1}")
    if col.numel() != val.numel():
        raise ValueError(f"CSR: 'col' has {col.numel()} entries but 'val' has {val.numel()}")
    nnz = col.numel()
    if int(rp[0]) != 0 or int(rp[-1]) != nnz:
        raise ValueError(f"CSR: 'row_ptr' must start at 0 and end at nnz = {nnz} (the length of 'col'); "
                         f"got {int(rp[0])} .. {int(rp[-1])}")
    if M and bool((rp[1:] < rp[:-1]).any()):
        i = int(torch.nonzero(rp[1:] < rp[:-1])[0])
        raise ValueError(f"CSR: row_ptr decreases at row {i} ({int(rp[i])} -> {int(rp[i + 1])})")
    if nnz:
        bad = (col < 0) | (col >= N)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise ValueError(f"CSR: column index {int(col[i])} at position {i} is outside [0, {N}): 'col' does "
                             f"not fit 'shape' {tuple(shape)}")
        down = col[1:] < col[:-1]
        if bool(down.any()):
            starts = torch.zeros(nnz, dtype=torch.bool, device=col.device)
            inner = rp[1:-1].long()
            starts[inner[inner < nnz]] = True  # a row may start lower than the last one ended
            down &= ~starts[1:]
            if bool(down.any()):
                i = int(torch.nonzero(down)[0]) + 1
                raise ValueError(f"CSR: the column indices of 'col' are not sorted within a row (position {i}); "
                                 f"sort them (torch: A.to_sparse_coo().coalesce().to_sparse_csr(); "
                                 f"SciPy: A.sort_indices())")


@dataclass
class ELL:
    """ELLPACK: col/val of shape (K, M), column-major over rows (entry k of row i at k * M + i),
    K = the longest row; padding has col = -1 and val = 0."""

    col: torch.Tensor
    val: torch.Tensor
    shape: tuple[int, int]
    nnz: int
    stats: RowStats = None
    build_ms: float = 0.0

    @property
    def width(self) -> int:
        return self.col.shape[0]

    @classmethod
    def from_csr(cls, A: CSR, max_fill: float = 3.0) -> "ELL":
        """Refuses (ValueError) when K * M > max_fill * nnz: the padding would dominate the bytes."""
        _need(A, CSR, "ELL.from_csr")
        M = A.shape[0]
        K = A.stats.max
        if K * M > max(max_fill * A.nnz, 1024):
            raise ValueError(f"ELL: {K} x {M} slots for {A.nnz} nonzeros is more than max_fill = {max_fill} "
                             f"times the nonzeros (the longest row is {K}); use CSR or JDS")
        def build():
            col = torch.full((K, M), -1, dtype=torch.int32, device=A.device)
            val = torch.zeros((K, M), dtype=torch.float32, device=A.device)
            if A.nnz:
                rows = torch.repeat_interleave(torch.arange(M, device=A.device), A.row_lengths().long(),
                                               output_size=A.nnz)
                pos = torch.arange(A.nnz, device=A.device) - A.row_ptr.long()[rows]
                col.view(-1)[pos * M + rows] = A.col
                val.view(-1)[pos * M + rows] = A.val
            return col, val

        (col, val), ms = _timed(build)
        return cls(col, val, A.shape, A.nnz, A.stats, ms)


@dataclass
class JDS:
    """Jagged diagonal storage: perm (M,) rows by decreasing length, len_sorted (M,), jd_ptr (K + 1,)
    start of each jagged diagonal, col/val (nnz,) diagonal by diagonal."""

    perm: torch.Tensor
    len_sorted: torch.Tensor
    jd_ptr: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    shape: tuple[int, int]
    stats: RowStats = None
    build_ms: float = 0.0

    @property
    def nnz(self) -> int:
        return self.col.numel()

    @classmethod
    def from_csr(cls, A: CSR) -> "JDS":
        _need(A, CSR, "JDS.from_csr")
        M, K = A.shape[0], A.stats.max

        def build():
            lengths = A.row_lengths().long()
            len_sorted, perm = torch.sort(lengths, descending=True, stable=True)
            # Diagonal k holds one entry per row longer than k: count = M - #rows of length <= k.
            counts = M - torch.cumsum(torch.bincount(lengths, minlength=K + 1)[:K], 0)
            jd_ptr = torch.zeros(K + 1, dtype=torch.int64, device=A.device)
            jd_ptr[1:] = torch.cumsum(counts, 0)
            col = torch.empty(A.nnz, dtype=torch.int32, device=A.device)
            val = torch.empty(A.nnz, dtype=torch.float32, device=A.device)
            if A.nnz:
                rank = torch.empty(M, dtype=torch.int64, device=A.device)
                rank[perm] = torch.arange(M, device=A.device)
                rows = torch.repeat_interleave(torch.arange(M, device=A.device), lengths, output_size=A.nnz)
                pos = torch.arange(A.nnz, device=A.device) - A.row_ptr.long()[rows]
                dest = jd_ptr[pos] + rank[rows]
                col[dest] = A.col
                val[dest] = A.val
            return perm.int(), len_sorted.int(), jd_ptr.int(), col, val

        (perm, ls, jp, col, val), ms = _timed(build)
        return cls(perm.contiguous(), ls.contiguous(), jp.contiguous(), col, val, A.shape, A.stats, ms)


@dataclass
class Panels:
    """Row panels with their nonzeros in column order (built by ``Panels.from_csr``).

    The M rows are cut into P = ceil(M / rows) panels. Panel p's nonzeros, sorted by column, are
    stored as chunks of 32 entries, each chunk inside one block of PANEL_COLS columns:
      key (n_chunks * 32,) int32: (col % 65536) << 16 | (row - p * rows); padding 0xFFFF
      val (n_chunks * 32,) float32: the value (0 for padding)
      chunk_col0 (n_chunks,) int32: the first column of the chunk's column block
      panel_chunk (P + 1,) int32: panel p's chunks are [panel_chunk[p], panel_chunk[p + 1])
      panel_tail (P,) int32: where panel p's tail starts (see ``rounds``)
    ``rounds`` (True): the panel's chunks up to its tail come in rounds of ``round_chunks``
    chunks (PANEL_ROUND = 64: two per warp of a 1024-thread CTA) in which no row appears twice, so the kernel adds them
    into shared memory with plain loads and stores and one barrier a round. The rounds are packed
    greedily in column order: a nonzero whose row is already in the current round is passed over
    to the tail (in column order again, added with shared-memory atomics) and takes no slot, so a
    round is full (uniform 2M x 2M x 32: +0.25 % padding and 176.8 us, against +3.35 % and 180.8 us
    for rounds cut at fixed places, where a repeat leaves a hole; docs/tuning/spmv.md, "Panels
    rounds").
    ``rounds=False``: everything is tail.
    ``cluster`` CTAs (one thread-block cluster) share a panel: each takes 1 / cluster of its rounds
    and of its tail, and the panel's y is summed across their shared memories. 8 bytes a nonzero
    plus padding (up to 31 entries where a column block starts a chunk, the last round's rest) and
    4 bytes a chunk.
    """

    key: torch.Tensor
    val: torch.Tensor
    chunk_col0: torch.Tensor
    panel_chunk: torch.Tensor
    panel_tail: torch.Tensor
    rows: int
    cluster: int
    shape: tuple[int, int]
    nnz: int
    rounds: bool = True
    round_chunks: int = PANEL_ROUND
    stats: RowStats = None
    build_ms: float = 0.0

    @property
    def panels(self) -> int:
        return self.panel_chunk.numel() - 1

    @classmethod
    def from_csr(cls, A: CSR, rows: int | None = None, cluster: int | None = None, rounds: bool = True,
                 round_chunks: int = PANEL_ROUND) -> "Panels":
        """``rows`` (rows a panel, 1..PANEL_MAX_ROWS) and ``cluster`` (CTAs a panel, 1..4) default to
        ``device_panel_shape``: the largest panels that fill the GPU in one wave of clusters. ``rounds``
        (default True; ``round_chunks`` default PANEL_ROUND = 64): on the H200, 2M x 2M with 32 / 16 /
        4 random columns a row, 66 panels x 2 CTAs: 181 / 105 / 49 us with rounds of 64 chunks,
        226 / 125 / 54 without, 198 / 116 / 51 with rounds of 128 (docs/tuning/spmv.md, "Panels
        rounds")."""
        _need(A, CSR, "Panels.from_csr")
        M, N = A.shape
        if rows is None or cluster is None:
            if not A.val.is_cuda:  # panel_shape asks the GPU how many clusters fit
                raise ValueError(f"Panels.from_csr: 'A' is on {A.device}; give rows and cluster, or a CUDA matrix")
            r0, c0 = device_panel_shape(M, A.val.get_device())
            rows = r0 if rows is None else rows
            cluster = c0 if cluster is None else cluster
        rows, cluster = int(rows), int(cluster)
        if not 1 <= rows <= PANEL_MAX_ROWS:
            raise ValueError(
                f"Panels: rows must be in 1..{PANEL_MAX_ROWS} (a panel's y is in shared memory), got {rows}")
        if cluster not in PANEL_DEFAULT:
            raise ValueError(f"Panels: cluster must be one of {sorted(PANEL_DEFAULT)}, got {cluster}")
        if round_chunks not in PANEL_ROUNDS:
            raise ValueError(f"Panels: round_chunks must be one of {PANEL_ROUNDS}, got {round_chunks}")

        def build():
            dev = A.device
            P = max(1, -(-M // rows))
            NB = max(1, -(-N // PANEL_COLS))
            lengths = A.row_lengths().long()
            r = torch.repeat_interleave(torch.arange(M, device=dev), lengths, output_size=A.nnz)
            c = A.col.long()
            panel = r // rows
            order = torch.sort(panel * (NB * PANEL_COLS) + c, stable=True)[1]
            panel, c, rl, v = panel[order], c[order], r[order] - panel[order] * rows, A.val[order]
            parts = []
            if rounds:
                lay, moved = _packed_rounds(panel, c, rl, v, P, rows, round_chunks)
                parts.append(lay)
                panel, c, rl, v = panel[moved], c[moved], rl[moved], v[moved]
            parts.append(_panel_chunks(panel, c, rl, v, P, NB))
            # chunks panel by panel: the rounds part first, then the tail
            n_parts = len(parts)
            chunk_key = torch.cat([q[3] * n_parts + i for i, q in enumerate(parts)])
            corder = torch.sort(chunk_key, stable=True)[1]
            key = torch.cat([q[0].view(-1, 32) for q in parts])[corder].reshape(-1)
            val = torch.cat([q[1].view(-1, 32) for q in parts])[corder].reshape(-1)
            chunk_col0 = torch.cat([q[2] for q in parts])[corder].to(torch.int32)
            per_panel = torch.stack([q[4] for q in parts]).sum(0)
            panel_chunk = torch.zeros(P + 1, dtype=torch.int64, device=dev)
            panel_chunk[1:] = torch.cumsum(per_panel, 0)
            panel_tail = panel_chunk[:-1] + (parts[0][4] if rounds else 0)
            return key, val, chunk_col0, panel_chunk.to(torch.int32), panel_tail.to(torch.int32)

        (key, val, cc, pc, pt), ms = _timed(build)
        return cls(key, val, cc, pc, pt, rows, cluster, A.shape, A.nnz, rounds, round_chunks, A.stats, ms)


def _packed_rounds(panel, c, rl, v, P: int, rows: int, round_chunks: int):
    """The rounds part of a Panels layout, for entries sorted by (panel, column): each panel walked
    in column order, an entry whose row is already in the current round passed over (to the tail),
    a new column block starting a new chunk, each panel padded to whole rounds (on the GPU
    ``spmv_panels_rounds``, a warp a panel taking 32 entries a step, with the serial walk's very
    result; on the CPU the serial walk in Python). Returns (key, val, chunk_col0, chunk_panel,
    chunks per panel) and the mask of the entries passed over."""
    dev = panel.device
    start = torch.zeros(P + 1, dtype=torch.int64, device=dev)
    start[1:] = torch.cumsum(torch.bincount(panel, minlength=P), 0)
    blk = (c // PANEL_COLS).to(torch.int32)
    rl32 = rl.to(torch.int32)
    round_slots = 32 * round_chunks
    if panel.is_cuda and panel.numel():
        local = torch.empty(panel.numel(), dtype=torch.int64, device=dev)
        totals = torch.empty(P, dtype=torch.int64, device=dev)
        panel_kernel("spmv_panels_rounds", panel.get_device())(P, 256, rl32, blk, start, local, totals, rows,
                                                                round_slots, shmem=rows * 4)
    else:
        local, totals = _packed_rounds_host(rl32.tolist(), blk.tolist(), start.tolist(), rows, round_slots)
        local, totals = local.to(dev), totals.to(dev)
    kept = local >= 0
    slot = (torch.cumsum(totals, 0) - totals)[panel[kept]] + local[kept]
    total = int(totals.sum())
    ck = c[kept]
    key, val = _slots(ck, rl[kept], v[kept], slot, total)
    n_chunks = total // 32
    chunk_col0 = torch.zeros(n_chunks, dtype=torch.int64, device=dev)
    chunk_col0[slot // 32] = ck // PANEL_COLS * PANEL_COLS
    per_panel = totals // 32
    chunk_panel = torch.repeat_interleave(torch.arange(P, device=dev), per_panel, output_size=n_chunks)
    return (key, val, chunk_col0, chunk_panel, per_panel), ~kept


def _packed_rounds_host(row: list, blk: list, start: list, rows: int, round_slots: int):
    """``spmv_panels_rounds`` on the host (CPU tensors): each entry's slot in its panel's rounds
    part (-1: passed over) and each panel's slot count."""
    out = [-1] * len(row)
    totals = []
    for p in range(len(start) - 1):
        stamp = [-1] * rows
        pos, end, rid, cur = 0, round_slots, 0, -1
        for i in range(start[p], start[p + 1]):
            if blk[i] != cur:
                cur = blk[i]
                pos = (pos + 31) & ~31
            while pos >= end:
                end += round_slots
                rid += 1
            r = row[i]
            if stamp[r] == rid:
                continue
            stamp[r] = rid
            out[i] = pos
            pos += 1
        totals.append(-(-pos // round_slots) * round_slots)
    return torch.tensor(out, dtype=torch.int64), torch.tensor(totals, dtype=torch.int64)


def _slots(c, rl, v, slot, total: int):
    """Key and value arrays of ``total`` slots with the entries (column c, row in panel rl, value v)
    at ``slot``: key = (c % PANEL_COLS) << 16 | rl as int32, padding 0xFFFF with value 0."""
    k = (c % PANEL_COLS) * 65536 + rl
    key = torch.full((total,), 0xFFFF, dtype=torch.int32, device=c.device)
    key[slot] = torch.where(k >= 2**31, k - 2**32, k).to(torch.int32)
    val = torch.zeros(total, dtype=torch.float32, device=c.device)
    val[slot] = v
    return key, val


def _panel_chunks(panel, c, rl, v, P: int, NB: int):
    """The tail part of a Panels layout: chunks of 32 for entries sorted by (panel, column), each
    (panel, column block) padded to whole chunks. Returns key, val, chunk_col0, chunk_panel (per
    chunk) and chunks per panel."""
    dev = panel.device
    seg = panel * NB + c // PANEL_COLS
    counts = torch.bincount(seg, minlength=P * NB)
    seg_chunks = (counts + 31) // 32
    per_panel = seg_chunks.view(P, NB).sum(1)
    slots = seg_chunks * 32
    pstart = torch.cumsum(slots, 0) - slots
    ustart = torch.cumsum(counts, 0) - counts
    slot = pstart[seg] + (torch.arange(seg.numel(), device=dev) - ustart[seg])
    total = int(slots.sum())
    key, val = _slots(c, rl, v, slot, total)
    seg_of_chunk = torch.repeat_interleave(torch.arange(P * NB, device=dev), seg_chunks, output_size=total // 32)
    return key, val, (seg_of_chunk % NB) * PANEL_COLS, seg_of_chunk // NB, per_panel


def converted(A: CSR, fmt: type):
    """``fmt.from_csr(A)`` (ELL, JDS or Panels), built once and kept with A (it costs about 3-5 ms for the
    suite's matrices, i.e. 40-60 calls' worth of what the format saves, and a second copy of A's
    values and indices). Returns None where the format refuses the matrix (ELL past max_fill)."""
    key = ("format", fmt.__name__)
    if key not in A._plans:
        try:
            A._plans[key] = fmt.from_csr(A)
        except ValueError:
            A._plans[key] = None
    return A._plans[key]


def as_csr(A, device=None) -> CSR:
    """A CSR from a CSR (as is), a torch sparse CSR / COO tensor, a SciPy sparse matrix or a dense tensor."""
    if isinstance(A, CSR):
        return A
    if isinstance(A, torch.Tensor):
        if A.layout == torch.sparse_csr:
            return CSR.from_torch(A)
        if A.layout == torch.sparse_coo:
            return CSR.from_torch(A.coalesce().to_sparse_csr())
        if A.layout == torch.strided:
            _check_dense(A, "spmv", "A")  # here, so that its errors name spmv's argument
            return CSR.from_dense(A)
    try:
        import scipy.sparse as sp

        if sp.issparse(A):
            return CSR.from_scipy(A, device=device or "cuda")
    except ImportError:
        pass
    raise ValueError(f"spmv: cannot make a CSR matrix of 'A', a {type(A).__name__}")


def device_panel_shape(M: int, device_index: int | None = None) -> tuple[int, int]:
    """``configs.panel_shape`` for this GPU (default: the current device): its resident clusters of
    each size from the occupancy API and its SM count."""
    dev = torch.cuda.current_device() if device_index is None else device_index
    return panel_shape(M, functools.partial(clusters_fit, dev), rt.sm_count(dev))
