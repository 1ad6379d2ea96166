"""The classifier's operations, each on a tilewise op when that op is importable and applies,
else on PyTorch with the reason kept in ``report()``.

This is the one place where the model meets the ops, so that wiring a new op in is a change here
only. The contract each op is expected to meet (looked up by name at first use):

    embedding      tilewise.ops.embedding.api.embedding(ids, weight, padding_idx=None)
    linear         tilewise.ops.gemm.api.linear(x, w, b=None, activation=None|"relu")
                   (x, w, b passed by position; also accepted: tilewise.linear)
    masked_mean    tilewise.ops.pointwise.reduce.masked_mean(x, lengths, dim=1)  (x (B, T, H), lengths (B,))
    cross_entropy  tilewise.ops.rowwise.cross_entropy.cross_entropy_capturable(logits, target): no host
                   sync, so CUDA graphs capture it and an eager loop runs ahead of the GPU; targets
                   out of range are counted on the device: ``check_targets()`` raises on them
                   (``tilewise train`` calls it after every epoch). Else ...cross_entropy(logits,
                   target), which checks the targets on the host (NOT_CAPTURABLE).

A candidate that is missing, raises on import, or lacks the parameters above is skipped with a
note, and the PyTorch expression of the same math is used. On CPU tensors every operation uses
PyTorch (the tilewise kernels are GPU kernels).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

import torch
import torch.nn.functional as F

# name -> list of (module, attribute, parameter names the call uses)
CANDIDATES: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "embedding": [("tilewise.ops.embedding.api", "embedding", ("ids", "weight", "padding_idx"))],
    "linear": [("tilewise.ops.gemm.api", "linear", ("x", "activation")),
               ("tilewise", "linear", ("x", "activation"))],
    "masked_mean": [("tilewise.ops.pointwise.reduce", "masked_mean", ("x", "lengths"))],
    "cross_entropy": [("tilewise.ops.rowwise.cross_entropy", "cross_entropy_capturable", ()),
                      ("tilewise.ops.rowwise.cross_entropy", "cross_entropy", ())],
}

# Implementations ("module.attr") that synchronize with the host (so cannot be captured in a CUDA
# graph), and why; when one of them is the resolved one, PyTorch's op is used while capturing.
NOT_CAPTURABLE: dict[str, str] = {
    "tilewise.ops.rowwise.cross_entropy.cross_entropy": "it checks the targets with a device-to-host copy",
}

_resolved: dict[str, Callable | None] = {}
_impl: dict[str, str] = {}  # name -> "module.attr" of the resolved implementation
_notes: dict[str, str] = {}


def _params_ok(fn: Callable, names: tuple[str, ...]) -> str | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or custom op without a signature: trust it
    params = sig.parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    missing = [n for n in names[1:] if n not in params]  # the first is positional by convention
    return f"its signature {sig} lacks {missing}" if missing else None


def resolve(name: str) -> Callable | None:
    """The tilewise function for ``name``, or None (and a note saying why) to use PyTorch."""
    if name in _resolved:
        return _resolved[name]
    why = []
    fn = None
    for mod_name, attr, names in CANDIDATES[name]:
        try:
            mod = importlib.import_module(mod_name)
        except Exception as e:  # a broken op module must not take the model down
            why.append(f"{mod_name} not importable ({type(e).__name__}: {e})")
            continue
        cand = getattr(mod, attr, None)
        if cand is None:
            why.append(f"{mod_name} has no {attr}")
            continue
        bad = _params_ok(cand, names)
        if bad:
            why.append(f"{mod_name}.{attr}: {bad}")
            continue
        fn = cand
        _impl[name] = f"{mod_name}.{attr}"
        _notes[name] = f"tilewise ({mod_name}.{attr})"
        break
    if fn is None:
        _notes[name] = "torch (" + "; ".join(why) + ")"
    _resolved[name] = fn
    return fn


def reset() -> None:
    """Forget what was resolved (tests; or after an op module was added at run time)."""
    _resolved.clear()
    _impl.clear()
    _notes.clear()


def report() -> dict[str, str]:
    """For each operation: which implementation the tilewise backend uses, and why."""
    for name in CANDIDATES:
        resolve(name)
    return dict(_notes)


def _capture_fallback(name: str) -> bool:
    """Whether ``name``'s resolved implementation synchronizes with the host (NOT_CAPTURABLE)."""
    resolve(name)
    return _impl.get(name) in NOT_CAPTURABLE


def _capturing(name: str) -> bool:
    if _capture_fallback(name) and torch.cuda.is_current_stream_capturing():
        _notes[name + " (in CUDA graphs)"] = f"torch ({_impl[name]}: {NOT_CAPTURABLE[_impl[name]]})"
        return True
    return False


def check_targets(device=None) -> None:
    """Raise ValueError if the sync-free cross-entropy saw class targets out of range on
    ``device`` since the last call (one host sync; a no-op when that op is not the one in use)."""
    if _impl.get("cross_entropy", "").endswith("cross_entropy_capturable"):
        from ..ops.rowwise import cross_entropy as ce

        ce.check_targets(device)


def _gpu(*ts: torch.Tensor) -> bool:
    return all(t.is_cuda for t in ts)


def embedding(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """(B, T) int64 ids, (V, E) weight -> (B, T, E)."""
    fn = resolve("embedding")
    if fn is not None and _gpu(ids, weight):
        return fn(ids, weight, padding_idx=padding_idx)
    return F.embedding(ids, weight, padding_idx=padding_idx)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None) -> torch.Tensor:
    """x (..., K), weight (N, K), bias (N,) -> (..., N), then ``activation`` (None or "relu")."""
    if activation not in (None, "relu"):
        raise ValueError(f"linear: activation must be None or 'relu', got {activation!r}")
    fn = resolve("linear")
    if fn is not None and _gpu(x, weight):
        lead = x.shape[:-1]
        y = fn(x.reshape(-1, x.shape[-1]), weight, bias, activation=activation)
        return y.reshape(*lead, weight.shape[0])
    y = F.linear(x, weight, bias)
    return F.relu(y) if activation == "relu" else y


def masked_mean_reference(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Mean of x[b, :lengths[b], :] over the tokens: (B, T, H), (B,) -> (B, H)."""
    T = x.shape[1]
    mask = (torch.arange(T, device=x.device)[None, :] < lengths[:, None]).to(x.dtype)
    return (x * mask[:, :, None]).sum(1) / lengths.clamp(min=1).to(x.dtype)[:, None]


def masked_mean(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T, H) and lengths (B,) int64 in [1, T] -> (B, H)."""
    fn = resolve("masked_mean")
    if fn is not None and _gpu(x, lengths):
        return fn(x, lengths)
    return masked_mean_reference(x, lengths)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, C) logits, (B,) int64 classes -> scalar mean loss."""
    fn = resolve("cross_entropy")
    if fn is not None and _gpu(logits, target) and not _capturing("cross_entropy"):
        return fn(logits, target)
    return F.cross_entropy(logits, target)
