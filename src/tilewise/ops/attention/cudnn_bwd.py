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


def backward(do, q, k, v, out, lse, causal: bool, scale: float, contiguous: bool = True):
    """(dq, dk, dv, empty dbias) from cuDNN's backward on our forward's ``out`` and ``lse`` (B, H, Sq);
    ``contiguous``: the gradients dense (the custom op's fake results), else as cuDNN gives them."""
    B, H, Sq, _ = q.shape
    empty = q.new_empty(0)
    seed = torch.empty((), dtype=torch.int64, device=q.device)  # dropout 0: never read
    if do.stride() != out.stride():
        do = do.contiguous() if out.is_contiguous() else torch.empty_like(out).copy_(do)
    # No bias and no cumulative lengths: undefined tensors (None), as PyTorch's own calls pass them (an
    # empty tensor is a defined one: it read as a 1-D bias and failed). The LSE as cuDNN's (B, H, Sq, 1).
    dq, dk, dv = _OP(do, q, k, v, out, lse.unsqueeze(-1), seed, seed, None, None, None, Sq, k.shape[2], 0.0, causal,
                     scale=scale)
    if contiguous:
        dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()
    return dq, dk, dv, empty
