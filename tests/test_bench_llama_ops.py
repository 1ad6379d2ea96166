"""The rmsnorm / rope / swiglu suites' rows (bench/suites/_llama_ops.py): only ours names a baseline,
the fastest of the others in the case, so the report never takes torch.compile's or Liger's row for ours."""

from tilewise.bench.suites import _llama_ops as L


class _Runner:
    quick = True

    def __init__(self):
        self.rows = []

    def status(self, msg):
        pass

    def add(self, op, variant, shape, dtype, ms, cost, *, baseline="", baseline_ms=None):
        self.rows.append((variant, ms, baseline, baseline_ms))


def test_only_ours_names_a_baseline_the_fastest_other(monkeypatch):
    speed = {"torch_eager": 3.0, "torch.compile": 1.2, "tilewise": 1.0, "liger": 1.1}
    cands = {n: (lambda *a, _n=n: _n) for n in speed}
    seen = iter(list(speed.values()))
    monkeypatch.setattr(L, "time_ms", lambda fn: next(seen))
    r = _Runner()
    L.time_rows(r, "op", "1x1", "bfloat16", None, cands, (0,), lambda name, out: None, backward=False)
    by = {v: (ms, b, bms) for v, ms, b, bms in r.rows}
    assert by["tilewise"] == (1.0, "liger", 1.1)
    assert all(by[n][1] == "" and by[n][2] is None for n in ("torch_eager", "torch.compile", "liger"))

