"""A SwiGLU MLP that keeps its activation out of the step's peak: ``swiglu_mlp``.

``down(swiglu_packed(linear_packed(x, (gate, up))))`` keeps, for the backward, x, the (N, 2I) gate / up
output (SwiGLU's backward reads it) and the (N, I) activation (the down projection's weight gradient
reads it). The activation is a function of the gate / up output, so ``swiglu_mlp`` frees it after the
forward and the SwiGLU backward kernel writes it again beside its gradient (one more (N, I) write in
the backward; the same kernel, so bitwise the forward's values). At Llama-3.2-1B's size and 16384
tokens a step that is 256 MiB a layer, 4 GiB over 16 layers, all alive at the step's peak.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import settings
from ..ops.pointwise.swiglu import _run_packed, swiglu_packed
from .packed import grads_packed, linear_packed, mm_packed, packs


KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # swiglu_packed's kernel's


class _SwiGLUMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, has_bias, w_gate, w_up, w_down, b_gate, b_up, b_down):
        x2 = x.reshape(-1, x.shape[-1])
        gate_up = mm_packed(x2, (w_gate, w_up), (b_gate, b_up) if has_bias else ())
        h = _run_packed(gate_up)
        y = torch.nn.functional.linear(h, w_down, b_down)
        ctx.has_bias = has_bias
        ctx.save_for_backward(x, gate_up, w_gate, w_up, w_down)  # not h: the backward writes it again
        return y.view(*x.shape[:-1], w_down.shape[0])

    @staticmethod
    def backward(ctx, grad_y):
        x, gate_up, w_gate, w_up, w_down = ctx.saved_tensors
        need = ctx.needs_input_grad
        g2 = grad_y.reshape(-1, grad_y.shape[-1])
        dgate_up, h = _run_packed(gate_up, g2 @ w_down, keep_y=True)
        grad_wd = g2.t() @ h if need[4] else None
        del h
        grad_bd = g2.sum(0) if need[7] else None
        grad_x, grad_ws, grad_bs = grads_packed(dgate_up, x, (w_gate, w_up), need[0], need[2] or need[3],
                                                ctx.has_bias)
        return (grad_x, None, *(grad_ws or (None, None)), grad_wd, *(grad_bs or (None, None)), grad_bd)


def swiglu_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
               b_gate: Optional[torch.Tensor] = None, b_up: Optional[torch.Tensor] = None,
               b_down: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(silu(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up), w_down, b_down)`` with the activation
    recomputed in the backward instead of kept (the module's docstring).

    x (..., H); w_gate, w_up (I, H); w_down (H_out, I); the biases (I,), (I,), (H_out,) or None (gate and
    up both or neither). Returns (..., H_out). Under autocast, torch.compile, with mixed dtypes or devices,
    or on CPU tensors outside Triton's interpreter it is ``linear_packed`` + ``swiglu_packed`` + the down
    projection, which keep the activation."""
    if (b_gate is None) != (b_up is None):
        raise ValueError("swiglu_mlp: 'b_gate' and 'b_up' must both be tensors or both None")
    if x.shape[-1:] != w_gate.shape[1:] or w_up.shape != w_gate.shape or w_down.shape[1:] != w_gate.shape[:1]:
        raise ValueError(f"swiglu_mlp: shapes x {tuple(x.shape)}, w_gate {tuple(w_gate.shape)}, w_up "
                         f"{tuple(w_up.shape)}, w_down {tuple(w_down.shape)}: need (..., H), (I, H), (I, H), "
                         f"(H_out, I)")
    params = tuple(p for p in (w_gate, w_up, w_down, b_gate, b_up, b_down) if p is not None)
    if (not packs(x, params) or x.dtype not in KERNEL_DTYPES
            or not (x.is_cuda or (settings.triton_interpret() and x.device.type == "cpu"))):
        gate_up = linear_packed(x, (w_gate, w_up), None if b_gate is None else (b_gate, b_up))
        return torch.nn.functional.linear(swiglu_packed(gate_up), w_down, b_down)
    return _SwiGLUMLP.apply(x, b_gate is not None, w_gate, w_up, w_down, b_gate, b_up, b_down)
