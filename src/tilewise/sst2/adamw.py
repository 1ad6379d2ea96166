"""AdamW for the classifier without ``torch.optim``: the update of ``torch.optim.AdamW`` (decoupled weight
decay, bias-corrected moments, its foreach arithmetic), the same ``param_groups`` / ``state`` /
``state_dict`` layout (checkpoints move between the two), and no import of ``torch._dynamo``, which
constructing any ``torch.optim.Optimizer`` triggers: 1.1 s of ``train``'s 2.1 s set-up on a CPU host,
about 3.8 s on the H200 machine (docs/design.md, "Start-up").

``capturable=True`` keeps the step counters on the device and reads a tensor ``lr`` from its address, so
a CUDA graph can capture ``step()`` (graph_step.py); otherwise the counters stay on the CPU, as in
torch's optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

# What torch's AdamW records in a param group beside its hyper-parameters (so its load_state_dict finds
# a group it knows); fixed here: no amsgrad, no maximize.
_TORCH_KEYS = {"amsgrad": False, "maximize": False, "foreach": None, "differentiable": False, "fused": None,
               "decoupled_weight_decay": True}


class AdamW:
    """``AdamW(groups, lr=, betas=, eps=, weight_decay=, capturable=)`` as ``torch.optim.AdamW`` takes them
    (``groups``: parameters, or dicts with ``params`` and per-group overrides)."""

    def __init__(self, groups: Iterable, lr: float | torch.Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, capturable: bool | None = False):
        groups = list(groups)
        if not groups:
            raise ValueError("AdamW: 'groups' is empty")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "capturable": bool(capturable)}
        if torch.is_tensor(lr) and not capturable:
            raise ValueError("AdamW: a tensor 'lr' needs capturable=True (the step reads it on the device)")
        self.param_groups: list[dict] = []
        for g in groups:
            params = list(g["params"])
            if any(not isinstance(p, torch.Tensor) or not p.requires_grad for p in params):
                raise ValueError("AdamW: every parameter must be a tensor that requires grad")
            self.param_groups.append({**defaults, **_TORCH_KEYS, **{k: v for k, v in g.items() if k != "params"},
                                      "params": params})
        self.state: dict[torch.Tensor, dict] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().requires_grad_(False)
                    p.grad.zero_()

    def _state(self, p: torch.Tensor, capturable: bool) -> dict:
        st = self.state.get(p)
        if st is None:
            step_dev = p.device if capturable else "cpu"
            st = self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=step_dev),
                                  "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                  "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return st

    @torch.no_grad()
    def step(self) -> None:
        for g in self.param_groups:
            params = [p for p in g["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p, g["capturable"]) for p in params]
            grads = [p.grad for p in params]
            avgs = [s["exp_avg"] for s in states]
            sqs = [s["exp_avg_sq"] for s in states]
            steps = [s["step"] for s in states]
            lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
            torch._foreach_add_(steps, 1)
            if wd != 0:
                torch._foreach_mul_(params, 1 - lr * wd)
            torch._foreach_lerp_(avgs, grads, 1 - beta1)
            torch._foreach_mul_(sqs, beta2)
            torch._foreach_addcmul_(sqs, grads, grads, 1 - beta2)
            if g["capturable"]:
                # Everything on the device, as torch's capturable path: the step counts are tensors.
                neg_step = torch._foreach_pow(beta1, steps)
                bc2 = torch._foreach_pow(beta2, steps)
                torch._foreach_sub_(neg_step, 1)  # beta1 ** t - 1
                torch._foreach_sub_(bc2, 1)
                torch._foreach_neg_(bc2)  # 1 - beta2 ** t
                torch._foreach_div_(neg_step, lr)
                torch._foreach_reciprocal_(neg_step)  # -lr / (1 - beta1 ** t)
                torch._foreach_sqrt_(bc2)
                denom = torch._foreach_sqrt(sqs)
                torch._foreach_div_(denom, bc2)
                torch._foreach_add_(denom, eps)
                torch._foreach_div_(denom, neg_step)
                torch._foreach_addcdiv_(params, avgs, denom)
            else:
                ts = [float(s) for s in steps]  # CPU counters: no device sync
                step_size = [(lr / (1 - beta1 ** t)) * -1 for t in ts]
                bc2_sqrt = [(1 - beta2 ** t) ** 0.5 for t in ts]
                denom = torch._foreach_sqrt(sqs)
                torch._foreach_div_(denom, bc2_sqrt)
                torch._foreach_add_(denom, eps)
                torch._foreach_addcdiv_(params, avgs, denom, step_size)

    def state_dict(self) -> dict:
        """torch.optim's layout: parameters by their index over the groups."""
        index: dict[int, int] = {}
        groups = []
        for g in self.param_groups:
            ids = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(st) for p, st in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        """A state dict of this class or of ``torch.optim.AdamW`` (Adam's amsgrad and maximize not)."""
        groups = sd["param_groups"]
        if len(groups) != len(self.param_groups) or any(len(a["params"]) != len(b["params"])
                                                       for a, b in zip(groups, self.param_groups)):
            raise ValueError("AdamW.load_state_dict: the saved groups do not match this optimizer's parameters")
        if any(g.get("amsgrad") or g.get("maximize") for g in groups):
            raise ValueError("AdamW.load_state_dict: amsgrad and maximize are not supported")
        by_index = {}
        for saved, mine in zip(groups, self.param_groups):
            for i, p in zip(saved["params"], mine["params"]):
                by_index[i] = p
            mine.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {}
        for i, st in sd["state"].items():
            p = by_index[int(i)]
            self.state[p] = {"step": st["step"].to(torch.float32).clone(),
                             "exp_avg": st["exp_avg"].to(p.device, p.dtype).clone(),
                             "exp_avg_sq": st["exp_avg_sq"].to(p.device, p.dtype).clone()}
