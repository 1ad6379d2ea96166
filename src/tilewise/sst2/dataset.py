"""SST-2 (GLUE binary sentiment) from a directory of TSV files, a vocabulary, padded batches.

Where the files come from, in the order they are looked for:
    1. the directory passed as ``data_dir``;
    2. ``$TILEWISE_SST2_DIR``;
    3. ``./.data/sst2`` (how the files travel to the GPU machine: an ignored folder);
    4. the tilewise cache, ``$TILEWISE_CACHE_DIR/data/sst2`` (or ``~/.cache/tilewise/data/sst2``),
       where ``fetch_sst2()`` writes them through Hugging Face ``datasets`` (an optional extra).

A directory holds ``train.tsv`` and ``dev.tsv`` (and optionally ``test.tsv``), GLUE's format: a
header line, then ``sentence<TAB>label`` (label 0 or 1); GLUE's test split is
``index<TAB>sentence`` with no labels (they are read as -1). The text is already tokenized and
lower-cased, so tokens are ``sentence.split()``. ``load_sst2`` requires labels in train and dev
(they are trained and scored on) and at least one example in every split it loads. Files are
UTF-8; lines of any length are accepted.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from .. import settings
from ..settings import cache_dir  # the kernel cache's directory: one tilewise cache

ENV_DATA_DIR = settings.SST2_DIR
SPLITS = ("train", "dev", "test")
PAD, UNK = "<pad>", "<unk>"


class MissingDataError(FileNotFoundError):
    """No SST-2 files where they were looked for; the message says both ways to get them."""


def default_cache_dir() -> Path:
    return cache_dir() / "data" / "sst2"


def _has_split(d: Path, split: str = "train") -> bool:
    return (d / f"{split}.tsv").is_file()


def candidate_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    out: list[Path] = []
    if data_dir is not None:
        out.append(Path(data_dir))
    if settings.sst2_dir() is not None:
        out.append(settings.sst2_dir())
    out += [Path(".data") / "sst2", default_cache_dir()]
    return out


def find_data_dir(data_dir: str | os.PathLike | None = None, *, download: bool = False) -> Path:
    """The first directory holding ``train.tsv`` (see the module docstring for the order).

    An explicit ``data_dir`` without the files is an error even when others exist: the user asked
    for that one. ``download=True`` fetches into the cache when nothing is found.
    Raises ``MissingDataError`` naming both ways to get the data.
    """
    if data_dir is not None:
        d = Path(data_dir)
        if _has_split(d):
            return d
        if not download:
            raise MissingDataError(_missing_message([d]))
    else:
        for d in candidate_dirs(None):
            if _has_split(d):
                return d
    if download:
        return fetch_sst2(Path(data_dir) if data_dir is not None else default_cache_dir())
    raise MissingDataError(_missing_message(candidate_dirs(None)))


def _missing_message(looked: Sequence[Path]) -> str:
    where = ", ".join(str(p) for p in looked)
    return (f"SST-2 not found (looked for train.tsv in: {where}). Two ways to get it:\n"
            f"  1. a directory of GLUE SST-2 TSV files (train.tsv, dev.tsv; 'sentence<TAB>label' with a "
            f"header line): pass it as --data-dir DIR (or data_dir=...), or set ${ENV_DATA_DIR};\n"
            f"  2. with internet: pip install datasets, then `tilewise train --download` "
            f"(or tilewise.sst2.dataset.fetch_sst2()), which saves the files once into {default_cache_dir()}.")


def fetch_sst2(dest: str | os.PathLike | None = None) -> Path:
    """Download GLUE SST-2 once through Hugging Face ``datasets`` and write train/dev/test TSVs.

    Needs the optional ``datasets`` package and internet access. Returns the directory.
    """
    dest = Path(dest) if dest is not None else default_cache_dir()
    try:
        import datasets  # optional extra: imported only here
    except ImportError:
        raise MissingDataError("fetching SST-2 needs the optional package 'datasets' "
                               "(pip install datasets), or pass a directory of GLUE SST-2 TSV files "
                               "with --data-dir") from None
    ds, errors = None, []
    for name in _HUB_NAMES:  # the GLUE repository's current id first, then its old alias
        try:
            ds = datasets.load_dataset(name, "sst2")
            break
        except Exception as e:  # no network, hub down, a renamed repository: say how else to get it
            errors.append(f"{name}: {type(e).__name__}: {str(e)[:160]}")
    if ds is None:
        raise MissingDataError("could not fetch SST-2 through Hugging Face datasets ("
                               + "; ".join(errors) + "). Without internet, pass a directory of GLUE "
                               "SST-2 TSV files (train.tsv, dev.tsv) with --data-dir or TILEWISE_SST2_DIR")
    dest.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        if split not in ds:
            continue
        tmp = dest / f".{name}.tsv.tmp"
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            if name == "test":
                f.write("index\tsentence\n")
                for i, row in enumerate(ds[split]):
                    f.write(f"{row.get('idx', i)}\t{_clean(row['sentence'])}\n")
            else:
                f.write("sentence\tlabel\n")
                for row in ds[split]:
                    f.write(f"{_clean(row['sentence'])}\t{int(row['label'])}\n")
        os.replace(tmp, dest / f"{name}.tsv")
    return dest


_HUB_NAMES = ("nyu-mll/glue", "glue")


def _clean(s: str) -> str:
    return " ".join(s.split())  # a tab or newline inside a sentence would break the TSV


@dataclass
class Split:
    """One split: ``tokens[i]`` (list of str) with ``labels[i]`` (0/1, or -1 when unlabelled)."""

    name: str
    tokens: list[list[str]]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.labels)


def _lines(path: Path, f) -> Iterator[tuple[int, str]]:
    """(line number, text) of the binary file ``f``; \\n, \\r\\n and a lone \\r end a line (as in the
    csv module). Each line is decoded alone so that a decoding error can name its line."""
    lineno = 0
    for raw in f:
        for piece in raw.splitlines():
            lineno += 1
            try:
                yield lineno, piece.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start} of the line); "
                                 f"save the file as UTF-8") from None


def read_tsv(path: str | os.PathLike, name: str | None = None, *, require_labels: bool = False) -> Split:
    """Read one GLUE SST-2 TSV file. Raises ``ValueError`` naming the file and line on bad rows, and
    naming the file when ``require_labels`` and the header has no ``label`` column."""
    path = Path(path)
    name = name or path.stem
    tokens: list[list[str]] = []
    labels: list[int] = []
    # Split on tabs by hand (no quoting, like csv.QUOTE_NONE): the csv module caps a field at 131,072
    # characters and its errors name neither file nor line.
    with open(path, "rb") as f:
        lines = _lines(path, f)
        first = next(lines, None)
        if first is None:
            raise ValueError(f"{path}: empty file (expected a header 'sentence<TAB>label')")
        header = first[1].split("\t")
        cols = [h.strip().lower() for h in header]
        if "sentence" not in cols:
            raise ValueError(f"{path}: header {header!r} has no 'sentence' column")
        si = cols.index("sentence")
        li = cols.index("label") if "label" in cols else None
        if li is None and require_labels:
            raise ValueError(f"{path}: header {header!r} has no 'label' column; the {name} split needs labels "
                             f"(only GLUE's test split comes without them)")
        for lineno, line in lines:
            row = line.split("\t")
            if len(row) == 1 and not row[0].strip():
                continue
            if li is not None and len(row) <= li:
                raise ValueError(f"{path}:{lineno}: no label (expected {len(cols)} tab-separated fields, "
                                 f"got {len(row)})")
            if len(row) <= si:
                raise ValueError(f"{path}:{lineno}: expected {len(cols)} tab-separated fields, got {len(row)}")
            if li is None:
                lab = -1
            else:
                try:
                    lab = int(row[li])
                except ValueError:
                    raise ValueError(f"{path}:{lineno}: label {row[li]!r} is not an integer") from None
                if lab not in (0, 1):
                    raise ValueError(f"{path}:{lineno}: label {lab} is not 0 or 1")
            tokens.append(row[si].split())
            labels.append(lab)
    return Split(name, tokens, labels)


def load_sst2(data_dir: str | os.PathLike | None = None, *, splits: Sequence[str] = ("train", "dev"),
              download: bool = False) -> dict[str, Split]:
    """The named splits from the first directory that has them (see ``find_data_dir``). Raises
    ``ValueError`` naming the file for a train or dev split without labels, or any split without examples."""
    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"load_sst2: unknown split {s!r}; choose from {SPLITS}")
    d = find_data_dir(data_dir, download=download)
    out = {}
    for s in splits:
        p = d / f"{s}.tsv"
        if not p.is_file():
            raise MissingDataError(f"{p} is missing ({d} has train.tsv but not {s}.tsv)")
        # GLUE's test split has no labels (read as -1; evaluate refuses it); train and dev need them.
        out[s] = read_tsv(p, s, require_labels=s != "test")
        if not len(out[s]):
            raise ValueError(f"{p}: no examples after the header line; the {s} split needs at least one")
    return out


class Vocab:
    """Token <-> id. Id 0 is ``<pad>``, id 1 is ``<unk>``; then tokens by count (desc), then text."""

    def __init__(self, itos: Sequence[str]):
        if len(itos) < 2 or itos[0] != PAD or itos[1] != UNK:
            raise ValueError(f"Vocab: the first two tokens must be {PAD!r} and {UNK!r}")
        self.itos = list(itos)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("Vocab: duplicate tokens")

    pad_id = 0
    unk_id = 1

    @classmethod
    def build(cls, sentences: Sequence[Sequence[str]], min_count: int = 1,
              max_size: int | None = None) -> "Vocab":
        """From the training sentences: tokens seen at least ``min_count`` times (at most
        ``max_size`` of them, the most frequent), ties broken by the token's text so the ids do not
        depend on the order of the data."""
        if min_count < 1:
            raise ValueError(f"Vocab.build: min_count must be >= 1, got {min_count}")
        counts = Counter(t for s in sentences for t in s)
        counts.pop(PAD, None)
        counts.pop(UNK, None)
        kept = sorted((t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[:max_size]
        return cls([PAD, UNK] + kept)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Ids of ``tokens``; an empty sentence becomes ``[<unk>]`` so that every length is >= 1
        (the mean over tokens would divide by zero otherwise)."""
        get = self.stoi.get
        ids = [get(t, 1) for t in tokens]
        return ids or [1]

    def coverage(self, sentences: Sequence[Sequence[str]]) -> float:
        """Share of tokens in ``sentences`` that are in the vocabulary."""
        total = sum(len(s) for s in sentences)
        known = sum(1 for s in sentences for t in s if t in self.stoi)
        return known / total if total else 1.0

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text("\n".join(self.itos) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocab":
        return cls(Path(path).read_text(encoding="utf-8").split("\n")[:-1])


@dataclass
class Batch:
    """``ids`` (B, T) int64 padded with 0 (``<pad>``), ``lengths`` (B,) int64 >= 1, ``labels`` (B,) int64."""

    ids: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor

    def to(self, device, non_blocking: bool = False) -> "Batch":
        return Batch(self.ids.to(device, non_blocking=non_blocking),
                     self.lengths.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking))


class EncodedSplit:
    """A split turned into ids, packed once into one padded tensor so that a batch is an index
    select (a Python loop per batch would cost more than a whole training step on the GPU)."""

    def __init__(self, split: Split, vocab: Vocab, max_len: int | None = None):
        if max_len is not None and max_len < 1:
            raise ValueError(f"EncodedSplit: max_len must be >= 1, got {max_len}")
        seqs = [vocab.encode(s)[:max_len] if max_len else vocab.encode(s) for s in split.tokens]
        self._set(split.name, torch.tensor([i for s in seqs for i in s], dtype=torch.int64),
                  torch.tensor([len(s) for s in seqs], dtype=torch.int64),
                  torch.tensor(split.labels, dtype=torch.int64))

    def _set(self, name: str, flat: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor) -> None:
        self.name = name
        self.lengths = lengths
        L = int(lengths.max()) if lengths.numel() else 1
        # One flat tensor scattered under a length mask: building (n, L) from nested lists took 0.5 s of
        # a run's start-up for SST-2's training split.
        self.padded = torch.full((lengths.numel(), L), Vocab.pad_id, dtype=torch.int64)
        self.padded[torch.arange(L) < lengths[:, None]] = flat
        self.labels = labels
        self._on = {}  # device -> (padded, lengths, labels) copies

    @classmethod
    def from_ids(cls, name: str, flat: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor,
                 vocab_size: int) -> "EncodedSplit":
        """A split from its sentences' ids end to end (``flat``), their ``lengths`` and 0 / 1 ``labels``
        (as ``ids()`` gives them; ``datacache`` stores them). ValueError on anything inconsistent: ids
        outside the vocabulary, a length under 1, lengths that do not sum to the ids, other labels."""
        flat, lengths, labels = (torch.as_tensor(t).to(torch.int64) for t in (flat, lengths, labels))
        if flat.dim() != 1 or lengths.dim() != 1 or labels.shape != lengths.shape:
            raise ValueError(f"EncodedSplit.from_ids: need 1-D ids, lengths and labels of one length; got "
                             f"{tuple(flat.shape)}, {tuple(lengths.shape)}, {tuple(labels.shape)}")
        if lengths.numel() and (int(lengths.min()) < 1 or int(lengths.sum()) != flat.numel()):
            raise ValueError("EncodedSplit.from_ids: every length must be >= 1 and the lengths must sum to the ids")
        if flat.numel() and not (0 <= int(flat.min()) and int(flat.max()) < vocab_size):
            raise ValueError(f"EncodedSplit.from_ids: ids outside the vocabulary of {vocab_size}")
        if labels.numel() and not bool(((labels == 0) | (labels == 1)).all()):
            raise ValueError("EncodedSplit.from_ids: labels must be 0 or 1")
        new = cls.__new__(cls)
        new._set(name, flat, lengths, labels)
        return new

    def ids(self) -> torch.Tensor:
        """Every sentence's ids end to end, in order (what ``from_ids`` takes back)."""
        return self.padded[torch.arange(self.padded.shape[1]) < self.lengths[:, None]]

    def __len__(self) -> int:
        return int(self.labels.numel())

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        return len(self) // batch_size if drop_last else -(-len(self) // batch_size)

    def batches(self, batch_size: int, *, shuffle: bool = False, generator: torch.Generator | None = None,
                drop_last: bool = False, buckets: Sequence[int] | None = None,
                device: str | torch.device | None = None, shard: tuple[int, int] = (0, 1),
                word_dropout: float = 0.0, dropout_generator: torch.Generator | None = None) -> Iterator[Batch]:
        """Batches in order (or shuffled by ``generator``, a CPU generator), each padded to its
        longest sentence, or, with ``buckets`` (lengths, e.g. (16, 32, 64)), to the smallest
        bucket that fits, so that only a few shapes occur (what a captured CUDA graph needs); a
        sentence longer than the largest bucket is cut to it. ``device``: where the batches are
        made (the split is copied there once). ``shard`` (rank, world): only every world-th batch
        of that order, from the rank-th (data-parallel processes share one shuffled order).
        ``word_dropout``: each batch through ``drop_words`` with that probability, drawn from
        ``dropout_generator`` (a generator on ``device``; training augmentation)."""
        if batch_size < 1:
            raise ValueError(f"batches: batch_size must be >= 1, got {batch_size}")
        rank, world = shard
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"batches: shard must be (rank, world) with 0 <= rank < world, got {shard}")
        if buckets is not None:
            buckets = sorted(int(b) for b in buckets)
            if not buckets or buckets[0] < 1:
                raise ValueError(f"batches: buckets must be positive lengths, got {buckets}")
        dev = torch.device(device) if device is not None else torch.device("cpu")
        key = str(dev)
        if key not in self._on:
            self._on[key] = (self.padded.to(dev), self.lengths.to(dev), self.labels.to(dev))
        padded, lengths, labels = self._on[key]
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(rank * batch_size, n, world * batch_size):
            idx = order[start:start + batch_size]
            if drop_last and idx.numel() < batch_size:
                return
            longest = int(self.lengths[idx].max()) if idx.numel() else 1
            T = next((b for b in buckets if b >= longest), buckets[-1]) if buckets is not None else longest
            di = idx.to(dev, non_blocking=True)
            ids = padded.index_select(0, di)
            if T <= ids.shape[1]:
                ids = ids[:, :T]
            else:
                ids = torch.nn.functional.pad(ids, (0, T - ids.shape[1]))
            lens = lengths.index_select(0, di).clamp(max=T)
            if word_dropout > 0.0:
                ids, lens = drop_words(ids, lens, word_dropout, generator=dropout_generator)
            yield Batch(ids.contiguous(), lens, labels.index_select(0, di))


def drop_words(ids: torch.Tensor, lengths: torch.Tensor, p: float, *, generator: torch.Generator | None = None,
               pad_id: int = Vocab.pad_id) -> tuple[torch.Tensor, torch.Tensor]:
    """Word dropout (Iyyer et al.'s deep averaging networks): each of a sentence's tokens is left out
    of it with probability ``p``, at least one is kept (the first, when the draw keeps none); the
    kept ones move to the front in their order and the rest is padding. ids (B, T) int64, lengths
    (B,) int64 in [1, T] -> new (ids, lengths), same shapes; runs where the tensors are, no sync."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"drop_words: p must be in [0, 1), got {p}")
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device)
    valid = pos[None, :] < lengths[:, None]
    keep = (torch.rand((B, T), device=ids.device, generator=generator) >= p) & valid
    keep[:, 0] |= ~keep.any(1)
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices  # kept first, in order
    new_len = keep.sum(1)
    out = torch.gather(ids, 1, order).masked_fill(pos[None, :] >= new_len[:, None], pad_id)
    return out, new_len
