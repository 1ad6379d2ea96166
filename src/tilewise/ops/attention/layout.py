"""Where v5 / v6 find a (B, H, S, D) tensor's rows: the 2-D views their TMA loads and stores use.

Two storages are read and written in place (docs/tuning/attention.md, "Strided inputs"):

    head-major      (B, H, S, D) contiguous            view (B * H * S, D)   RB = H * S  RH = S  CH = 0
    sequence-major  a (B, H, S, D) view of (B, S, H, D) view (B * S, H * D)  RB = S      RH = 0  CH = D

Row s of head h of batch b is row b * RB + h * RH + s of the view, its D elements from column
h * CH. transformers hands attention sequence-major tensors (its projections' (B, S, H, D) outputs
transposed), so reading them in place saves a copy each, and an output or gradient written
sequence-major saves the copy the caller would make to get back to (B, S, H * D).
"""

from __future__ import annotations

from typing import Optional

import torch

ROWS_MAX = 2 ** 31  # TMA coordinates and the kernels' row arithmetic are int32
DTYPES = (torch.float16, torch.bfloat16)


def rows(t: torch.Tensor) -> Optional[tuple]:
    """(RB, RH, CH, row length) of a 4-D (B, H, S, D) ``t`` that v5 / v6 read and write in place: the
    row of (b, h, s) in its 2-D view is b * RB + h * RH + s, its D elements from column h * CH, rows
    ``row length`` elements apart (``gluon_fwd.head_rc``). ``t`` must be 16-bit, head-major contiguous
    or a sequence-major view, with a 16-byte aligned base and rows and fewer than 2 ** 31 rows; else
    None (the caller copies). A tensor both layouts describe (H = 1 or S = 1) is head-major. Plain
    tuples from shapes and strides: the routing asks on every call (about 1 us each)."""
    if t.dtype not in DTYPES or t.data_ptr() % 16 or t.dim() != 4:
        return None
    B, H, S, D = t.shape
    if B * H * S >= ROWS_MAX:
        return None
    if t.is_contiguous():
        r = (H * S, S, 0, D)
    elif all(n == 1 or st == want for n, st, want in zip(t.shape, t.stride(), (S * H * D, D, H * D, 1))):
        r = (S, 0, D, H * D)
    else:
        return None
    return r if r[3] % 8 == 0 else None  # 16-bit elements: 16-byte rows


def tma_view(t: torch.Tensor) -> Optional[tuple]:
    """(2-D view, ``rows(t)``): the view TMA descriptors are built on, (B * H * S, D) head-major or
    (B * S, H * D) sequence-major; None where ``rows`` is."""
    r = rows(t)
    if r is None:
        return None
    return (t.view(-1, r[3]) if r[2] == 0 else t.transpose(1, 2).view(-1, r[3])), r


# The v5 / v6 kernels' LAYOUT (a constexpr): one bit a tensor, set where it is sequence-major. A
# constexpr, not (RB, RH, CH) as runtime ints: the head-major build keeps its arithmetic, and the
# dK / dV kernel's registers are tight (with 20 runtime ints its D = 64 build spilled 44 instructions
# under Triton 3.9, against 20).
SEQ_BITS = {"q": 1, "k": 2, "v": 4, "o": 8, "do": 16, "dq": 32, "dk": 64, "dv": 128}


def seq_mask(**tensors) -> int:
    """The LAYOUT bits of ``tensors`` (by name, as SEQ_BITS), each one ``rows`` accepts."""
    return sum(SEQ_BITS[n] for n, t in tensors.items() if rows(t)[2])


def seq_major_like(t: torch.Tensor) -> torch.Tensor:
    """An empty (B, H, S, D) tensor in sequence-major storage, the strides of a transposed (B, S, H, D).
    Not a view: autograd forbids in-place changes to a view a custom Function returns."""
    B, H, S, D = t.shape
    return torch.empty_strided((B, H, S, D), (S * H * D, D, H * D, 1), dtype=t.dtype, device=t.device)


def for_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plain: bool):
    """An eager call routed to v5 / v6: q, k, v with the ones TMA cannot read in place copied to
    contiguous, and whether the output is allocated sequence-major (q or v is: the caller's
    ``transpose(1, 2).contiguous()`` is then free). Only ``plain`` calls (no band or score mod) read
    sequence-major tensors in place: the band kernel keeps head-major rows."""
    if not plain:
        return (*(t.contiguous() for t in (q, k, v)), False)
    rq, rk, rv = rows(q), rows(k), rows(v)
    q, k, v = (t if r is not None else t.contiguous() for t, r in ((q, rq), (k, rk), (v, rv)))
    return q, k, v, any(r is not None and r[2] != 0 for r in (rq, rv))
