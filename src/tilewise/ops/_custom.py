"""The eager twin of a torch custom op: an autograd Function that runs the op's implementation and its
registered setup and backward directly, without the dispatcher's host time (the custom op stays what
torch.compile traces)."""

from __future__ import annotations

from typing import Callable

import torch


def eager_twin(name: str, run: Callable, setup: Callable, grad: Callable,
               nondifferentiable: tuple[int, ...] = ()) -> type:
    """A Function whose forward is ``run(*args)`` then ``setup(ctx, args, out)`` (``ctx.eager`` set, so
    ``grad`` can call the implementation instead of the backward op) and whose backward is ``grad``;
    outputs at ``nondifferentiable`` are marked so."""

    def forward(ctx, *args):
        out = run(*args)
        setup(ctx, args, out)
        ctx.eager = True
        if nondifferentiable:
            ctx.mark_non_differentiable(*(out[i] for i in nondifferentiable))
        return out

    def backward(ctx, *grads):
        return grad(ctx, *grads)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                    "backward": staticmethod(backward), "__doc__": __doc__})
