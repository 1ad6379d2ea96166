"""Argument checks that the kernel launchers of several op families share, so that each op words
the argument at fault the same way."""

from __future__ import annotations

import torch

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_kernel_inputs(what: str, inputs: dict, *, every: bool = False, interpreter: bool = False,
                        reference: str | None = None) -> torch.Tensor:
    """Each of ``inputs`` (argument name -> value) a tensor, then the first a CUDA tensor of a dtype
    the kernels are built for; returns the first. ValueError naming the argument. The first picks the
    kernel: how the others must match it is left to the caller (or to the kernel call's checks), or,
    with ``every``, each one's dtype is a kernel dtype and its device the first's. ``interpreter``: a
    CPU tensor passes under Triton's interpreter (Triton kernels, for tests). ``reference``: the CPU
    alternative the message names (default ``<what>.reference``)."""
    from .. import settings

    for name, t in inputs.items():  # what each argument is, before where it lives
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what}: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    name, first = next(iter(inputs.items()))
    if first.get_device() < 0 and not (interpreter and first.device.type == "cpu" and settings.triton_interpret()):
        raise ValueError(f"{what}: '{name}' is on {first.device}; tilewise kernels need CUDA tensors "
                         f"(use {reference or what + '.reference'} for CPU tensors)")
    for other, t in (inputs.items() if every else [(name, first)]):
        if t.dtype not in KERNEL_DTYPES:
            raise ValueError(f"{what}: '{other}' has dtype {t.dtype}; supported: float32, float16, bfloat16")
        if t.device != first.device:
            raise ValueError(f"{what}: '{other}' is on {t.device} but '{name}' is on {first.device}")
    return first
