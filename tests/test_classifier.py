"""The classifier and `tilewise train`: torch backend and training on the CPU on data the tests
write; the tilewise backend against the torch one on the GPU."""

import argparse
import dataclasses
import json
import os

import pytest
import torch

from tilewise.sst2 import checkpoint, commands, config, dataset, loop, step_bench
from tilewise.nn import SentimentClassifier
from tilewise.nn import functional as twf

POS = ["good", "great", "fun", "warm", "moving", "smart"]
NEG = ["bad", "dull", "boring", "flat", "weak", "tired"]
FILL = ["the", "a", "movie", "film", "is", "and", "very", ","]


def write_tiny_sst2(d, n_train=256, n_dev=64, seed=0):
    """Sentences whose label is the majority of sentiment words, mixed with filler."""
    g = torch.Generator().manual_seed(seed)
    d.mkdir(parents=True, exist_ok=True)

    def rows(n):
        out = []
        for _ in range(n):
            lab = int(torch.randint(0, 2, (1,), generator=g))
            words = POS if lab else NEG
            k = int(torch.randint(1, 4, (1,), generator=g))
            toks = [words[int(torch.randint(0, 6, (1,), generator=g))] for _ in range(k)]
            toks += [FILL[int(torch.randint(0, 8, (1,), generator=g))]
                     for _ in range(int(torch.randint(0, 9, (1,), generator=g)))]
            perm = torch.randperm(len(toks), generator=g).tolist()
            out.append((" ".join(toks[i] for i in perm) + " ", lab))
        return out

    for name, n in (("train", n_train), ("dev", n_dev)):
        (d / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in rows(n)))
    return d


def tiny_config(tmp_path, **kw):
    base = dict(data_dir=str(write_tiny_sst2(tmp_path / "sst2")), epochs=3, batch_size=16, lr=1e-2, hidden=16,
                embedding_init="random", dropout=0.1, backend="torch", device="cpu", seed=0,
                output_dir=str(tmp_path / "run"), progress=False)
    base.update(kw)
    return config.TrainConfig(**base)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_model_shapes_and_masked_mean():
    torch.manual_seed(0)
    m = SentimentClassifier(20, embed_dim=5, hidden=7, dropout=0.0)
    ids = torch.randint(1, 20, (3, 6))
    lengths = torch.tensor([6, 1, 3])
    logits = m(ids, lengths)
    assert logits.shape == (3, 2)
    # Tokens past a sentence's length must not change its logits.
    ids2 = ids.clone()
    ids2[1, 1:] = 0
    ids2[2, 3:] = 5
    torch.testing.assert_close(m(ids2, lengths), logits)
    # And the pooling is a mean: one sentence by hand.
    h = torch.relu(m.fc1(m.embedding.weight[ids[2, :3]])).mean(0)
    torch.testing.assert_close(m.fc2(h), logits[2])


def test_masked_mean_reference():
    x = torch.arange(24.0).reshape(2, 3, 4)
    out = twf.masked_mean_reference(x, torch.tensor([1, 3]))
    torch.testing.assert_close(out, torch.stack([x[0, 0], x[1].mean(0)]))


def test_model_checks():
    with pytest.raises(ValueError, match="backend"):
        SentimentClassifier(10, backend="jax")
    with pytest.raises(ValueError, match="dropout"):
        SentimentClassifier(10, dropout=1.0)
    with pytest.raises(ValueError, match="embedding_init"):
        SentimentClassifier(10, embed_dim=4, embedding_init=torch.zeros(10, 5))
    m = SentimentClassifier(10, embed_dim=4, hidden=3)
    with pytest.raises(ValueError, match="lengths"):
        m(torch.zeros(2, 3, dtype=torch.long), torch.ones(3, dtype=torch.long))


def test_backends_share_parameters_and_match_on_cpu():
    """On the CPU the tilewise backend falls back to PyTorch per op: same numbers, same state dict."""
    torch.manual_seed(0)
    a = SentimentClassifier(30, 8, 16, dropout=0.0, backend="torch")
    b = SentimentClassifier(30, 8, 16, dropout=0.0, backend="tilewise")
    b.load_state_dict(a.state_dict())
    ids, lengths, y = torch.randint(0, 30, (5, 7)), torch.tensor([7, 1, 2, 5, 3]), torch.tensor([0, 1, 1, 0, 1])
    la, lb = a.loss(a(ids, lengths), y), b.loss(b(ids, lengths), y)
    torch.testing.assert_close(la, lb)
    la.backward()
    lb.backward()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=n)
    assert not a.embedding.weight.grad[0].any()  # <pad> gets no gradient


def test_functional_report_names_each_op(monkeypatch):
    twf.reset()
    monkeypatch.setitem(twf.CANDIDATES, "masked_mean", [("tilewise.ops.no_such_module", "masked_mean", ("x",))])
    rep = twf.report()
    assert set(rep) == {"embedding", "linear", "masked_mean", "cross_entropy"}
    assert rep["embedding"].startswith("tilewise")
    assert rep["masked_mean"].startswith("torch (") and "no_such_module" in rep["masked_mean"]
    twf.reset()


def test_functional_rejects_wrong_signature(monkeypatch):
    import types
    import sys

    mod = types.ModuleType("tilewise_fake_gemm")
    mod.linear = lambda x, w: x
    monkeypatch.setitem(sys.modules, "tilewise_fake_gemm", mod)
    monkeypatch.setitem(twf.CANDIDATES, "linear",
                        [("tilewise_fake_gemm", "linear", ("x", "weight", "bias", "activation"))])
    twf.reset()
    assert twf.resolve("linear") is None and "lacks" in twf.report()["linear"]
    twf.reset()


def test_short_cpu_training_reduces_loss(tmp_path):
    m = loop.train(tiny_config(tmp_path, epochs=4))
    ep = m["epochs"]
    assert len(ep) == 4 and m["backend"] == "torch"
    assert ep[-1]["train_loss"] < 0.7 * ep[0]["train_loss"]
    assert ep[-1]["dev_accuracy"] > 0.8
    out = tmp_path / "run"
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["epochs"][-1]["dev_accuracy"] == ep[-1]["dev_accuracy"]
    assert len(saved["step_losses"]) == 4 * 16
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert (out / "checkpoint.pt").is_file()


def test_resume_continues_exactly(tmp_path):
    full = loop.train(tiny_config(tmp_path, epochs=3, output_dir=str(tmp_path / "full")))
    loop.train(tiny_config(tmp_path, epochs=1, output_dir=str(tmp_path / "part")))
    resumed = loop.train(tiny_config(tmp_path, epochs=3, output_dir=str(tmp_path / "part"), resume=True))
    assert resumed["step_losses"] == full["step_losses"]
    assert [e["dev_accuracy"] for e in resumed["epochs"]] == [e["dev_accuracy"] for e in full["epochs"]]


def test_tilewise_adamw_trains_as_torch_adamw_and_resumes_across(tmp_path):
    # The same update as torch.optim.AdamW (CPU: the same foreach arithmetic, so the same losses), and a
    # checkpoint written with one optimizer resumes with the other.
    assert config.TrainConfig().optimizer == "tilewise"  # train's default
    ref = loop.train(tiny_config(tmp_path, epochs=2, output_dir=str(tmp_path / "torch"), optimizer="torch"))
    ours = loop.train(tiny_config(tmp_path, epochs=2, output_dir=str(tmp_path / "ours"), optimizer="tilewise"))
    assert ours["step_losses"] == ref["step_losses"]
    loop.train(tiny_config(tmp_path, epochs=1, output_dir=str(tmp_path / "part"), optimizer="torch"))
    resumed = loop.train(tiny_config(tmp_path, epochs=2, output_dir=str(tmp_path / "part"), resume=True,
                                     optimizer="tilewise"))
    assert resumed["step_losses"] == ref["step_losses"]
    with pytest.raises(ValueError, match="--optimizer must be one of"):
        loop.train(tiny_config(tmp_path, optimizer="sgd", output_dir=str(tmp_path / "bad")))


def test_cpu_backend_choice_and_errors(tmp_path):
    dev, backend, notes = config.resolve_device_backend(config.TrainConfig(device="cpu", backend="auto"))
    assert backend == "torch" and any("CPU" in n for n in notes)
    with pytest.raises(ValueError, match="tilewise needs a CUDA GPU"):
        config.resolve_device_backend(config.TrainConfig(device="cpu", backend="tilewise"))
    with pytest.raises(ValueError, match="--graph"):
        config.resolve_device_backend(config.TrainConfig(device="cpu", backend="torch", graph=True))
    with pytest.raises(FileNotFoundError, match="--resume"):
        loop.train(tiny_config(tmp_path, resume=True, output_dir=str(tmp_path / "none")))


def test_cli_arguments_and_missing_data(tmp_path, monkeypatch, capsys):
    p = argparse.ArgumentParser()
    commands.add_arguments(p)
    args = p.parse_args(["--data-dir", str(tmp_path / "nothing"), "--epochs", "2", "--buckets", "16,32",
                         "--backend", "torch", "--device", "cpu", "--no-progress",
                         "--output-dir", str(tmp_path / "o")])
    cfg = commands.config_from_args(args)
    assert cfg.epochs == 2 and cfg.buckets == (16, 32) and cfg.backend == "torch"
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "c"))
    assert commands.main(args) == 2
    err = capsys.readouterr().err
    assert "--data-dir" in err and "datasets" in err
    with pytest.raises(SystemExit):
        p.parse_args(["--buckets", "0"])


def test_cli_prints_unexpected_failures(tmp_path, monkeypatch, capsys):
    """A failure inside training (a kernel error, say) is printed with its traceback on both
    streams and exits 1, even with --no-progress (the first GPU run left an empty log)."""
    p = argparse.ArgumentParser()
    commands.add_arguments(p)
    args = p.parse_args(["--no-progress", "--device", "cpu", "--output-dir", str(tmp_path / "o")])

    def boom(cfg, prewarm=None, started=None, plotter=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(loop, "train", boom)
    assert commands.main(args) == 1
    cap = capsys.readouterr()
    for stream in (cap.out, cap.err):
        assert "RuntimeError: CUDA error: an illegal memory access" in stream and "Traceback" in stream


def test_tilewise_backend_pads_to_buckets(tmp_path, monkeypatch):
    """The tilewise backend defaults to bucket lengths (few GEMM shapes to autotune); checked on
    the CPU by faking the backend choice, since the shapes are decided before any kernel runs."""
    seen = []
    real = dataset.EncodedSplit.batches

    def spy(self, *a, **kw):
        seen.append(kw.get("buckets"))
        return real(self, *a, **kw)

    monkeypatch.setattr(dataset.EncodedSplit, "batches", spy)
    monkeypatch.setattr(loop, "resolve_device_backend", lambda cfg: (torch.device("cpu"), "tilewise", []))
    m = loop.train(tiny_config(tmp_path, epochs=1, max_len=40))
    assert seen and all(b == (16, 32, 40) for b in seen)
    assert any("bucket lengths (16, 32, 40)" in n for n in m["notes"])


def test_cli_trains_with_glove_cache(tmp_path):
    """GloVe init from a cached extract (the package itself is not needed then)."""
    import numpy as np

    from tilewise.sst2 import glove

    cfg = tiny_config(tmp_path, epochs=1, embedding_init="glove", embed_dim=50)
    data = dataset.load_sst2(cfg.data_dir)
    vocab = dataset.Vocab.build(data["train"].tokens)
    found = np.array([t in POS for t in vocab.itos])
    vecs = np.where(found[:, None], 1.0, 0.0).astype(np.float32) * np.ones((len(vocab), 50), np.float32)
    glove.save(glove.GloveVectors(vocab.itos, vecs, found), tmp_path / "g.npz")
    cfg.glove_cache = str(tmp_path / "g.npz")
    m = loop.train(cfg)
    assert any("GloVe" in n and f"{100 * found[2:].mean():.1f}%" in n for n in m["notes"])


# --------------------------------------------------------------------------- training options


def test_lr_factor_and_group_lrs():
    assert loop.lr_factor("constant", 5, 10) == 1.0
    assert loop.lr_factor("cosine", 0, 10) == 1.0
    assert loop.lr_factor("cosine", 5, 10) == pytest.approx(0.5)
    assert loop.lr_factor("cosine", 10, 10) == pytest.approx(0.0, abs=1e-12)
    assert loop.lr_factor("linear", 3, 4) == pytest.approx(0.25)
    assert loop.lr_factor("linear", 99, 4) == 0.0 and loop.lr_factor("linear", 0, 0) == 1.0
    with pytest.raises(ValueError, match="lr_schedule"):
        loop.lr_factor("step", 0, 1)
    cfg = config.TrainConfig(lr=2e-3, embedding_lr=1e-2, lr_schedule="linear", freeze_embeddings_epochs=1)
    assert loop.group_lrs(cfg, 0, 0, 10) == (0.0, 2e-3)
    emb, rest = loop.group_lrs(cfg, 1, 5, 10)
    assert emb == pytest.approx(5e-3) and rest == pytest.approx(1e-3)
    assert loop.group_lrs(config.TrainConfig(lr=1e-3), 0, 3, 10) == (1e-3, 1e-3)


def test_training_option_errors(tmp_path):
    for kw, msg in ((dict(lr_schedule="step"), "--lr-schedule"), (dict(freeze_embeddings_epochs=-1), "freeze"),
                    (dict(embed_dropout=1.0), "--embed-dropout")):
        with pytest.raises(ValueError, match=msg):
            loop.train(tiny_config(tmp_path, **kw))
    with pytest.raises(ValueError, match="embed_dropout"):
        SentimentClassifier(10, 4, 4, embed_dropout=-0.1)


def test_schedule_freeze_and_best_epoch(tmp_path):
    """Linear decay ends at ~0; a frozen first epoch leaves the table bit-identical; the best epoch
    is the one with the highest dev accuracy; no plot when asked."""
    m = loop.train(tiny_config(tmp_path, epochs=2, lr_schedule="linear", freeze_embeddings_epochs=1, plot=False,
                               embed_dropout=0.2))
    ep = m["epochs"]
    steps = ep[0]["steps"] + ep[1]["steps"]
    assert ep[0]["lr_end"][0] == 0.0  # frozen embedding
    assert ep[0]["lr_end"][1] == pytest.approx(1e-2 * (1 - (ep[0]["steps"] - 1) / steps))
    assert ep[1]["lr_end"][0] == pytest.approx(1e-2 / steps) and ep[1]["lr_end"][1] == pytest.approx(1e-2 / steps)
    assert m["best_epoch"] == max(ep, key=lambda e: e["dev_accuracy"])["epoch"]
    assert not (tmp_path / "run" / "loss_curve.png").exists()

    # Freezing: after one frozen epoch the table equals its initial value exactly.
    loop.train(tiny_config(tmp_path, epochs=1, freeze_embeddings_epochs=1, output_dir=str(tmp_path / "f"),
                           plot=False))
    frozen = torch.load(tmp_path / "f" / "checkpoint.pt", weights_only=False)["model"]["embedding.weight"]
    loop.train(tiny_config(tmp_path, epochs=1, output_dir=str(tmp_path / "moved"), plot=False))
    moved = torch.load(tmp_path / "moved" / "checkpoint.pt", weights_only=False)["model"]["embedding.weight"]
    assert not torch.equal(frozen, moved)  # the unfrozen run moves it
    torch.manual_seed(0)
    init = SentimentClassifier(frozen.shape[0], 50, 16, dropout=0.1).embedding.weight.detach()
    assert torch.equal(frozen, init)


def _full_and_resumed(tmp_path, monkeypatch, kw):
    """(an uninterrupted run, the same run killed at the end of epoch 2 before its checkpoint and
    resumed from epoch 1's) with the options kw."""
    full = loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "full"), **kw))
    real = loop.evaluate
    calls = []

    def dies_in_epoch_2(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(loop, "evaluate", dies_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "part"), **kw))
    monkeypatch.setattr(loop, "evaluate", real)
    assert torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)["epoch"] == 1
    return full, loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "part"), resume=True, **kw))


def test_resume_with_schedule_continues_exactly(tmp_path, monkeypatch):
    """A 3-epoch cosine run with a frozen first epoch, killed during epoch 2 and resumed, gives the
    uninterrupted run's step losses (the schedule spans the configured epochs, not the resumed ones)."""
    kw = dict(epochs=3, lr_schedule="cosine", freeze_embeddings_epochs=1, embed_dropout=0.1, plot=False)
    full, resumed = _full_and_resumed(tmp_path, monkeypatch, kw)
    assert resumed["step_losses"] == full["step_losses"]
    assert [e["lr_end"] for e in resumed["epochs"]] == [e["lr_end"] for e in full["epochs"]]


def test_resume_with_word_dropout_and_ema_continues_exactly(tmp_path, monkeypatch):
    """Word dropout draws from its own seeded stream and the weight average is saved: a run killed
    after epoch 1 and resumed gives the uninterrupted run's losses and dev accuracies (those of
    the averaged weights)."""
    kw = dict(epochs=3, word_dropout=0.3, ema=0.9, plot=False)
    full, resumed = _full_and_resumed(tmp_path, monkeypatch, kw)
    assert resumed["step_losses"] == full["step_losses"]
    assert [e["dev_accuracy"] for e in resumed["epochs"]] == [e["dev_accuracy"] for e in full["epochs"]]
    plain = loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "plain"), epochs=3, plot=False))
    assert plain["step_losses"] != full["step_losses"]  # the options change the run


def test_ema_is_what_is_evaluated_and_saved(tmp_path, monkeypatch):
    """With --ema the dev accuracy is that of the averaged weights, the trained weights come back
    after each evaluation, and the checkpoint loads with the averaged ones (predict/evaluate)."""
    seen = []
    real = loop.evaluate

    def spy(model, *a, **k):
        seen.append([p.detach().clone() for p in model.parameters()])
        return real(model, *a, **k)

    monkeypatch.setattr(loop, "evaluate", spy)
    loop.train(tiny_config(tmp_path, epochs=2, ema=0.95, plot=False))
    ck = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    shadow, trained = ck["ema"]["shadow"], list(ck["model"].values())
    assert all(torch.equal(a, b) for a, b in zip(seen[-1], shadow))
    assert not all(torch.equal(a, b) for a, b in zip(shadow, trained))
    model, _, _ = checkpoint.load_checkpoint(tmp_path / "run", device="cpu", backend="torch")
    assert all(torch.equal(p.detach(), a) for p, a in zip(model.parameters(), shadow))
    ema = loop.EMA(torch.nn.Linear(3, 2), 0.5)
    w0 = ema.shadow[0].clone()
    with torch.no_grad():
        ema.params[0].add_(1.0)
    ema.update()  # first step: decay min(0.5, 1/10) = 0.1
    torch.testing.assert_close(ema.shadow[0], w0 + 0.9)


def test_graph_auto_is_off_on_the_cpu(tmp_path):
    m = loop.train(tiny_config(tmp_path, epochs=1, graph=None))
    assert m["config"]["graph"] is False and m["epochs"][0]["steps"] > 0


def test_cli_training_options():
    p = argparse.ArgumentParser()
    commands.add_arguments(p)
    cfg = commands.config_from_args(p.parse_args(["--lr-schedule", "cosine", "--freeze-embeddings-epochs", "2",
                                                  "--embed-dropout", "0.25", "--no-plot", "--weight-decay", "0",
                                                  "--word-dropout", "0.3", "--ema", "0.999"]))
    assert (cfg.lr_schedule, cfg.freeze_embeddings_epochs, cfg.embed_dropout, cfg.plot, cfg.weight_decay,
            cfg.word_dropout, cfg.ema) == ("cosine", 2, 0.25, False, 0.0, 0.3, 0.999)
    d = commands.config_from_args(p.parse_args([]))
    assert (d.lr_schedule, d.freeze_embeddings_epochs, d.embed_dropout, d.plot, d.word_dropout, d.ema) == \
        ("constant", 0, 0.0, True, 0.0, 0.0)
    # graphs: the CLI asks for the automatic choice (on a GPU, off on the CPU and under torchrun)
    assert d.graph is None
    assert commands.config_from_args(p.parse_args(["--graph"])).graph is True
    assert commands.config_from_args(p.parse_args(["--no-graph"])).graph is False
    with pytest.raises(SystemExit):
        p.parse_args(["--lr-schedule", "step"])


# --------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu


def _pair(V=500, E=50, H=64, dropout=0.0):
    torch.manual_seed(0)
    a = SentimentClassifier(V, E, H, dropout=dropout, backend="torch").cuda()
    b = SentimentClassifier(V, E, H, dropout=dropout, backend="tilewise").cuda()
    b.load_state_dict(a.state_dict())
    return a, b


def _batch(B=64, T=33, V=500, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), device="cuda", generator=g)
    ids = torch.randint(1, V, (B, T), device="cuda", generator=g)
    ids[torch.arange(T, device="cuda")[None, :] >= lengths[:, None]] = 0
    return ids, lengths, torch.randint(0, 2, (B,), device="cuda", generator=g)


def _tol():
    """tilewise.linear computes float32 GEMMs in TF32 (10-bit mantissa), PyTorch in full float32:
    relative differences of about 1e-3 are expected then, 1e-6 otherwise."""
    twf.reset()
    return 1e-2 if twf.report()["linear"].startswith("tilewise") else 1e-4


@gpu
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_tilewise_vs_torch_one_step_gpu(dropout):
    """Same seed, same batch: same loss and gradients (dropout draws the same mask in both)."""
    a, b = _pair(dropout=dropout)
    ids, lengths, y = _batch()
    tol = _tol()
    torch.manual_seed(5)
    la = a.loss(a(ids, lengths), y)
    torch.manual_seed(5)
    lb = b.loss(b(ids, lengths), y)
    torch.testing.assert_close(lb, la, rtol=tol, atol=tol / 10)
    la.backward()
    lb.backward()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        rel = ((pb.grad - pa.grad).norm() / pa.grad.norm().clamp(min=1e-12)).item()
        assert rel < tol, f"{n}: relative gradient difference {rel:.2e}"
    assert not pb.grad.isnan().any()


@gpu
@pytest.mark.slow
def test_convergence_50_steps_gpu():
    """From one seed the two backends give the same loss step by step (AdamW, dropout off)."""
    a, b = _pair(V=2000, H=256)
    tol = _tol()
    oa = torch.optim.AdamW(a.parameters(), lr=1e-3)
    ob = torch.optim.AdamW(b.parameters(), lr=1e-3)
    for step in range(50):
        ids, lengths, y = _batch(V=2000, T=1 + step % 64, seed=step)
        losses = []
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            loss = m.loss(m(ids, lengths), y)
            loss.backward()
            o.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= tol * max(1.0, abs(losses[0])), f"step {step}: {losses}"


@gpu
@pytest.mark.parametrize("backend", ["torch", "tilewise"])
def test_train_gpu_with_graph(tmp_path, backend):
    m = loop.train(tiny_config(tmp_path, device="cuda", backend=backend, graph=True, epochs=3))
    ep = m["epochs"]
    assert ep[-1]["train_loss"] < 0.7 * ep[0]["train_loss"] and ep[-1]["dev_accuracy"] > 0.8


@gpu
@pytest.mark.parametrize("backend", ["torch", "tilewise"])
def test_train_gpu_graph_with_word_dropout_and_ema(tmp_path, backend):
    """Word dropout on the device's batches and the weight average beside graphed steps."""
    m = loop.train(tiny_config(tmp_path, device="cuda", backend=backend, graph=True, epochs=3, word_dropout=0.2,
                               ema=0.9, plot=False))
    ep = m["epochs"]
    assert ep[-1]["train_loss"] < 0.7 * ep[0]["train_loss"] and ep[-1]["dev_accuracy"] > 0.8


@gpu
def test_train_gpu_graphs_by_default(tmp_path):
    """graph=None (the CLI's default) replays CUDA graphs on a GPU."""
    m = loop.train(tiny_config(tmp_path, device="cuda", backend="tilewise", graph=None, epochs=2, plot=False))
    assert m["config"]["graph"] is True and any("CUDA graph" in n for n in m["notes"])
    assert m["epochs"][-1]["dev_accuracy"] > 0.8


@gpu
@pytest.mark.parametrize("graph", [False, True])
def test_train_gpu_tilewise_adamw_matches_torch_adamw(tmp_path, graph):
    # graph: the capturable path with device lrs (a cosine schedule changes them between replays)
    kw = dict(device="cuda", backend="tilewise", dropout=0.0, epochs=2, buckets=(24,), graph=graph,
              lr_schedule="cosine")
    ref = loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "t"), optimizer="torch", **kw))
    ours = loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "o"), optimizer="tilewise", **kw))
    torch.testing.assert_close(torch.tensor(ours["step_losses"]), torch.tensor(ref["step_losses"]),
                               rtol=1e-4, atol=1e-5)


@gpu
def test_train_gpu_graph_matches_eager_without_dropout(tmp_path):
    kw = dict(device="cuda", backend="tilewise", dropout=0.0, epochs=2, buckets=(24,))
    eager = loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "e"), **kw))
    graph = loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "g"), graph=True, **kw))
    torch.testing.assert_close(torch.tensor(graph["step_losses"]), torch.tensor(eager["step_losses"]),
                               rtol=1e-3, atol=1e-4)


@gpu
@pytest.mark.parametrize("backend", ["torch", "tilewise"])
def test_train_gpu_graph_schedule_matches_eager(tmp_path, backend):
    """With a schedule and a frozen epoch the graphed step reads its lrs from device tensors that
    change between replays: its losses must follow the eager run's (same seed, no dropout)."""
    kw = dict(device="cuda", backend=backend, dropout=0.0, epochs=2, buckets=(24,), lr_schedule="cosine",
              freeze_embeddings_epochs=1, plot=False)
    eager = loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "e"), **kw))
    graph = loop.train(tiny_config(tmp_path, output_dir=str(tmp_path / "g"), graph=True, **kw))
    torch.testing.assert_close(torch.tensor(graph["step_losses"]), torch.tensor(eager["step_losses"]),
                               rtol=1e-3, atol=1e-4)
    assert (sum((e["lr_end"] for e in graph["epochs"]), [])
            == pytest.approx(sum((e["lr_end"] for e in eager["epochs"]), [])))
    assert graph["epochs"][0]["lr_end"][0] == 0.0


def test_step_throughput_cpu():
    out = step_bench.step_throughput("torch", "eager", device="cpu", steps=2, vocab_size=50, hidden=8,
                                     batch_size=4, seq_len=5)
    assert out["ms_per_step"] > 0 and out["examples_per_second"] > 0
    with pytest.raises(ValueError, match="mode"):
        step_bench.step_throughput("torch", "fast", device="cpu")


@gpu
@pytest.mark.parametrize("backend", ["torch", "tilewise"])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_step_throughput_gpu(backend, mode):
    out = step_bench.step_throughput(backend, mode, steps=20, count_kernels=True)
    assert out["examples_per_second"] > 0 and out["kernels_per_step"] > 0


def test_predict_and_evaluate_checkpoint(tmp_path, capsys):
    m = loop.train(tiny_config(tmp_path, epochs=4))
    out = tmp_path / "run"
    res = commands.predict(out, ["great fun movie", "dull and boring", ""], device="cpu")
    assert [r[0] for r in res[:2]] == ["positive", "negative"]
    assert all(0.5 <= p <= 1.0 for _, p in res)
    ev = commands.evaluate_checkpoint(out / "checkpoint.pt", str(tmp_path / "sst2"), "dev", device="cpu")
    assert ev["accuracy"] == pytest.approx(m["epochs"][-1]["dev_accuracy"])
    # no --data-dir, from another directory: the data the checkpoint was trained on
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path / "run")
        assert commands.evaluate_checkpoint(out / "checkpoint.pt", None, "dev", device="cpu") == ev
    finally:
        os.chdir(cwd)
    p = argparse.ArgumentParser()
    commands.add_predict_arguments(p)
    assert commands.main_predict(p.parse_args([str(out), "great", "--device", "cpu"])) == 0
    assert capsys.readouterr().out.startswith("positive\t")
    p = argparse.ArgumentParser()
    commands.add_evaluate_arguments(p)
    assert commands.main_evaluate(p.parse_args([str(tmp_path / "none"), "--device", "cpu"])) == 2


@gpu
def test_resume_eager_checkpoint_into_graph_gpu(tmp_path):
    kw = dict(device="cuda", backend="tilewise", output_dir=str(tmp_path / "r"))
    loop.train(tiny_config(tmp_path, epochs=1, **kw))
    m = loop.train(tiny_config(tmp_path, epochs=3, resume=True, graph=True, **kw))
    assert len(m["epochs"]) == 3 and m["epochs"][-1]["train_loss"] < m["epochs"][0]["train_loss"]


def test_train_args_reproduce_a_config():
    """commands.train_args gives the `tilewise train` options of a setting (what a sweep prints to
    reproduce a run); parsed back, they give the same TrainConfig, for every field an option sets."""
    cfg = config.TrainConfig(
        data_dir="d i r", download=True, epochs=3, batch_size=8, lr=0.005, embedding_lr=0.05, weight_decay=0.0,
        hidden=1024, embedding_init="random", glove_cache="g.npz", dropout=0.2, embed_dropout=0.1,
        word_dropout=0.3, ema=0.999, lr_schedule="cosine", freeze_embeddings_epochs=1, min_count=2, max_len=40,
        buckets=(8, 16, 40), backend="torch", device="cpu", graph=True, seed=7, output_dir="o", resume=True,
        max_steps=5, progress=False, plot=False)
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("embed_dim", "log_every")}
    p = argparse.ArgumentParser()
    commands.add_arguments(p)
    assert commands.config_from_args(p.parse_args(commands.train_args(fields))) == cfg
    # In the order given; the defaults of None, False flags and graph=None leave their options out.
    assert commands.train_args({"lr": 0.005, "hidden": 1024, "graph": False}) == \
        ["--lr", "0.005", "--hidden", "1024", "--no-graph"]
    assert commands.train_args({"embedding_lr": None, "resume": False, "plot": True, "graph": None}) == []
    assert commands.train_args({"progress": False}) == ["--no-progress"]
    with pytest.raises(ValueError, match="embed_dim"):
        commands.train_args({"embed_dim": 50})


def test_torchrun_data_parallel_on_cpu(tmp_path):
    """`torchrun --nproc_per_node 2 -m tilewise train` on the CPU (gloo): both processes train on
    their halves of each epoch (the same number of steps each), rank 0 alone writes metrics and a
    checkpoint, and the metrics say world_size 2."""
    import json
    import os
    import subprocess
    import sys

    data = write_tiny_sst2(tmp_path / "sst2", n_train=192, n_dev=48)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    import socket

    with socket.socket() as sock:  # a free port: two test runs at once must not meet in one group
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
           "-m", "tilewise", "train", "--data-dir", str(data), "--epochs", "2", "--batch-size", "16",
           "--hidden", "16", "--embedding-init", "random", "--backend", "torch", "--device", "cpu",
           "--output-dir", str(out), "--no-progress", "--no-plot", "--seed", "3"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["world_size"] == 2
    # 192 sentences / 16 = 12 batches, 6 a process and epoch
    assert [e["steps"] for e in m["epochs"]] == [6, 6]
    assert all(0.0 <= e["dev_accuracy"] <= 1.0 for e in m["epochs"])
    ck = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert ck["epoch"] == 2
