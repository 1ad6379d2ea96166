"""cross_entropy: loss of logits (N, C) against integer targets, with its gradient in the same pass.

Versions:
    v1_torch:  F.cross_entropy (log-softmax, gather, reduction; backward re-reads the logits and
               the saved log-probabilities). The baseline, kept so every version sits in VARIANTS.
    v2_fused:  one Triton kernel, a row (or a tile of several short rows) in registers: reads
               the logits once and, when a gradient is needed, writes dL/dlogits in the same pass.
               Rows up to MAX_FUSED classes. bound: copy bandwidth on N x C x itemsize x 2.
    v3_online: any C (a 128k vocabulary): pass 1 keeps a running max, sum of exp and sum of
               logits (with smoothing); pass 2 re-reads the row (from L2, with a persistent
               grid that keeps few rows in flight) and writes the gradient. bound: as v2 when the re-read hits L2.
    v5_cluster_cuda: v4's design in CUDA C thread-block clusters (cluster.cu; Triton 3.6
               cannot build v4): a row split over 2-8 CTAs in registers, max / sum of exp / sum
               of x reduced across the cluster in distributed shared memory, the loss and the
               gradient written in the same pass: one read, one write. C up to 262144 (fp32 131072
               per 8 x 512-thread cluster, 262144 with 1024 threads); rows whose length, stride and
               start are multiples of 16 bytes. The default past MAX_FUSED where that holds.
               bound: copy bandwidth on N x C x itemsize x 2.
    v6_cluster_pipe: v5 in a persistent grid of resident clusters, each thread copying its vectors
               of the next row into shared memory (cp.async, two row slices a block) while the
               current row is reduced, exchanged and written: loads in flight through the cluster
               barriers. C up to 131072. bound: as v5. Measured slower than v5
               (docs/tuning/rowwise.md, "Pipelined v6").
    v7_cluster_tma: softmax's v7 pipeline (cluster.cu, rc_cross_entropy_tma): each CTA's
               slice of a row arrives by one bulk copy (TMA) into shared memory, the next row's
               copy starts right after the row's single cluster barrier; every warp's (max, sum of
               exp, sum of x) exchanged through distributed shared memory; one exp an element.
               2-byte logits, C up to 131072; the default there (else v5). bound: as v5.
               (docs/tuning/rowwise.md, "Cross-entropy on the TMA pipeline")
    v4_cluster: v2 for C up to 131072: each row split over a cluster of up to 8 CTAs (Triton
               num_ctas, sm_90), 16384 classes each in registers, reductions across the cluster
               in distributed shared memory: one read, one write. Experimental, not the default
               until measured (Policy.triton_cluster); raises NotImplementedError for C > 16384 where
               this Triton cannot build multi-CTA kernels (softmax.cluster_unsupported_reason;
               docs/tuning/rowwise.md, "Triton multi-CTA v4_cluster").

The forward writes the gradient for an upstream gradient of 1 (the common case: the loss is the
last op). Backward returns it unchanged when the upstream gradient is 1 (decided on the device by
a small kernel that scales only otherwise: no host sync), else scales it in place (mean/sum: by a
scalar; none: by row, a new tensor). In eager
mode backward drops its own reference before returning the gradient, so AccumulateGrad adopts it
as .grad without a copy: peak extra memory is the gradient itself (+ N x 4 B of row losses).

Loss of row i with smoothing e:  lse_i - (1 - e) x[i, t_i] - (e / C) sum_j x[i, j]
Gradient:                        softmax(x_i)_j - (1 - e) [j == t_i] - e / C, times 1/n_valid for
                                 'mean'; rows whose target is ignore_index: loss 0, gradient 0.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ... import settings
from ...cost import Cost
from .._checks import check_kernel_inputs, runs_reference
from ...runtime.triton_launch import cdiv as _cdiv, launch as _tl_launch
from .configs import CAPTURABLE_BLOCK, CLUSTER_SLICE, DEFAULT_POLICY, MAX_CLUSTER, MAX_FUSED, SCALE_BLOCK, Policy, \
    default_variant as _default_variant, fused_config, online_config, scale_programs, triton_cluster_config
from .softmax import _block_rows, _online_step
from .softmax import _require_cluster, cluster_unsupported_reason  # noqa: F401 (re-exported)

_TARGET_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8)
_REDUCTIONS = ("mean", "sum", "none")


def reference(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean",
              ignore_index: int = -100, label_smoothing: float = 0.0) -> torch.Tensor:
    """F.cross_entropy in fp32: reads the logits once forward; its backward reads them again
    (through the saved log-probabilities) and writes the gradient."""
    return F.cross_entropy(logits.float(), target.long(), reduction=reduction,
                           ignore_index=ignore_index, label_smoothing=label_smoothing)


def cost(N: int, C: int, dtype: torch.dtype = torch.float32, grad: bool = True) -> Cost:
    """Read the logits once; with grad, write dL/dlogits once (targets and loss are negligible).
    ~6 FLOPs an element with the gradient (max, exp, sum, sum of x, scale, subtract)."""
    b = dtype.itemsize
    n = N * C
    return Cost(flops=(6 if grad else 4) * n, bytes=(2 if grad else 1) * n * b + N * 8)


@triton.jit
def _ce_kernel(X, T, LOSS, DX, M, N, stride_xm, stride_dxm, ignore_index, smoothing, grad_scale,
               ROWS: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
               HAS_GRAD: tl.constexpr, SMOOTH: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    for rb in range(tl.program_id(0), tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows, rmask = _block_rows(rb, M, ROWS)
        r64 = rows.to(tl.int64)
        t = tl.load(T + r64, mask=rmask, other=ignore_index).to(tl.int64)
        valid = rmask & (t != ignore_index)
        tt = tl.where(valid, t, 0)
        xrow = X + r64[:, None] * stride_xm
        x_t = tl.load(X + r64 * stride_xm + tt, mask=valid, other=0.0).to(tl.float32)
        if ONE_PASS:
            mask = rmask[:, None] & (cols[None, :] < N)
            x = tl.load(xrow + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
            m = tl.max(x, 1)
            m = tl.where(m == float("-inf"), 0.0, m)
            e = tl.exp(x - m[:, None])
            s = tl.sum(e, 1)
            if SMOOTH:
                sx = tl.sum(tl.where(mask, x, 0.0), 1)
        else:
            # Running row max (one reduction a chunk), per-lane sums rescaled by one scalar exp
            # a chunk: one exp an element, not two (the exp unit bounded pass 1 on the H200);
            # the next chunk's load is issued before this chunk's math (32 KB an SM in flight).
            m_run = tl.full([ROWS], float("-inf"), tl.float32)
            s_vec = tl.zeros([ROWS, BLOCK], tl.float32)
            sx = tl.zeros([ROWS], tl.float32)
            x_nxt = tl.load(xrow + cols[None, :], mask=rmask[:, None] & (cols[None, :] < N),
                            other=float("-inf"), eviction_policy="evict_last")
            for start in range(0, N, BLOCK):
                c = start + cols
                xc = x_nxt.to(tl.float32)
                cn = c + BLOCK
                x_nxt = tl.load(xrow + cn[None, :], mask=rmask[:, None] & (cn[None, :] < N),
                                other=float("-inf"), eviction_policy="evict_last")
                m_run, s_vec = _online_step(m_run, s_vec, xc)
                if SMOOTH:
                    mk = rmask[:, None] & (c[None, :] < N)
                    sx += tl.sum(tl.where(mk, xc, 0.0), 1)
            m = tl.where(m_run == float("-inf"), 0.0, m_run)
            s = tl.sum(s_vec, 1)
        lse = m + tl.log(s)
        loss = lse - (1.0 - smoothing) * x_t
        if SMOOTH:
            loss -= smoothing / N * sx
        tl.store(LOSS + r64, tl.where(valid, loss, 0.0), mask=rmask)
        if HAS_GRAD:
            # Zero where no softmax exists (a row of only -inf): no NaN in the gradient.
            inv = tl.where(valid & (s > 0), grad_scale / s, 0.0)
            hit = (1.0 - smoothing) * grad_scale
            off = smoothing / N * grad_scale
            drow = DX + r64[:, None] * stride_dxm
            vm = valid[:, None]
            if ONE_PASS:
                g = e * inv[:, None] - tl.where(cols[None, :] == tt[:, None], hit, 0.0) - off
                tl.store(drow + cols[None, :], tl.where(vm, g, 0.0).to(DX.dtype.element_ty),
                         mask=mask)
            else:
                x_nxt = tl.load(xrow + cols[None, :], mask=rmask[:, None] & (cols[None, :] < N),
                                other=float("-inf"), eviction_policy="evict_first")
                for start in range(0, N, BLOCK):
                    c = start + cols
                    mk = rmask[:, None] & (c[None, :] < N)
                    xc = x_nxt.to(tl.float32)
                    cn = c + BLOCK
                    x_nxt = tl.load(xrow + cn[None, :], mask=rmask[:, None] & (cn[None, :] < N),
                                    other=float("-inf"), eviction_policy="evict_first")
                    g = (tl.exp(xc - m[:, None]) * inv[:, None]
                         - tl.where(c[None, :] == tt[:, None], hit, 0.0) - off)
                    tl.store(drow + c[None, :], tl.where(vm, g, 0.0).to(DX.dtype.element_ty),
                             mask=mk, eviction_policy="evict_first")


def default_variant(logits: torch.Tensor, policy: Policy | None = None) -> str:
    """The version ``variant=None`` runs for these logits under ``policy`` (default DEFAULT_POLICY;
    the rule: ``configs.default_variant``)."""
    policy = policy or DEFAULT_POLICY
    C = logits.shape[-1] if logits.dim() == 2 else 0
    return _default_variant(C, policy, lambda: _cuda_cluster_ok(logits), lambda: _tma_ok(logits, policy))


def _tma_ok(logits, policy: Policy) -> bool:
    """v7_cluster_tma takes these logits (2-byte, C <= 131072, 16-byte rows; see _cuda_cluster_ok)."""
    from . import cluster as rc

    return rc.tma_unsupported_reason(logits, kind="ce", config=policy.tma_ce) is None


def _cuda_cluster_ok(logits) -> bool:
    """v5_cluster_cuda takes these logits (and a gradient laid out like them, the contiguous one
    the forward allocates): sm_90+, rows of whole 16-byte vectors, C <= its largest config."""
    if settings.triton_interpret() or not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        return False
    from . import cluster as rc

    return rc.unsupported_reason(logits, kind="ce") is None


def _check(logits, target, reduction, ignore_index, label_smoothing, cpu=False):
    check_kernel_inputs("cross_entropy", {"logits": logits, "target": target}, interpreter=True, cpu=cpu)
    if logits.dim() != 2:
        raise ValueError(f"cross_entropy: 'logits' must be 2-D (N, C), got shape {tuple(logits.shape)}")
    if target.dtype not in _TARGET_DTYPES:
        raise ValueError(f"cross_entropy: 'target' must hold integer class indices (int64/int32/...), "
                         f"got {target.dtype}")
    if target.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy: 'target' must have shape ({logits.shape[0]},), one class per row of "
                         f"'logits' {tuple(logits.shape)}; got {tuple(target.shape)}")
    if target.device != logits.device:
        raise ValueError(f"cross_entropy: 'target' is on {target.device}, logits on {logits.device}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    # int() and float() below would take 1.5 and "0.1" silently, and a string fails the comparison
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise ValueError(f"cross_entropy: ignore_index must be an int, got {ignore_index!r}")
    if not isinstance(label_smoothing, numbers.Real) or isinstance(label_smoothing, bool):
        raise ValueError(f"cross_entropy: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if logits.shape[1] == 0 and logits.shape[0] > 0:
        raise ValueError("cross_entropy: 'logits' has no classes (C = 0)")


def _bad_targets(t: torch.Tensor, C: int, ignore_index: int) -> torch.Tensor:
    return (t != ignore_index) & ((t < 0) | (t >= C))


def _target_counts(target: torch.Tensor, C: int, ignore_index: int) -> torch.Tensor:
    """(targets out of range, rows that count) as one int64 tensor of 2, on target's device (no sync)."""
    t = target.long()
    return torch.stack([_bad_targets(t, C, ignore_index).sum(), (t != ignore_index).sum()])


def _checked_count(n_bad: int, n_valid: int, target: torch.Tensor, C: int, ignore_index: int, what: str,
                   classes: str) -> int:
    """n_valid, or the error naming the first bad target (the message: ``what``, then ``classes`` with C)."""
    if n_bad:
        t = target.long()
        first = t[_bad_targets(t, C, ignore_index)][0].item()
        raise ValueError(f"{what}: {n_bad} target(s) out of range [0, {C}) ({classes.format(C=C)}) and not "
                         f"ignore_index={ignore_index}, e.g. {first}")
    return n_valid


def _count_valid(target: torch.Tensor, C: int, ignore_index: int, what: str = "cross_entropy",
                 classes: str = "'logits' has C = {C} classes") -> int:
    """Number of rows that count; raises on a target outside [0, C) other than ignore_index. One small
    reduction and one host sync (tens of us; the logits take ~1 ms at 8192 x 128k)."""
    if target.numel() == 0:
        return 0
    n_bad, n_valid = _target_counts(target, C, ignore_index).tolist()
    return _checked_count(n_bad, n_valid, target, C, ignore_index, what, classes)


def _launch_cluster(logits, target, reduction, ignore_index, label_smoothing, compute_grad, variant, policy):
    """v5_cluster_cuda / v6_cluster_pipe (N > 0), with no idle GPU for the target
    check: one small kernel checks and counts the targets on the device (bad ones become
    ignore_index, so the loss kernel never reads outside a row) and copies the count of bad ones
    to pinned host memory; the loss kernel is launched next and reads 1/(rows that count) of
    'mean' from the device; only then does the host wait, for the copy (done long before the
    loss kernel ends), and raise on a bad target. Counting, syncing and only then launching would
    leave the GPU idle for the host's launch latency on every call."""
    from . import cluster as rc

    N, C = logits.shape
    dev = logits.device
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    t = target if target.is_contiguous() else target.contiguous()
    pipe = variant == "v6_cluster_pipe"
    tma = variant == "v7_cluster_tma"
    grad = torch.empty((N, C) if compute_grad else (0,), device=dev, dtype=logits.dtype)
    ts = (x, *((grad,) if compute_grad else ()))
    why = (rc.pipe_unsupported_reason(*ts, kind="ce") if pipe
           else rc.tma_unsupported_reason(*ts, kind="ce", config=policy.tma_ce) if tma
           else rc.unsupported_reason(*ts, kind="ce"))
    if why:
        raise ValueError(f"cross_entropy.{variant}: {why}; use v3_online (variant=None)")
    t_safe = torch.empty(N, device=dev, dtype=torch.int64)
    inv_n = torch.empty(1, device=dev, dtype=torch.float32)
    bad = torch.empty(1, device=dev, dtype=torch.int64)
    _tl_launch(_ce_targets_kernel, (1,), t, t_safe, bad, inv_n, N, C, ignore_index, MEAN=reduction == "mean",
                             BLOCK=CAPTURABLE_BLOCK, ADD=False)
    bad_host = torch.empty(1, dtype=torch.int64, pin_memory=True)
    bad_host.copy_(bad, non_blocking=True)
    counted = torch.cuda.Event()
    counted.record()
    loss_rows = torch.empty(N, device=dev, dtype=torch.float32)
    if tma:
        rc.cross_entropy_tma(x, t_safe, loss_rows, grad if compute_grad else None, ignore_index,
                             float(label_smoothing), 1.0, config=policy.tma_ce,
                             scale_dev=inv_n if reduction == "mean" else None)
    else:
        rc.cross_entropy(x, t_safe, loss_rows, grad if compute_grad else None, ignore_index, float(label_smoothing),
                         1.0, pipe=pipe, scale_dev=inv_n if reduction == "mean" else None)
    counted.synchronize()
    if int(bad_host[0]):
        _count_valid(target, C, ignore_index)  # raises, naming a bad target
    if reduction == "none":
        loss = loss_rows.to(logits.dtype)
    elif reduction == "sum":
        loss = loss_rows.sum().to(logits.dtype)
    else:  # NaN when no row counts (inv_n is NaN then), as F.cross_entropy
        loss = (loss_rows.sum() * inv_n[0]).to(logits.dtype)
    return loss, grad


def _rows_kernel(x, t, loss_rows, grad, grad_scale, ignore_index, label_smoothing, one_pass):
    """v2_fused's (``one_pass``: a row in registers, C <= MAX_FUSED) or v3_online's launch: row losses
    into ``loss_rows`` (fp32) and, unless ``grad`` is None, the gradient times ``grad_scale`` into
    ``grad``, which may be ``x`` itself (a program reads all of a row before it writes any of it).
    Targets must be checked already (ignore_index or in [0, C))."""
    N, C = x.shape
    has_grad = grad is not None
    dx, sdx = (grad, grad.stride(0)) if has_grad else (loss_rows, 0)  # a placeholder pointer, never written
    if one_pass:
        rows, block, warps = fused_config(C)
        grid = (_cdiv(N, rows),)
    else:
        rows, (block, warps, progs) = 1, online_config(x, C * x.element_size(), N)
        grid = (progs,)
    _tl_launch(_ce_kernel, grid, x, t, loss_rows, dx, N, C, x.stride(0), sdx, ignore_index, float(label_smoothing),
               grad_scale, ROWS=rows, BLOCK=block, ONE_PASS=one_pass, HAS_GRAD=has_grad, SMOOTH=label_smoothing > 0,
               num_warps=warps)


def _launch(logits, target, reduction, ignore_index, label_smoothing, compute_grad, variant,
            policy: Policy = DEFAULT_POLICY):
    N, C = logits.shape
    if variant in ("v5_cluster_cuda", "v6_cluster_pipe", "v7_cluster_tma") and N:
        return _launch_cluster(logits, target, reduction, ignore_index, label_smoothing, compute_grad, variant,
                               policy)
    n_valid = _count_valid(target, C, ignore_index)
    dev = logits.device
    grad = torch.empty((N, C) if compute_grad else (0,), device=dev, dtype=logits.dtype)
    if N == 0:
        loss_rows = torch.zeros(0, device=dev, dtype=torch.float32)
    else:
        x = logits if logits.stride(1) == 1 else logits.contiguous()
        t = target if target.is_contiguous() else target.contiguous()
        loss_rows = torch.empty(N, device=dev, dtype=torch.float32)
        scale = 1.0 / n_valid if reduction == "mean" and n_valid else 1.0
        smooth = label_smoothing > 0
        dx = grad if compute_grad else loss_rows  # a placeholder pointer, never written
        sdx = grad.stride(0) if compute_grad else 0
        if variant in ("v2_fused", "v3_online"):
            if variant == "v2_fused" and C > MAX_FUSED:
                raise ValueError(f"cross_entropy.v2_fused: C = {C} does not fit in registers (at most "
                                 f"{MAX_FUSED}); use v3_online or variant=None")
            _rows_kernel(x, t, loss_rows, grad if compute_grad else None, scale, ignore_index, label_smoothing,
                         one_pass=variant == "v2_fused")
        elif variant == "v4_cluster":
            if C > MAX_CLUSTER:
                raise ValueError(f"cross_entropy.v4_cluster: C = {C} exceeds {MAX_CLUSTER} (8 CTAs x "
                                 f"{CLUSTER_SLICE}); use v3_online or variant=None")
            block, warps, ctas = triton_cluster_config(C, x.is_cuda)
            _require_cluster(x, ctas, "cross_entropy")
            _tl_launch(_ce_kernel, (N,), x, t, loss_rows, dx, N, C, x.stride(0), sdx, ignore_index,
                       float(label_smoothing), scale, ROWS=1, BLOCK=block, ONE_PASS=True,
                       HAS_GRAD=compute_grad, SMOOTH=smooth, num_warps=warps, num_ctas=ctas)
        else:
            raise ValueError(f"cross_entropy: unknown variant {variant!r}")
    if reduction == "none":
        loss = loss_rows.to(logits.dtype)
    elif reduction == "sum":
        loss = loss_rows.sum().to(logits.dtype)
    else:  # mean over the rows that count; 0 / 0 = NaN when none does, as F.cross_entropy
        loss = (loss_rows.sum() / n_valid if n_valid else loss_rows.sum() * float("nan")).to(logits.dtype)
    return loss, grad


# ``policy``: ``Policy.pack()``, what a custom op's schema can carry; empty for DEFAULT_POLICY.
@torch.library.custom_op("tilewise::cross_entropy_fwd", mutates_args=())
def _ce_op(logits: torch.Tensor, target: torch.Tensor, reduction: str, ignore_index: int,
           label_smoothing: float, compute_grad: bool, variant: str,
           policy: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(logits, target, reduction, ignore_index, label_smoothing, compute_grad, variant,
                   Policy.unpack(policy))


@_ce_op.register_fake
def _(logits, target, reduction, ignore_index, label_smoothing, compute_grad, variant, policy):
    N, C = logits.shape
    shape = (N,) if reduction == "none" else ()
    g = (N, C) if compute_grad else (0,)
    return (logits.new_empty(shape), logits.new_empty(g))


def _setup(ctx, inputs, output):
    ctx.reduction, ctx.has_grad = inputs[2], inputs[5]
    ctx.mark_non_differentiable(output[1])
    # Autograd would otherwise hand backward a zero-filled (N, C) tensor as the gradient of the
    # non-differentiable second output: a second gradient-sized buffer (peak 2x, measured on the H200;
    # docs/tuning/rowwise.md, "Cross-entropy gradient memory").
    ctx.set_materialize_grads(False)
    ctx.compiled = torch.compiler.is_compiling()
    if ctx.compiled:
        ctx.save_for_backward(output[1])
    else:
        # Eager: hold the gradient in a list that backward empties, so that when backward returns
        # it nothing else references it and AccumulateGrad adopts it as .grad instead of copying
        # it (a copy doubled the peak: 2 x the gradient, measured on the H200). save_for_backward
        # would keep a reference until the graph is freed, after AccumulateGrad ran.
        ctx.holder = [output[1]]


def _grad(ctx, dloss, _dgrad):
    if not ctx.has_grad:
        raise RuntimeError("cross_entropy: the forward ran without grad mode; no gradient was kept")
    if ctx.compiled:
        (g,) = ctx.saved_tensors
    else:
        if not ctx.holder:
            raise RuntimeError("cross_entropy: backward ran a second time (retain_graph=True); the "
                               "gradient written by the forward was handed out by the first backward")
        g = ctx.holder.pop()
    nones = (None,) * 7
    if dloss is None:  # grads are not materialized: the loss did not reach the output
        return (None,) + nones
    if ctx.reduction == "none":
        return (g * dloss.to(g.dtype)[:, None],) + nones
    if ctx.compiled or torch.compiler.is_compiling() or type(g) is not torch.Tensor or type(dloss) is not torch.Tensor:
        # Traced (fake / functional tensors, e.g. AOT autograd tracing the backward): plain ops.
        return (g * dloss.to(g.dtype),) + nones
    # The common case (the loss is the output, dloss = 1): the gradient written in the forward is
    # the answer. Decided on the device, not the host (no sync): a small persistent kernel reads
    # dloss and scales g in place only when it is not 1, so g is touched only when it must be.
    return (scale_unless_one(g, dloss),) + nones  # ours alone now: scaled in place, no second copy


def scale_unless_one(g: torch.Tensor, dloss: torch.Tensor) -> torch.Tensor:
    """``g * dloss`` (dloss one element) in place, decided on the device: untouched when dloss is 1."""
    g = g if g.is_contiguous() else g.contiguous()
    if g.numel():
        d = dloss.reshape(1) if dloss.is_contiguous() else dloss.contiguous().reshape(1)
        progs = scale_programs(g)
        _tl_launch(_scale_unless_one_kernel, (progs,), g, d, g.numel(), BLOCK=SCALE_BLOCK,
                   ITERS=_cdiv(_cdiv(g.numel(), SCALE_BLOCK), progs))
    return g


@triton.jit
def _scale_unless_one_kernel(G, DLOSS, total, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    # Every program reads the scalar; when it is 1 the loop runs zero times (a few us for the
    # whole grid instead of a host sync or a pass over the gradient).
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    s = tl.load(DLOSS).to(tl.float32)
    n = tl.where(s == 1.0, 0, ITERS)
    for i in range(0, n):
        o = (pid + i * nprog).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = o < total
        v = tl.load(G + o, mask=m, other=0.0).to(tl.float32)
        tl.store(G + o, (v * s).to(G.dtype.element_ty), mask=m)


_ce_op.register_autograd(_grad, setup_context=_setup)


def _variant(name):
    def fn(logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0, *, policy=None):
        return cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index,
                             label_smoothing=label_smoothing, variant=name, policy=policy)
    fn.__name__ = name
    return fn


def _torch(logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)


_KERNEL_VARIANTS = ("v2_fused", "v3_online", "v4_cluster", "v5_cluster_cuda", "v6_cluster_pipe", "v7_cluster_tma")
VARIANTS = {"v1_torch": _torch, **{v: _variant(v) for v in _KERNEL_VARIANTS}}


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean",
                  ignore_index: int = -100, label_smoothing: float = 0.0,
                  variant: str | None = None, policy: Policy | None = None) -> torch.Tensor:
    """Cross-entropy of logits against class indices, differentiable in ``logits``.

    logits:          CUDA tensor (N, C), float32 / float16 / bfloat16, unit stride along C
                     (other layouts are copied). N may be 0; C >= 1. CPU tensors run the PyTorch
                     reference (F.cross_entropy in fp32; any variant and policy).
    target:          (N,) integer class indices in [0, C) or ``ignore_index``, same device;
                     anything else raises ValueError (one host sync to check).
    reduction:       'mean' (default; over rows whose target is not ignore_index; NaN when there
                     are none, as PyTorch), 'sum', or 'none' (per-row loss, 0 for ignored rows).
    ignore_index:    target value whose rows give loss 0 and gradient 0 (default -100).
    label_smoothing: e in [0, 1] (default 0): the target distribution is (1-e) one-hot + e/C.
    variant:         None (v2_fused for C <= MAX_FUSED = 16384, else v7_cluster_tma for 2-byte
                     logits of C <= 131072 and v5_cluster_cuda otherwise where their layout and GPU
                     conditions hold, else v3_online; ``configs.default_variant``) or a name of
                     _KERNEL_VARIANTS.
    policy:          a ``configs.Policy`` for this call (None: DEFAULT_POLICY, the measured
                     defaults): what variant=None prefers and v7's configuration.
    Returns the loss in logits' dtype: shape () or (N,) for 'none'. When logits require grad,
    the gradient (N, C, logits' dtype) is written during this call and held for backward: the
    only extra memory of any size.
    """
    if variant is None:
        variant = default_variant(logits, policy) if isinstance(logits, torch.Tensor) else "v2_fused"
    elif variant not in _KERNEL_VARIANTS:
        raise ValueError(f"cross_entropy: unknown variant {variant!r}; choose from "
                         f"{list(_KERNEL_VARIANTS)} (v1_torch is F.cross_entropy)")
    cpu = runs_reference("cross_entropy", {"logits": logits, "target": target}, interpreter=True)
    _check(logits, target, reduction, ignore_index, label_smoothing, cpu=cpu)
    if cpu:
        return reference(logits, target, reduction, int(ignore_index), float(label_smoothing)).to(logits.dtype)
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    packed = [] if policy is None or policy == DEFAULT_POLICY else policy.pack()
    loss, _ = _ce_op(logits, target, reduction, int(ignore_index), float(label_smoothing),
                     compute_grad, variant, packed)
    return loss


# --------------------------------------------------------------------------- capturable path
# Added for the classifier's CUDA-graph step (issue 8): cross_entropy() above checks the targets and
# counts the valid rows with a device-to-host copy, which a CUDA graph cannot capture, and its
# backward reads the upstream gradient on the host. This path does neither: the targets are checked
# and counted on the device, a bad one is recorded in a per-device counter (bad_target_count /
# check_targets read it later, once per epoch say) instead of raising, and the 1/n_valid of 'mean'
# is applied by the backward's scale from a device scalar. It reuses _ce_kernel (v2_fused's one-pass
# configuration) unchanged. Kernels per forward + backward: targets, _ce_kernel, reduction, scale.

_BAD_TARGETS: dict[str, torch.Tensor] = {}


def _bad_counter(device: torch.device) -> torch.Tensor:
    key = str(device)
    c = _BAD_TARGETS.get(key)
    if c is None:
        c = _BAD_TARGETS[key] = torch.zeros(1, dtype=torch.int64, device=device)
    return c


@triton.jit
def _ce_targets_kernel(T, T_SAFE, BAD, INV_N, M, C, ignore_index, MEAN: tl.constexpr, BLOCK: tl.constexpr,
                       ADD: tl.constexpr = True):
    # One program: targets outside [0, C) that are not ignore_index become ignore_index (so the
    # loss kernel never reads outside its row) and are counted into BAD (added to it with ADD, a
    # running counter; written without, so BAD needs no zeroing); INV_N = 1 / rows that count
    # ('mean'; NaN when none does, as F.cross_entropy) or 1 ('sum').
    offs = tl.arange(0, BLOCK)
    n_ok = tl.zeros([BLOCK], tl.int32)
    n_bad = tl.zeros([BLOCK], tl.int32)
    for start in range(0, M, BLOCK):
        o = start + offs
        m = o < M
        t = tl.load(T + o, mask=m, other=ignore_index).to(tl.int64)
        keep = m & (t != ignore_index)
        bad = keep & ((t < 0) | (t >= C))
        ok = keep & (t >= 0) & (t < C)
        tl.store(T_SAFE + o, tl.where(ok, t, ignore_index), mask=m)
        n_ok += ok.to(tl.int32)
        n_bad += bad.to(tl.int32)
    n = tl.sum(n_ok, 0)
    if MEAN:
        inv = tl.where(n > 0, 1.0 / n.to(tl.float32), float("nan"))
    else:
        inv = n.to(tl.float32) * 0.0 + 1.0  # a tensor, like the other branch's
    tl.store(INV_N, inv)
    if ADD:
        tl.store(BAD, tl.load(BAD) + tl.sum(n_bad, 0).to(tl.int64))
    else:
        tl.store(BAD, tl.sum(n_bad, 0).to(tl.int64))


@triton.jit
def _ce_reduce_kernel(LOSS_ROWS, INV_N, OUT, M, BLOCK: tl.constexpr):
    # One program, a fixed order: the same bits every run (no atomics).
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, M, BLOCK):
        o = start + offs
        acc += tl.load(LOSS_ROWS + o, mask=o < M, other=0.0)
    total = tl.sum(acc, 0) * tl.load(INV_N)
    tl.store(OUT, total.to(OUT.dtype.element_ty))


@triton.jit
def _ce_scale_kernel(G, DLOSS, INV_N, total, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    o = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < total
    s = tl.load(DLOSS).to(tl.float32) * tl.load(INV_N)
    g = tl.load(G + o, mask=m, other=0.0).to(tl.float32)
    tl.store(G + o, (g * s).to(G.dtype.element_ty), mask=m)


def _launch_capturable(logits, target, reduction, ignore_index, label_smoothing, compute_grad):
    N, C = logits.shape
    dev = logits.device
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    t = target if target.is_contiguous() else target.contiguous()
    t_safe = torch.empty(N, device=dev, dtype=torch.int64)
    inv_n = torch.empty(1, device=dev, dtype=torch.float32)
    loss_rows = torch.empty(max(N, 1), device=dev, dtype=torch.float32)
    grad = torch.empty((N, C) if compute_grad else (0,), device=dev, dtype=logits.dtype)
    _tl_launch(_ce_targets_kernel, (1,), t, t_safe, _bad_counter(dev), inv_n, N, C, ignore_index,
                             MEAN=reduction == "mean", BLOCK=CAPTURABLE_BLOCK)
    if N:
        rows, block, warps = fused_config(C)
        dx = grad if compute_grad else loss_rows  # a placeholder pointer, never written
        sdx = grad.stride(0) if compute_grad else 0
        # grad_scale 1: 1/n_valid is only known on the device; the backward applies it.
        _tl_launch(_ce_kernel, (_cdiv(N, rows),), x, t_safe, loss_rows, dx, N, C, x.stride(0), sdx, ignore_index,
                                            float(label_smoothing), 1.0, ROWS=rows, BLOCK=block, ONE_PASS=True,
                                            HAS_GRAD=compute_grad, SMOOTH=label_smoothing > 0, num_warps=warps)
    loss = torch.empty((), device=dev, dtype=logits.dtype)
    _tl_launch(_ce_reduce_kernel, (1,), loss_rows, inv_n, loss, N, BLOCK=CAPTURABLE_BLOCK)
    return loss, grad, inv_n


class _CapturableCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, reduction, ignore_index, label_smoothing, compute_grad):
        loss, grad, inv_n = _launch_capturable(logits, target, reduction, ignore_index, label_smoothing,
                                               compute_grad)
        # Held outside save_for_backward so that backward hands the one reference to autograd and
        # AccumulateGrad adopts it as .grad (as cross_entropy's eager path does).
        ctx.holder = [grad, inv_n]
        return loss

    @staticmethod
    def backward(ctx, dloss):
        if not ctx.holder:
            raise RuntimeError("cross_entropy_capturable: backward ran a second time (retain_graph=True)")
        if ctx.holder[0].numel() == 0 and ctx.holder[0].dim() == 1:
            raise RuntimeError("cross_entropy_capturable: the forward ran without grad mode; no gradient was kept")
        g, inv_n = ctx.holder
        ctx.holder = []
        n = g.numel()
        if n:
            d = dloss.reshape(1) if dloss.is_contiguous() else dloss.contiguous().reshape(1)
            _tl_launch(_ce_scale_kernel, (_cdiv(n, 1024),), g, d, inv_n, n, BLOCK=1024)
        return g, None, None, None, None, None


def cross_entropy_capturable(logits: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean",
                             ignore_index: int = -100, label_smoothing: float = 0.0) -> torch.Tensor:
    """``cross_entropy`` without any host synchronization, so that it can be captured in a CUDA
    graph (and lets an eager training loop run ahead of the GPU).

    logits: CUDA tensor (N, C), float32 / float16 / bfloat16, C <= MAX_FUSED (16384); target: (N,)
    integer class indices; reduction 'mean' (default) or 'sum'; ignore_index, label_smoothing as
    ``cross_entropy``. Returns the loss () in logits' dtype.

    Targets are checked on the device: one outside [0, C) that is not ``ignore_index`` does NOT
    raise here; its row counts as ignored (loss 0, gradient 0, not in the mean's count) and it is
    added to a per-device counter: call ``check_targets(device)`` (one host sync) when a host sync
    is affordable, e.g. after each epoch, to raise on it. The gradient is written by the forward
    without the 1/n_valid of 'mean'; the backward scales it in place by upstream x 1/n_valid (one
    pass over N x C; the target row count lives in a device scalar).
    """
    _check(logits, target, reduction, ignore_index, label_smoothing)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy_capturable: reduction must be 'mean' or 'sum', got {reduction!r}")
    if logits.shape[1] > MAX_FUSED:
        raise ValueError(f"cross_entropy_capturable: C = {logits.shape[1]} classes; at most {MAX_FUSED} "
                         f"(the one-pass kernel); use cross_entropy")
    # Decided here: inside Function.forward grad mode is off.
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    return _CapturableCE.apply(logits, target, reduction, int(ignore_index), float(label_smoothing), compute_grad)


def _counter_device(device) -> torch.device:
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def bad_target_count(device: torch.device | str | None = None) -> int:
    """Targets ``cross_entropy_capturable`` found out of range on ``device`` since the last
    reset (a host sync). ``device`` None or "cuda": the current CUDA device."""
    dev = _counter_device(device)
    c = _BAD_TARGETS.get(str(dev))
    return 0 if c is None else int(c.item())


def check_targets(device: torch.device | str | None = None, reset: bool = True) -> None:
    """Raise ValueError if ``cross_entropy_capturable`` saw targets out of range on ``device``
    (one host sync); ``reset`` zeroes the counter (also when it raises)."""
    dev = _counter_device(device)
    n = bad_target_count(dev)
    if reset and str(dev) in _BAD_TARGETS:
        _BAD_TARGETS[str(dev)].zero_()
    if n:
        raise ValueError(f"cross_entropy_capturable: {n} target(s) out of range of the classes and not "
                         f"ignore_index were seen on {dev} (their rows were ignored)")
