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
