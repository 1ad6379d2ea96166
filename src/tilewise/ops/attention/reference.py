"""attention's references: v1_naive (the full score matrix) and v2_online (the online softmax over
key tiles), in PyTorch, in fp32 (fp64 for fp64 inputs). Semantics as ``flash_attention``'s."""

from __future__ import annotations

import torch


def _expand_kv(k: torch.Tensor, h: int) -> torch.Tensor:
    return k if k.shape[1] == h else k.repeat_interleave(h // k.shape[1], dim=1)


ALIGNS = ("top_left", "bottom_right")


def band(causal: bool, window, align: str, sq: int, sk: int) -> tuple[int, int] | None:
    """(lo, hi): query i keeps key j where lo <= j - i <= hi, for a sliding ``window`` = (left,
    right) (None: unbounded on that side) around query i's diagonal key: j = i (``align``
    "top_left") or j = i + sk - sq ("bottom_right"); ``causal`` sets right to 0. None where no band
    is needed: no window, and causal (if at all) top-left or square."""
    if window is None and (not causal or align == "top_left" or sq == sk):
        return None
    left, right = window if window is not None else (None, None)
    off = sk - sq if align == "bottom_right" else 0
    if causal:
        right = 0
    big = sq + sk  # past every key
    return (off - left if left is not None else -big, off + right if right is not None else big)


def call_band(causal: bool, window, align: str, sq: int, sk: int) -> tuple[list | None, bool]:
    """(band as a list or None, causal) for a kernel call: None with causal False where ``band`` keeps every
    key, None with causal True where it keeps top-left causal's (j <= i), so a window as wide as the
    sequence runs the plain kernels (a band's range and edge tests cost 10 % at S 4096, H100)."""
    b = band(causal, window, align, sq, sk)
    if b is None or sq == 0 or sk == 0:
        return (None if b is None else list(b)), causal and b is None
    if b[0] <= 1 - sq and (b[1] >= sk - 1 or b[1] == 0):  # j - i >= 1 - sq holds for every pair
        return None, b[1] < sk - 1
    return list(b), False


def _logits_mask(b, h, sq, sk, causal, mask, device, band_=None):
    """The boolean (.., Sq, Sk) 'attend' map combining causal (or the band) and mask, or None."""
    keep = None
    if band_ is not None:
        rel = torch.arange(sk, device=device)[None, :] - torch.arange(sq, device=device)[:, None]
        keep = (rel >= band_[0]) & (rel <= band_[1])
    elif causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
    if mask is not None:
        keep = mask if keep is None else keep & mask
    return keep


def _mods(s, q, sk, softcap, alibi_slopes, align, ct, n0=0):
    """Softcap on the scaled scores of keys [n0, n0 + s.shape[-1]), then ALiBi's -slope * |j - i - diag|
    (``flash_attention``'s order)."""
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        B, H, sq = q.shape[:3]
        diag = sk - sq if align == "bottom_right" else 0
        rel = torch.arange(n0, n0 + s.shape[-1], device=q.device)[None, :] - torch.arange(sq, device=q.device)[:, None]
        slopes = alibi_slopes.to(ct).expand(B, H)[:, :, None, None]
        s = s - slopes * (rel - diag).abs().to(ct)
    return s


def reference(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False, window=None,
              align="top_left", softcap=None, alibi_slopes=None):
    """v1_naive: the full score matrix in fp32 (B H Sq Sk x 4 bytes written, then read twice).

    Shapes as in ``flash_attention``; returns out in q's dtype (and LSE (B, H, Sq) fp32). Rows with
    every key masked give 0 and LSE -inf.
    """
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    ct = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    kf, vf = _expand_kv(k, H).to(ct), _expand_kv(v, H).to(ct)
    s = _mods(torch.matmul(q.to(ct), kf.transpose(-1, -2)) * scale, q, Sk, softcap, alibi_slopes, align, ct)
    if bias is not None:
        s = s + bias.to(ct)
    keep = _logits_mask(B, H, Sq, Sk, causal, mask, q.device, band(causal, window, align, Sq, Sk))
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # exp(s - lse) is NaN on an all -inf row; those rows are defined as 0.
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    out = torch.matmul(p, vf).to(q.dtype)
    return (out, lse) if return_lse else out


def reference_tiled(q, k, v, *, causal=False, mask=None, bias=None, scale=None, return_lse=False,
                    block_n: int = 128, window=None, align="top_left", softcap=None, alibi_slopes=None):
    """v2_online: the online softmax over key tiles of ``block_n`` (running max m, sum l, and an
    accumulator rescaled by exp(m_old - m_new) whenever the max grows). Same contract as
    ``reference``; only (B, H, Sq, block_n) scores exist at a time."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    ct = torch.promote_types(q.dtype, torch.float32)
    kf, vf, qf = _expand_kv(k, H).to(ct), _expand_kv(v, H).to(ct), q.to(ct)
    keep = _logits_mask(B, H, Sq, Sk, causal, mask, q.device, band(causal, window, align, Sq, Sk))
    if keep is not None:
        keep = keep.expand(B, H, Sq, Sk)
    if bias is not None:
        bias = bias.expand(B, H, Sq, Sk)
    m = torch.full((B, H, Sq), float("-inf"), device=q.device, dtype=ct)
    l = torch.zeros((B, H, Sq), device=q.device, dtype=ct)
    acc = torch.zeros((B, H, Sq, D), device=q.device, dtype=ct)
    for n0 in range(0, Sk, block_n):
        n1 = min(Sk, n0 + block_n)
        s = torch.matmul(qf, kf[:, :, n0:n1].transpose(-1, -2)) * scale
        s = _mods(s, q, Sk, softcap, alibi_slopes, align, ct, n0)
        if bias is not None:
            s = s + bias[..., n0:n1].to(ct)
        if keep is not None:
            s = s.masked_fill(~keep[..., n0:n1], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = m_new.masked_fill(torch.isinf(m_new) & (m_new < 0), 0.0)  # no -inf - -inf
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.matmul(p, vf[:, :, n0:n1])
        m = m_new
    empty = l == 0
    out = (acc / l.masked_fill(empty, 1.0)[..., None]).to(q.dtype)
    lse = torch.where(empty, torch.full_like(l, float("-inf")), m + torch.log(l.masked_fill(empty, 1.0)))
    return (out, lse) if return_lse else out
