"""Hugging Face ``transformers`` on tilewise kernels.

Importing this module registers ``"tilewise"`` as an attention implementation, with its mask builder:

    import tilewise.integrations.transformers  # noqa: F401  (registers "tilewise")
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="tilewise")

or swaps the Llama-family layers of a model that is already built (Llama, Mistral, Qwen2 and the
models that reuse their layers):

    from tilewise.integrations.transformers import apply_tilewise
    apply_tilewise(model)             # attention, RMSNorm, RoPE, the SwiGLU MLP, the lm head + loss
    apply_tilewise(model, rope=False) # each part has its own keyword

What reaches ``flash_attention``:
- A padded batch (the usual 2D ``attention_mask``) arrives as a (B, 1, 1, Sk) key mask; key tiles
  of padding are skipped. No (Sq, Sk) tensor is built for plain causal or bidirectional masks.
- Causal attention over a KV cache (Sq < Sk, the new queries last) uses ``align="bottom_right"``.
- ``sliding_window`` (Mistral, Qwen2) becomes ``window=(sliding_window - 1, 0)``: transformers keeps
  key j for query i when i - j < sliding_window. Padding comes as the key mask, as above.
- ``softcap`` (Gemma 2) and ``scaling`` pass through.
- Packed sequences (documents back to back in a row, found by transformers from ``position_ids``
  that restart, with no ``attention_mask``; e.g. ``DataCollatorWithFlattening``) run
  ``flash_attention_varlen`` on the rows' documents: no (Sq, Sk) mask and no work across documents.
  The mask builder hands the attention transformers' per-token document ids (a (B, S) integer
  tensor) in place of a mask. Eager calls only: under ``torch.compile`` the builder does not look
  inside mask functions, and packing takes the dense path below.
- Any other mask (a static cache's slots, a model's own mask function) is built dense by
  transformers' SDPA mask builder and passed as ``mask=``: correct, and slower (the mask is read
  tile by tile). A 4D mask the caller gives is used as is (bool: ``mask=``; float: ``bias=``).
- Attention dropout is not implemented: a training call with dropout > 0 raises.

``"tilewise_auto"`` (what ``apply_tilewise`` sets by default) runs each call on whichever of
``flash_attention`` and PyTorch's ``scaled_dot_product_attention`` measured faster for it on this GPU
(``ops/attention/configs.py``'s ``SDPA_RULES``, by compute capability, head dim, causality, length
and whether gradients follow): SDPA only for plain self-attention (no padding or other mask, no window,
softcap or attention sinks, Sq = Sk) on a measured GPU; everything else, and any GPU or head dim not
measured, runs ``flash_attention`` as above. On sm_90 a training call takes cuDNN's backward at every
measured shape but head dim 64 causal from 4096 to 16384 (there flash_attention's whole call is the faster):
with our forward where that is the faster one (``configs.cudnn_backward_pays``: the policy's backward "cudnn"),
else SDPA's whole (docs/tuning/attention.md, "Against SDPA", "The backward along S").

``transformers`` is an optional dependency (``pip install tilewise[transformers]``).
"""

from __future__ import annotations

import functools
import sys
import warnings

import torch

try:
    import transformers
    from transformers import masking_utils
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("tilewise.integrations.transformers needs the transformers package: "
                      "pip install 'tilewise[transformers]'") from e

from .. import settings
from ..nn.layers import RMSNorm, SwiGLU, is_plain_linear
from ..ops._autocast import autocast_inputs
from ..ops.norm.api import add_rms_norm
from ..ops.attention import configs as attention_configs
from ..ops.attention.api import flash_attention
from ..ops.attention.varlen import flash_attention_varlen
from ..ops.rope.api import apply_rotary, apply_rotary_qkv
from ..ops.rowwise.linear_cross_entropy import TargetCount, linear_cross_entropy
from ..ops.rope.api import reference as rope_reference

NAME = "tilewise"
AUTO_NAME = "tilewise_auto"

# What the attention calls; module attributes so the CPU tests can put the references in their place.
_attention = flash_attention
_attention_varlen = flash_attention_varlen


def _sliding_causal(fn) -> bool:
    # transformers' sliding-window causal mask is and_masks(sliding_window_overlay(W), causal_mask_function);
    # the window itself reaches attention_forward as ``sliding_window``. Anything else is not this.
    parts = [c for c in _closure(fn).values() if isinstance(c, tuple)]
    return (len(parts) == 1 and len(parts[0]) == 2 and parts[0][1] is masking_utils.causal_mask_function
            and getattr(parts[0][0], "__qualname__", "").startswith("sliding_window_overlay."))


def _closure(fn) -> dict:
    return dict(zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()),
                    (c.cell_contents for c in (getattr(fn, "__closure__", None) or ()))))


def _packed_documents(fn):
    """The (B, S) document ids of transformers' packed-sequence mask, ``and_masks(base,
    packed_sequence_mask_function(ids))`` with ``base`` causal or sliding causal, as transformers 5.17
    builds it, or (5.25) that base inside ``remap_positions_for_packed_sequence(base, position_ids)``;
    None for any other mask function. Within a document positions step by one, so a remapped causal (and
    window) test is the plain one on token indices."""
    parts = _closure(fn).get("mask_functions")
    if not (isinstance(parts, tuple) and len(parts) == 2):
        return None
    base, same = parts
    if not getattr(same, "__qualname__", "").startswith("packed_sequence_mask_function."):
        return None
    if getattr(base, "__qualname__", "").startswith("remap_positions_for_packed_sequence."):
        base = _closure(base).get("mask_function")
    if base is not masking_utils.causal_mask_function and not _sliding_causal(base):
        return None
    ids = _closure(same).get("packed_sequence_mask")
    return ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point() else None


def _query_span(kw) -> tuple:
    # (q_length, q_offset): transformers >= 5 passes them; 4.5x passes cache_position (the queries'
    # positions), read on the host only when the keys outnumber the queries (a cached step).
    if "q_length" in kw:
        return kw["q_length"], kw.get("q_offset", 0)
    positions = kw["cache_position"]
    n = positions.shape[0]
    return n, (0 if n == 0 or kw["kv_length"] == n else int(positions[0]))


def mask_builder(batch_size: int, **kw):
    """transformers' mask hook for ``attn_implementation="tilewise"`` (called with keywords: q_length,
    kv_length, q_offset, kv_offset or, before transformers 5, cache_position; mask_function;
    attention_mask, the (B, kv) 0/1 padding mask). Returns None (no padding), the (B, kv_length) bool
    key mask (padding), or, for a mask it cannot describe that way, the dense (B, 1, Sq, kv_length)
    bool mask of transformers' SDPA builder."""
    mask_function = kw.get("mask_function", masking_utils.causal_mask_function)
    attention_mask, kv_length = kw.get("attention_mask"), kw["kv_length"]
    # Under torch.compile the closure inspection of _sliding_causal breaks Dynamo's tracing of the mask
    # function later (a crash, not a graph break); there transformers ANDs a packed-sequence mask into
    # every training mask anyway, so the window takes the dense path, as other masks do.
    plain = mask_function in (masking_utils.causal_mask_function, getattr(masking_utils, "bidirectional_mask_function",
                                                                          None)) or (
        not torch.compiler.is_compiling() and _sliding_causal(mask_function))
    q_length, q_offset = _query_span(kw)
    if attention_mask is None and not torch.compiler.is_compiling() and isinstance(q_offset, int) and \
            q_offset == 0 and kw.get("kv_offset", 0) == 0 and q_length == kv_length:
        documents = _packed_documents(mask_function)
        if documents is not None and documents.shape == (batch_size, kv_length):
            return documents  # attention_forward runs each row's documents as varlen sequences
    # Plain masks need the queries to be the last q_length keys (no cache, or a dynamic one).
    if plain and isinstance(q_offset, int) and kw.get("kv_offset", 0) == 0 and q_offset + q_length == kv_length:
        if attention_mask is None:
            return None
        keys = attention_mask[:, -kv_length:].to(torch.bool)
        if keys.shape[1] == kv_length:
            return None if bool(keys.all()) else keys
    kw = dict(kw, allow_is_causal_skip=False)
    kw.pop("allow_is_bidirectional_skip", None)
    return masking_utils.sdpa_mask(batch_size=batch_size, **kw)


def _causal(module, is_causal=None) -> bool:
    """The call's ``is_causal`` where given, else the module's (decoders' default: causal)."""
    return bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)


def attention_args(module, query: torch.Tensor, key: torch.Tensor, attention_mask, scaling=None,
                   sliding_window=None, softcap=None, is_causal=None) -> dict:
    """The ``flash_attention`` keywords for one transformers attention call (shapes as transformers
    gives them: query (B, H, Sq, D), key (B, Hkv, Sk, D)); ``is_causal`` overrides the module's."""
    Sq, Sk = query.shape[2], key.shape[2]
    args = {"scale": scaling, "causal": _causal(module, is_causal), "softcap": softcap}
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise ValueError(f"tilewise attention: 'attention_mask' of type {type(attention_mask).__name__} is "
                             f"not supported (a tensor or None; build the model with attn_implementation="
                             f"'{NAME}' so that its masks come from tilewise's mask builder)")
        if attention_mask.dim() == 2:  # key padding, from mask_builder
            args["mask"] = attention_mask[:, None, None, :]
        elif attention_mask.dim() == 4:  # dense: it holds causality, windows and packing itself
            args["causal"] = False
            if attention_mask.dtype == torch.bool:
                args["mask"] = attention_mask
            else:
                args["bias"] = attention_mask.to(query.dtype)
            return args
        else:
            raise ValueError(f"tilewise attention: 'attention_mask' has shape {tuple(attention_mask.shape)}; "
                             f"expected (B, Sk) or (B, 1 or H, Sq, Sk)")
    if args["causal"] and Sq != Sk:
        args["align"] = "bottom_right"  # new queries after a cache: the last query sees every key
    if sliding_window is not None:
        args["window"] = (int(sliding_window) - 1, 0 if args["causal"] else int(sliding_window) - 1)
    return args


def attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                      dropout: float = 0.0, scaling=None, sliding_window=None, softcap=None, **kwargs):
    """transformers' attention hook: returns (out (B, Sq, H, D), None)."""
    if dropout and module.training:
        raise ValueError(f"tilewise attention: attention dropout ({dropout}) is not supported; set the "
                         f"model config's attention_dropout to 0")
    if kwargs.get("s_aux") is not None:
        raise ValueError("tilewise attention: attention sinks ('s_aux') are not supported")
    if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.dtype != torch.bool:
        return _documents_forward(module, query, key, value, attention_mask, scaling, sliding_window, softcap,
                                  kwargs.get("is_causal")), None
    args = attention_args(module, query, key, attention_mask, scaling, sliding_window, softcap, kwargs.get("is_causal"))
    # over fp32 weights transformers' RoPE hands over fp32 q and k beside a 16-bit v: autocast's dtype
    out = _attention(*autocast_inputs(query, key, value), **args)
    return out.transpose(1, 2).contiguous(), None


_OFFSETS: dict = {}  # the last document ids' (cu_seqlens, longest): every layer of a forward shares them


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _document_offsets(documents: torch.Tensor) -> tuple:
    """(cu_seqlens (n + 1,) int32, the longest document's length) of the documents of each row of
    ``documents`` (B, S), back to back over the rows: one copy to the host per forward (kept for
    the tensor the layers share)."""
    hit = _OFFSETS.get("last")  # (tensor, its version, value): one entry, replaced whole
    if hit is not None and hit[0] is documents and hit[1] == documents._version:
        return hit[2]
    B, S = documents.shape
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    first = starts.reshape(-1).nonzero().flatten()
    cu = torch.cat([first, first.new_tensor([B * S])]).to(torch.int32)
    value = (cu, int((cu[1:] - cu[:-1]).max()))
    _OFFSETS["last"] = (documents, documents._version, value)
    return value


def _documents_forward(module, query, key, value, documents, scaling, sliding_window, softcap, is_causal):
    """Packed rows (``documents``: (B, S) ids, from ``mask_builder``) through ``flash_attention_varlen``:
    query (B, H, S, D) and key / value (B, Hkv, S, D) seen as (B * S, heads, D) (free for the sequence-
    major tensors transformers' projections give); returns (B, S, H, D)."""
    B, H, S, D = query.shape
    if key.shape[2] != S or documents.shape != (B, S):
        raise ValueError(f"tilewise attention: packed documents {tuple(documents.shape)} need queries and keys of "
                         f"their length, got {S} and {key.shape[2]}")
    causal = _causal(module, is_causal)
    window = None
    if sliding_window is not None:
        window = (int(sliding_window) - 1, 0 if causal else int(sliding_window) - 1)
    if _capturing(documents):  # the offsets need host reads, which a CUDA graph's capture forbids
        same = (documents[:, None, :, None] == documents[:, None, None, :])
        out = _attention(*autocast_inputs(query, key, value), mask=same, causal=causal, scale=scaling,
                         window=window, softcap=softcap)
        return out.transpose(1, 2).contiguous()
    cu, longest = _document_offsets(documents)
    q, k, v = (t.transpose(1, 2).reshape(B * S, t.shape[1], D) for t in autocast_inputs(query, key, value))
    out = _attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal, scale=scaling, window=window,
                            softcap=softcap, check_seqlens=False)
    return out.view(B, S, H, D)


@torch.compiler.assume_constant_result  # under torch.compile: read once while tracing, a constant after
@functools.lru_cache(maxsize=None)
def _capability(device: torch.device):
    """The compute capability of a CUDA ``device``; None for other devices (SDPA_RULES has no entry)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def _auto_route(module, query, key, value, attention_mask, dropout, sliding_window, softcap, causal, kwargs):
    """Where "tilewise_auto" sends this call: None (``attention_forward``), "sdpa", or "cudnn_bwd" (our
    forward with cuDNN's backward, where ours is the faster forward and SDPA's the faster backward).
    Only plain self-attention goes elsewhere than ``attention_forward``."""
    if (attention_mask is not None or sliding_window is not None or softcap is not None
            or kwargs.get("s_aux") is not None or (dropout and module.training)
            or query.shape[2] != key.shape[2] or query.dtype not in (torch.float16, torch.bfloat16)):
        return None
    capability = _capability(query.device)
    if capability is None:
        return None
    backward = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    D, S = query.shape[-1], query.shape[2]
    if not attention_configs.prefer_sdpa(capability, D, S, causal, backward):
        return None
    if backward and attention_configs.cudnn_backward_pays(capability, D, S, causal):
        return "cudnn_bwd"
    return "sdpa"


@functools.lru_cache(maxsize=64)
def _cudnn_bwd_policy(head_dim: int, seq: int, causal: bool):
    """The default policy's forward with cuDNN's backward (``AttentionPolicy(backward="cudnn")``)."""
    return attention_configs.choose_policy(head_dim, seq, seq, causal=causal, deterministic=False).replace(
        backward="cudnn")


def auto_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                           dropout: float = 0.0, scaling=None, sliding_window=None, softcap=None, **kwargs):
    """transformers' attention hook for ``"tilewise_auto"``: SDPA, or our forward with cuDNN's backward, where
    ``_auto_route`` says, else ``attention_forward``; returns (out (B, Sq, H, D), None)."""
    causal = _causal(module, kwargs.get("is_causal"))
    route = _auto_route(module, query, key, value, attention_mask, dropout, sliding_window, softcap, causal, kwargs)
    if route == "sdpa":
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=causal,
                                                               scale=scaling,
                                                               enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous(), None
    if route == "cudnn_bwd":  # SDPA's cuDNN backward is not reproducible either: deterministic=False is no change
        policy = _cudnn_bwd_policy(query.shape[-1], query.shape[2], causal)
        out = _attention(*autocast_inputs(query, key, value), causal=causal, scale=scaling, deterministic=False,
                         policy=policy)
        return out.transpose(1, 2).contiguous(), None
    return attention_forward(module, query, key, value, attention_mask, dropout, scaling, sliding_window, softcap,
                             **kwargs)


def register(name: str = NAME, forward=attention_forward) -> None:
    """Register an attention hook (``attention_forward``, or ``auto_attention_forward`` under
    ``AUTO_NAME``) and tilewise's mask builder under ``name`` (both done once at import)."""
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, mask_builder)


register()
register(AUTO_NAME, auto_attention_forward)


def rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1):
    """transformers' ``apply_rotary_pos_emb`` contract on ``tilewise.apply_rotary``: q, k (B, heads, S, D)
    (``unsqueeze_dim=1``) or (B, S, heads, D) (``unsqueeze_dim=2``), cos / sin (B, S, D). CPU tensors
    outside Triton's interpreter take the PyTorch formula (other models of the family may live there)."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"rotary_pos_emb: 'unsqueeze_dim' must be 1 or 2, got {unsqueeze_dim!r}")
    if unsqueeze_dim == 2:
        qe, ke = rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return qe.transpose(1, 2), ke.transpose(1, 2)
    if q.device.type == "cpu" and not settings.triton_interpret():
        return rope_reference(q, k, cos, sin)
    return apply_rotary(q, k, cos, sin)


_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # same RMSNorm, MLP, rotary and attention contracts


def _children(model, suffix, families, skip=()):
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            cls = type(child).__name__
            if cls.endswith(suffix) and cls[:-len(suffix)].lower() in families and not isinstance(child, skip):
                yield parent, name, child


def _fused_loss_forward(self, *args, labels=None, **kwargs):
    """The causal LM's forward with, in training with labels, the lm head and its loss in one
    ``linear_cross_entropy``: the base model's last hidden state is kept by a forward hook registered
    once (``_keep_hidden``, into the base model's ``_tilewise_loss_state``; registering one per call
    would break torch.compile's graph), the class's forward keeps zero positions of logits, and the
    loss follows transformers' ForCausalLMLoss (labels shifted by one, -100 ignored,
    ``num_items_in_batch`` or ``shift_labels`` as given). Such a forward builds no KV cache unless the
    call asks for one (``use_cache=True``) or passes one. The forward of a subclass made for the model's
    class (``_override_forward``); it holds no module, so ``copy.deepcopy`` of the model gives the copy its
    own (the state lives on the model)."""
    original, state = _class_forward(self), self.model._tilewise_loss_state
    shift = kwargs.pop("shift_labels", None)
    # a head that is not a plain Linear (a LoRA adapter, a quantized layer, hooks) runs as itself
    if (not self.training or (labels is None and shift is None) or "logits_to_keep" in kwargs
            or not is_plain_linear(self.get_output_embeddings())):
        if shift is not None:
            kwargs["shift_labels"] = shift
        return original(self, *args, labels=labels, **kwargs)
    n_items = kwargs.pop("num_items_in_batch", None)
    # a training step has no use for a KV cache, and with one the fused q / k / v path stands aside
    if all(kwargs.get(n) is None for n in _CACHES):
        kwargs.setdefault("use_cache", False)
    embed = _sparse_embedding(self) if state.get("sparse_embedding") else None
    if shift is None:
        shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    head = self.get_output_embeddings()
    # counted before the forward is queued, so the loss reads the count without draining the stream
    target = shift.to(head.weight.device)
    count = None if torch.compiler.is_compiling() else TargetCount(target, head.weight.shape[0])
    state["keep"] = True
    slot = _HeadGrad() if embed is not None else None
    if embed is not None:  # this forward only; removed below, so no module keeps a reference to itself
        embed.forward = functools.partial(_embedding_rows, embed, slot)
    try:
        out = original(self, *args, labels=None, logits_to_keep=torch.empty(0, dtype=torch.long), **kwargs)
        hidden = state.pop("hidden")
    finally:
        state["keep"] = False
        if embed is not None:
            del embed.forward
    head_weight = head.weight
    if slot is not None and slot.armed:  # the embedding ran and its backward will follow the loss's
        head_weight = _HandHeadGrad.apply(head_weight, slot)
    # under autocast the lm head's GEMMs in its dtype, as the model's own head would run (not fp32)
    hidden, weight, bias = autocast_inputs(hidden, head_weight, head.bias)
    if target.device != hidden.device:  # the head and the last hidden state on different devices
        target, count = target.to(hidden.device), None
    loss = linear_cross_entropy(hidden, weight, target, bias, reduction="mean" if n_items is None else "sum",
                                target_count=count)
    if n_items is not None:
        loss = loss / n_items
    if isinstance(out, tuple):
        return (loss,) + out
    return type(out)(loss=loss, **dict(out.items()))


def _sparse_embedding(model):
    """The input embedding whose gradient, in this forward, is only its tokens' rows added into the lm head's
    dense gradient (the weight is tied): ``_embedding_rows``, instead of a dense (vocab, hidden) gradient
    zeroed, scattered into and added (~2.6 GB of traffic a step at Llama-3.2-1B's size). None under
    torch.compile, without gradients, for a sharded weight (FSDP units reduce dense gradients), an embedding
    that is not a plain nn.Embedding or one with ``max_norm`` or ``scale_grad_by_freq``."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return None
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if (type(embed) is not torch.nn.Embedding or embed.sparse or head is None or embed.max_norm is not None
            or embed.scale_grad_by_freq):
        return None
    w = embed.weight
    if w is not head.weight or not w.requires_grad or type(w) is not torch.nn.Parameter or _sharded(embed, w):
        return None
    return embed


class _HeadGrad:
    """The tied weight's dense gradient from the fused loss, on its way to the input embedding's backward.
    ``armed``: the embedding ran in this forward with gradients, so that backward will run after the loss's."""
    __slots__ = ("grad", "armed")

    def __init__(self):
        self.grad, self.armed = None, False


class _HandHeadGrad(torch.autograd.Function):
    """The lm head's weight as it is; its gradient (the fused loss's fresh buffer) goes to ``slot``, not to
    autograd: the embedding's backward returns it with its rows added."""

    @staticmethod
    def forward(ctx, weight, slot):
        ctx.slot = slot
        ctx.set_materialize_grads(False)
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        ctx.slot.grad = grad  # one use a forward, a fresh slot each: nothing is there to add to
        return None, None


class _EmbeddingRows(torch.autograd.Function):
    """``F.embedding(ids, weight, padding_idx)`` whose weight gradient is the head's dense one from ``slot``
    with the tokens' output-gradient rows added in place (``index_add_``), or zeros with them where the loss
    handed none. One dense gradient reaches the tied weight and its AccumulateGrad adopts it. (Given a dense
    gradient and then a sparse one for a tensor, autograd's input buffer adds them out of place: at
    Llama-3.2-1B's size a 525 MB copy a step, docs/tuning/bench.md, "llama: the tied embedding's gradient".)"""

    @staticmethod
    def forward(ctx, ids, weight, padding_idx, slot):
        ctx.save_for_backward(ids)
        ctx.padding_idx, ctx.slot, ctx.weight_like = padding_idx, slot, (weight.shape, weight.dtype, weight.device)
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_out):
        (ids,) = ctx.saved_tensors
        dense, ctx.slot.grad = ctx.slot.grad, None
        shape, dtype, device = ctx.weight_like
        if dense is None:
            dense = torch.zeros(shape, dtype=dtype, device=device)
        flat, rows = ids.reshape(-1), grad_out.reshape(-1, shape[1])
        if ctx.padding_idx is not None:  # as F.embedding: the padding row gets no gradient
            rows = rows.masked_fill((flat == ctx.padding_idx).unsqueeze(1), 0)
        # index_add_, not index_put_(accumulate=True): the latter's sort took 2.6 ms against 0.27 where a few ids
        # repeat many times, as in text (llama_small_kernels.py --embed, H100), though 0.15 against 0.30 for uniform
        dense.index_add_(0, flat, rows.to(dense.dtype))
        return None, dense, None, None


def _embedding_rows(embed, slot, ids):
    """The input embedding's forward for one fused-loss training forward (``_fused_loss_forward``; gradients on
    and the weight's required, as ``_sparse_embedding`` checked)."""
    slot.armed = True
    return _EmbeddingRows.apply(ids, embed.weight, embed.padding_idx, slot)


def _signed_like(fn, like):
    """``fn`` under ``like``'s signature (``__wrapped__``): the model's forward keeps its parameter names,
    which transformers' Trainer reads to keep the dataset's columns (with ``(*args, **kwargs)`` it
    dropped input_ids and attention_mask). Holds the class's function, no module."""

    @functools.wraps(like)
    def forward(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    return forward


_SUBCLASSES: dict = {}  # (class, forward, signed) -> its subclass with that forward


def _override_forward(module, fn, signed: bool = False) -> None:
    """``module`` runs ``fn`` as its forward from now on, through a subclass of its class made once for
    them (name, qualname and module kept: save_pretrained writes the name; isinstance holds). Not a bound
    method in the module's ``__dict__``: that held the module, so a patched model was a reference cycle
    and outlived ``del`` until the cycle collector ran (its GPU memory with it). ``signed``: under the
    class forward's signature (``_signed_like``)."""
    base = type(module)
    if getattr(base, "_tilewise_forward", None) is fn:  # applied before (apply_tilewise called again)
        return
    key = (base, fn, signed)
    sub = _SUBCLASSES.get(key)
    if sub is None:
        forward = _signed_like(fn, base.forward) if signed else fn
        sub = type(base.__name__, (base,), {"forward": forward, "__module__": base.__module__,
                                            "__qualname__": base.__qualname__, "_tilewise_base": base,
                                            "_tilewise_forward": fn})
        _SUBCLASSES[key] = sub
    module.__class__ = sub


def _class_forward(module):
    """The forward ``module``'s class had before ``_override_forward`` (also under a wrapper's subclass,
    as FSDP2's fully_shard makes)."""
    cls = type(module)
    return getattr(cls, "_tilewise_base", cls).forward


def _keep_hidden(module, inputs, output):
    state = module._tilewise_loss_state
    if state.get("keep"):
        state["hidden"] = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]


def _decoder_forward(self, hidden_states, **kwargs):
    """A pre-norm decoder layer's forward (Llama's, Mistral's, Qwen2's, Qwen3's: norm, attention, add,
    norm, MLP, add) with its residual adds inside ``add_rms_norm``: the attention's add with
    post_attention_layernorm, the MLP's with ``nxt``'s norm. ``nxt`` (the layer's ``_tilewise_next``):
    (the module that runs next, its input norm): the next layer and its input_layernorm, or the
    model's final norm after the last layer; None: the MLP's add stays an add. Kept on the layer, not
    in a closure, so that ``copy.deepcopy`` of the model points the copy's layers at the copy's. The
    next module gets (sum, normed sum) as a hand-off and uses it when its input is that sum
    (``_handoff_input``). Under gradient checkpointing or
    torch.compile the MLP's add stays an add (the normed sum would cross the checkpoint's boundary),
    and where the next module's weights are sharded (``_sharded``). Under autocast over fp32 weights
    (the attention's output in bf16, the residual stream in fp32) both adds stay adds."""
    nxt = self.__dict__.get("_tilewise_next")
    h = _handoff_input(self, hidden_states, self.input_layernorm)
    h, _ = self.self_attn(hidden_states=h, **kwargs)
    norm = self.post_attention_layernorm
    if h.dtype != hidden_states.dtype:  # autocast over fp32 weights: the adds in the promoted dtype, as
        residual = hidden_states + h   # transformers' layer does them (add_rms_norm takes one dtype)
        return residual + self.mlp(norm(residual))
    h, residual = add_rms_norm(h, hidden_states, norm.weight, norm.variance_epsilon)
    h = self.mlp(h)
    if nxt is None or (self.training and getattr(self, "gradient_checkpointing", False)) or \
            torch.compiler.is_compiling() or _sharded(nxt[0], nxt[1].weight):
        return residual + h
    y, s = add_rms_norm(h, residual, nxt[1].weight, nxt[1].variance_epsilon)
    nxt[0].__dict__["_tilewise_handoff"] = (s, y)  # a plain attribute: no module registration
    return s


def _sharded(owner, weight) -> bool:
    """Whether a sharding wrapper (FSDP2's fully_shard, FSDP, DeepSpeed ZeRO-3) manages ``owner`` or
    ``weight``. Its unit gathers the weight when it runs and reduces its gradient when its backward
    ends, so a hand-off from the layer before would read a shard or a stale copy and add its gradient
    after that reduction: the MLP's add stays an add there."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without torch.distributed
        return False
    if isinstance(owner, FSDPModule) or isinstance(weight, DTensor):
        return True
    return bool(getattr(weight, "_fsdp_flattened", False)) or hasattr(weight, "ds_id") or \
        weight.untyped_storage().size() == 0


def _handed_off(module, hidden_states):
    """The normed sum the previous layer handed to ``module`` for ``hidden_states``, else None."""
    handoff = None if torch.compiler.is_compiling() else module.__dict__.pop("_tilewise_handoff", None)
    return handoff[1] if handoff is not None and handoff[0] is hidden_states else None


def _handoff_input(module, hidden_states, norm):
    """``norm(hidden_states)``, or the normed sum the previous layer handed to ``module`` for it."""
    y = _handed_off(module, hidden_states)
    return norm(hidden_states) if y is None else y


def _final_norm_forward(self, hidden_states):
    """The model's final norm taking the last layer's hand-off; else its class's forward."""
    y = _handed_off(self, hidden_states)
    return _class_forward(self)(self, hidden_states) if y is None else y


def _takes_handoff(norm) -> None:
    """The model's final norm, made to take the last layer's hand-off (per instance: a subclass of its class
    with the class's name; its parameters and its state-dict keys stay as they are)."""
    _override_forward(norm, _final_norm_forward)


def _fuse_residual_norms(model, family: str) -> None:
    base = getattr(model, "model", model)
    layers = list(getattr(base, "layers", ()))
    if not layers or any(type(m).__name__.lower() != f"{family}decoderlayer" for m in layers):
        raise ValueError(f"apply_tilewise: residual_norm=True needs {family} decoder layers in "
                         f"'{type(base).__name__}.layers'")
    final = getattr(base, "norm", None)
    if final is not None:
        _takes_handoff(final)
    for i, layer in enumerate(layers):
        nxt = (layers[i + 1], layers[i + 1].input_layernorm) if i + 1 < len(layers) else \
            ((final, final) if final is not None else None)
        layer.__dict__["_tilewise_next"] = nxt  # a plain attribute: no module registration
        _override_forward(layer, _decoder_forward)


_CACHES = ("past_key_values", "past_key_value", "cache")  # the KV cache's keyword, by transformers version


def _interface(module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    impl = module.config._attn_implementation
    eager = sys.modules[type(module).__module__].eager_attention_forward
    if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):
        return ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)
    return eager if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]


def _fused_qkv_forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    """A Llama / Mistral / Qwen2 attention's forward with q, k and v from one projection GEMM (the three
    weights concatenated each call: 12 MiB a layer at Llama-3.2-1B's size) and ``apply_rotary_qkv``
    (RoPE and the three attention inputs in one kernel; one input gradient, so one dX GEMM and no sums
    of three). A call with a KV cache runs the original forward, with a warning in training mode, where
    transformers builds a cache unless ``use_cache=False`` (the model's config or the call). Per attention
    module (``_override_forward``); the original forward is the class's, so a deep copy runs its own."""
    original = _class_forward(self)
    p = (self.q_proj, self.k_proj, self.v_proj)
    if not all(is_plain_linear(m) for m in p):  # LoRA adapters, quantized layers, hooks: the layers run
        return original(self, hidden_states, position_embeddings=position_embeddings,
                        attention_mask=attention_mask, **kwargs)
    if position_embeddings is None or any(kwargs.get(n) is not None for n in _CACHES):
        if self.training and not self.__dict__.get("_tilewise_warned"):
            self.__dict__["_tilewise_warned"] = True
            warnings.warn("apply_tilewise(fuse_qkv=True): a training forward was given a KV cache, so the "
                          "model's own attention ran (unfused); set model.config.use_cache = False for "
                          "training", stacklevel=2)
        return original(self, hidden_states, position_embeddings=position_embeddings,
                        attention_mask=attention_mask, **kwargs)
    for n in (*_CACHES, "cache_position"):  # consumed by the original forward, not passed on
        kwargs.pop(n, None)
    bias = torch.cat([m.bias for m in p]) if p[0].bias is not None else None
    qkv = torch.nn.functional.linear(hidden_states, torch.cat([m.weight for m in p]), bias)
    heads, kv_heads = p[0].out_features // self.head_dim, p[1].out_features // self.head_dim
    q, k, v = apply_rotary_qkv(qkv, *position_embeddings, heads, kv_heads)
    # Qwen2 keeps its layer's window on the module, Mistral on the config, Llama has none
    window = getattr(self, "sliding_window", getattr(self.config, "sliding_window", None))
    dropout = self.attention_dropout if self.training else 0.0
    out, weights = _interface(self)(self, q, k, v, attention_mask, dropout=dropout, scaling=self.scaling,
                                    sliding_window=window, **kwargs)
    return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


def apply_tilewise(model: torch.nn.Module, *, attention: bool | str = "auto", rms_norm: bool = True, rope: bool = True,
                   swiglu: bool = True, loss: bool = True, residual_norm: bool = True,
                   fuse_qkv: bool | None = None, fuse_gate_up: bool = True,
                   recompute_swiglu: bool = True, sparse_embedding_grad: bool = True) -> torch.nn.Module:
    """Run ``model`` (a Llama, Mistral, Qwen2 or Qwen3 model of transformers, built from a config or
    loaded with ``from_pretrained``) on tilewise kernels, in place; returns the model.

    attention: "auto" (default): ``model.set_attn_implementation("tilewise_auto")``, each call on
               flash_attention or SDPA, whichever measured faster for it on this GPU (the module's doc);
               True: ``"tilewise"``, flash_attention always (see the module's doc for masks); False: the
               model's own.
    rms_norm:  each ``<Family>RMSNorm`` becomes ``tilewise.nn.RMSNorm`` holding the same weight
               Parameter (optimizer state and state-dict keys unchanged).
    rope:      the family's ``apply_rotary_pos_emb`` becomes ``rotary_pos_emb`` (``tilewise.apply_rotary``).
               It is a module global of transformers' modeling file, so this holds for every model of
               that family in the process (as Liger-Kernel's patch does).
    swiglu:    each ``<Family>MLP`` becomes ``tilewise.nn.SwiGLU`` holding the same three Linear modules;
               the model's ``hidden_act`` must be "silu".
    loss:      a ``<Family>ForCausalLM`` called with labels in training mode computes its lm head and loss
               as one ``tilewise.linear_cross_entropy`` (no (tokens, vocab) logits; the output's logits
               then hold no positions, as Liger-Kernel's fused loss gives none). Eval mode, a call
               with ``logits_to_keep``, or a head that is not a plain Linear (PEFT's LoRA, a quantized
               layer, forward hooks: ``tilewise.nn.layers.is_plain_linear``) runs the model's own head and loss.
               Under autocast its GEMMs run in autocast's dtype, as the model's own head would.
    residual_norm: each decoder layer's residual adds go into ``tilewise.add_rms_norm`` with the norm
               that follows them (the next layer's input norm, or the model's final norm), so neither
               add nor the sums of the residual stream's gradients runs as a kernel of its own. The
               layers' and the final norm's forwards are replaced per instance, by a subclass of the
               same name (parameters and state-dict keys unchanged). Where a sharding wrapper (FSDP,
               DeepSpeed ZeRO-3) holds the next layer, its add stays an add (its measured share of the
               Llama step: docs/tuning/norm.md).
    fuse_qkv:  each attention's q, k and v come from one GEMM over the concatenated weights, through
               ``tilewise.apply_rotary_qkv``. None (the default): on for Llama, Mistral and Qwen2, off
               for Qwen3, whose q / k norms sit between the projections and RoPE (True raises there).
               Parameters and state-dict keys unchanged; calls with a KV cache (generation) run the
               model's own forward: a training forward with labels and ``loss`` builds none, other
               training forwards warn unless called with ``use_cache=False``; so do calls where q, k or v
               is not a plain Linear (LoRA adapters, quantized layers, hooks: they run as themselves).
    fuse_gate_up: with ``swiglu``, each MLP's gate and up are written side by side into one output
               (``tilewise.nn.packed.linear_packed``: no concatenated weight kept) and go through
               ``tilewise.swiglu_packed`` (``tilewise.nn.SwiGLU``'s ``fuse_gate_up``). Where gate or up is
               not a plain Linear, the two run as themselves.
    recompute_swiglu: with ``fuse_gate_up``, each MLP's activation (tokens x intermediate) is not kept for
               the backward but written again by SwiGLU's backward kernel (``tilewise.nn.mlp.swiglu_mlp``):
               at Llama-3.2-1B's size and 16384 tokens, 4 GiB less at the step's peak for one more
               write a layer in the backward (measured: docs/tuning/bench.md, "Peak memory").
    sparse_embedding_grad: with ``loss`` and the input embedding tied to the lm head, the embedding's gradient
               of a fused-loss forward is only its tokens' rows, added in place into the head's dense one
               (``_sparse_embedding``, ``_EmbeddingRows``); the parameter's ``.grad`` is that one dense tensor.
    """
    if not isinstance(model, transformers.PreTrainedModel):
        raise ValueError(f"apply_tilewise: 'model' must be a transformers PreTrainedModel, got {type(model).__name__}")
    module = type(model).__module__
    family = next((f for f in _FAMILIES if module == f"transformers.models.{f}.modeling_{f}"), None)
    if family is None:
        raise ValueError(f"apply_tilewise: {type(model).__name__} ({module}) is not a Llama, Mistral, Qwen2 or "
                         f"Qwen3 model; attn_implementation='{NAME}' gives any model tilewise attention")
    if attention not in (True, False, "auto"):
        raise ValueError(f"apply_tilewise: 'attention' must be True, False or 'auto', got {attention!r}")
    if swiglu and getattr(model.config, "hidden_act", "silu") != "silu":
        raise ValueError(f"apply_tilewise: swiglu=True needs hidden_act='silu'; the model has "
                         f"{model.config.hidden_act!r} (pass swiglu=False)")
    if attention:
        model.set_attn_implementation(AUTO_NAME if attention == "auto" else NAME)
    if rms_norm:
        for parent, name, old in _children(model, "RMSNorm", (family,), skip=RMSNorm):
            setattr(parent, name, RMSNorm.sharing(old.weight, old.variance_epsilon))
    if swiglu:
        for parent, name, old in _children(model, "MLP", (family,)):
            setattr(parent, name, SwiGLU.sharing(old.gate_proj, old.up_proj, old.down_proj, fuse_gate_up,
                                                 recompute_swiglu))
    if rope:
        sys.modules[module].apply_rotary_pos_emb = rotary_pos_emb
    if residual_norm:
        _fuse_residual_norms(model, family)
    if fuse_qkv is None:
        fuse_qkv = family != "qwen3"
    if fuse_qkv:
        if family == "qwen3":
            raise ValueError("apply_tilewise: fuse_qkv=True does not apply to Qwen3 (its q / k norms come between "
                             "the projections and RoPE); pass fuse_qkv=False")
        for _, _, attn in _children(model, "Attention", (family,)):
            if "_tilewise_qkv" not in attn.__dict__:
                _override_forward(attn, _fused_qkv_forward)
                attn.__dict__["_tilewise_qkv"] = True
    if loss and type(model).__name__.endswith("ForCausalLM") and not getattr(model, "_tilewise_loss", False):
        model.model.__dict__["_tilewise_loss_state"] = {"keep": False, "sparse_embedding": sparse_embedding_grad}
        model.model.register_forward_hook(_keep_hidden)
        _override_forward(model, _fused_loss_forward, signed=True)
        model._tilewise_loss = True
    return model


apply_tilewise_to_llama = apply_tilewise
