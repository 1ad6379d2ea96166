"""Issue 29's data findings: the GloVe extract holds no pickle and never overwrites a user's file;
SST-2 splits without labels or examples, long lines and non-UTF-8 bytes give errors naming the file."""

import numpy as np
import pytest
import torch

from tilewise.sst2 import dataset, glove

TOKENS = ["<pad>", "<unk>", "great", "zzz", "the", "bad"]


class _Plant:
    """Unpickling this creates ``marker``: the code a planted extract would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(path, marker):
    tokens = np.empty(2, dtype=object)
    tokens[:] = [_Plant(marker), "x"]
    np.savez(path, tokens=tokens, vectors=np.zeros((2, glove.DIM), np.float32), found=np.zeros(2, bool))


@pytest.fixture
def fake_glove(tmp_path, monkeypatch):
    """A fake package (as in test_data.py): a 5-word index and a 5 x 50 table."""
    root = tmp_path / "pkg"
    root.mkdir()
    table = np.arange(5 * 50, dtype=np.float32).reshape(5, 50) / 100
    np.save(root / "glove_6B_50d_emb.npy", table)
    monkeypatch.setattr(glove, "_package_root", lambda: root)
    monkeypatch.setattr(glove, "_read_index", lambda path: ["the", "great", "movie", "bad", "the"])
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "cache"))
    return table


# --------------------------------------------------------------------------- 2: no pickle


def test_planted_pickle_extract_is_refused_and_not_run(tmp_path):
    live = tmp_path / "live.npz"
    _plant(live, tmp_path / "control")
    with np.load(live, allow_pickle=True) as z:  # the plant works when pickle is allowed
        z["tokens"]
    assert (tmp_path / "control").exists()

    path, marker = tmp_path / "old.npz", tmp_path / "marker"
    _plant(path, marker)
    with pytest.raises(ValueError, match=r"old\.npz.*pickle.*delete it.*--glove-cache"):
        glove.load(path)
    assert not marker.exists()


def test_glove_vectors_refuses_planted_cache_without_running_it(fake_glove, tmp_path):
    path, marker = tmp_path / "cache.npz", tmp_path / "marker"
    _plant(path, marker)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"cache\.npz"):
        glove.glove_vectors(TOKENS, path)
    assert not marker.exists() and path.read_bytes() == before


def test_extract_round_trip_without_pickle(fake_glove, tmp_path):
    g = glove.extract(TOKENS + ["émigré", "naïve"])
    path = tmp_path / "g.npz"
    glove.save(g, path)
    with np.load(path, allow_pickle=False) as z:  # every array reads without pickle
        assert z["tokens"].dtype.kind == "U"
        assert int(z[glove.MARK]) == glove.FORMAT_VERSION
    h = glove.load(path)
    assert h.tokens == g.tokens and all(type(t) is str for t in h.tokens)
    np.testing.assert_array_equal(h.vectors, g.vectors)
    np.testing.assert_array_equal(h.found, g.found)
    assert h.vectors.dtype == np.float32 and h.found.dtype == bool


def test_save_temp_file_is_unique_per_writer(tmp_path, monkeypatch):
    g = glove.GloveVectors(["<pad>", "<unk>"], np.zeros((2, glove.DIM), np.float32), np.zeros(2, bool))
    seen = []
    real = glove.os.replace
    monkeypatch.setattr(glove.os, "replace", lambda a, b: (seen.append(str(a)), real(a, b)))
    glove.save(g, tmp_path / "g.npz")
    glove.save(g, tmp_path / "g.npz")
    assert len(seen) == 2 and seen[0] != seen[1]
    assert all(str(tmp_path) in s for s in seen)  # same folder: os.replace stays atomic
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.npz"]  # no temp files left


# --------------------------------------------------------------------------- 6: never clobber a user's file


def test_glove_cache_never_overwrites_a_users_file(fake_glove, tmp_path):
    # An extract-shaped npz the user made (no tilewise mark) for another vocabulary.
    user = tmp_path / "mine.npz"
    np.savez(user, tokens=np.array(["<pad>", "<unk>", "other"]), vectors=np.ones((3, glove.DIM), np.float32),
             found=np.ones(3, bool))
    mine = user.read_bytes()
    with pytest.raises(ValueError, match=r"mine\.npz.*refusing to overwrite"):
        glove.glove_vectors(TOKENS, user)
    assert user.read_bytes() == mine
    # Any other file at that path: not read as pickle, not overwritten.
    for name, data in (("notes.txt", b"my notes\n"), ("other.npz", None)):
        p = tmp_path / name
        if data is None:
            np.savez(p, weights=np.arange(3))
        else:
            p.write_bytes(data)
        before = p.read_bytes()
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            glove.glove_vectors(TOKENS, p)
        assert p.read_bytes() == before
    with pytest.raises(ValueError, match="refusing to overwrite"):  # save itself checks too
        glove.save(glove.extract(TOKENS), user)
    assert user.read_bytes() == mine


def test_own_extract_for_another_vocabulary_is_replaced(fake_glove, tmp_path):
    path = tmp_path / "g.npz"
    glove.glove_vectors(["<pad>", "<unk>", "great"], path)
    with np.load(path, allow_pickle=False) as z:
        assert glove.MARK in z.files
    assert glove.is_extract(path)
    other = ["<pad>", "<unk>", "bad", "movie"]  # not a subset: our cache, so it is rebuilt in place
    g = glove.glove_vectors(other, path)
    assert g.tokens == other and glove.load(path).tokens == other
    np.testing.assert_array_equal(glove.load(path).vectors[2], fake_glove[3])


# --------------------------------------------------------------------------- 7: unlabelled or empty splits


def _write(d, **files):
    d.mkdir(parents=True, exist_ok=True)
    defaults = {"train": "sentence\tlabel\ngood fun\t1\nbad\t0\n", "dev": "sentence\tlabel\ngreat\t1\ndull\t0\n"}
    for name, text in {**defaults, **files}.items():
        (d / f"{name}.tsv").write_bytes(text.encode() if isinstance(text, str) else text)
    return d


@pytest.mark.parametrize("split", ["train", "dev"])
def test_unlabelled_train_or_dev_is_refused(tmp_path, split):
    d = _write(tmp_path / "d", **{split: "sentence\ngood fun\nbad\n"})
    with pytest.raises(ValueError, match=rf"{split}\.tsv: .*no 'label' column"):
        dataset.load_sst2(d)


@pytest.mark.parametrize("split,text", [("train", "sentence\tlabel\n"), ("dev", "sentence\tlabel\n\n"),
                                        ("test", "index\tsentence\n")])
def test_split_without_examples_is_refused(tmp_path, split, text):
    d = _write(tmp_path / "d", **{split: text})
    with pytest.raises(ValueError, match=rf"{split}\.tsv: no examples"):
        dataset.load_sst2(d, splits=("train", "dev", "test") if split == "test" else ("train", "dev"))


def test_row_missing_its_label_names_the_line(tmp_path):
    d = _write(tmp_path / "d", train="sentence\tlabel\ngood\t1\nno label here\n")
    with pytest.raises(ValueError, match=r"train\.tsv:3: no label"):
        dataset.load_sst2(d)


def test_unlabelled_test_split_still_loads(tmp_path):
    d = _write(tmp_path / "d", test="index\tsentence\n0\tfun movie\n")
    data = dataset.load_sst2(d, splits=("train", "dev", "test"))
    assert data["test"].labels == [-1] and data["test"].tokens == [["fun", "movie"]]


def test_train_stops_before_training_on_unlabelled_dev(tmp_path):
    from tilewise.sst2 import config, loop

    d = _write(tmp_path / "d", train="sentence\tlabel\n" + "good fun\t1\nbad dull\t0\n" * 8,
               dev="sentence\ngood\nbad\n")
    cfg = config.TrainConfig(data_dir=str(d), epochs=1, batch_size=4, hidden=4, embedding_init="random",
                             backend="torch", device="cpu", output_dir=str(tmp_path / "run"), progress=False)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with pytest.raises(ValueError, match=r"dev\.tsv: .*no 'label' column"):
            loop.train(cfg)
    finally:
        torch.set_num_threads(n)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


# --------------------------------------------------------------------------- 8: long lines, bad bytes


def test_long_field_is_read(tmp_path):
    long = " ".join(["word"] * 40_000)  # 200k characters, over the csv module's 131,072 cap
    p = tmp_path / "train.tsv"
    p.write_text(f"sentence\tlabel\nshort\t0\n{long}\t1\n", encoding="utf-8")
    s = dataset.read_tsv(p)
    assert s.labels == [0, 1] and len(s.tokens[1]) == 40_000


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    d = _write(tmp_path / "d", train=b"sentence\tlabel\ngood\t1\ncaf\xe9 bad\t0\n")
    with pytest.raises(ValueError, match=r"train\.tsv:3: not UTF-8"):
        dataset.load_sst2(d)


def test_line_endings_and_bom_read_as_before(tmp_path):
    p = tmp_path / "x.tsv"
    p.write_bytes(b"\xef\xbb\xbfsentence\tlabel\r\ngood \xc3\xa9t\xc3\xa9\t1\r\n\r\nbad\t0\rdull\t0")
    s = dataset.read_tsv(p)
    assert s.tokens == [["good", "été"], ["bad"], ["dull"]] and s.labels == [1, 0, 0]
