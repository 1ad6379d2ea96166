"""Where the TMA kernels apply (v4's Triton forward, v5 / v6 in Gluon): the layout, dtype, head dim and
device checks ``api`` routes by. v5 / v6 take head-major and sequence-major tensors in place
(``layout.rows``); v4 and the band kernel dense head-major rows only."""

from __future__ import annotations

import torch

from ... import settings
from .layout import DTYPES, ROWS_MAX, rows


def tma_applies(q, k, v, mask, bias) -> bool:
    """v4 needs dense (rows, D) views with 16-byte aligned rows, a power-of-two D, no mask or bias,
    and row indices that fit int32."""
    D = q.shape[-1]
    return (mask is None and bias is None and D in (32, 64, 128, 256) and q.dtype in DTYPES
            and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v))
            and q.numel() // D < ROWS_MAX and k.numel() // D < ROWS_MAX)


def tma_bias_rows(q, k, bias, bias_strides) -> bool:
    """A bias TMA can read by rows: q's dtype, contiguous, its rows not broadcast (its query dim is
    real, so its storage is a dense (rows, Sk) matrix), 16-byte aligned base and rows."""
    Sk = k.shape[2]
    return (bias.dtype == q.dtype and bias.is_contiguous() and bias.data_ptr() % 16 == 0 and bias_strides[3] == 1
            and bias_strides[2] == Sk and (Sk * bias.element_size()) % 16 == 0 and bias.numel() // Sk < ROWS_MAX)


def tma_bias_applies(q, k, v, bias, bias_strides) -> bool:
    """The bias forward through v4's TMA kernel: q/k/v as ``tma_applies`` asks and a bias as
    ``tma_bias_rows`` asks, on sm_90+."""
    return (tma_applies(q, k, v, None, None) and tma_bias_rows(q, k, bias, bias_strides)
            and (settings.triton_interpret() or (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9)))


def ws_applies(q, k, v, mask, bias, bias_strides) -> bool:
    """v5 needs Hopper (wgmma; sm_90 exactly), Gluon, D 64 or 128, no mask, q / k / v each head-major
    or sequence-major as ``rows`` asks, and a bias (if any) that TMA reads by rows (``tma_bias_rows``)."""
    from . import gluon_fwd  # Gluon (Triton) imported on the first call, as the kernels are

    return (q.shape[-1] in (64, 128) and mask is None and gluon_fwd.available() and q.is_cuda
            and not settings.triton_interpret() and all(rows(t) is not None for t in (q, k, v))
            and (bias is None or tma_bias_rows(q, k, bias, bias_strides))
            and torch.cuda.get_device_capability(q.device) == (9, 0))


def ws_bwd_applies(q, k, v, do, mask, bias) -> bool:
    """v6's kernels run where v5's forward does without a bias (``ws_applies``), with dO head-major or
    sequence-major in q's dtype."""
    return bias is None and do.dtype == q.dtype and rows(do) is not None and ws_applies(q, k, v, mask, None, None)


def dense(*ts) -> bool:
    """All contiguous (the band kernel's and v4's head-major rows)."""
    return all(t.is_contiguous() for t in ts)
