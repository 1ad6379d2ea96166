"""The fewest FLOPs and bytes an op must move: what every roofline number is computed from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    """``flops``: arithmetic the op must do; ``bytes``: each input read once, each output written once."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte (0 for pure data movement)."""
        return self.flops / self.bytes if self.bytes else float("inf")

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes)
