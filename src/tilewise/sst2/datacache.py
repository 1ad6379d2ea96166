"""SST-2 as ``train`` uses it (the vocabulary, both splits encoded, the dev split's token coverage),
kept on disk between runs.

Reading the TSV files, building the vocabulary and encoding both splits took ~0.55 s of every run's
start-up on the CPU host (0.13 s reading, 0.09 s the vocabulary, 0.34 s encoding); loading the stored
result takes ~0.02 s. A file is named by a digest of the TSVs' bytes, ``min_count``, ``max_len`` and
``FORMAT``, so an edited file or another option is a different entry. It is written atomically and
read back with numpy's ``allow_pickle=False``, then checked (``Vocab``'s and
``EncodedSplit.from_ids``'s rules); a missing, corrupt or foreign file, or a cache folder that cannot
be written, only means the TSVs are read as before.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import torch

from .._files import write_atomic
from ..settings import cache_dir
from . import dataset

FORMAT = 1  # bump when what is stored, or how the TSVs are tokenized and encoded, changes


def path_for(data_dir: Path, min_count: int, max_len: int | None) -> Path:
    """The cache entry for SST-2's train and dev files in ``data_dir`` under these options."""
    h = hashlib.sha256(f"sst2-encoded format={FORMAT} min_count={min_count} max_len={max_len}".encode())
    for split in ("train", "dev"):
        h.update(hashlib.sha256((Path(data_dir) / f"{split}.tsv").read_bytes()).digest())
    return cache_dir() / "data" / "sst2-encoded" / f"{h.hexdigest()[:32]}.npz"


def save(path: Path, vocab: dataset.Vocab, train: dataset.EncodedSplit, dev: dataset.EncodedSplit,
         coverage: float) -> bool:
    """Store one entry; False (nothing written) where the cache folder cannot be written."""
    # The tokens as UTF-8 joined by newlines (whitespace splits the sentences, so no token holds one):
    # a fixed-width unicode array would take 4 bytes a character of the longest token for every token.
    itos = np.frombuffer("\n".join(vocab.itos).encode("utf-8"), dtype=np.uint8)
    arrays = {"itos_utf8": itos, "coverage": np.float64(coverage)}
    for name, split in (("train", train), ("dev", dev)):
        arrays[f"{name}_ids"] = split.ids().numpy().astype(np.uint16 if len(vocab) <= 1 << 16 else np.int32)
        arrays[f"{name}_lengths"] = split.lengths.numpy().astype(np.int32)
        arrays[f"{name}_labels"] = split.labels.numpy().astype(np.int8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    try:
        write_atomic(path, buf.getbuffer())
    except OSError:
        return False
    return True


def load(path: Path) -> tuple[dataset.Vocab, dataset.EncodedSplit, dataset.EncodedSplit, float] | None:
    """(vocabulary, train, dev, dev coverage) of an entry, or None where there is none or it does not
    hold what ``save`` writes."""
    try:
        with np.load(path, allow_pickle=False) as z:
            a = {k: z[k] for k in z.files}
        vocab = dataset.Vocab(a["itos_utf8"].astype(np.uint8, copy=False).tobytes().decode("utf-8").split("\n"))
        splits = [dataset.EncodedSplit.from_ids(name, torch.from_numpy(a[f"{name}_ids"]),
                                                torch.from_numpy(a[f"{name}_lengths"]),
                                                torch.from_numpy(a[f"{name}_labels"]), len(vocab))
                  for name in ("train", "dev")]
        coverage = float(a["coverage"])
    except (OSError, KeyError, ValueError, TypeError, UnicodeDecodeError, zipfile.BadZipFile):
        return None
    if not 0.0 <= coverage <= 1.0 or not all(len(s) for s in splits):
        return None
    return vocab, splits[0], splits[1], coverage
