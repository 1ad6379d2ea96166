"""Transformer layers on tilewise kernels, drop-in for their Hugging Face counterparts."""

from __future__ import annotations

import torch

from ..ops.norm.api import MODES, rms_norm


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

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, mode=self.mode)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, mode={self.mode!r}"
