"""AdamW's Triton kernels: one pass over a parameter and its gradient and moments, in fp32, each rounded
once to its own dtype on the way out; ``_adamw_kernel`` one parameter a launch, ``_adamw_multi_kernel`` every
parameter of a group in one launch. The update is torch.optim.AdamW's (decoupled weight decay, bias
corrections folded into the step size and the second moment's scale):

    p <- p (1 - lr wd);  m <- m + (1 - beta1)(g - m);  v <- beta2 v + (1 - beta2) g^2
    p <- p - step_size m / (sqrt(v) inv_bc2_sqrt + eps),  step_size = lr / (1 - beta1^t),
                                                           inv_bc2_sqrt = 1 / sqrt(1 - beta2^t)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _adamw_block(P, G, M, V, offs, mask, beta1, beta2, eps, decay, step_size, inv_bc2_sqrt):
    """The update of the elements ``offs`` (where ``mask``) of one parameter, in fp32 (the module doc's formula)."""
    p = tl.load(P + offs, mask=mask).to(tl.float32)
    g = tl.load(G + offs, mask=mask).to(tl.float32)
    m = tl.load(M + offs, mask=mask).to(tl.float32)
    v = tl.load(V + offs, mask=mask).to(tl.float32)
    m = m + (1.0 - beta1) * (g - m)  # torch's exp_avg.lerp_(grad, 1 - beta1)
    v = v * beta2 + (1.0 - beta2) * g * g
    denom = tl.sqrt_rn(v) * inv_bc2_sqrt + eps  # IEEE square root and division, as torch's
    p = p * decay - step_size * tl.div_rn(m, denom)
    tl.store(P + offs, p.to(P.dtype.element_ty), mask=mask)
    tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
    tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)


@triton.jit
def _adamw_kernel(P, G, M, V, n, beta1, beta2, eps, decay, step_size, inv_bc2_sqrt, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _adamw_block(P, G, M, V, offs, offs < n, beta1, beta2, eps, decay, step_size, inv_bc2_sqrt)


@triton.jit
def _adamw_multi_kernel(PTRS, SCALARS, NUMELS, BLOCK_TENSOR, BLOCK_INDEX, beta1, beta2, eps, decay,
                        P_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    # Every parameter of a group in one launch: program -> (tensor, block) from two int32 tables; the tensor's
    # p, g, m, v addresses from PTRS (T, 4), its step size and 1 / sqrt(bias correction 2) from SCALARS (T, 2).
    # The host sends here only tensors whose four addresses are 16-byte aligned and whose element count is a
    # multiple of 16 (the hints below: without them every access would be 2 bytes wide).
    pid = tl.program_id(0)
    t = tl.load(BLOCK_TENSOR + pid).to(tl.int64)
    n = tl.multiple_of(tl.load(NUMELS + t), 16)
    P = tl.multiple_of(tl.load(PTRS + 4 * t).to(tl.pointer_type(P_DTYPE)), 16)
    G = tl.multiple_of(tl.load(PTRS + 4 * t + 1).to(tl.pointer_type(P_DTYPE)), 16)
    M = tl.multiple_of(tl.load(PTRS + 4 * t + 2).to(tl.pointer_type(S_DTYPE)), 16)
    V = tl.multiple_of(tl.load(PTRS + 4 * t + 3).to(tl.pointer_type(S_DTYPE)), 16)
    offs = tl.load(BLOCK_INDEX + pid).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _adamw_block(P, G, M, V, offs, offs < n, beta1, beta2, eps, decay, tl.load(SCALARS + 2 * t),
                 tl.load(SCALARS + 2 * t + 1))
