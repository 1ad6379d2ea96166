"""Transformer layers on tilewise kernels, drop-in for their Hugging Face counterparts."""

from __future__ import annotations

import math

import torch

from ..ops._autocast import autocast_inputs
from ..ops.attention.api import flash_attention
from ..ops.gemm.api import linear
from ..ops.norm.api import MODES, rms_norm
from ..ops.pointwise.swiglu import swiglu, swiglu_packed
from ..ops.rope.api import apply_rotary
from .mlp import swiglu_mlp
from .packed import linear_packed


def is_plain_linear(m: torch.nn.Module) -> bool:
    """Whether ``m(x)`` is exactly ``F.linear(x, m.weight, m.bias)``: a ``torch.nn.Linear`` itself with no
    forward hooks. A fused path that reads a layer's weight in place of calling it stands aside for
    anything else: PEFT's LoRA layers, quantized linears and parametrizations compute more than the
    weight says, and sharding hooks (DeepSpeed ZeRO-3) gather the weight only when the layer is called."""
    return type(m) is torch.nn.Linear and not m._forward_hooks and not m._forward_pre_hooks


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
    Same parameter names as transformers', so a state dict loads as is.

    fuse_gate_up: gate and up written side by side into one (..., 2 * I) output (``linear_packed``: no
    concatenated weight kept for the backward), then ``swiglu_packed``; its one (..., 2 * I) gradient
    makes the input gradient one GEMM too. The parameters stay two. Where gate or up is not a plain
    Linear (``is_plain_linear``), they run as themselves.
    recompute: with ``fuse_gate_up``, the activation (..., I) is not kept for the backward but written
    again by SwiGLU's backward kernel (``tilewise.nn.mlp.swiglu_mlp``): (tokens x I) elements less a layer
    at the step's peak for one more write in the backward. Needs down_proj a plain Linear too."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None,
                 fuse_gate_up: bool = False, recompute: bool = False):
        super().__init__()
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.gate_proj = torch.nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = torch.nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = torch.nn.Linear(intermediate_size, hidden_size, **kw)
        self.fuse_gate_up, self.recompute = fuse_gate_up, recompute

    @classmethod
    def sharing(cls, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Linear,
                fuse_gate_up: bool = False, recompute: bool = False) -> "SwiGLU":
        """A SwiGLU holding these three Linear modules themselves (as ``RMSNorm.sharing``)."""
        new = cls(gate_proj.in_features, gate_proj.out_features, device="meta", fuse_gate_up=fuse_gate_up,
                  recompute=recompute)
        new.gate_proj, new.up_proj, new.down_proj = gate_proj, up_proj, down_proj
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_proj, self.up_proj
        # the fused GEMM reads the weights: LoRA adapters, quantized layers and hooks must run themselves
        if not self.fuse_gate_up or not (is_plain_linear(g) and is_plain_linear(u)):
            return self.down_proj(swiglu(g(x), u(x)))
        d = self.down_proj
        if self.recompute and is_plain_linear(d) and (g.bias is None) == (u.bias is None):
            return swiglu_mlp(x, g.weight, u.weight, d.weight, g.bias, u.bias, d.bias)
        biases = (g.bias, u.bias) if g.bias is not None else None
        return d(swiglu_packed(linear_packed(x, (g.weight, u.weight), biases)))

    def extra_repr(self) -> str:
        return ", ".join(f"{k}=True" for k in ("fuse_gate_up", "recompute") if getattr(self, k))


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` on ``tilewise.linear``: ``activation(x @ weight.T + bias)`` with the bias and
    the activation (None, "relu" or "gelu") applied in the GEMM's epilogue, not as separate passes.
    Same parameters as torch's (a state dict loads as is). x: (..., in_features) CUDA float16 /
    bfloat16 / float32 (TF32) of the weight's dtype; under autocast, as torch's Linear, x, the weight and
    the bias in autocast's dtype (the weight cast on every call: autocast's own cache of casts is not
    reached from here)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 device=None, dtype=None):
        if activation not in (None, "relu", "gelu"):
            raise ValueError(f"Linear: 'activation' must be None, 'relu' or 'gelu', got {activation!r}")
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(*autocast_inputs(x, self.weight, self.bias), self.activation)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation!r}"


class RotaryEmbedding(torch.nn.Module):
    """Llama's rotary embedding: ``forward(x, position_ids)`` -> (cos, sin), each (B, S, head_dim) in x's
    dtype, as transformers' LlamaRotaryEmbedding returns them (for ``apply_rotary``).

    head_dim: even. base: the rope theta (Llama 3: 500000). scaling: None, or Llama 3.1's
    ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}``: wavelengths longer than original / low_freq_factor are
    stretched by ``factor``, shorter than original / high_freq_factor kept, the band between
    interpolated."""

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: dict | None = None, device=None):
        super().__init__()
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"RotaryEmbedding: 'head_dim' must be even and > 0, got {head_dim}")
        # float32 throughout, as transformers computes them: its cos / sin come out bit for bit
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind != "llama3":
                raise ValueError(f"RotaryEmbedding: 'scaling' rope_type {kind!r} is not supported (None or 'llama3')")
            inv = _llama3_inv_freq(inv, float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                   float(scaling["high_freq_factor"]),
                                   float(scaling["original_max_position_embeddings"]))
        self.register_buffer("inv_freq", inv, persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)  # (B, S, head_dim / 2), fp32
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _llama3_inv_freq(inv, factor, low, high, original):
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = original / low, original / high
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    return torch.where((wavelen >= high_wl) & (wavelen <= low_wl), mid, scaled)


class Attention(torch.nn.Module):
    """``LlamaAttention``'s computation on tilewise kernels: q / k / v projections, RoPE
    (``apply_rotary``), ``flash_attention`` (grouped-query), the output projection. Parameters named
    as transformers' (q_proj, k_proj, v_proj, o_proj), so its state dict loads as is.

    forward(hidden (B, S, hidden_size), cos, sin, causal=True, mask=None, window=None) -> (B, S,
    hidden_size); cos / sin from ``RotaryEmbedding`` (or transformers'); mask / window as
    ``flash_attention``'s."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, bias: bool = False, device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_kv_heads or num_heads
        head_dim = head_dim or hidden_size // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"Attention: 'num_heads' ({num_heads}) must be a multiple of 'num_kv_heads' "
                             f"({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.q_proj = torch.nn.Linear(hidden_size, num_heads * head_dim, **kw)
        self.k_proj = torch.nn.Linear(hidden_size, num_kv_heads * head_dim, **kw)
        self.v_proj = torch.nn.Linear(hidden_size, num_kv_heads * head_dim, **kw)
        self.o_proj = torch.nn.Linear(num_heads * head_dim, hidden_size, bias=bias, device=device, dtype=dtype)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, causal: bool = True,
                mask: torch.Tensor | None = None, window: tuple | None = None) -> torch.Tensor:
        B, S, _ = hidden.shape
        q = self.q_proj(hidden).view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden).view(B, S, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden).view(B, S, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        out = flash_attention(q, k, v, causal=causal, mask=mask, window=window)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))
