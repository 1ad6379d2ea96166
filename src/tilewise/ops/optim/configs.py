"""AdamW's launch table: elements a program updates, by the parameter's element size. The pass is pure
streaming (four tensors read, three written, ~14 bytes an element for bf16 parameters and moments), so a
program moves two 16-byte vectors of each tensor a thread; not yet swept on a GPU (docs/tuning/optim.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdamWLaunch:
    """BLOCK: elements a program updates; warps: its warps (BLOCK / (32 x warps) elements a thread)."""

    BLOCK: int
    warps: int


_BY_ITEMSIZE = {2: AdamWLaunch(4096, 8), 4: AdamWLaunch(2048, 8)}  # 16 elements a thread: 2 x 16 B (2-byte)


def launch_for(itemsize: int, config: AdamWLaunch | None = None) -> AdamWLaunch:
    """``config`` where given, else the table's launch for parameters of ``itemsize`` bytes."""
    if config is not None:
        if not isinstance(config, AdamWLaunch):
            raise ValueError(f"adamw_: 'config' must be an AdamWLaunch, got {type(config).__name__}")
        return config
    return _BY_ITEMSIZE[itemsize]
