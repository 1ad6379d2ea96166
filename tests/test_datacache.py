"""sst2/datacache.py: the encoded SST-2 kept between runs, and train's use of it."""

import io
import json
import zipfile

import numpy as np
import pytest
import torch

from tilewise.sst2 import config, datacache, dataset, loop
from test_classifier import write_tiny_sst2

pytestmark = pytest.mark.usefixtures("one_thread")


def _fresh(d, min_count=1, max_len=64):
    data = dataset.load_sst2(d)
    vocab = dataset.Vocab.build(data["train"].tokens, min_count)
    train, dev = (dataset.EncodedSplit(data[s], vocab, max_len) for s in ("train", "dev"))
    return vocab, train, dev, vocab.coverage(data["dev"].tokens)


def _same(a, b):
    assert a[0].itos == b[0].itos and a[3] == b[3]
    for x, y in zip(a[1:3], b[1:3]):
        assert x.name == y.name
        for t in ("padded", "lengths", "labels"):
            assert torch.equal(getattr(x, t), getattr(y, t)), t


def test_round_trip_and_keys(tmp_path, fresh_cache):
    d = write_tiny_sst2(tmp_path / "sst2")
    path = datacache.path_for(d, 1, 64)
    assert path.parent == fresh_cache / "data" / "sst2-encoded" and datacache.load(path) is None
    want = _fresh(d)
    assert datacache.save(path, *want)
    _same(datacache.load(path), want)
    assert datacache.path_for(d, 2, 64) != path and datacache.path_for(d, 1, 32) != path
    with open(d / "dev.tsv", "a") as f:
        f.write("good fine 1\t1\n")
    assert datacache.path_for(d, 1, 64) != path  # the files' bytes name the entry


def _npz(path, **arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def test_what_is_not_an_entry_reads_as_none(tmp_path, fresh_cache):
    d = write_tiny_sst2(tmp_path / "sst2")
    path = datacache.path_for(d, 1, 64)
    datacache.save(path, *_fresh(d))
    with np.load(path) as z:
        good = {k: z[k] for k in z.files}
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file at all")
    assert datacache.load(bad) is None
    cases = {
        "ids past the vocabulary": dict(good, train_ids=good["train_ids"] + len(good["itos_utf8"])),
        "lengths that do not sum": dict(good, dev_lengths=good["dev_lengths"] + 1),
        "a label 2": dict(good, train_labels=np.full_like(good["train_labels"], 2)),
        "no vocabulary": {k: v for k, v in good.items() if k != "itos_utf8"},
        "vocabulary without <pad>": dict(good, itos_utf8=np.frombuffer(b"a\nb\nc", dtype=np.uint8)),
        "coverage above 1": dict(good, coverage=np.float64(1.5)),
        "not UTF-8": dict(good, itos_utf8=np.frombuffer(b"<pad>\n<unk>\n\xff", dtype=np.uint8)),
    }
    for what, arrays in cases.items():
        _npz(bad, **arrays)
        assert datacache.load(bad) is None, what
    # An object array would need pickle to read: refused, never unpickled.
    _npz(bad, **dict(good, coverage=np.array([{"x": 1}], dtype=object)))
    assert datacache.load(bad) is None
    assert zipfile.is_zipfile(bad)


def test_train_reads_the_cache_on_its_second_run(tmp_path, fresh_cache, monkeypatch):
    """The second run of the same data and options reads no TSV and trains the same; a resumed run
    takes the checkpoint's vocabulary from the TSVs as before."""
    d = write_tiny_sst2(tmp_path / "sst2")
    cfg = config.TrainConfig(data_dir=str(d), epochs=1, batch_size=16, hidden=8, embedding_init="random",
                             backend="torch", device="cpu", output_dir=str(tmp_path / "run1"), progress=False,
                             plot=False)
    first = loop.train(cfg)
    assert len(list((fresh_cache / "data" / "sst2-encoded").glob("*.npz"))) == 1
    loop._DATA_CACHE.clear()

    def no_tsv(*a, **k):
        raise AssertionError("read a TSV")

    monkeypatch.setattr(dataset, "read_tsv", no_tsv)
    second = loop.train(config.TrainConfig(**{**cfg.__dict__, "output_dir": str(tmp_path / "run2")}))
    assert second["step_losses"] == first["step_losses"] and second["vocab_size"] == first["vocab_size"]
    assert [e["dev_accuracy"] for e in second["epochs"]] == [e["dev_accuracy"] for e in first["epochs"]]
    monkeypatch.undo()
    resumed = config.TrainConfig(**{**cfg.__dict__, "epochs": 2, "resume": True})
    loop._DATA_CACHE.clear()
    third = loop.train(resumed)
    assert len(third["epochs"]) == 2 and third["vocab_size"] == first["vocab_size"]


def test_train_runs_where_the_cache_cannot_be_written(tmp_path, monkeypatch):
    d = write_tiny_sst2(tmp_path / "sst2")
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(blocker))
    loop._DATA_CACHE.clear()
    cfg = config.TrainConfig(data_dir=str(d), epochs=1, batch_size=16, hidden=8, embedding_init="random",
                             backend="torch", device="cpu", output_dir=str(tmp_path / "run"), progress=False,
                             plot=False)
    m = loop.train(cfg)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["step_losses"] == m["step_losses"]
