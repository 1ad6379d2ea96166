"""The train_step bench suite and the step helpers of tilewise.sst2.step_bench it is built on."""

import pytest
import torch

from tilewise.bench import harness, suites
from tilewise.sst2 import graph_step, step_bench
from tilewise.bench.suites import train_step as ts

gpu = pytest.mark.gpu
TINY = dict(batch=4, seq=7, vocab=30, embed=5, hidden=8, classes=2)


class _Log:
    def __init__(self):
        self.lines = []

    def print(self, msg):
        self.lines.append(str(msg))


def _runner():
    con = _Log()
    return harness.Runner(console=con), con


# --------------------------------------------------------------------------- CPU


def test_suite_is_discovered_with_its_paths():
    assert "train_step" in suites.SUITES
    assert suites.get("train_step") is ts
    variants = [v for v, _, _ in ts.PATHS]
    assert variants == ["torch_eager", "torch_compile", "torch_graph", "tilewise_eager", "tilewise_graph"]
    # ours name the baseline's time, so the baseline is timed before them
    assert variants.index(ts.BASELINE) < variants.index("tilewise_eager")
    assert all(m in step_bench.STEP_MODES for _, _, m in ts.PATHS)
    assert ts.SHAPE == "B=64 T=64 E=50 H=256 V=14819"


@pytest.mark.parametrize("pad_id", [0, 3])
def test_synthetic_batches(pad_id):
    n, B, T, V, C = 5, 6, 11, 20, 3
    bs = step_bench.synthetic_batches(n, B, T, V, C, pad_id=pad_id, min_len=2, seed=7)
    assert len(bs) == n
    pos = torch.arange(T)[None, :]
    seen_lengths = set()
    for b in bs:
        assert b.ids.shape == (B, T) and b.lengths.shape == (B,) and b.labels.shape == (B,)
        assert b.ids.dtype == b.lengths.dtype == b.labels.dtype == torch.int64
        assert ((b.lengths >= 2) & (b.lengths <= T)).all()
        pad = pos >= b.lengths[:, None]
        assert (b.ids[pad] == pad_id).all()            # every position past the length is padding
        assert (b.ids[~pad] != pad_id).all()           # and no token before it is
        assert ((b.ids >= 0) & (b.ids < V)).all()
        assert ((b.labels >= 0) & (b.labels < C)).all()
        seen_lengths |= set(b.lengths.tolist())
    assert len(seen_lengths) > 3                       # lengths vary
    tokens = torch.cat([b.ids[pos.expand(B, T) < b.lengths[:, None]] for b in bs])
    assert tokens.max() == V - 1 or tokens.max() == V - 2 and pad_id == V - 1
    again = step_bench.synthetic_batches(n, B, T, V, C, pad_id=pad_id, min_len=2, seed=7)
    assert all(torch.equal(a.ids, b.ids) and torch.equal(a.lengths, b.lengths) for a, b in zip(bs, again))
    other = step_bench.synthetic_batches(n, B, T, V, C, pad_id=pad_id, min_len=2, seed=8)
    assert not torch.equal(bs[0].ids, other[0].ids)


def test_synthetic_batches_full_length_and_validation():
    (b,) = step_bench.synthetic_batches(1, 3, 4, 10, min_len=4)
    assert (b.lengths == 4).all() and (b.ids != 0).all()
    for kw, word in ((dict(n_batches=0), "n_batches"), (dict(vocab_size=1), "vocab_size"),
                     (dict(pad_id=10), "pad_id"), (dict(min_len=0), "min_len"),
                     (dict(min_len=5), "min_len"), (dict(num_classes=0), "num_classes")):
        args = dict(n_batches=1, batch_size=3, seq_len=4, vocab_size=10)
        args.update(kw)
        with pytest.raises(ValueError, match=word):
            step_bench.synthetic_batches(**args)


def test_cost_numbers():
    c = ts.cost()
    n_params = 14819 * 50 + 50 * 256 + 256 + 256 * 2 + 2
    assert n_params == 754_520
    gemm = 2 * 64 * 64 * 50 * 256 + 2 * 64 * 256 * 2
    assert c.flops == 3 * gemm + 64 * 64 * 50 + 10 * n_params
    elems = 64 * 64 * 2 + 64 * 2 + 2 * 4096 * 50 + 2 * 4096 * 256 + 9 * n_params
    assert c.bytes == 4 * elems
    # the floor: ~10 us on the H200 (bytes at 4.27 TB/s, FLOPs at 51 TFLOP/s fp32)
    assert 5e-6 < c.bytes / 4273e9 + c.flops / 51e12 < 20e-6


def test_tolerance_and_summarize():
    assert ts.tolerance("tilewise_graph", "tilewise (tilewise.ops.gemm.api.linear)") == 1e-2
    assert ts.tolerance("tilewise_eager", "torch (no module)") == 1e-4
    assert ts.tolerance("torch_graph", "tilewise (x)") == 1e-4
    s = ts.summarize(0.5, 64)
    assert s["examples_per_second"] == pytest.approx(128_000) and s["us_per_example"] == pytest.approx(7.8125)
    with pytest.raises(ValueError, match="ms_per_step"):
        ts.summarize(0.0)


def test_step_model_same_init_across_backends_and_modes():
    a, _ = step_bench.step_model("torch", "eager", vocab_size=30, embed_dim=5, hidden=8, device="cpu")
    b, ob = step_bench.step_model("tilewise", "graph", vocab_size=30, embed_dim=5, hidden=8, device="cpu")
    for (n, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), n
    assert ob.param_groups[0]["capturable"] and a.training
    with pytest.raises(ValueError, match="mode"):
        step_bench.step_model("torch", "jit", device="cpu")
    with pytest.raises(ValueError, match="mode"):
        step_bench.build_step(a, ob, "jit", batch_size=4, seq_len=7, device="cpu")


def test_step_model_optimizer_choice():
    """optimizer="tilewise" builds train's default AdamW (same groups and hyper-parameters); another
    value is an error naming the argument. In a fresh process it never imports torch._dynamo, which
    torch.optim's constructor does."""
    import subprocess
    import sys

    from tilewise.sst2.adamw import AdamW

    _, ours = step_bench.step_model("tilewise", "graph", vocab_size=30, embed_dim=5, hidden=8, device="cpu",
                                    optimizer="tilewise")
    _, theirs = step_bench.step_model("tilewise", "graph", vocab_size=30, embed_dim=5, hidden=8, device="cpu")
    assert isinstance(ours, AdamW) and isinstance(theirs, torch.optim.AdamW)
    for key in ("lr", "weight_decay", "betas", "eps", "capturable"):
        assert ours.param_groups[0][key] == theirs.param_groups[0][key], key
    with pytest.raises(ValueError, match="optimizer"):
        step_bench.step_model("torch", "eager", device="cpu", optimizer="sgd")
    code = ("import sys; from tilewise.sst2 import step_bench; step_bench.step_model('tilewise', 'graph', "
            "vocab_size=30, embed_dim=5, hidden=8, device='cpu', optimizer='{}'); "
            "print('torch._dynamo' in sys.modules)")
    out = [subprocess.run([sys.executable, "-c", code.format(o)], capture_output=True, text=True, check=True).stdout
           for o in ("tilewise", "torch")]
    assert [o.strip() for o in out] == ["False", "True"]


def test_eager_step_trains_and_helpers_on_cpu():
    model, opt = step_bench.step_model("torch", "eager", vocab_size=30, embed_dim=5, hidden=8, dropout=0.0,
                                       device="cpu")
    step = step_bench.build_step(model, opt, "eager", batch_size=4, seq_len=7, device="cpu")
    (b,) = step_bench.synthetic_batches(1, 4, 7, 30)
    losses = [step(b).item() for _ in range(30)]
    assert losses[-1] < 0.95 * losses[0]               # it does update the weights
    assert step.graphed is None and graph_step.graph_kernel_nodes(step) is None
    assert step_bench.count_step_kernels(step, b, "cpu") == {"kernels": 0, "memcpy": 0, "memset": 0}


def test_run_paths_on_cpu_adds_checked_rows():
    r, con = _runner()
    paths = (("torch_eager", "torch", "eager"), ("tilewise_eager", "tilewise", "eager"))
    res = ts.run_paths(r, "cpu", paths, steps=2, repeats=2, warmup=1, **TINY)
    assert [x["variant"] for x in res] == ["torch_eager", "tilewise_eager"]
    assert [row.variant for row in r.rows] == ["torch_eager", "tilewise_eager"]
    assert all(row.op == "train_step" and row.shape == "B=4 T=7 E=5 H=8 V=30" and row.median_ms > 0
               for row in r.rows)
    # no torch_graph timed here, so no row names a baseline it does not have
    assert all(row.baseline == "" for row in r.rows)
    assert any("examples/s" in line for line in con.lines)


def test_run_paths_baseline_named_by_ours(monkeypatch):
    r, _ = _runner()
    monkeypatch.setattr(ts, "BASELINE", "torch_eager")
    paths = (("torch_eager", "torch", "eager"), ("tilewise_eager", "tilewise", "eager"))
    ts.run_paths(r, "cpu", paths, steps=2, repeats=1, warmup=0, **TINY)
    base, ours = r.rows
    assert base.baseline == "" and ours.baseline == "torch_eager"
    assert ours.baseline_ms == base.median_ms and ours.speedup == pytest.approx(base.median_ms / ours.median_ms)


def test_run_paths_check_catches_a_wrong_step(monkeypatch):
    real = step_bench.build_step

    def wrong(model, opt, mode, **kw):
        step = real(model, opt, mode, **kw)
        if model.backend == "tilewise":
            def bad(b):
                return step(b) * 1.001                    # 1e-3 off: over the 1e-4 tolerance on a CPU
            bad.graphed = None
            return bad
        return step

    monkeypatch.setattr(step_bench, "build_step", wrong)
    r, con = _runner()
    paths = (("torch_eager", "torch", "eager"), ("tilewise_eager", "tilewise", "eager"))
    with pytest.raises(harness.CheckError, match="tilewise_eager"):
        ts.run_paths(r, "cpu", paths, steps=2, repeats=1, warmup=0, **TINY)
    assert [row.variant for row in r.rows] == ["torch_eager"]  # the wrong one is not timed


def test_run_paths_check_catches_nan(monkeypatch):
    real = step_bench.build_step

    def nan_step(model, opt, mode, **kw):
        step = real(model, opt, mode, **kw)

        def bad(b):
            return step(b) * float("nan")
        bad.graphed = None
        return bad

    monkeypatch.setattr(step_bench, "build_step", nan_step)
    r, _ = _runner()
    with pytest.raises(harness.CheckError):
        ts.run_paths(r, "cpu", (("torch_eager", "torch", "eager"),), steps=1, repeats=1, warmup=0, **TINY)
    assert r.rows == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
def test_run_without_gpu_skips():
    r, con = _runner()
    ts.run(r)
    assert r.rows == [] and "no CUDA" in con.lines[0]


# --------------------------------------------------------------------------- GPU


def _graph_vs_eager(backend, steps=6):
    """Losses of the graphed step against the eager step of the same backend, same init, same batches."""
    sizes = dict(vocab_size=ts.V, embed_dim=ts.E, hidden=ts.H, num_classes=ts.C, dropout=0.0, device="cuda")
    batches = step_bench.synthetic_batches(steps, ts.B, ts.T, ts.V, device="cuda", seed=3)
    out = {}
    for mode in ("eager", "graph"):
        model, opt = step_bench.step_model(backend, mode, **sizes)
        step = step_bench.build_step(model, opt, mode, batch_size=ts.B, seq_len=ts.T, device="cuda", keep_graph=True)
        losses = torch.full((steps,), float("nan"), device="cuda")
        for i, b in enumerate(batches):
            losses[i] = step(b)
        out[mode] = (losses, step, model)
    return out


@gpu
def test_torch_step_graph_capture_gpu():
    out = _graph_vs_eager("torch")
    (le, _, me), (lg, step, mg) = out["eager"], out["graph"]
    assert not lg.isnan().any()
    # capturable AdamW keeps its bias corrections on the device in float32, the eager one in Python floats
    torch.testing.assert_close(lg, le, rtol=1e-4, atol=1e-5)
    for (n, pe), (_, pg) in zip(me.named_parameters(), mg.named_parameters()):
        # a norm, not elementwise: one near-zero gradient whose sign rounds differently moves its
        # weight by 2 x lr under Adam without anything being wrong
        assert not pg.isnan().any(), n
        assert ((pg - pe).norm() / pe.norm()).item() < 1e-4, n
    (b,) = step_bench.synthetic_batches(1, ts.B, ts.T, ts.V, device="cuda")
    k = step_bench.count_step_kernels(step, b)
    nodes = graph_step.graph_kernel_nodes(step)
    assert k["kernels"] > 10 or (nodes is not None and nodes > 10), (k, nodes)


@gpu
def test_tilewise_step_graph_capture_gpu():
    from tilewise.nn import functional as twf

    twf.reset()
    out = _graph_vs_eager("tilewise")
    (le, _, _), (lg, _, _) = out["eager"], out["graph"]
    assert not lg.isnan().any()
    torch.testing.assert_close(lg, le, rtol=1e-3, atol=1e-4)
    rep = twf.report()
    # Every op the tilewise backend has runs inside the graph too: no PyTorch fallback while capturing.
    assert not [k for k in rep if "CUDA graphs" in k], rep
    if "cross_entropy_capturable" in rep["cross_entropy"]:
        twf.check_targets()  # synthetic labels are all in range


@gpu
def test_eager_kernel_counts_gpu():
    (b,) = step_bench.synthetic_batches(1, ts.B, ts.T, ts.V, device="cuda")
    for backend in ("torch", "tilewise"):
        model, opt = step_bench.step_model(backend, "eager", vocab_size=ts.V, dropout=0.0, device="cuda")
        step = step_bench.build_step(model, opt, "eager", batch_size=ts.B, seq_len=ts.T, device="cuda")
        step(b)
        k = step_bench.count_step_kernels(step, b)
        assert 5 < k["kernels"] < 300, (backend, k)


@gpu
def test_run_paths_gpu_all_paths():
    r, con = _runner()
    res = ts.run_paths(r, "cuda", ts.PATHS, steps=5, repeats=2, warmup=2)
    timed = [x["variant"] for x in res]
    assert timed[:4] == ["torch_eager", "torch_compile", "torch_graph", "tilewise_eager"], con.lines
    for row in r.rows:
        assert row.median_ms > 0 and row.op == "train_step" and row.shape == ts.SHAPE
        assert row.baseline == ("torch_graph" if row.variant.startswith("tilewise") else "")
    assert all(x["kernels"] > 0 or (x["graph_nodes"] or 0) > 0 for x in res), res


@gpu
def test_tilewise_eager_step_has_no_host_sync_gpu():
    """With the sync-free cross-entropy, an eager tilewise step (after its first, which autotunes)
    makes no synchronizing CUDA call, so the host can run ahead of the GPU. A failure names the
    op that still syncs."""
    from tilewise.nn import functional as twf

    twf.reset()
    batches = step_bench.synthetic_batches(3, ts.B, ts.T, ts.V, device="cuda")
    model, opt = step_bench.step_model("tilewise", "eager", vocab_size=ts.V, dropout=0.0, device="cuda")
    step = step_bench.build_step(model, opt, "eager", batch_size=ts.B, seq_len=ts.T, device="cuda")
    step(batches[0])
    torch.cuda.synchronize()
    if "cross_entropy_capturable" not in twf.report()["cross_entropy"]:
        pytest.skip("the sync-free cross-entropy is not the one in use")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for b in batches[1:]:
            step(b)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    twf.check_targets()
