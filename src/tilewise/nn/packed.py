"""One linear layer's output from several weights side by side, without keeping their concatenation.

``F.linear(x, torch.cat(weights))`` (one GEMM for SwiGLU's gate and up) copies the weights into a new
tensor each call, and autograd keeps that copy until the backward: at Llama-3.2-1B's size 64 MiB a
layer, 1 GiB over 16 layers at the step's peak. ``linear_packed`` writes each weight's GEMM into its
columns of one output instead (no copy forward; cuBLAS takes a strided output) and keeps only ``x`` and
the weights themselves; the backward concatenates the weights once for the input gradient's one GEMM
(a copy that lives for that GEMM only) and computes every weight gradient in one GEMM, split by rows.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def mm_packed(x2: torch.Tensor, weights, biases=()) -> torch.Tensor:
    """x2 (N, H) against each weight, the products side by side in one (N, sum O_i) output."""
    y = x2.new_empty(x2.shape[0], sum(w.shape[0] for w in weights))
    col = 0
    for i, w in enumerate(weights):
        out = y[:, col:col + w.shape[0]]  # rows 2I apart: cuBLAS writes it in place (a leading dimension)
        if biases:
            torch.addmm(biases[i], x2, w.t(), out=out)
        else:
            torch.mm(x2, w.t(), out=out)
        col += w.shape[0]
    return y


def grads_packed(g2: torch.Tensor, x: torch.Tensor, weights, need_x: bool, need_w: bool, has_bias: bool):
    """(grad x, grad weights, grad biases) of ``mm_packed`` for its output's gradient g2 (N, sum O_i)."""
    grad_x = grad_ws = grad_bs = None
    if need_x:
        grad_x = (g2 @ torch.cat(weights)).view(x.shape)  # the concatenation lives for this GEMM only
    if need_w:
        grad_ws = (g2.t() @ x.reshape(-1, x.shape[-1])).split([w.shape[0] for w in weights])
    if has_bias:
        grad_bs = g2.sum(0).split([w.shape[0] for w in weights])
    return grad_x, grad_ws, grad_bs


class _LinearPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int, *params: torch.Tensor):
        weights, biases = params[:n], params[n:]
        y = mm_packed(x.reshape(-1, x.shape[-1]), weights, biases)
        ctx.n, ctx.has_bias = n, bool(biases)
        ctx.save_for_backward(x, *weights)
        return y.view(*x.shape[:-1], y.shape[1])

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        x, *weights = ctx.saved_tensors
        grad_x, grad_ws, grad_bs = grads_packed(grad_y.reshape(-1, grad_y.shape[-1]), x, weights,
                                                ctx.needs_input_grad[0], any(ctx.needs_input_grad[2:2 + ctx.n]),
                                                ctx.has_bias)
        return (grad_x, None, *(grad_ws or (None,) * ctx.n), *(grad_bs or ()))


def packs(x: torch.Tensor, params) -> bool:
    """Whether the packed autograd paths apply: not under autocast or torch.compile (they cast or trace
    the weights themselves), x at least 2-D, every parameter of x's dtype and device."""
    return not (torch.is_autocast_enabled(x.device.type) or torch.compiler.is_compiling() or x.dim() < 2
                or any(p.dtype != x.dtype or p.device != x.device for p in params))


def linear_packed(x: torch.Tensor, weights: Sequence[torch.Tensor],
                  biases: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
    """``F.linear(x, torch.cat(weights), torch.cat(biases))``: x (..., H), weights (O_i, H), biases (O_i,)
    or None -> (..., sum O_i), without a concatenated weight kept for the backward (the module's
    docstring). Under autocast, torch.compile, or with mixed dtypes or devices it is exactly that
    expression (those paths cast or trace the weights themselves)."""
    weights = tuple(weights)
    biases = tuple(biases) if biases is not None else ()
    if biases and len(biases) != len(weights):
        raise ValueError(f"linear_packed: {len(biases)} biases for {len(weights)} weights")
    params = weights + biases
    if not packs(x, params):
        return torch.nn.functional.linear(x, torch.cat(weights), torch.cat(biases) if biases else None)
    return _LinearPacked.apply(x, len(weights), *params)
