"""linear_cross_entropy: the LM head and its loss, ``cross_entropy(x @ weight.T + bias, target)``,
without the (N, V) logits.

The rows go in chunks: a chunk's logits (chunk x V, x's dtype) come from one GEMM, the cross-entropy
kernel writes their gradient over them in place (v2_fused's ``_ce_kernel`` for rows in registers;
past that the CUDA C cluster kernel, v7, which reads a chunk once, where it takes the chunk, else
v3_online's two passes), and two more GEMMs turn it into the chunk's dx rows and add its share of dW
(and the column sums into db). Everything is computed in the forward, as the loss is the last op;
backward scales the held gradients by the upstream gradient on the device (untouched when it is 1).

Memory beyond the inputs: one chunk of logits, dx (N x H) and dW (V x H, weight's dtype), db
(V, fp32) when there is a bias; never N x V. Time: three GEMMs of 2 N V H FLOPs each (cuBLAS
through torch.mm) and the cross-entropy's read / write of each chunk.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from ... import settings
from ...cost import Cost
from .._autocast import autocast_inputs
from .._checks import runs_reference
from . import cluster as rc
from .configs import MAX_FUSED, lce_chunk_rows
from .cross_entropy import _checked_count, _count_valid, _rows_kernel, _target_counts, scale_unless_one


def reference(x, weight, target, bias=None, reduction="mean", ignore_index=-100, label_smoothing=0.0, softcap=None):
    """The logits in full (fp32, or fp64 for fp64 inputs), softcapped if asked, then F.cross_entropy."""
    dt = torch.promote_types(x.dtype, torch.float32)
    logits = torch.nn.functional.linear(x.reshape(-1, x.shape[-1]).to(dt), weight.to(dt),
                                        None if bias is None else bias.to(dt))
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return torch.nn.functional.cross_entropy(logits, target.reshape(-1).long(), reduction=reduction,
                                             ignore_index=ignore_index, label_smoothing=label_smoothing)


def cost(N: int, H: int, V: int, dtype: torch.dtype = torch.bfloat16) -> Cost:
    """Forward with its gradients: 3 GEMMs of 2 N V H FLOPs; bytes: x, W read three times, the logits
    written, read twice and written once more (in place), dx and dW written."""
    e = dtype.itemsize
    return Cost(6.0 * N * V * H, e * (3 * (N * H + V * H) + 4 * N * V + N * H + V * H))


def chunk_rows_for(N: int, H: int, V: int, dtype: torch.dtype, need=(True, True, False)) -> int:
    """Rows a chunk (configs.lce_chunk_rows): the largest the memory budget allows beside the
    gradients in ``need`` (dx, dW, db), a multiple of 128 (whole GEMM tiles)."""
    return lce_chunk_rows(N, H, V, dtype.itemsize, *(bool(n) for n in need))


def _check(x, weight, target, bias, reduction, chunk_rows, ignore_index, label_smoothing, softcap=None, cpu=False):
    for name, t in (("x", x), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"linear_cross_entropy: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if not x.is_cuda and not ((cpu or settings.triton_interpret()) and x.device.type == "cpu"):
        raise ValueError(f"linear_cross_entropy: 'x' is on {x.device}; tilewise kernels need CUDA tensors "
                         f"(use tilewise.linear_cross_entropy for CPU tensors)")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"linear_cross_entropy: 'x' has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
        raise ValueError(f"linear_cross_entropy: 'target' must hold integer class indices, got {target.dtype}")
    if target.device != x.device:
        raise ValueError(f"linear_cross_entropy: 'target' is on {target.device}, 'x' on {x.device}")
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise ValueError(f"linear_cross_entropy: 'ignore_index' must be an int, got {ignore_index!r}")
    if not isinstance(label_smoothing, numbers.Real) or isinstance(label_smoothing, bool) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"linear_cross_entropy: 'label_smoothing' must be a number in [0, 1], got {label_smoothing!r}")
    if x.dim() < 1 or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"linear_cross_entropy: 'weight' has shape {tuple(weight.shape)}; 'x' of shape "
                         f"{tuple(x.shape)} needs (V, {x.shape[-1] if x.dim() else '?'})")
    if target.shape != x.shape[:-1]:
        raise ValueError(f"linear_cross_entropy: 'target' has shape {tuple(target.shape)} but 'x' of shape "
                         f"{tuple(x.shape)} needs {tuple(x.shape[:-1])} (x's leading dims)")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"linear_cross_entropy: 'weight' is {weight.dtype} on {weight.device}; 'x' is {x.dtype} "
                         f"on {x.device} (they must match)")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != weight.shape[:1]
                             or bias.device != x.device):
        raise ValueError(f"linear_cross_entropy: 'bias' must be a tensor of shape ({weight.shape[0]},) on "
                         f"{x.device}, got {bias if not isinstance(bias, torch.Tensor) else tuple(bias.shape)}")
    if softcap is not None and (not isinstance(softcap, numbers.Real) or isinstance(softcap, bool)
                                or not 0 < softcap < float("inf")):
        raise ValueError(f"linear_cross_entropy: 'softcap' must be a finite number > 0 or None, got {softcap!r}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"linear_cross_entropy: 'reduction' must be 'mean' or 'sum', got {reduction!r}")
    if chunk_rows is not None and (not isinstance(chunk_rows, numbers.Integral) or isinstance(chunk_rows, bool)
                                   or chunk_rows < 1):
        raise ValueError(f"linear_cross_entropy: 'chunk_rows' must be an int >= 1 or None, got {chunk_rows!r}")


_CLASSES = "'target' indexes the rows of 'weight', which has V = {C}"


class TargetCount:
    """The rows of ``target`` that count for ``linear_cross_entropy`` (not ``ignore_index``), counted on the
    target's device when made, read on the host when the loss needs them; a target outside [0, V) raises then.

    Why: the loss scales its gradients by 1 / (rows that count), a host number. Counted inside the loss, the
    host waits for everything queued before the count, the whole forward, and then the GPU idles while the
    host launches the loss's first GEMM (~0.5 ms a step in the llama bench, docs/tuning/bench.md, "llama: the
    stream's idle time"). Made as soon as the labels are known, before the forward is queued, the count's copy
    to pinned memory is done long before the loss reads it: the host waits for that copy, the forward stays
    queued. ``apply_tilewise``'s fused loss does this.

        count = TargetCount(target, weight.shape[0])   # before the model's forward
        loss = linear_cross_entropy(x, weight, target, target_count=count)

    target: the tensor later passed as ``linear_cross_entropy``'s target (the same object); V: the head's rows.
    """

    def __init__(self, target: torch.Tensor, V: int, ignore_index: int = -100):
        if not isinstance(target, torch.Tensor) or target.dtype.is_floating_point or target.is_complex():
            raise ValueError(f"TargetCount: 'target' must be an integer tensor, got "
                             f"{target.dtype if isinstance(target, torch.Tensor) else type(target).__name__}")
        for name, v in (("V", V), ("ignore_index", ignore_index)):
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise ValueError(f"TargetCount: '{name}' must be an int, got {v!r}")
        if V < 1:
            raise ValueError(f"TargetCount: 'V' must be >= 1, got {V}")
        self.target, self.V, self.ignore_index = target, int(V), int(ignore_index)
        self._event = None
        counts = _target_counts(target.reshape(-1), self.V, self.ignore_index)
        if counts.is_cuda:  # copied behind the count kernels; result() waits for this copy alone
            self._host = torch.empty(2, dtype=torch.int64, pin_memory=True)
            self._host.copy_(counts, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(counts.device))
        else:
            self._host = counts

    def result(self) -> int:
        """The rows that count; raises ValueError on a target outside [0, V) other than ignore_index."""
        if self._event is not None:
            self._event.synchronize()
        n_bad, n_valid = self._host.tolist()
        return _checked_count(n_bad, n_valid, self.target.reshape(-1), self.V, self.ignore_index,
                              "linear_cross_entropy", _CLASSES)

    def made_for(self, target: torch.Tensor, V: int, ignore_index: int) -> bool:
        return self.target is target and self.V == V and self.ignore_index == ignore_index


def _forward(x2, weight, t, bias, reduction, ignore_index, label_smoothing, chunk_rows, need, softcap=None,
             n_valid=-1):
    """loss (fp32 scalar), dx, dW, db (None where not needed) for an upstream gradient of 1. n_valid: the rows
    that count if known (``TargetCount``), else -1: counted here (raises on a bad target; one host sync)."""
    N, H = x2.shape
    V = weight.shape[0]
    if n_valid < 0:
        n_valid = _count_valid(t, V, ignore_index, "linear_cross_entropy", _CLASSES)
    scale = 1.0 / n_valid if reduction == "mean" and n_valid else 1.0
    dev = x2.device
    loss_rows = torch.empty(N, device=dev, dtype=torch.float32)
    dx = torch.empty_like(x2) if need[0] else None
    # dW and db are written by the first chunk (beta = 0: their contents are not read), so they start
    # empty: a zero fill of dW is a V x H write, and the first addmm's read of it another (2 x 0.5 GB
    # at Llama 3's V 128,256, H 2,048 in bf16). No rows, no chunk: zeros.
    dw = (torch.empty_like if N else torch.zeros_like)(weight) if need[1] else None
    db = (torch.empty if N else torch.zeros)(V, device=dev, dtype=torch.float32) if need[2] else None
    grad = any(need)
    step = chunk_rows or chunk_rows_for(N, H, V, x2.dtype, need)
    # One chunk buffer for every chunk: a new tensor a chunk held two at the peak (the next product is
    # allocated before the last one is freed; 1631 MiB beyond the inputs at N 16384, H 4096, V 128256).
    buf = torch.empty(min(step, N), V, device=dev, dtype=x2.dtype)
    b = None if bias is None else bias.to(x2.dtype)
    # Rows past MAX_FUSED: v7 reads a chunk once where v3_online reads it twice (docs/tuning/rowwise.md,
    # "Fused linear cross-entropy"); it takes int64 targets, which _count_valid has checked.
    tma = V > MAX_FUSED and rc.tma_unsupported_reason(buf, buf, kind="ce") is None
    t_cl = t.to(torch.int64) if tma else t
    for r0 in range(0, N, step):
        xc = x2[r0:r0 + step]
        logits = buf[:xc.shape[0]]
        if b is None:
            torch.mm(xc, weight.t(), out=logits)
        else:
            torch.addmm(b, xc, weight.t(), out=logits)
        if softcap is not None:  # Gemma 2's final-logit softcap: cap * tanh(z / cap), its derivative 1 - tanh^2
            th = logits.to(torch.float32, copy=True).div_(softcap).tanh_()  # one fp32 chunk, then in place
            torch.mul(th, softcap, out=logits)
        # The chunk's gradient is written unscaled (softmax - target, |g| >= ~1 / V) and 'mean''s 1 / n_valid
        # rides in the GEMMs' fp32 alpha: scaled first, float16 would flush most of it (~1 / (V n), below its
        # smallest subnormal; measured on the H200: dbias 2.9 % off at V 32k, n 923).
        if tma:
            rc.cross_entropy_tma(logits, t_cl[r0:r0 + step], loss_rows[r0:r0 + step], logits if grad else None,
                                 ignore_index, float(label_smoothing), 1.0)
        else:
            _rows_kernel(logits, t[r0:r0 + step], loss_rows[r0:r0 + step], logits if grad else None, 1.0,
                         ignore_index, label_smoothing, one_pass=V <= MAX_FUSED)
        if softcap is not None and grad:
            torch.mul(logits, th.mul_(th).neg_().add_(1.0), out=logits)
        if dx is not None:
            torch.addmm(dx[r0:r0 + step], logits, weight, beta=0, alpha=scale, out=dx[r0:r0 + step])
        first = r0 == 0
        if dw is not None:
            dw.addmm_(logits.t(), xc, beta=0 if first else 1, alpha=scale)
        if db is not None:
            if first:
                torch.mul(logits.sum(0, dtype=torch.float32), scale, out=db)
            else:
                db.add_(logits.sum(0, dtype=torch.float32), alpha=scale)
    loss = loss_rows.sum()
    if reduction == "mean":
        loss = loss / n_valid if n_valid else loss * float("nan")  # as F.cross_entropy: NaN when nothing counts
    return loss, dx, dw, db


def _rows_of(x, weight, target):
    x2 = x.reshape(-1, x.shape[-1])
    t = target.reshape(-1)
    return (x2 if x2.stride(-1) == 1 else x2.contiguous(), weight if weight.stride(-1) == 1 else weight.contiguous(),
            t if t.is_contiguous() else t.contiguous())


# A custom op, so that torch.compile keeps it whole (its target check syncs with the host, its kernels are
# Triton's and cuBLAS's) instead of tracing into it. Gradients not needed come back as empty tensors.
@torch.library.custom_op("tilewise::linear_cross_entropy_fwd", mutates_args=())
def _lce_op(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
            reduction: str, ignore_index: int, label_smoothing: float, chunk_rows: int, softcap: float,
            need: list[bool], n_valid: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x2, w, t = _rows_of(x, weight, target)
    loss, dx, dw, db = _forward(x2, w, t, bias, reduction, ignore_index, label_smoothing, chunk_rows or None,
                                tuple(need), softcap or None, n_valid)
    return (loss, dx.view(x.shape) if dx is not None else x.new_empty(0),
            dw if dw is not None else weight.new_empty(0),
            db if db is not None else x.new_empty(0, dtype=torch.float32))


@_lce_op.register_fake
def _(x, weight, target, bias, reduction, ignore_index, label_smoothing, chunk_rows, softcap, need, n_valid=-1):
    return (x.new_empty((), dtype=torch.float32), torch.empty_like(x) if need[0] else x.new_empty(0),
            torch.empty_like(weight) if need[1] else weight.new_empty(0),
            x.new_empty((weight.shape[0],) if need[2] else (0,), dtype=torch.float32))


def _setup(ctx, inputs, output):
    bias, need = inputs[3], inputs[9]
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)
    ctx.need, ctx.bias_dtype = tuple(need), None if bias is None else bias.dtype
    ctx.compiled = torch.compiler.is_compiling()
    if ctx.compiled:
        ctx.save_for_backward(*output[1:])
    else:  # eager: held in a list backward empties, so AccumulateGrad adopts them without a copy
        ctx.holder = list(output[1:])


def _grad(ctx, dloss, *_):
    if ctx.compiled:
        dx, dw, db = ctx.saved_tensors
    else:
        if not ctx.holder:
            raise RuntimeError("linear_cross_entropy: backward ran a second time (retain_graph=True); the "
                               "gradients written by the forward were handed out by the first backward")
        dx, dw, db = ctx.holder
        ctx.holder = []
    nones = (None,) * 7  # reduction .. need, n_valid
    if dloss is None:
        return (None, None, None, None) + nones
    plain = ctx.compiled or torch.compiler.is_compiling() or type(dloss) is not torch.Tensor

    def scale(g):
        return g * dloss.to(g.dtype) if plain else scale_unless_one(g, dloss)

    return (scale(dx) if ctx.need[0] else None, scale(dw) if ctx.need[1] else None, None,
            (db * dloss.float()).to(ctx.bias_dtype) if ctx.need[2] else None) + nones


_lce_op.register_autograd(_grad, setup_context=_setup)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: torch.Tensor | None = None, *, reduction: str = "mean", ignore_index: int = -100,
                         label_smoothing: float = 0.0, chunk_rows: int | None = None,
                         softcap: float | None = None, target_count: TargetCount | None = None) -> torch.Tensor:
    """``cross_entropy(x @ weight.T + bias, target)`` in chunks of rows, never holding the (N, V) logits.

    x:          (..., H) CUDA tensor, float32 / float16 / bfloat16 (the last hidden states). CPU
                tensors run the PyTorch reference (whole fp32 logits; chunk_rows unused).
    weight:     (V, H), x's dtype and device (the LM head: ``lm_head.weight``).
    target:     x's leading shape, class indices in [0, V) or ``ignore_index`` (checked: one host sync).
    bias:       optional (V,).
    reduction:  "mean" (over the rows that count; NaN when none does) or "sum".
    label_smoothing: in [0, 1], as ``cross_entropy``.
    chunk_rows: rows a chunk (default ``chunk_rows_for``: up to 4,096 within 1.5 GiB beyond the inputs).
    softcap:    None, or c > 0: the logits become c * tanh(logits / c) before the loss (Gemma 2's
                ``final_logit_softcapping``); costs a chunk-sized fp32 buffer and two passes a chunk.
    target_count: None, or a ``TargetCount(target, V, ignore_index)`` made earlier for this very target: the
                count and the check of the targets are read from it, without waiting for the work queued since
                (not under torch.compile, where the loss counts as without it).
    Returns the loss, a 0-dim float32 tensor (as transformers' loss), differentiable in x, weight and bias; the
    gradients are computed in this call (memory: dx, dW and db, and one chunk of logits).
    """
    cpu = runs_reference("linear_cross_entropy", {"x": x, "weight": weight, "target": target, "bias": bias},
                         interpreter=True)
    _check(x, weight, target, bias, reduction, chunk_rows, ignore_index, label_smoothing, softcap, cpu=cpu)
    if target_count is not None and (not isinstance(target_count, TargetCount)
                                     or not target_count.made_for(target, weight.shape[0], int(ignore_index))):
        raise ValueError("linear_cross_entropy: 'target_count' must be a TargetCount made for this call's target "
                         f"(the same tensor), V = weight.shape[0] = {weight.shape[0]} and ignore_index = "
                         f"{ignore_index}")
    if cpu:  # the one CPU rule: logits in fp32, differentiable by PyTorch
        return reference(x, weight, target, bias, reduction, int(ignore_index), float(label_smoothing), softcap)
    need = [x.requires_grad and torch.is_grad_enabled(), weight.requires_grad and torch.is_grad_enabled(),
            bias is not None and bias.requires_grad and torch.is_grad_enabled()]
    # an int argument would be a guarded constant under torch.compile: there the op counts for itself
    n_valid = -1 if target_count is None or torch.compiler.is_compiling() else target_count.result()
    return _lce_op(x, weight, target, bias, reduction, int(ignore_index), float(label_smoothing), int(chunk_rows or 0),
                   float(softcap or 0.0), need, n_valid)[0]


class FusedLinearCrossEntropyLoss(torch.nn.Module):
    """``linear_cross_entropy`` as a loss module: ``loss_fn(lm_head.weight, hidden, target, bias=None)``.
    Under autocast, x, the weight and the bias in autocast's dtype, as torch's Linear would take them."""

    def __init__(self, reduction: str = "mean", ignore_index: int = -100, label_smoothing: float = 0.0):
        super().__init__()
        self.reduction, self.ignore_index, self.label_smoothing = reduction, ignore_index, label_smoothing

    def forward(self, weight: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        x, weight, bias = autocast_inputs(x, weight, bias)  # a module: autocast as for torch's Linear
        return linear_cross_entropy(x, weight, target, bias, reduction=self.reduction,
                                    ignore_index=self.ignore_index, label_smoothing=self.label_smoothing)


VARIANTS = {"v1_reference": reference, "v2_chunked": linear_cross_entropy}
