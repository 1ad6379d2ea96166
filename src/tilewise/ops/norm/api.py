"""RMSNorm over the last dimension: ``rms_norm(x, weight, eps, mode=...)``, its reference and cost.

    v1_reference: PyTorch, HF's LlamaRMSNorm written out (fp32 statistics; several passes over x).
    v2_fused:     one Triton kernel a direction (``triton_kernels``): forward reads x once and writes y
                  and the (rows,) fp32 rstd; backward reads x and dy once, writes dx, and leaves a
                  partial dW a persistent program that one fixed-order sum reduces (deterministic).
                  Bound: bytes (2 passes forward, 3 backward, in x's dtype).

Modes: "llama" (LlamaRMSNorm, Mistral, Qwen2: the normalized row cast to x's dtype, then times the
weight) and "gemma" (GemmaRMSNorm: (1 + weight) times the fp32 normalized row, then cast).
"""

from __future__ import annotations

import torch

from ...cost import Cost
from ...runtime import cuda as rt
from ...runtime.triton_launch import launch as _launch
from .._checks import check_kernel_inputs, runs_reference
from .._custom import eager_twin
from .configs import MAX_N, PROGRAMS_PER_SM, NormLaunch, forward_launch_for, launch_for

MODES = ("llama", "gemma")


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "llama") -> torch.Tensor:
    """v1_reference: HF's formula in PyTorch (fp32 statistics)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if mode == "gemma":
        return (h * (1.0 + weight.float())).to(x.dtype)
    return weight * h.to(x.dtype)


def cost(M: int, N: int, dtype: torch.dtype = torch.bfloat16, backward: bool = False) -> Cost:
    """Forward: x read, y written (+ the rows' rstd); backward: x, dy read, dx written (dW and the
    weight are N-sized). FLOPs: about 4 a forward element, 8 a backward one."""
    e = M * N * dtype.itemsize
    if not backward:
        return Cost(4.0 * M * N, 2 * e + 4 * M)
    return Cost(8.0 * M * N, 3 * e + 4 * M)


def _check(x, weight, eps, mode, cpu=False):
    check_kernel_inputs("rms_norm", {"x": x, "weight": weight}, every=True, interpreter=True, cpu=cpu)
    if x.dim() < 1 or weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: 'weight' has shape {tuple(weight.shape)}; 'x' of shape {tuple(x.shape)} "
                         f"needs ({x.shape[-1] if x.dim() else '?'},)")
    if not 1 <= x.shape[-1] <= MAX_N:
        raise ValueError(f"rms_norm: 'x' rows of {x.shape[-1]} elements; supported: 1 to {MAX_N}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0 or eps == float("inf"):
        raise ValueError(f"rms_norm: 'eps' must be a finite number >= 0, got {eps!r}")
    if mode not in MODES:
        raise ValueError(f"rms_norm: 'mode' must be one of {MODES}, got {mode!r}")


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


def _forward(x, weight, eps, mode):
    weight = weight.contiguous()  # the kernels read it densely (N elements: a copy costs nothing)
    x2 = _rows(x)
    M, N = x2.shape
    y = torch.empty((M, N), dtype=_out_dtype(x, weight, mode), device=x.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    if M:
        L = forward_launch_for(N)
        from . import triton_kernels as K

        _launch(K._rms_norm_fwd_kernel, (_programs(M, L, x.get_device()),),
                x2, weight, y, rstd, M, N, x2.stride(0), y.stride(0), float(eps), 1.0 if mode == "gemma" else 0.0,
                BLOCK=L.BLOCK, ROWS=L.ROWS, CAST_FIRST=mode == "llama", num_warps=L.warps)
    return y.view(x.shape), rstd


def _backward(dy, x, weight, rstd, mode):
    weight = weight.contiguous()
    x2, dy2 = _rows(x), _rows(dy)
    M, N = x2.shape
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if not M:
        return dx.view(x.shape), torch.zeros_like(weight)
    L = launch_for(N)
    P = _programs(M, L, x.get_device())
    part = torch.empty((P, L.BLOCK), dtype=torch.float32, device=x.device)
    from . import triton_kernels as K

    _launch(K._rms_norm_bwd_kernel, (P,),
            dy2, x2, weight, rstd, dx, part, M, N, dy2.stride(0), x2.stride(0), dx.stride(0),
            1.0 if mode == "gemma" else 0.0, BLOCK=L.BLOCK, ROWS=L.ROWS, CAST_FIRST=mode == "llama",
            num_warps=L.warps)
    return dx.view(x.shape), part[:, :N].sum(0).to(weight.dtype)


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


def v1_reference(x, weight, eps=1e-6, *, mode="llama"):
    return reference(x, weight, eps, mode)


VARIANTS = {"v1_reference": v1_reference, "v2_fused": rms_norm}
