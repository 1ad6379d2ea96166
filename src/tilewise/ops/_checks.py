"""Argument checks that the kernel launchers of several op families share, so that each op words
the argument at fault the same way."""

from __future__ import annotations

import torch

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_kernel_inputs(what: str, inputs: dict, *, every: bool = False, interpreter: bool = False,
                        cpu: bool = False) -> torch.Tensor:
    """Each of ``inputs`` (argument name -> value) a tensor, then the first a CUDA tensor of a dtype
    the kernels are built for; returns the first. ValueError naming the argument. The first picks the
    kernel: how the others must match it is left to the caller (or to the kernel call's checks), or,
    with ``every``, each one's dtype is a kernel dtype and its device the first's. A CPU tensor
    passes with ``cpu`` (a public op about to run its reference: ``runs_reference``) or, with
    ``interpreter``, under Triton's interpreter (Triton kernels, for tests); else the message names
    the public op that takes it (``tilewise.<what>``)."""
    from .. import settings

    for name, t in inputs.items():  # what each argument is, before where it lives
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what}: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    name, first = next(iter(inputs.items()))
    if first.get_device() < 0 and not (first.device.type == "cpu"
                                       and (cpu or (interpreter and settings.triton_interpret()))):
        raise ValueError(f"{what}: '{name}' is on {first.device}; tilewise kernels need CUDA tensors "
                         f"(use tilewise.{what} for CPU tensors)")
    for other, t in (inputs.items() if every else [(name, first)]):
        if t.dtype not in KERNEL_DTYPES:
            raise ValueError(f"{what}: '{other}' has dtype {t.dtype}; supported: float32, float16, bfloat16")
        if t.device != first.device:
            raise ValueError(f"{what}: '{other}' is on {t.device} but '{name}' is on {first.device}")
    return first


def runs_reference(what: str, inputs: dict, *, interpreter: bool = False) -> bool:
    """The one CPU rule: True when a public op must run its PyTorch reference, because its first
    tensor argument (``inputs``: argument name -> value, in signature order) is on the CPU. Then every
    other tensor argument must be on the CPU too (ValueError naming it). ``interpreter``: the op's
    Triton kernels run on CPU tensors under Triton's interpreter (tests), so they do there instead.
    False when the first argument is not a tensor: the op's own checks word that error."""
    from .. import settings

    name, first = next(iter(inputs.items()))
    if not isinstance(first, torch.Tensor) or first.device.type != "cpu":
        return False
    if interpreter and settings.triton_interpret():
        return False
    for other, t in inputs.items():
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            raise ValueError(f"{what}: '{other}' is on {t.device} but '{name}' is on cpu; put both on one device")
    return True


def into_out(what: str, result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A reference's result written into the caller's ``out`` (checked to match it), or the result."""
    if out is None:
        return result
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{what}: 'out' must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != result.shape or out.dtype != result.dtype or out.device != result.device:
        raise ValueError(f"{what}: 'out' is {tuple(out.shape)} {out.dtype} on {out.device}; the result is "
                         f"{tuple(result.shape)} {result.dtype} on {result.device}")
    return out.copy_(result)
