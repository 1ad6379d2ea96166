"""Whether two tensors may share memory, for the ops that write an ``out`` while reading inputs
tile by tile (an aliased output there is a wrong answer, not an in-place operation)."""

from __future__ import annotations

import torch


def span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] byte address a tensor's elements may occupy (PyTorch strides are >= 0)."""
    first = t.data_ptr()
    size = t.element_size()
    return first, first + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) * size + size - 1


def may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when the address ranges of two non-empty tensors intersect (conservative: two views
    interleaved in one buffer count as overlapping)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, a1 = span(a)
    b0, b1 = span(b)
    return a0 <= b1 and b0 <= a1


def check_no_overlap(op: str, name: str, written: torch.Tensor, **reads) -> None:
    """Raise ValueError if ``written`` may share memory with any tensor of ``reads`` (None skipped)."""
    for rname, r in reads.items():
        if r is not None and may_overlap(written, r):
            raise ValueError(f"{op}: '{name}' shares memory with '{rname}'; write the result to a separate tensor")
