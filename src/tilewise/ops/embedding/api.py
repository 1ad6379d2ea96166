"""embedding: ``out[b, t, :] = weight[ids[b, t], :]``, and a deterministic backward.

Versions (``embedding.cu``); the forward is the same gather in both, the backward differs:
    v1_naive:     forward one thread per output element (grid-stride).
                  backward: ``torch.sort(ids, stable=True)`` (equal ids stay in position order),
                  and ``torch.searchsorted`` for each row's segment start, then
                  ``embedding_bwd_segment_sum``: one warp per table row reads its segment
                  [start[v], start[v+1]) and adds those grad_out rows in position order,
                  writing every row of grad_weight (zeros where no id points), so no memset and
                  no float atomics: the same bits every run.
                  bound: launches (torch.sort is several kernels); bytes are tiny at training sizes.
    v2_fused_sort: v1 with the sort done by one block: a bitonic sort of (id << 32 | position)
                  keys in shared memory (n_ids <= 8192), then each row's segment start found by
                  binary search in that shared memory: one launch instead of torch.sort's and
                  searchsorted's. More than 8192 ids, or more than 65535 rows, take v1's path.
                  bound: one block's shared-memory sort (log2(n)^2 / 2 barrier stages) + the
                  segment sum's write of grad_weight (V x E x itemsize bytes).

    v3_scan:      no sort at all: one kernel, each warp owns 4 table rows, the block holds the ids
                  in shared memory, and the warp walks them 32 at a time, a ballot per row finding
                  the positions that name it, adding their grad_out rows in position order (the
                  same fixed order as v1/v2: deterministic) and writing every row (zeros where no
                  id points). rows x ids comparisons (6 x 10^7 at the classifier's 64 x 64 ids into
                  14,819 rows: a few microseconds), so it serves up to 12288 ids and rows x ids <=
                  2^28; past that v2's sort.
                  bound: one launch; the ballots (rows x ids / 32 a warp) and grad_w's write.

    v4_block_scan: v3 turned around: a block owns 32 table rows and maps every id to its local
                  row (or -1) while loading them, so the scan is one ballot per 32 ids, and the
                  ids are split over 4 warps (a quarter of v3's serial walk each), whose partial
                  rows in shared memory are summed in warp order: deterministic. Past its limits
                  (shared memory, rows x ids <= 2^33) v3, then v2, then v1. The default: its
                  forward + backward replayed in a CUDA graph takes 20.7 us on the H200 at 64 x 64
                  ids into 20000 x 50, against v3's 94 us and torch.embedding's 114 us
                  (docs/tuning/embedding.md, "Default backward: v4_block_scan").
                  bound: one launch; V / 32 blocks each reading the ids (n x id bytes) from L2.

Forward and backward are both one pass over their bytes; at the classifier's sizes (64 x 64 ids,
20000 x 50 table) they take a few microseconds each, so launches set the time.

An id outside ``[0, V)`` is not read: the forward writes NaN in its row of ``out`` and the backward
ignores it (checking ids on the host would need a device-to-host copy every call).

The limits, the block-scan configurations and the rule that picks the backward's path are in
``configs``; the block-scan configuration is chosen per call (``config=``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ...cost import Cost
from ...runtime import cuda as rt
from ...runtime.lazy import LazyModule, load_lazy
from .._checks import runs_reference
from .configs import BLOCK_SCAN, BLOCK_SCAN_DEFAULT, BLOCK_SCAN_EXTRA, ONE_BLOCK_SORT, SCAN, SCAN_ROWS_PER_BLOCK, \
    SCAN_THREADS, SHMEM_OPT_IN, SORT_MAX_IDS, TORCH_SORT, backward_path, block_scan_config, block_scan_shmem, \
    scan_chunks

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ID_DTYPES = (torch.int64, torch.int32)
_SRC = Path(__file__).with_name("embedding.cu")
_THREADS = 256
_SORT_THREADS = 1024


def _ict(dtype: torch.dtype) -> str:
    return "i64" if dtype == torch.int64 else "int"


def reference(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """PyTorch: reads the ids (n x id bytes) and n rows of the table, writes n x E elements."""
    return torch.nn.functional.embedding(ids, weight, padding_idx=padding_idx)


def reference_backward(ids: torch.Tensor, grad_out: torch.Tensor, num_rows: int,
                       padding_idx: int | None = None) -> torch.Tensor:
    """grad_weight (num_rows, E) in float64: each row the sum of the grad_out rows whose id names it."""
    E = grad_out.shape[-1]
    flat = ids.reshape(-1)
    g = grad_out.reshape(-1, E).double()
    out = torch.zeros(num_rows, E, dtype=torch.float64, device=grad_out.device)
    ok = (flat >= 0) & (flat < num_rows)
    out.index_add_(0, flat[ok].long(), g[ok])
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


def cost(n_ids: int, num_rows: int, dim: int, dtype: torch.dtype = torch.float32,
         id_dtype: torch.dtype = torch.int64, backward: bool = False) -> Cost:
    """Forward: ids read once, n_ids rows read, n_ids rows written. With ``backward``: also the
    backward's ids and grad_out read once and the whole grad_weight (num_rows x dim) written."""
    it = dtype.itemsize
    iid = id_dtype.itemsize
    fwd = n_ids * iid + 2 * n_ids * dim * it
    if not backward:
        return Cost(0, fwd)
    bwd = n_ids * iid + n_ids * dim * it + num_rows * dim * it
    return Cost(n_ids * dim, fwd + bwd)


# --------------------------------------------------------------------------- kernels


def module_names(extra: bool = False) -> list[str]:
    """Every kernel _module loads (the CPU tests check them against embedding.cu's instantiations);
    ``extra``: the block-scan configs only the experiment asks for, in a module of their own so
    that the package's module does not compile them."""
    if extra:
        return [f"embedding_bwd_block_scan_v4<float,{_ict(torch.int64)},{nw},{lu},{rb}>"
                for nw, lu, rb in BLOCK_SCAN_EXTRA]
    names = [f"embedding_fwd_v1_naive<{rt.ctype(d)},{_ict(i)}>" for d in _DTYPES for i in _ID_DTYPES]
    names += [f"embedding_sort_keys_v2<{_ict(i)}>" for i in _ID_DTYPES]
    names += [f"embedding_bwd_segment_sum<{rt.ctype(d)}>" for d in _DTYPES]
    names += [f"embedding_bwd_scan_v3<{rt.ctype(d)},{_ict(i)},{ec}>" for d in _DTYPES for i in _ID_DTYPES
              for ec in (1, 2, 4, 8)]
    nw, lu, rb = BLOCK_SCAN_DEFAULT
    names += [f"embedding_bwd_block_scan_v4<{rt.ctype(d)},{_ict(i)},{nw},{lu},{rb}>" for d in _DTYPES
              for i in _ID_DTYPES]
    return names


@functools.cache
def _module(device_index: int, extra: bool = False) -> LazyModule:
    # each kernel compiled on its first use (runtime/lazy.py): a step launches 2-4 of the 41
    return load_lazy(_SRC, module_names(extra), device_index=device_index)


_kernels: dict[tuple, rt.Kernel] = {}


def _fwd_kernel(dtype, id_dtype, dev) -> rt.Kernel:
    key = ("fwd", dtype, id_dtype, dev)
    k = _kernels.get(key)
    if k is None:
        p = (rt.Tensor("ids", (id_dtype,)), rt.Tensor("weight", (dtype,)), rt.Tensor("out", (dtype,)),
             rt.Scalar("n_ids", "i64"), rt.Scalar("V", "i64"), rt.Scalar("E", "i64"))
        k = _kernels[key] = _module(dev).kernel(f"embedding_fwd_v1_naive<{rt.ctype(dtype)},{_ict(id_dtype)}>", p)
    return k


def _sort_kernel(id_dtype, dev) -> rt.Kernel:
    key = ("sort", id_dtype, dev)
    k = _kernels.get(key)
    if k is None:
        p = (rt.Tensor("ids", (id_dtype,)), rt.Tensor("sorted_pos", (torch.int64,)),
             rt.Tensor("row_start", (torch.int32,)),
             rt.Scalar("n_ids", "i64"), rt.Scalar("V", "i64"), rt.Scalar("n_pow2", "i32"))
        k = _module(dev).kernel(f"embedding_sort_keys_v2<{_ict(id_dtype)}>", p)
        k.set_max_dynamic_shared(SORT_MAX_IDS * 8)
        _kernels[key] = k
    return k


def _seg_kernel(dtype, dev) -> rt.Kernel:
    key = ("seg", dtype, dev)
    k = _kernels.get(key)
    if k is None:
        p = (rt.Tensor("row_start", (torch.int32,)), rt.Tensor("sorted_pos", (torch.int64,)),
             rt.Tensor("grad_out", (dtype,)), rt.Tensor("grad_weight", (dtype,)),
             rt.Scalar("V", "i64"), rt.Scalar("E", "i64"), rt.Scalar("padding_idx", "i64"))
        k = _kernels[key] = _module(dev).kernel(f"embedding_bwd_segment_sum<{rt.ctype(dtype)}>", p)
    return k


def _block_scan_kernel(dtype, id_dtype, dev, config: tuple) -> rt.Kernel:
    key = ("block_scan", dtype, id_dtype, dev, config)
    k = _kernels.get(key)
    if k is None:
        if config != BLOCK_SCAN_DEFAULT and (dtype, id_dtype) != (torch.float32, torch.int64):
            raise ValueError(f"embedding: block-scan config {config} is built for float32 tables and int64 "
                             f"ids only, got {dtype} / {id_dtype}")
        p = (rt.Tensor("ids", (id_dtype,)), rt.Tensor("grad_out", (dtype,)), rt.Tensor("grad_weight", (dtype,)),
             rt.Scalar("n_ids", "i64"), rt.Scalar("V", "i64"), rt.Scalar("E", "i64"),
             rt.Scalar("padding_idx", "i64"))
        nw, lu, rb = config
        mod = _module(dev) if config == BLOCK_SCAN_DEFAULT else _module(dev, True)
        k = mod.kernel(
            f"embedding_bwd_block_scan_v4<{rt.ctype(dtype)},{_ict(id_dtype)},{nw},{lu},{rb}>", p)
        k.set_max_dynamic_shared(SHMEM_OPT_IN)
        _kernels[key] = k
    return k


def _scan_kernel(dtype, id_dtype, ec: int, dev) -> rt.Kernel:
    key = ("scan", dtype, id_dtype, ec, dev)
    k = _kernels.get(key)
    if k is None:
        p = (rt.Tensor("ids", (id_dtype,)), rt.Tensor("grad_out", (dtype,)), rt.Tensor("grad_weight", (dtype,)),
             rt.Scalar("n_ids", "i64"), rt.Scalar("V", "i64"), rt.Scalar("E", "i64"),
             rt.Scalar("padding_idx", "i64"))
        k = _kernels[key] = _module(dev).kernel(
            f"embedding_bwd_scan_v3<{rt.ctype(dtype)},{_ict(id_dtype)},{ec}>", p)
    return k


_waves: dict[tuple, int] = {}


def _wave(kernel: rt.Kernel, block: int) -> int:
    key = (kernel.name, kernel.device_index, block)
    w = _waves.get(key)
    if w is None:
        w = _waves[key] = kernel.resident_grid(block)
    return w


# --------------------------------------------------------------------------- checks and launchers


def _check(ids, weight, padding_idx, cpu=False):
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"embedding: 'ids' must be a torch.Tensor, got {type(ids).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"embedding: 'weight' must be a torch.Tensor, got {type(weight).__name__}")
    if (weight.get_device() < 0 or ids.get_device() < 0) and not (cpu and ids.device == weight.device):
        raise ValueError(f"embedding: 'ids' is on {ids.device} and 'weight' on {weight.device}; tilewise "
                         f"kernels need CUDA tensors (use tilewise.embedding for CPU tensors)")
    if ids.get_device() != weight.get_device():
        raise ValueError(f"embedding: 'ids' is on {ids.device} but 'weight' on {weight.device}")
    if ids.dtype not in _ID_DTYPES:
        raise ValueError(f"embedding: 'ids' has dtype {ids.dtype}; supported: int64, int32")
    if weight.dtype not in _DTYPES:
        raise ValueError(f"embedding: 'weight' has dtype {weight.dtype}; supported: float32, float16, bfloat16")
    if weight.dim() != 2:
        raise ValueError(f"embedding: 'weight' must be 2-D (num_rows, dim), got shape {tuple(weight.shape)}")
    if not weight.is_contiguous():
        raise ValueError("embedding: 'weight' is not contiguous; pass weight.contiguous()")
    V = weight.shape[0]
    if V >= 2**32 - 1:
        raise ValueError(f"embedding: 'weight' has {V} rows; at most 2^32 - 2 are supported")
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not hasattr(type(padding_idx), "__index__"):
            raise ValueError(f"embedding: 'padding_idx' must be an int or None, got {padding_idx!r}")
        if not -V <= padding_idx.__index__() < V:
            raise ValueError(f"embedding: 'padding_idx' = {padding_idx} is outside [-{V}, {V})")
    return ids.contiguous()


_plans: dict[tuple, tuple] = {}


def _plan(dtype, id_dtype, dev: int) -> tuple:
    """(forward kernel, its resident grid, sort kernel, segment-sum kernel, its resident grid) for
    one (table dtype, id dtype, device): one dict lookup per call instead of five."""
    key = (dtype, id_dtype, dev)
    p = _plans.get(key)
    if p is None:
        fk, sk, gk = _fwd_kernel(dtype, id_dtype, dev), _sort_kernel(id_dtype, dev), _seg_kernel(dtype, dev)
        p = _plans[key] = (fk, _wave(fk, _THREADS), sk, gk, _wave(gk, _THREADS))
    return p


def _forward(ids: torch.Tensor, weight: torch.Tensor, plan: tuple | None = None) -> torch.Tensor:
    V, E = weight.shape
    out = torch.empty(*ids.shape, E, dtype=weight.dtype, device=weight.device)
    n = ids.numel()
    if n and E:
        fk, wave = (plan or _plan(weight.dtype, ids.dtype, weight.get_device()))[:2]
        fk(max(1, min(wave, -(-(n * E) // _THREADS))), _THREADS, ids, weight, out, n, V, E)
    return out


# Sort workspaces (sorted positions, segment starts) kept per (device, stream, n, V): the backward
# runs every training step at the same sizes, and three allocations cost more host time than the
# kernels take. Reuse is safe on one stream (its kernels run in order); another stream gets its
# own. While a CUDA graph is being captured the buffers are allocated normally (the graph's pool
# keeps them), so that replays never share them with eager calls.
_workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_MAX_WORKSPACES = 16
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def _workspace(n: int, V: int, device: torch.device, dev: int) -> tuple[torch.Tensor, torch.Tensor]:
    if _raw_stream is None or _capturing is None or _capturing():
        return (torch.empty(n, dtype=torch.int64, device=device),
                torch.empty(V + 1, dtype=torch.int32, device=device))
    key = (dev, _raw_stream(dev), n, V)
    ws = _workspaces.get(key)
    if ws is None:
        if len(_workspaces) >= _MAX_WORKSPACES:
            _workspaces.clear()
        ws = _workspaces[key] = (torch.empty(n, dtype=torch.int64, device=device),
                                 torch.empty(V + 1, dtype=torch.int32, device=device))
    return ws


def _backward(ids: torch.Tensor, grad_out: torch.Tensor, V: int, padding_idx: int | None,
              kind: int, out: torch.Tensor | None = None, plan: tuple | None = None,
              config: tuple | None = None) -> torch.Tensor:
    """grad_weight (V, E). ``kind``: TORCH_SORT v1, ONE_BLOCK_SORT v2, SCAN v3, BLOCK_SCAN v4 (at
    the block-scan ``config``, default BLOCK_SCAN_DEFAULT); each falls back to the next simpler
    kind past its limits (``configs.backward_path``). ``out``: an optional contiguous (V, E) buffer
    to write into (tests pass a NaN-filled one, to show that every element is written)."""
    E = grad_out.shape[-1]
    n = ids.numel()
    grad_out = grad_out.reshape(n, E)
    if not grad_out.is_contiguous():
        grad_out = grad_out.contiguous()
    if out is None:
        grad_w = torch.empty(V, E, dtype=grad_out.dtype, device=grad_out.device)
    else:
        if tuple(out.shape) != (V, E) or out.dtype != grad_out.dtype or not out.is_contiguous():
            raise ValueError(f"embedding backward: 'out' must be a contiguous ({V}, {E}) {grad_out.dtype} "
                             f"tensor, got {tuple(out.shape)} {out.dtype}")
        grad_w = out
    if V == 0 or E == 0:
        return grad_w
    if n >= 2**31:
        raise ValueError(f"embedding backward: {n} ids; at most 2^31 - 1 are supported (int32 segment starts)")
    dev = grad_out.get_device()
    _, _, sk, gk, wave = plan or _plan(grad_out.dtype, ids.dtype, dev)
    flat = ids.reshape(-1)
    pad = -1 if padding_idx is None else padding_idx % V
    cfg = config or BLOCK_SCAN_DEFAULT
    path = backward_path(kind, n, V, E, cfg)
    if path == BLOCK_SCAN:
        k = _block_scan_kernel(grad_out.dtype, ids.dtype, dev, cfg)
        k(-(-V // cfg[2]), cfg[0] * 32, flat, grad_out, grad_w, n, V, E, pad, shmem=block_scan_shmem(n, E, cfg))
        return grad_w
    if path == SCAN:
        k = _scan_kernel(grad_out.dtype, ids.dtype, scan_chunks(E), dev)
        k(-(-V // SCAN_ROWS_PER_BLOCK), SCAN_THREADS, flat, grad_out, grad_w, n, V, E, pad, shmem=n * 4)
        return grad_w
    if path == ONE_BLOCK_SORT:
        sorted_pos, row_start = _workspace(n, V, grad_out.device, dev)
        n_pow2 = 1 << max(0, (n - 1).bit_length())
        sk(1, _SORT_THREADS, flat, sorted_pos, row_start, n, V, n_pow2, shmem=n_pow2 * 8)
    else:
        # Out-of-range ids become V so that they sort after every row and match none.
        keyed = torch.where((flat >= 0) & (flat < V), flat.long(), torch.full_like(flat, V, dtype=torch.int64))
        sorted_ids, sorted_pos = torch.sort(keyed, stable=True)
        rows = torch.arange(V + 1, dtype=torch.int64, device=grad_out.device)
        row_start = torch.searchsorted(sorted_ids, rows, out_int32=True)  # first index with id >= v
    gk(max(1, min(wave, -(-V * 32 // _THREADS))), _THREADS, row_start, sorted_pos, grad_out, grad_w, V, E, pad)
    return grad_w


# --------------------------------------------------------------------------- autograd + custom op


# ``config``: the block-scan configuration as a list (what a custom op's schema can carry); the
# forward op takes it only to hand it to the backward.
@torch.library.custom_op("tilewise::embedding_forward", mutates_args=())
def _embedding_op(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int, kind: int,
                  config: list[int]) -> torch.Tensor:
    return _forward(ids, weight)


@_embedding_op.register_fake
def _(ids, weight, padding_idx, kind, config):
    return weight.new_empty(*ids.shape, weight.shape[1])


@torch.library.custom_op("tilewise::embedding_backward", mutates_args=())
def _embedding_bwd_op(ids: torch.Tensor, grad_out: torch.Tensor, num_rows: int, padding_idx: int,
                      kind: int, config: list[int]) -> torch.Tensor:
    return _backward(ids, grad_out, num_rows, None if padding_idx < 0 else padding_idx, kind,
                     config=tuple(config))


@_embedding_bwd_op.register_fake
def _(ids, grad_out, num_rows, padding_idx, kind, config):
    return grad_out.new_empty(num_rows, grad_out.shape[-1])


def _setup(ctx, inputs, output):
    ids, weight, padding_idx, kind, config = inputs
    ctx.save_for_backward(ids)
    ctx.num_rows = weight.shape[0]
    ctx.padding_idx = padding_idx
    ctx.kind = kind
    ctx.config = config


def _bwd(ctx, grad):
    (ids,) = ctx.saved_tensors
    if not ctx.needs_input_grad[1]:
        return None, None, None, None, None
    gw = _embedding_bwd_op(ids, grad.contiguous(), ctx.num_rows, ctx.padding_idx, ctx.kind, ctx.config)
    return None, gw, None, None, None


_embedding_op.register_autograd(_bwd, setup_context=_setup)


class _EmbeddingFunction(torch.autograd.Function):
    """Eager path: an autograd.Function costs a few microseconds of host time less per call than
    the custom op's dispatch, and at the classifier's sizes host time is the whole cost."""

    @staticmethod
    def forward(ctx, ids, weight, padding_idx, kind, config):
        # ids are kept as an attribute, not through save_for_backward: they are an input that does
        # not require grad, and the saved-tensor bookkeeping (version counters, unpacking) is host
        # time on every step. The ids must then not be modified in place before backward (as for
        # any input the caller passes to a training step). They live as long as the autograd graph
        # (retain_graph=True keeps working), as saved tensors would.
        plan = _plan(weight.dtype, ids.dtype, weight.get_device())
        ctx.ids, ctx.num_rows, ctx.padding_idx, ctx.kind, ctx.config, ctx.plan = (
            ids, weight.shape[0], padding_idx, kind, config, plan)
        return _forward(ids, weight, plan)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[1]:
            return None, None, None, None, None
        pad = None if ctx.padding_idx < 0 else ctx.padding_idx
        gw = _backward(ctx.ids, grad, ctx.num_rows, pad, ctx.kind, plan=ctx.plan, config=ctx.config)
        return None, gw, None, None, None


def _run(ids, weight, padding_idx, kind, config=BLOCK_SCAN_DEFAULT):
    ids = _check(ids, weight, padding_idx)
    pad = -1 if padding_idx is None else padding_idx.__index__() % weight.shape[0]  # a plain int (NumPy's too)
    if torch.compiler.is_compiling():  # torch.compile traces the custom op (it has a fake impl)
        return _embedding_op(ids, weight, pad, kind, list(config))
    return _EmbeddingFunction.apply(ids, weight, pad, kind, config)


def v1_naive(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    return _run(ids, weight, padding_idx, TORCH_SORT)


def v2_fused_sort(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    return _run(ids, weight, padding_idx, ONE_BLOCK_SORT)


def v3_scan(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    return _run(ids, weight, padding_idx, SCAN)


def v4_block_scan(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None, *,
                  config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """``config``: the backward's block-scan (warps, ids loaded at once a thread, table rows a block),
    BLOCK_SCAN_DEFAULT (None) or one of BLOCK_SCAN_EXTRA (fp32 tables with int64 ids only); it
    travels with the autograd graph to this call's backward."""
    return _run(ids, weight, padding_idx, BLOCK_SCAN, block_scan_config(config))


VARIANTS = {"v1_naive": v1_naive, "v2_fused_sort": v2_fused_sort, "v3_scan": v3_scan,
            "v4_block_scan": v4_block_scan}


def _cpu_embedding(ids, weight, padding_idx):
    """The one CPU rule with the kernels' contract: ``reference`` on the ids in range, NaN rows (and no
    gradient) for the others, where F.embedding would raise."""
    V, E = weight.shape
    ok = (ids >= 0) & (ids < V)
    if V == 0:
        return weight.new_full((*ids.shape, E), float("nan"))
    rows = reference(torch.where(ok, ids, torch.zeros_like(ids)), weight, padding_idx)
    return torch.where(ok[..., None], rows, float("nan"))


def embedding(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None, *,
              variant: str | None = None, config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Rows of ``weight`` picked by ``ids``, differentiable in ``weight`` (deterministically).

    ids:         CUDA tensor of any shape S, int64 or int32; values in [0, num_rows) (others give
                 NaN rows forward and no gradient).
    weight:      CUDA tensor (num_rows, dim), float32 / float16 / bfloat16, contiguous. CPU ids and
                 weight run the PyTorch reference (the same contract).
    padding_idx: like ``F.embedding``: that row gets no gradient (its forward rows are still read).
    variant:     ``None`` = ``v4_block_scan`` (no sort: while the ids and a block's partial rows fit
                 in shared memory and rows x ids <= 2^33; past that v3_scan, up to 12288 ids,
                 rows x ids <= 2^28 and dim <= 256; past that v2's one-block sort, up to 8192 ids
                 and 65535 rows; past that v1's torch.sort), or a key of ``VARIANTS``.
    config:      v4_block_scan's block-scan configuration (``v4_block_scan``); default None, the
                 measured BLOCK_SCAN_DEFAULT.
    Returns (*S, dim) in weight's dtype. The backward writes grad_weight (num_rows, dim) in
    weight's dtype, accumulated in float32 in position order.
    """
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"embedding: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    variant = variant or "v4_block_scan"
    if config is not None and variant != "v4_block_scan":
        raise ValueError(f"embedding: 'config' is v4_block_scan's block-scan configuration; {variant} takes none")
    if runs_reference("embedding", {"weight": weight, "ids": ids}):
        _check(ids, weight, padding_idx, cpu=True)
        return _cpu_embedding(ids, weight, padding_idx)
    if config is None:
        return VARIANTS[variant](ids, weight, padding_idx)
    return VARIANTS[variant](ids, weight, padding_idx, config=config)
