"""SwiGLU's activation, ``silu(gate) * up`` (Llama's, Mistral's and Qwen2's MLP between its projections).

    v1_reference: PyTorch, ``F.silu(gate) * up`` (two kernels, an intermediate of the full size).
    v2_fused:     one Triton kernel a direction: forward reads gate and up once and writes y; backward
                  reads dy, gate and up once and writes dgate and dup (silu recomputed, not stored).
                  Bound: bytes.

``swiglu_packed(gate_up)`` takes both halves in one (..., 2 * I) tensor, the output of one GEMM over
the concatenated gate and up weights, and its backward writes one (..., 2 * I) gradient, so the input
gradient is one GEMM as well (no sum of two dX products).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ...cost import Cost
from ...runtime.triton_launch import launch as _launch
from .._checks import check_kernel_inputs, runs_reference
from .._custom import eager_twin
from .configs import SWIGLU_BLOCK, SWIGLU_PACKED_BLOCK, SWIGLU_WARPS, swiglu_packed_block

@triton.jit
def _swiglu_kernel(G, U, DY, Y, DG, DU, n, BLOCK: tl.constexpr, BACKWARD: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(G + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=m, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    if BACKWARD:  # d silu(g) / dg = sig * (1 + g * (1 - sig))
        dy = tl.load(DY + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(DG + offs, (dy * u * sig * (1.0 + g * (1.0 - sig))).to(DG.dtype.element_ty), mask=m)
        tl.store(DU + offs, (dy * silu).to(DU.dtype.element_ty), mask=m)
    else:
        tl.store(Y + offs, (silu * u).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _swiglu_packed_kernel(GU, DY, Y, DGU, I, ld, BLOCK: tl.constexpr, BACKWARD: tl.constexpr,
                          STORE_Y: tl.constexpr):
    # One program: BLOCK columns of one row; row r's gate at GU[r * ld + c], its up I further on.
    # STORE_Y: the backward writes y again too, for a caller that did not keep the forward's (swiglu_mlp).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    src = GU + row * ld + cols
    g = tl.load(src, mask=m, other=0.0).to(tl.float32)
    u = tl.load(src + I, mask=m, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    if BACKWARD:
        dy = tl.load(DY + row * I + cols, mask=m, other=0.0).to(tl.float32)
        dst = DGU + row * (2 * I) + cols
        tl.store(dst, (dy * u * sig * (1.0 + g * (1.0 - sig))).to(DGU.dtype.element_ty), mask=m)
        tl.store(dst + I, (dy * silu).to(DGU.dtype.element_ty), mask=m)
    if STORE_Y or not BACKWARD:
        tl.store(Y + row * I + cols, (silu * u).to(Y.dtype.element_ty), mask=m)


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """v1_reference: HF's ``act_fn(gate_proj(x)) * up_proj(x)`` on the projections' outputs."""
    return F.silu(gate) * up


def cost(n: int, dtype: torch.dtype = torch.bfloat16, backward: bool = False) -> Cost:
    """Forward: gate, up read, y written; backward: dy, gate, up read, dgate, dup written."""
    return Cost((5.0 if not backward else 10.0) * n, (3 if not backward else 5) * n * dtype.itemsize)


def _check(gate, up, cpu=False):
    check_kernel_inputs("swiglu", {"gate": gate, "up": up}, every=True, interpreter=True, cpu=cpu)
    if up.device != gate.device or up.dtype != gate.dtype or up.shape != gate.shape:
        raise ValueError(f"swiglu: 'up' is {tuple(up.shape)} {up.dtype} on {up.device}; 'gate' is "
                         f"{tuple(gate.shape)} {gate.dtype} on {gate.device}: they must match")


def _run(gate, up, dy=None):
    gate, up = gate.contiguous(), up.contiguous()  # (the projections' outputs already are)
    n = gate.numel()
    grid = (triton.cdiv(n, SWIGLU_BLOCK),)
    if dy is None:
        y = torch.empty_like(gate)
        if n:
            _launch(_swiglu_kernel, grid, gate, up, gate, y, gate, gate, n, BLOCK=SWIGLU_BLOCK, BACKWARD=False,
                    num_warps=SWIGLU_WARPS)
        return y
    dy = dy.contiguous()
    dg, du = torch.empty_like(gate), torch.empty_like(up)
    if n:
        _launch(_swiglu_kernel, grid, gate, up, dy, gate, dg, du, n, BLOCK=SWIGLU_BLOCK, BACKWARD=True,
                num_warps=SWIGLU_WARPS)
    return dg, du


@torch.library.custom_op("tilewise::swiglu", mutates_args=())
def _fwd_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _run(gate, up)


@_fwd_op.register_fake
def _(gate, up):
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


@torch.library.custom_op("tilewise::swiglu_bwd", mutates_args=())
def _bwd_op(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(gate, up, dy)


@_bwd_op.register_fake
def _(dy, gate, up):
    c = torch.contiguous_format
    return torch.empty_like(gate, memory_format=c), torch.empty_like(up, memory_format=c)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _grad(ctx, dy):
    gate, up = ctx.saved_tensors
    return _run(gate, up, dy) if getattr(ctx, "eager", False) else _bwd_op(dy, gate, up)


_fwd_op.register_autograd(_grad, setup_context=_setup)


_Eager = eager_twin("_Eager", _run, _setup, _grad)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in one kernel, differentiable in both (silu recomputed in the backward).

    gate, up: CUDA tensors of one shape, dtype (float32 / float16 / bfloat16) and device; CPU
              tensors run the PyTorch reference.
    Returns y of that shape, contiguous. Under ``torch.compile`` it is the custom op
    ``torch.ops.tilewise.swiglu``.
    """
    cpu = runs_reference("swiglu", {"gate": gate, "up": up}, interpreter=True)
    _check(gate, up, cpu=cpu)
    if cpu:
        return reference(gate, up)
    if torch.compiler.is_compiling():
        return _fwd_op(gate, up)
    return _Eager.apply(gate, up)


def v1_reference(gate, up):
    return reference(gate, up)


VARIANTS = {"v1_reference": v1_reference, "v2_fused": swiglu}


# --------------------------------------------------------------------------- packed halves


def reference_packed(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with gate and up the first and second halves of the last dimension."""
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate) * up


def _check_packed(gate_up, cpu=False):
    check_kernel_inputs("swiglu_packed", {"gate_up": gate_up}, interpreter=True, cpu=cpu)
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu_packed: 'gate_up' must be (..., 2 * I), its last dimension even; got "
                         f"{tuple(gate_up.shape)}")
    if gate_up.shape[-1] // 2 > 65535 * SWIGLU_PACKED_BLOCK:  # the grid's second dimension
        raise ValueError(f"swiglu_packed: 'gate_up' has I = {gate_up.shape[-1] // 2} columns a half; at most "
                         f"{65535 * SWIGLU_PACKED_BLOCK}")


def _rows(gate_up):
    """(rows, 2 * I) with unit column stride (a view where the layout allows) and its row stride."""
    x = gate_up.reshape(math.prod(gate_up.shape[:-1]), gate_up.shape[-1])
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x, (x.stride(0) if x.shape[0] > 1 else x.shape[1])


def _run_packed(gate_up, dy=None, keep_y=False):
    """y (forward); with ``dy`` the gradient (..., 2 * I), and with ``keep_y`` (dgu, y): y recomputed by
    the backward kernel, bitwise the forward's."""
    x, ld = _rows(gate_up)
    rows, i = x.shape[0], x.shape[1] // 2
    block = swiglu_packed_block(i)
    grid = (rows, triton.cdiv(i, block))
    y = gate_up.new_empty(*gate_up.shape[:-1], i) if dy is None or keep_y else x
    if dy is None:
        if y.numel():
            _launch(_swiglu_packed_kernel, grid, x, x, y, x, i, ld, BLOCK=block, BACKWARD=False,
                    STORE_Y=False, num_warps=SWIGLU_WARPS)
        return y
    dy = dy.contiguous()
    dgu = torch.empty(gate_up.shape, dtype=gate_up.dtype, device=gate_up.device)
    if dgu.numel():
        _launch(_swiglu_packed_kernel, grid, x, dy, y, dgu, i, ld, BLOCK=block, BACKWARD=True,
                STORE_Y=keep_y, num_warps=SWIGLU_WARPS)
    return (dgu, y) if keep_y else dgu


@torch.library.custom_op("tilewise::swiglu_packed", mutates_args=())
def _packed_fwd_op(gate_up: torch.Tensor) -> torch.Tensor:
    return _run_packed(gate_up)


@_packed_fwd_op.register_fake
def _(gate_up):
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


@torch.library.custom_op("tilewise::swiglu_packed_bwd", mutates_args=())
def _packed_bwd_op(dy: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    return _run_packed(gate_up, dy)


@_packed_bwd_op.register_fake
def _(dy, gate_up):
    return torch.empty_like(gate_up, memory_format=torch.contiguous_format)


def _packed_grad(ctx, dy):
    (gate_up,) = ctx.saved_tensors
    return _run_packed(gate_up, dy) if getattr(ctx, "eager", False) else _packed_bwd_op(dy, gate_up)


_packed_fwd_op.register_autograd(_packed_grad, setup_context=_setup)


_EagerPacked = eager_twin("_EagerPacked", _run_packed, _setup, _packed_grad)


def swiglu_packed(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up`` (..., 2 * I) holds gate in its first I columns and up in
    the last I (``torch.cat([gate, up], -1)``, or one GEMM over the concatenated weights), in one
    kernel each way; the backward returns one (..., 2 * I) gradient.

    gate_up: a CUDA float32 / float16 / bfloat16 tensor (rows may be strided, columns unit-stride
             or it is copied); CPU tensors run the PyTorch reference.
    Returns y (..., I), contiguous. Under ``torch.compile`` it is the custom op
    ``torch.ops.tilewise.swiglu_packed``.
    """
    cpu = runs_reference("swiglu_packed", {"gate_up": gate_up}, interpreter=True)
    _check_packed(gate_up, cpu=cpu)
    if cpu:
        return reference_packed(gate_up)
    if torch.compiler.is_compiling():
        return _packed_fwd_op(gate_up)
    return _EagerPacked.apply(gate_up)
