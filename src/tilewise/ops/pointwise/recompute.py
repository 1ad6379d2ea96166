"""recompute: the lecture's three stacked sigmoids, y = s(s(s(x))), with activations stored for
backward against recomputed in backward (checkpointing), forward and backward both in Triton.

Versions (each a forward kernel and a backward kernel, elementwise, n elements of b bytes):
    stored:     forward reads x, writes a1 = s(x), a2 = s(a1) (kept for backward) and y = s(a2);
                backward reads a1, a2 and dy, writes dx = dy * y(1-y) * a2(1-a2) * a1(1-a1) with
                y = s(a2) taken again from the a2 it reads (one sigmoid instead of a read of y).
                bytes: (1 + 3) + (3 + 1) = 8 n b.
    recomputed: forward reads x, writes y (only x is kept: it exists anyway);
                backward reads x and dy, recomputes a1, a2, y in registers, writes dx.
                bytes: (1 + 1) + (2 + 1) = 5 n b.  Extra FLOPs: three sigmoids, free at this
                intensity. bound: copy bandwidth on those bytes for both.

Recomputation moves 5/8 of the bytes: the lecture's ratio. The stored backward takes y from a2
rather than reading it: reading y too makes 9 streams and a 5/9 ratio, 12.7 % off the lecture's
(docs/tuning/rowwise.md, "Recompute: stored backward streams").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...cost import Cost
from .._checks import check_kernel_inputs, runs_reference
from ...runtime.triton_launch import cdiv as _cdiv, launch as _launch
from .configs import RECOMPUTE_BLOCK

LECTURE_RATIO = 5 / 8
BYTES_RATIO = 5 / 8  # recomputed (5 streams) over stored (8 streams)


def reference(x: torch.Tensor) -> torch.Tensor:
    """torch.sigmoid three times in fp32 (eager autograd stores every intermediate)."""
    return torch.sigmoid(torch.sigmoid(torch.sigmoid(x.float()))).to(x.dtype)


def reference_backward(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    a1 = torch.sigmoid(x.float())
    a2 = torch.sigmoid(a1)
    y = torch.sigmoid(a2)
    return (dy.float() * y * (1 - y) * a2 * (1 - a2) * a1 * (1 - a1)).to(x.dtype)


def cost(n: int, dtype: torch.dtype = torch.float32, recompute: bool = True) -> Cost:
    """Forward + backward. A sigmoid ~4 FLOPs (exp, add, divide, negate), its derivative ~2,
    the chain ~4: stored 12 + 14 (y again from a2), recomputed 12 + 22 per element."""
    b = dtype.itemsize
    return Cost(flops=34 * n, bytes=5 * n * b) if recompute else Cost(flops=26 * n, bytes=8 * n * b)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _fwd_kernel(X, A1, A2, Y, n, STORE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask).to(tl.float32)
    a1 = _sigmoid(x)
    a2 = _sigmoid(a1)
    y = _sigmoid(a2)
    if STORE:
        tl.store(A1 + offs, a1.to(A1.dtype.element_ty), mask=mask)
        tl.store(A2 + offs, a2.to(A2.dtype.element_ty), mask=mask)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_stored_kernel(A1, A2, DY, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a1 = tl.load(A1 + offs, mask=mask).to(tl.float32)
    a2 = tl.load(A2 + offs, mask=mask).to(tl.float32)
    y = _sigmoid(a2)  # from the stored a2: a sigmoid instead of a read of y
    g = tl.load(DY + offs, mask=mask).to(tl.float32)
    dx = g * y * (1.0 - y) * a2 * (1.0 - a2) * a1 * (1.0 - a1)
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_recompute_kernel(X, DY, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask).to(tl.float32)
    g = tl.load(DY + offs, mask=mask).to(tl.float32)
    a1 = _sigmoid(x)
    a2 = _sigmoid(a1)
    y = _sigmoid(a2)
    dx = g * y * (1.0 - y) * a2 * (1.0 - a2) * a1 * (1.0 - a1)
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)


def _block(t: torch.Tensor) -> int:
    return RECOMPUTE_BLOCK if t.is_cuda else 16


def _check(x: torch.Tensor, name: str = "x", cpu: bool = False) -> None:
    check_kernel_inputs("sigmoid3", {name: x}, interpreter=True, cpu=cpu)


@torch.library.custom_op("tilewise::sigmoid3_fwd", mutates_args=())
def _fwd_op(x: torch.Tensor, store: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.contiguous()
    n = x.numel()
    y = torch.empty_like(x)
    a1 = torch.empty_like(x) if store else x.new_empty(0)
    a2 = torch.empty_like(x) if store else x.new_empty(0)
    if n:
        B = _block(x)
        _launch(_fwd_kernel, (_cdiv(n, B),), x, a1 if store else y, a2 if store else y, y, n,
                                          STORE=store, BLOCK=B, num_warps=8)
    return y, a1, a2


@_fwd_op.register_fake
def _(x, store):
    e = x.new_empty(x.shape) if store else x.new_empty(0)
    return x.new_empty(x.shape), e, x.new_empty(x.shape) if store else x.new_empty(0)


@torch.library.custom_op("tilewise::sigmoid3_bwd_stored", mutates_args=())
def _bwd_stored_op(a1: torch.Tensor, a2: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    dy = dy.contiguous()
    dx = torch.empty_like(a2)
    n = a2.numel()
    if n:
        B = _block(a2)
        _launch(_bwd_stored_kernel, (_cdiv(n, B),), a1, a2, dy, dx, n, BLOCK=B, num_warps=8)
    return dx


@_bwd_stored_op.register_fake
def _(a1, a2, dy):
    return torch.empty_like(a2)


@torch.library.custom_op("tilewise::sigmoid3_bwd_recompute", mutates_args=())
def _bwd_recompute_op(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    x, dy = x.contiguous(), dy.contiguous()
    dx = torch.empty_like(x)
    n = x.numel()
    if n:
        B = _block(x)
        _launch(_bwd_recompute_kernel, (_cdiv(n, B),), x, dy, dx, n, BLOCK=B, num_warps=8)
    return dx


@_bwd_recompute_op.register_fake
def _(x, dy):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    x, store = inputs
    ctx.store = store
    if store:
        ctx.save_for_backward(output[1], output[2])
    else:
        ctx.save_for_backward(x)
    ctx.mark_non_differentiable(output[1], output[2])
    # Without this autograd hands backward a zero-filled gradient for a1 and a2 (never used):
    # two full-size memsets, 2 x n x b bytes of extra writes that held 'stored' to 82 % of its
    # roofline on the H200 (docs/tuning/rowwise.md, "Recompute: no zero gradients").
    ctx.set_materialize_grads(False)


def _grad(ctx, dy, _d1, _d2):
    if dy is None:  # not materialized (see _setup): y did not reach the loss
        return None, None
    if ctx.store:
        a1, a2 = ctx.saved_tensors
        return _bwd_stored_op(a1, a2, dy), None
    (x,) = ctx.saved_tensors
    return _bwd_recompute_op(x, dy), None


_fwd_op.register_autograd(_grad, setup_context=_setup)


def sigmoid3(x: torch.Tensor, *, recompute: bool = True) -> torch.Tensor:
    """y = sigmoid(sigmoid(sigmoid(x))), differentiable.

    x:         CUDA tensor, any shape, float32 / float16 / bfloat16 (non-contiguous is copied); a
               CPU tensor runs the PyTorch reference.
    recompute: True (default): keep only x for backward and recompute the sigmoids there;
               False: keep the two intermediates a1, a2 (two tensors of x's size; the
               backward takes y = sigmoid(a2) again instead of reading it).
    Returns y, same shape and dtype as x (fp32 arithmetic inside).
    """
    cpu = runs_reference("sigmoid3", {"x": x}, interpreter=True)
    _check(x, cpu=cpu)
    if not isinstance(recompute, bool):  # "no" would read as True
        raise ValueError(f"sigmoid3: 'recompute' must be a bool, got {recompute!r}")
    if cpu:
        return reference(x)
    return _fwd_op(x, not recompute)[0]


VARIANTS = {"stored": lambda x: sigmoid3(x, recompute=False),
            "recomputed": lambda x: sigmoid3(x, recompute=True)}
