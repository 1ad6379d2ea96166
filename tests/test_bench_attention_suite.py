"""The attention bench suite's guard around a version that may not run here (bench/suites/attention.py)."""

import pytest

from tilewise.bench.harness import CheckError
from tilewise.bench.suites import attention as S


class _Log:
    def __init__(self):
        self.lines = []

    def log(self, msg):
        self.lines.append(msg)


def test_measured_returns_logs_or_raises():
    r = _Log()
    assert S._measured(r, "v", "1x1", lambda: 1.5) == 1.5 and not r.lines

    def broken():
        raise RuntimeError("out of shared memory")

    assert S._measured(r, "v", "1x1", broken) is None
    assert r.lines == ["  v failed on 1x1: RuntimeError: out of shared memory"]

    def wrong():
        raise CheckError("v: relative error 1 > 0.01")

    with pytest.raises(CheckError):  # a wrong answer is never a missing row
        S._measured(r, "v", "1x1", wrong)


def test_rows_against_flex():
    class R:
        rows = []

        def add(self, op, variant, shape, dtype, ms, cost, *, baseline="", baseline_ms=None):
            self.rows.append((variant, ms, baseline, baseline_ms))

    r, times = R(), {}
    S._row_against_flex(r, times, "op", "flex_attention", "s", "bf16", None, 2.0)
    S._row_against_flex(r, times, "op", "flash_attention", "s", "bf16", None, 1.0)
    S._row_against_flex(r, times, "op", "missing", "s", "bf16", None, None)
    assert r.rows == [("flex_attention", 2.0, "", None), ("flash_attention", 1.0, "flex_attention", 2.0)]
    assert times == {"flex_attention": 2.0, "flash_attention": 1.0}


def test_ours_is_compared_with_the_fastest_baseline():
    assert S.best_baseline({"sdpa_flash": 1.3, "sdpa_cudnn": 0.9, "sdpa_efficient": 2.0}) == "sdpa_cudnn"
    assert S.best_baseline({"sdpa_efficient": 2.0}) == "sdpa_efficient"
    assert S.best_baseline({}) == ""

