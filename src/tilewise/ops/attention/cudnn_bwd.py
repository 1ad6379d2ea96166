"""The backward of a tilewise forward by PyTorch's cuDNN attention backward (policy backward "cudnn").

Where our forward is the faster one and cuDNN's backward is (sm_90, D = 64 from S = 8192: tuning
"Against SDPA"), a training call can keep both: ``aten._scaled_dot_product_cudnn_attention_backward``
recomputes P from the saved log-sum-exp, so it takes our O and LSE as it takes its own forward's (the
same quantities: O, and log sum_n exp(scale q.k_n) per row in natural log). It applies to a plain
self-attention call (no mask, bias, window or score mod; top-left causal or none), fp16 / bf16 CUDA
tensors, head dim <= 128, no gradient of the LSE; elsewhere the backward is v3's two kernels, as for
any policy path that does not apply. cuDNN's backward is not bitwise reproducible, so the policy
needs ``deterministic=False``.
"""

from __future__ import annotations

import torch

MAX_D = 128  # cuDNN's SDPA backward on sm_90 up to head dim 128 (the shapes measured)
_OP = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention_backward", None)  # PyTorch >= 2.5


def applies(q, k, v, dlse, mask, bias, plain: bool) -> bool:
    """Whether cuDNN's backward can take this call's gradients (``plain``: no window, score mod or
    bottom-right alignment)."""
    return (_OP is not None and plain and mask is None and bias is None and dlse is None and q.is_cuda
            and q.shape[2] == k.shape[2] and q.dtype in (torch.float16, torch.bfloat16)
            and q.dtype == k.dtype == v.dtype and q.shape[-1] <= MAX_D and q.shape[-1] % 8 == 0)


def cache_layout(q: torch.Tensor) -> tuple[int, ...]:
    """The strides PyTorch's cuDNN attention gives O for this ``q`` (``empty_like(q)``: q's own where q is
    dense, else dense ones in q's stride order), which its backward's graph cache assumes."""
    return torch.empty_like(q, device="meta").stride()


def _same_strides(t: torch.Tensor, strides) -> bool:
    """``t``'s strides equal ``strides`` over the dims of size > 1 (a size-1 dim's stride addresses nothing)."""
    return all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), strides))


def backward(do, q, k, v, out, lse, causal: bool, scale: float, contiguous: bool = True):
    """(dq, dk, dv, empty dbias) from cuDNN's backward on our forward's ``out`` and ``lse`` (B, H, Sq);
    ``contiguous``: the gradients dense (the custom op's fake results), else as cuDNN gives them."""
    B, H, Sq, _ = q.shape
    empty = q.new_empty(0)
    seed = torch.empty((), dtype=torch.int64, device=q.device)  # dropout 0: never read
    if not _same_strides(out, cache_layout(q)):
        # PyTorch caches the backward's cuDNN graph by q's, k's and v's shapes and strides alone, with O's and
        # dO's strides built in: O must be laid out as the cache assumes (empty_like(q), as SDPA's own forward
        # allocates it), or a graph built for another O layout reads this one wrong (an eager sequence-major O
        # after a compiled call's dense one at the same shapes gave garbage gradients).
        out = torch.empty_like(q).copy_(out)
    if do.stride() != out.stride():
        do = do.contiguous() if out.is_contiguous() else torch.empty_like(out).copy_(do)
    # No bias and no cumulative lengths: undefined tensors (None), as PyTorch's own calls pass them (an
    # empty tensor is a defined one: it read as a 1-D bias and failed). The LSE as cuDNN's (B, H, Sq, 1).
    dq, dk, dv = _OP(do, q, k, v, out, lse.unsqueeze(-1), seed, seed, None, None, None, Sq, k.shape[2], 0.0, causal,
                     scale=scale)
    if contiguous:
        dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()
    return dq, dk, dv, empty
