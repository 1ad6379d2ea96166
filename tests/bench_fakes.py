"""A bench runner's stand-in for the suites' CPU tests: what a suite calls on it (``status``, ``log``, ``add``),
recording the rows and log lines in place of timing tables and CSV files."""

from __future__ import annotations


class FakeRunner:
    """``rows``: (variant, ms, baseline, baseline_ms) a row, with the shape after the variant when ``with_shape``;
    ``lines``: the log's lines."""

    out_dir = None

    def __init__(self, quick: bool = True, with_shape: bool = False):
        self.quick, self.with_shape = quick, with_shape
        self.rows, self.lines = [], []

    def status(self, msg):
        pass

    def log(self, msg):
        self.lines.append(msg)

    def add(self, op, variant, shape, dtype, ms, cost, *, baseline="", baseline_ms=None):
        self.rows.append((variant, shape, ms, baseline, baseline_ms) if self.with_shape
                         else (variant, ms, baseline, baseline_ms))
