"""The elementwise ops: each one's functor in ``include/elementwise_ops.cuh``, PyTorch reference and
FLOP count. ``elementwise`` runs them as kernels, ``fusion`` writes them into generated kernels."""

from __future__ import annotations

import torch


def _gelu_ref(x):
    # PyTorch's vectorized float32 CPU gelu gives NaN at +inf; the kernels (and the math) give +inf
    return torch.where(x == float("inf"), x, torch.nn.functional.gelu(x))


# op name -> (functor, PyTorch reference, FLOPs per element as counted in elementwise.cost())
MAP_OPS = {
    "neg": ("Neg", torch.neg, 1),
    "relu": ("Relu", torch.relu, 1),
    "exp": ("Exp", torch.exp, 1),
    "log": ("Log", torch.log, 1),
    "sigmoid": ("Sigmoid", torch.sigmoid, 3),
    "tanh": ("Tanh", torch.tanh, 1),
    "gelu": ("Gelu", _gelu_ref, 5),
    "sin": ("Sin", torch.sin, 1),
    "cos": ("Cos", torch.cos, 1),
}


def _relu_backward_ref(g, x):
    return torch.where(x > 0, g, torch.zeros((), dtype=g.dtype, device=g.device))


ZIP_OPS = {
    "add": ("Add", torch.add, 1),
    "sub": ("Sub", torch.sub, 1),
    "mul": ("Mul", torch.mul, 1),
    "div": ("Div", torch.div, 1),
    "max": ("Max", torch.maximum, 1),
    "pow": ("Pow", torch.pow, 1),
    "relu_backward": ("ReluBackward", _relu_backward_ref, 1),
}


def check_op(op: str, table: dict, what: str) -> str:
    """``op`` when it is a key of ``table``; ValueError listing the choices otherwise."""
    if op not in table:
        raise ValueError(f"{what}: unknown op {op!r}; choose from {sorted(table)}")
    return op
