"""The rmsnorm / rope / swiglu suites' rows (bench/suites/_llama_ops.py): only ours names a baseline,
the fastest of the others in the case, so the report never takes torch.compile's or Liger's row for ours."""

from bench_fakes import FakeRunner

from tilewise.bench.suites import _llama_ops as L


def test_only_ours_names_a_baseline_the_fastest_other(monkeypatch):
    speed = {"torch_eager": 3.0, "torch.compile": 1.2, "tilewise": 1.0, "liger": 1.1}
    cands = {n: (lambda *a, _n=n: _n) for n in speed}
    seen = iter(list(speed.values()))
    monkeypatch.setattr(L, "time_ms", lambda fn: 99.0)
    monkeypatch.setattr(L, "time_ms_graph", lambda fn, **kw: next(seen))
    r = FakeRunner()
    L.time_rows(r, "op", "1x1", "bfloat16", None, cands, (0,), lambda name, out: None, backward=False)
    by = {v: (ms, b, bms) for v, ms, b, bms in r.rows}
    assert by["tilewise"] == (1.0, "liger", 1.1)
    assert all(by[n][1] == "" and by[n][2] is None for n in ("torch_eager", "torch.compile", "liger"))



def test_rows_hold_device_time_and_eager_where_capture_fails(monkeypatch):
    # The row is the graph's time; a candidate whose capture raises keeps its eager time, and the log says so.
    def graph(fn, **kw):
        if fn() == "liger":
            raise RuntimeError("operation not permitted when stream is capturing")
        return 0.5

    monkeypatch.setattr(L, "time_ms", lambda fn: 2.0)
    monkeypatch.setattr(L, "time_ms_graph", graph)
    monkeypatch.setattr(L.torch.cuda, "synchronize", lambda: None)
    cands = {n: (lambda *a, _n=n: _n) for n in ("torch_eager", "tilewise", "liger")}
    r = FakeRunner()
    L.time_rows(r, "op", "1x1", "bfloat16", None, cands, (0,), lambda name, out: None, backward=False)
    by = {v: ms for v, ms, _, _ in r.rows}
    assert by == {"torch_eager": 0.5, "tilewise": 0.5, "liger": 2.0}
    assert any("liger" in m and "no CUDA graph" in m for m in r.lines)
    assert any("tilewise" in m and "0.5000 ms device" in m and "2.0000 ms eager" in m for m in r.lines)


def test_graph_false_times_eager_and_never_captures(monkeypatch):
    # linear_cross_entropy's candidates cannot be captured: a failed capture can leave the CUDA generator
    # in capture mode, so with graph=False no capture is tried at all.
    def graph(fn, **kw):
        raise AssertionError("a capture was tried")

    monkeypatch.setattr(L, "time_ms", lambda fn: 2.0)
    monkeypatch.setattr(L, "time_ms_graph", graph)
    cands = {n: (lambda *a, _n=n: _n) for n in ("torch_eager", "tilewise", "liger")}
    r = FakeRunner()
    L.time_rows(r, "op", "1x1", "bfloat16", None, cands, (0,), lambda name, out: None, backward=False, graph=False)
    assert {v: ms for v, ms, _, _ in r.rows} == {"torch_eager": 2.0, "tilewise": 2.0, "liger": 2.0}
