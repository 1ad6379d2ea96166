"""Autocast for tilewise's modules: their kernels take one dtype, where torch's layers are cast by
autocast itself (its dispatcher key, which tilewise's eager paths do not go through)."""

from __future__ import annotations

import torch


def autocast_inputs(*tensors):
    """``tensors`` in autocast's dtype where autocast is on for the first one's device (floating ones;
    None and others as they are), as autocast casts a torch Linear's or SDPA's; else unchanged."""
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in tensors)
