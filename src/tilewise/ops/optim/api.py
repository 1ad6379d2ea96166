"""AdamW: ``adamw_`` updates lists of parameters, gradients and moments in place; ``AdamW`` is the
``torch.optim.Optimizer`` around it (the same hyper-parameters, param groups and state dict as
``torch.optim.AdamW``, so checkpoints, LR schedulers and Hugging Face's Trainer take it as they take torch's).

Versions:
    v1_reference: torch.optim.AdamW's update in PyTorch ops, per tensor in fp32 (six passes over memory).
                  bound: memory traffic, ~5x the fused pass's.
    v2_fused:     one Triton pass a parameter (``triton_kernels._adamw_kernel``): p, g, m, v read once, p, m, v
                  written once, the arithmetic in fp32, 16-byte accesses (the launcher specializes on each
                  tensor's alignment). bound: copy bandwidth: 4 reads + 3 writes of the element size
                  (14 bytes an element with bf16 parameters and moments), plus a launch a parameter.
    v3_multi_tensor: v2's pass over every parameter of a group in one launch (``_adamw_multi_kernel``: each
                  program finds its tensor and block in two tables, the tensor's four addresses in a third,
                  copied to the device each step through pinned memory); parameters whose addresses are
                  not 16-byte aligned or whose size is not a multiple of 16 go as v2. bound: copy bandwidth.

What ``torch.optim.AdamW(fused=True)`` does instead: one multi-tensor kernel over chunks of every
parameter, at ~63 % of the H200's copy bandwidth in the Llama-3.2-1B step (docs/tuning/optim.md).

Not supported (ValueError naming the argument): amsgrad, maximize, capturable (the bias corrections are
host scalars), sparse gradients. A parameter whose tensors are not all contiguous, or on the CPU, takes
v1_reference's arithmetic (the one CPU rule; contiguous CUDA tensors never do).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ...cost import Cost
from ...runtime.triton_launch import launch as _launch
from .._checks import runs_reference
from .._memory import check_no_overlap
from .configs import AdamWLaunch, launch_for

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_VARIANT_NAMES = ("v1_reference", "v2_fused", "v3_multi_tensor")


def cost(n: int, dtype: torch.dtype = torch.bfloat16, state_dtype: Optional[torch.dtype] = None) -> Cost:
    """One update of n elements: ~12 FLOPs an element; p, g, m, v read and p, m, v written."""
    s = (state_dtype or dtype).itemsize
    return Cost(flops=12 * n, bytes=n * (3 * dtype.itemsize + 4 * s))


def _hyper(lr, beta1, beta2, eps, weight_decay):
    for name, x in (("lr", lr), ("beta1", beta1), ("beta2", beta2), ("eps", eps), ("weight_decay", weight_decay)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"adamw_: '{name}' must be a finite number, got {x!r}")
    if lr < 0 or eps < 0 or weight_decay < 0:
        raise ValueError(f"adamw_: lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"adamw_: '{name}' must be in [0, 1), got {b}")


def _scalars(step: int, lr, beta1, beta2, weight_decay):
    """(decay, step_size, inv_bc2_sqrt) of step ``step`` (1 for the first update)."""
    return (1.0 - lr * weight_decay, lr / (1.0 - beta1 ** step), 1.0 / math.sqrt(1.0 - beta2 ** step))


def reference(p, g, m, v, *, step: int, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
              weight_decay: float = 1e-2) -> None:
    """v1_reference on one parameter, in place: torch.optim.AdamW's update in fp32 (fp64 for fp64 tensors),
    each tensor rounded once to its dtype."""
    ct = torch.promote_types(p.dtype, torch.float32)
    decay, step_size, inv = _scalars(step, lr, beta1, beta2, weight_decay)
    gf, mf, vf = g.to(ct), m.to(ct), v.to(ct)
    mf = mf + (1.0 - beta1) * (gf - mf)
    vf = vf * beta2 + (1.0 - beta2) * gf * gf
    pf = p.to(ct) * decay - step_size * mf / (vf.sqrt() * inv + eps)
    p.copy_(pf)
    m.copy_(mf)
    v.copy_(vf)


def _check(params, grads, exp_avgs, exp_avg_sqs, steps):
    """Everything ``adamw_`` takes, named in each error; the tensors a CUDA update writes must not overlap."""
    lists = {"params": params, "grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
    for name, xs in lists.items():
        if not isinstance(xs, (list, tuple)):
            raise ValueError(f"adamw_: '{name}' must be a list of tensors, got {type(xs).__name__}")
        if len(xs) != len(params):
            raise ValueError(f"adamw_: '{name}' has {len(xs)} tensors, 'params' {len(params)}")
    if not isinstance(steps, (list, tuple)) or len(steps) != len(params):
        raise ValueError(f"adamw_: 'steps' must be a list of {len(params)} ints (each parameter's step, from 1)")
    for i, (p, g, m, v, t) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, steps)):
        for name, x in (("params", p), ("grads", g), ("exp_avgs", m), ("exp_avg_sqs", v)):
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"adamw_: '{name}[{i}]' must be a torch.Tensor, got {type(x).__name__}")
            if x.dtype not in DTYPES:
                raise ValueError(f"adamw_: '{name}[{i}]' has dtype {x.dtype}; supported: float32, float16, bfloat16")
            if x.shape != p.shape or x.device != p.device:
                raise ValueError(f"adamw_: '{name}[{i}]' is {tuple(x.shape)} on {x.device}; 'params[{i}]' is "
                                 f"{tuple(p.shape)} on {p.device}")
            if x.is_sparse:
                raise ValueError(f"adamw_: '{name}[{i}]' is sparse; AdamW takes dense gradients")
        if g.dtype != p.dtype:
            raise ValueError(f"adamw_: 'grads[{i}]' has dtype {g.dtype}, 'params[{i}]' {p.dtype}")
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"adamw_: 'steps[{i}]' must be an int >= 1, got {t!r}")
        if p.is_cuda and p.numel():
            for name, x in (("grads", g), ("exp_avgs", m), ("exp_avg_sqs", v)):
                check_no_overlap("adamw_", f"{name}[{i}]", x, **{f"params[{i}]": p})
            check_no_overlap("adamw_", f"exp_avg_sqs[{i}]", v, **{f"exp_avgs[{i}]": m, f"grads[{i}]": g})
            check_no_overlap("adamw_", f"exp_avgs[{i}]", m, **{f"grads[{i}]": g})


def _fused(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay, config):
    n = p.numel()
    L = launch_for(p.element_size(), config)
    decay, step_size, inv = _scalars(step, lr, beta1, beta2, weight_decay)
    _launch(_kernels()._adamw_kernel, (-(-n // L.BLOCK),), p, g, m, v, n, float(beta1), float(beta2),
            float(eps), decay, step_size, inv, BLOCK=L.BLOCK, num_warps=L.warps)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2's parameters, their gradients and moments: the update is elementwise, so
    each rank updates its own), else the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None and hasattr(t, "placements") else t


_BLOCK_MAPS: dict = {}  # (device, BLOCK, element counts) -> (numels, block -> tensor, block -> index): pure


def _block_map(dev, block: int, numels: tuple):
    """The multi-tensor launch's tables for these element counts (the same every step: built once)."""
    key = (dev, block, numels)
    got = _BLOCK_MAPS.get(key)
    if got is None:
        counts = torch.tensor([-(-n // block) for n in numels])
        tensor = torch.repeat_interleave(torch.arange(len(numels), dtype=torch.int32), counts)
        starts = torch.cumsum(counts, 0) - counts
        index = (torch.arange(int(counts.sum())) - torch.repeat_interleave(starts, counts)).to(torch.int32)
        if len(_BLOCK_MAPS) >= 16:  # a run steps one model: a handful of groups
            _BLOCK_MAPS.clear()
        got = _BLOCK_MAPS[key] = tuple(x.to(dev) for x in (torch.tensor(numels, dtype=torch.int64), tensor, index))
    return got


def _to_device(rows, dtype, dev):
    """A small host table on ``dev`` without a sync: through pinned memory on CUDA (the caching host allocator
    keeps the buffer until the copy has run)."""
    t = torch.tensor(rows, dtype=dtype)
    return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t


def _on_kernels(p, g, m, v) -> bool:
    """Whether the Triton kernels may take this parameter: plain CUDA tensors (or CPU ones under the interpreter).
    A tensor subclass (a DTensor not unwrapped, a fake tensor under torch.compile) takes the reference's torch
    ops, which dispatch through it; its data pointer is not the data."""
    return all(type(x) in (torch.Tensor, torch.nn.Parameter) for x in (p, g, m, v)) and not runs_reference(
        "adamw_", {"params": p, "grads": g, "exp_avgs": m, "exp_avg_sqs": v}, interpreter=True)


def _multi_takes(p, g, m, v) -> bool:
    """Whether v3's launch takes this parameter: its hints hold (16-byte aligned addresses, a multiple of 16
    elements), the moments share a dtype, everything contiguous and on the kernels' side."""
    return (p.numel() > 0 and p.numel() % 16 == 0 and m.dtype == v.dtype and _on_kernels(p, g, m, v)
            and all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (p, g, m, v)))


def _multi(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay, config):
    """v3 over every parameter it takes, one launch per (device, parameter dtype, moment dtype); the others
    (returned, as indices) go one launch each."""
    groups: dict = {}
    rest = []
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        if _multi_takes(p, g, m, v):
            groups.setdefault((p.device, p.dtype, m.dtype), []).append(i)
        else:
            rest.append(i)
    K = _kernels()
    for (dev, pdt, sdt), idx in groups.items():
        L = launch_for(torch.empty((), dtype=pdt).element_size(), config)
        numels, tensor, index = _block_map(dev, L.BLOCK, tuple(params[i].numel() for i in idx))
        ptrs = _to_device([[params[i].data_ptr(), grads[i].data_ptr(), exp_avgs[i].data_ptr(),
                            exp_avg_sqs[i].data_ptr()] for i in idx], torch.int64, dev)
        scal = _to_device([list(_scalars(steps[i], lr, beta1, beta2, weight_decay)[1:]) for i in idx], torch.float32,
                          dev)
        _launch(K._adamw_multi_kernel, (tensor.numel(),), ptrs, scal, numels, tensor, index, float(beta1),
                float(beta2), float(eps), 1.0 - lr * weight_decay, P_DTYPE=K.TL_DTYPES[pdt], S_DTYPE=K.TL_DTYPES[sdt],
                BLOCK=L.BLOCK, num_warps=L.warps)
    return rest


def _kernels():
    from . import triton_kernels  # Triton is imported on the first CUDA update, not with the package

    return triton_kernels


def adamw_(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
           exp_avg_sqs: Sequence[torch.Tensor], steps: Sequence[int], *, lr: float, beta1: float = 0.9,
           beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2, variant: str = "v3_multi_tensor",
           config: Optional[AdamWLaunch] = None) -> None:
    """One AdamW update of each parameter, in place (params, exp_avgs and exp_avg_sqs are written).

    params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]: tensors of one shape on one device; float32, float16 or
    bfloat16, the gradient of the parameter's dtype, the moments of any of the three (torch keeps them in the
    parameter's). steps[i]: the update's number for that parameter (1 for the first: the bias corrections
    1 - beta^t). variant: "v3_multi_tensor" (one launch for every parameter it takes, the others as v2's),
    "v2_fused" (one Triton pass a parameter; CPU tensors and non-contiguous ones take v1's arithmetic) or
    "v1_reference". config: the kernels' ``AdamWLaunch``, default ``configs.launch_for``.
    """
    _check(params, grads, exp_avgs, exp_avg_sqs, steps)
    _hyper(lr, beta1, beta2, eps, weight_decay)
    if variant not in _VARIANT_NAMES:
        raise ValueError(f"adamw_: 'variant' must be one of {', '.join(_VARIANT_NAMES)}, got {variant!r}")
    _update(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay, variant, config)


def _update(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay, variant, config):
    """``adamw_`` past its checks (``AdamW.step`` checks what it did not allocate itself)."""
    order = range(len(params))
    if variant == "v3_multi_tensor":
        order = _multi(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay, config)
    for i in order:
        p, g, m, v, t = params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], steps[i]
        if not p.numel():
            continue
        fused = variant != "v1_reference" and all(x.is_contiguous() for x in (p, g, m, v)) and _on_kernels(p, g, m, v)
        if fused:
            _fused(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay, config)
        else:
            reference(p, g, m, v, step=t, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)


def v1_reference(params, grads, exp_avgs, exp_avg_sqs, steps, **hyper):
    return adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, variant="v1_reference", **hyper)


def v2_fused(params, grads, exp_avgs, exp_avg_sqs, steps, **hyper):
    return adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, variant="v2_fused", **hyper)


def v3_multi_tensor(params, grads, exp_avgs, exp_avg_sqs, steps, **hyper):
    return adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, variant="v3_multi_tensor", **hyper)


VARIANTS = {"v1_reference": v1_reference, "v2_fused": v2_fused, "v3_multi_tensor": v3_multi_tensor}


class AdamW(torch.optim.Optimizer):
    """``torch.optim.AdamW``'s update through ``adamw_`` (one fused pass a parameter on CUDA tensors).

    params, lr, betas, eps, weight_decay: as torch.optim.AdamW (param groups may override each). The state
    of a parameter is torch's: ``step`` (a CPU float32 scalar tensor), ``exp_avg`` and ``exp_avg_sq`` (zeros
    like the parameter), so ``state_dict()`` loads into torch.optim.AdamW and back. amsgrad, maximize,
    capturable and differentiable raise ValueError; foreach and fused are accepted and ignored (the update
    is always tilewise's). config, variant: as ``adamw_``'s (default: one multi-tensor launch a param group).
    FSDP2's DTensor parameters are updated through each rank's local shards (the update is elementwise).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: Optional[bool] = None, capturable: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None, config: Optional[AdamWLaunch] = None, variant: str = "v3_multi_tensor"):
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"AdamW: 'betas' must be a pair (beta1, beta2), got {betas!r}")
        if torch.is_tensor(lr):
            raise ValueError("AdamW: a tensor 'lr' is not supported (capturable updates are not); pass a float")
        _hyper(lr, betas[0], betas[1], eps, weight_decay)
        for name, flag in (("amsgrad", amsgrad), ("maximize", maximize), ("capturable", capturable),
                           ("differentiable", differentiable)):
            if flag:
                raise ValueError(f"AdamW: {name}=True is not supported; use torch.optim.AdamW for it")
        if config is not None:
            launch_for(2, config)  # the type check
        if variant not in _VARIANT_NAMES:
            raise ValueError(f"AdamW: 'variant' must be one of {', '.join(_VARIANT_NAMES)}, got {variant!r}")
        self._config, self._variant = config, variant
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False, maximize=False,
                        foreach=foreach, capturable=False, differentiable=False, fused=fused,
                        decoupled_weight_decay=True)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss where given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
                if group.get(flag):
                    raise ValueError(f"AdamW: param group has {flag}=True, which is not supported")
            params, grads, ms, vs, counters = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                # What autograd or a caller set: the moments are this optimizer's own (no overlap to check),
                # and a gradient aliasing its parameter is not looked for (nor is it by torch's fused step).
                g = _local(p.grad)
                if g.is_sparse or g.dtype != p.dtype or g.shape != _local(p).shape or g.device != p.device:
                    raise ValueError(f"AdamW: a gradient is {'sparse' if g.is_sparse else g.dtype} "
                                     f"{tuple(g.shape)} on {g.device}; its parameter {p.dtype} {tuple(p.shape)} "
                                     f"on {p.device} (sparse gradients are not supported)")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m, v, p = _local(state["exp_avg"]), _local(state["exp_avg_sq"]), _local(p)
                for name, x in (("exp_avg", m), ("exp_avg_sq", v)):  # a loaded state dict's: the kernel's bounds
                    if x.shape != p.shape or x.device != p.device or x.dtype not in DTYPES:
                        raise ValueError(f"AdamW: state '{name}' is {x.dtype} {tuple(x.shape)} on {x.device}; its "
                                         f"parameter {tuple(p.shape)} on {p.device}")
                params.append(p)
                grads.append(g)
                ms.append(m)
                vs.append(v)
                if state["step"].device.type != "cpu":  # from a checkpoint of a fused or capturable torch AdamW
                    state["step"] = state["step"].to("cpu", torch.float32)
                counters.append(state["step"])
            if not params:
                continue
            torch._foreach_add_(counters, 1.0)
            steps = [int(c.item()) for c in counters]  # CPU scalars: no device sync
            beta1, beta2 = group["betas"]
            lr, eps, wd = float(group["lr"]), group["eps"], group["weight_decay"]
            _hyper(lr, beta1, beta2, eps, wd)  # a group's values may have been changed since (schedulers do)
            _update(params, grads, ms, vs, steps, lr, beta1, beta2, eps, wd, self._variant, self._config)
        return loss
