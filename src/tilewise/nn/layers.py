"""Transformer layers on tilewise kernels, drop-in for their Hugging Face counterparts."""

from __future__ import annotations

import torch

from ..ops.norm.api import MODES, rms_norm
from ..ops.pointwise.swiglu import swiglu


class RMSNorm(torch.nn.Module):
    """``LlamaRMSNorm`` (``mode="llama"``; Mistral, Qwen2) or ``GemmaRMSNorm`` (``mode="gemma"``: the
    weight starts at 0 and scales by 1 + weight) on ``tilewise.rms_norm``. Same parameter name
    (``weight``) and ``variance_epsilon`` attribute as transformers', so a state dict loads as is.
    CUDA tensors (and CPU ones under TRITON_INTERPRET=1)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, mode: str = "llama", device=None, dtype=None):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"RMSNorm: 'mode' must be one of {MODES}, got {mode!r}")
        init = torch.zeros if mode == "gemma" else torch.ones
        self.weight = torch.nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self.mode = mode

    @classmethod
    def sharing(cls, weight: torch.nn.Parameter, eps: float, mode: str = "llama") -> "RMSNorm":
        """An RMSNorm holding ``weight`` itself (the Parameter, not a copy): to stand in for a
        transformers norm without touching the optimizer or the state dict."""
        new = cls(weight.shape[0], eps, mode, device="meta")
        new.weight = weight
        return new

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, mode=self.mode)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, mode={self.mode!r}"


class SwiGLU(torch.nn.Module):
    """``LlamaMLP`` (Mistral's, Qwen2's): ``down_proj(silu(gate_proj(x)) * up_proj(x))`` with the
    activation in one tilewise kernel (``swiglu``); the projections are torch's Linear (cuBLAS).
    Same parameter names as transformers', so a state dict loads as is."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.gate_proj = torch.nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = torch.nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = torch.nn.Linear(intermediate_size, hidden_size, **kw)

    @classmethod
    def sharing(cls, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Linear) -> "SwiGLU":
        """A SwiGLU holding these three Linear modules themselves (as ``RMSNorm.sharing``)."""
        new = cls(gate_proj.in_features, gate_proj.out_features, device="meta")
        new.gate_proj, new.up_proj, new.down_proj = gate_proj, up_proj, down_proj
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
