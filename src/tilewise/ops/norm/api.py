"""RMSNorm over the last dimension: ``rms_norm(x, weight, eps, mode=...)``, its reference and cost.

    v1_reference: PyTorch, HF's LlamaRMSNorm written out (fp32 statistics; several passes over x).
    v2_fused:     one Triton kernel a direction (``triton_kernels``): forward reads x once and writes y
                  and the (rows,) fp32 rstd; backward reads x and dy once, writes dx, and leaves a
                  partial dW a persistent program that one fixed-order sum reduces (deterministic).
                  Bound: bytes (2 passes forward, 3 backward, in x's dtype).

``add_rms_norm(x, residual, weight)``: a pre-norm block's residual add and the next norm, the same
kernels with the add inside: forward reads x and residual and writes the sum and y (4 passes, against
3 for an add and 2 for the norm); backward adds the sum's own gradient into dx (4 passes, against 3
for the norm and 3 for the add that sums the two gradients).

Modes: "llama" (LlamaRMSNorm, Mistral, Qwen2: the normalized row cast to x's dtype, then times the
weight) and "gemma" (GemmaRMSNorm: (1 + weight) times the fp32 normalized row, then cast).
"""

from __future__ import annotations

from typing import Optional

import torch

from ...cost import Cost
from ...runtime import cuda as rt
from ...runtime.triton_launch import launch as _launch
from .._checks import check_kernel_inputs, runs_reference
from .._custom import eager_twin
from .configs import DW_SUM_WARPS, MAX_N, PROGRAMS_PER_SM, NormLaunch, dw_sum_tile, forward_launch_for, launch_for

MODES = ("llama", "gemma")


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "llama") -> torch.Tensor:
    """v1_reference: HF's formula in PyTorch (fp32 statistics)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if mode == "gemma":
        return (h * (1.0 + weight.float())).to(x.dtype)
    return weight * h.to(x.dtype)


def add_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  mode: str = "llama") -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm``'s reference: the model's ``residual + hidden_states``, then ``reference``."""
    s = x + residual
    return reference(s, weight, eps, mode), s


def cost(M: int, N: int, dtype: torch.dtype = torch.bfloat16, backward: bool = False,
         residual: bool = False) -> Cost:
    """Forward: x read, y written (+ the rows' rstd); backward: x, dy read, dx written (dW and the
    weight are N-sized). FLOPs: about 4 a forward element, 8 a backward one. ``residual``
    (add_rms_norm): the residual read and the sum written forward, the sum's gradient read backward."""
    e = M * N * dtype.itemsize
    if not backward:
        return Cost(4.0 * M * N, (4 if residual else 2) * e + 4 * M)
    return Cost(8.0 * M * N, (4 if residual else 3) * e + 4 * M)


_ABSENT = object()  # rms_norm takes no residual (add_rms_norm's None is an error)


def _check(x, weight, eps, mode, cpu=False, what="rms_norm", residual=_ABSENT):
    tensors = {"x": x, "weight": weight} | ({} if residual is _ABSENT else {"residual": residual})
    check_kernel_inputs(what, tensors, every=True, interpreter=True, cpu=cpu)
    if x.dim() < 1 or weight.shape != x.shape[-1:]:
        raise ValueError(f"{what}: 'weight' has shape {tuple(weight.shape)}; 'x' of shape {tuple(x.shape)} "
                         f"needs ({x.shape[-1] if x.dim() else '?'},)")
    if residual is not _ABSENT and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"{what}: 'residual' is {tuple(residual.shape)} {residual.dtype}; it must match 'x' "
                         f"({tuple(x.shape)} {x.dtype})")
    if not 1 <= x.shape[-1] <= MAX_N:
        raise ValueError(f"{what}: 'x' rows of {x.shape[-1]} elements; supported: 1 to {MAX_N}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0 or eps == float("inf"):
        raise ValueError(f"{what}: 'eps' must be a finite number >= 0, got {eps!r}")
    if mode not in MODES:
        raise ValueError(f"{what}: 'mode' must be one of {MODES}, got {mode!r}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(M, N) with unit column stride (a copy only where the last dim is strided)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _programs(M: int, L: NormLaunch, dev: int) -> int:
    blocks = max(1, -(-M // L.ROWS))
    if not L.persistent:
        return blocks
    return min(blocks, (4 if dev < 0 else rt.sm_count(dev)) * PROGRAMS_PER_SM)


def _out_dtype(x, weight, mode):
    # llama: weight * (normalized row in x's dtype), PyTorch's promotion; gemma: x's dtype
    return torch.promote_types(weight.dtype, x.dtype) if mode == "llama" else x.dtype


def _forward(x, weight, eps, mode, residual=None):
    """(y, rstd), and with ``residual`` (y, rstd, s): y the norm of s = x + residual."""
    weight = weight.contiguous()  # the kernels read it densely (N elements: a copy costs nothing)
    x2 = _rows(x)
    M, N = x2.shape
    y = torch.empty((M, N), dtype=_out_dtype(x, weight, mode), device=x.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    has = residual is not None
    r2 = _rows(residual) if has else x2
    s = torch.empty((M, N), dtype=x.dtype, device=x.device) if has else y
    if M:
        L = forward_launch_for(N)
        from . import triton_kernels as K

        _launch(K._rms_norm_fwd_kernel, (_programs(M, L, x.get_device()),),
                x2, weight, y, rstd, M, N, x2.stride(0), y.stride(0), float(eps), 1.0 if mode == "gemma" else 0.0,
                r2, s, r2.stride(0), s.stride(0),
                BLOCK=L.BLOCK, ROWS=L.ROWS, CAST_FIRST=mode == "llama", HAS_RESIDUAL=has, num_warps=L.warps)
    return (y.view(x.shape), rstd, s.view(x.shape)) if has else (y.view(x.shape), rstd)


def _backward(dy, x, weight, rstd, mode, ds=None):
    """(dx, dW); with ``ds`` (the gradient of add_rms_norm's sum from its other use) added into dx."""
    weight = weight.contiguous()
    x2, dy2 = _rows(x), _rows(dy)
    M, N = x2.shape
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if not M:
        return dx.view(x.shape), torch.zeros_like(weight)
    L = launch_for(N)
    P = _programs(M, L, x.get_device())
    part = torch.empty((P, L.BLOCK), dtype=torch.float32, device=x.device)
    ds2 = _rows(ds) if ds is not None else dy2
    from . import triton_kernels as K

    _launch(K._rms_norm_bwd_kernel, (P,),
            dy2, x2, weight, rstd, dx, part, M, N, dy2.stride(0), x2.stride(0), dx.stride(0),
            1.0 if mode == "gemma" else 0.0, ds2, ds2.stride(0), BLOCK=L.BLOCK, ROWS=L.ROWS,
            CAST_FIRST=mode == "llama", HAS_DS=ds is not None, num_warps=L.warps)
    dw = torch.empty((N,), dtype=weight.dtype, device=x.device)
    block_r, block_n = dw_sum_tile(P)
    _launch(K._dw_sum_kernel, (-(-N // block_n),), part, dw, P, N, part.stride(0),
            BLOCK_R=block_r, BLOCK_N=block_n, num_warps=DW_SUM_WARPS)
    return dx.view(x.shape), dw


@torch.library.custom_op("tilewise::rms_norm_fwd", mutates_args=())
def _fwd_op(x: torch.Tensor, weight: torch.Tensor, eps: float, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(x, weight, eps, mode)


@_fwd_op.register_fake
def _(x, weight, eps, mode):
    return (torch.empty(x.shape, dtype=_out_dtype(x, weight, mode), device=x.device),
            x.new_empty((x.numel() // x.shape[-1],), dtype=torch.float32))


@torch.library.custom_op("tilewise::rms_norm_bwd", mutates_args=())
def _bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
            mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward(dy, x, weight, rstd, mode)


@_bwd_op.register_fake
def _(dy, x, weight, rstd, mode):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight)


def _setup(ctx, inputs, output):
    x, weight, _eps, mode = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.mode = mode


def _grad(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    if dy is None:
        return None, None, None, None
    bwd = _backward if getattr(ctx, "eager", False) else _bwd_op
    dx, dw = bwd(dy, x, weight, rstd, ctx.mode)
    return dx, dw, None, None


_fwd_op.register_autograd(_grad, setup_context=_setup)


_Eager = eager_twin("_Eager", _forward, _setup, _grad, nondifferentiable=(1,))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, mode: str = "llama") -> torch.Tensor:
    """RMSNorm over the last dimension, differentiable in x and weight.

    x:      (..., N) CUDA tensor, float32 / float16 / bfloat16, rows of unit stride or copied to it;
            N <= 32768. A CPU tensor runs the PyTorch reference.
    weight: (N,), x's device (any of the three dtypes).
    eps:    added to the mean square (HF's ``variance_epsilon``).
    mode:   "llama": ``weight * (x * rstd).to(x.dtype)`` (LlamaRMSNorm, Mistral, Qwen2; the result in
            the promoted dtype of weight and x); "gemma": ``((1 + weight) * x * rstd).to(x.dtype)``.
    Returns y of x's shape. Statistics in fp32; dW is summed in a fixed order (deterministic).
    Under ``torch.compile`` it is the custom op ``torch.ops.tilewise.rms_norm_fwd``.
    """
    cpu = runs_reference("rms_norm", {"x": x, "weight": weight}, interpreter=True)
    _check(x, weight, eps, mode, cpu=cpu)
    if cpu:
        return reference(x, weight, float(eps), mode)
    if torch.compiler.is_compiling():
        return _fwd_op(x, weight, float(eps), mode)[0]
    return _Eager.apply(x, weight, float(eps), mode)[0]


@torch.library.custom_op("tilewise::add_rms_norm_fwd", mutates_args=())
def _add_fwd_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward(x, weight, eps, mode, residual)


@_add_fwd_op.register_fake
def _(x, residual, weight, eps, mode):
    return (torch.empty(x.shape, dtype=_out_dtype(x, weight, mode), device=x.device),
            x.new_empty((x.numel() // x.shape[-1],), dtype=torch.float32), torch.empty_like(x))


@torch.library.custom_op("tilewise::add_rms_norm_bwd", mutates_args=())
def _add_bwd_op(dy: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, mode: str,
                ds: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward(dy, s, weight, rstd, mode, ds)


@_add_bwd_op.register_fake
def _(dy, s, weight, rstd, mode, ds):
    return torch.empty_like(s, memory_format=torch.contiguous_format), torch.empty_like(weight)


def _add_setup(ctx, inputs, output):
    _x, _residual, weight, _eps, mode = inputs
    ctx.save_for_backward(output[2], weight, output[1])
    ctx.mode = mode


def _add_grad(ctx, dy, _drstd, ds):
    s, weight, rstd = ctx.saved_tensors
    if dy is None:  # only the sum was used: its gradient is both inputs'
        return ds, ds, None, None, None
    bwd = _backward if getattr(ctx, "eager", False) else _add_bwd_op
    dx, dw = bwd(dy, s, weight, rstd, ctx.mode, ds)
    return dx, dx, dw, None, None  # x and residual: the same gradient (the sum's)


_add_fwd_op.register_autograd(_add_grad, setup_context=_add_setup)


_AddEager = eager_twin("_AddEager", lambda x, r, w, eps, mode: _forward(x, w, eps, mode, r), _add_setup, _add_grad,
                       nondifferentiable=(1,))


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                 mode: str = "llama") -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm block's residual add and the next RMSNorm in one kernel each way: ``s = x + residual``
    and ``y = rms_norm(s, weight, eps, mode=mode)``, differentiable in x, residual and weight.

    x:        (..., N), as ``rms_norm``'s x (the block's output, e.g. attention's after o_proj).
    residual: x's shape, dtype and device (the residual stream).
    Returns (y, s): y as ``rms_norm`` gives it; s = x + residual in x's dtype, rounded as
    ``residual + hidden_states`` is, to carry on as the residual stream. The backward adds s's own
    gradient into the norm's, one kernel writing the one gradient that x and residual both get.
    CPU tensors run ``add_reference``. Under ``torch.compile``: ``torch.ops.tilewise.add_rms_norm_fwd``.
    """
    cpu = runs_reference("add_rms_norm", {"x": x, "residual": residual, "weight": weight}, interpreter=True)
    _check(x, weight, eps, mode, cpu=cpu, what="add_rms_norm", residual=residual)
    if cpu:
        return add_reference(x, residual, weight, float(eps), mode)
    if torch.compiler.is_compiling():
        y, _, s = _add_fwd_op(x, residual, weight, float(eps), mode)
    else:
        y, _, s = _AddEager.apply(x, residual, weight, float(eps), mode)
    return y, s


def v1_reference(x, weight, eps=1e-6, *, mode="llama"):
    return reference(x, weight, eps, mode)


VARIANTS = {"v1_reference": v1_reference, "v2_fused": rms_norm}
