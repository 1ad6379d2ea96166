"""The SST-2 sentiment classifier: a bag of token features, averaged.

    ids (B, T) --embedding--> (B, T, E) --linear + ReLU per token--> (B, T, H)
        --mean over the first lengths[b] tokens--> (B, H) --dropout--> --linear--> (B, C) logits
        --softmax cross-entropy--> loss

``backend="torch"`` runs plain PyTorch layers; ``backend="tilewise"`` runs the same math through
``tilewise.nn.functional`` (tilewise kernels where they exist, PyTorch otherwise: see its
``report()``). Both hold the same parameters (an ``nn.Embedding`` and two ``nn.Linear``), so
their state dicts are interchangeable and one seed gives both the same initial weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as twf

BACKENDS = ("torch", "tilewise")


class SentimentClassifier(nn.Module):
    """vocab_size: rows of the embedding table (id 0 = <pad>, which gets no gradient);
    embed_dim E (50 for GloVe 6B 50-d); hidden H; num_classes C; dropout on the pooled (B, H);
    backend "torch" or "tilewise"; embedding_init: optional (vocab_size, E) tensor to copy in;
    embed_dropout: dropout on the embedded (B, T, E) vectors (default 0: off, nothing launched)."""

    def __init__(self, vocab_size: int, embed_dim: int = 50, hidden: int = 256, num_classes: int = 2,
                 dropout: float = 0.3, backend: str = "torch", padding_idx: int = 0,
                 embedding_init: torch.Tensor | None = None, embed_dropout: float = 0.0):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"SentimentClassifier: backend must be one of {BACKENDS}, got {backend!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"SentimentClassifier: dropout must be in [0, 1), got {dropout}")
        if not 0.0 <= embed_dropout < 1.0:
            raise ValueError(f"SentimentClassifier: embed_dropout must be in [0, 1), got {embed_dropout}")
        for n, v in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("hidden", hidden),
                     ("num_classes", num_classes)):
            if v < 1:
                raise ValueError(f"SentimentClassifier: {n} must be >= 1, got {v}")
        self.backend = backend
        self.padding_idx = padding_idx
        self.dropout_p = float(dropout)
        self.embed_dropout_p = float(embed_dropout)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        if embedding_init is not None:
            if tuple(embedding_init.shape) != (vocab_size, embed_dim):
                raise ValueError(f"SentimentClassifier: embedding_init has shape {tuple(embedding_init.shape)}, "
                                 f"expected ({vocab_size}, {embed_dim})")
            with torch.no_grad():
                self.embedding.weight.copy_(embedding_init)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ids (B, T) int64, lengths (B,) int64 in [1, T] -> logits (B, C)."""
        if ids.dim() != 2:
            raise ValueError(f"SentimentClassifier: ids must be (B, T), got shape {tuple(ids.shape)}")
        if lengths.shape != ids.shape[:1]:
            raise ValueError(f"SentimentClassifier: lengths must be ({ids.shape[0]},), got {tuple(lengths.shape)}")
        if self.backend == "torch":
            x = F.embedding(ids, self.embedding.weight, padding_idx=self.padding_idx)
            if self.embed_dropout_p:
                x = F.dropout(x, self.embed_dropout_p, self.training)
            h = F.relu(self.fc1(x))
            pooled = twf.masked_mean_reference(h, lengths)
            pooled = F.dropout(pooled, self.dropout_p, self.training)
            return self.fc2(pooled)
        x = twf.embedding(ids, self.embedding.weight, padding_idx=self.padding_idx)
        if self.embed_dropout_p:
            x = F.dropout(x, self.embed_dropout_p, self.training)  # same RNG stream as the torch backend
        h = twf.linear(x, self.fc1.weight, self.fc1.bias, activation="relu")
        pooled = twf.masked_mean(h, lengths)
        pooled = F.dropout(pooled, self.dropout_p, self.training)  # no tilewise dropout yet
        return twf.linear(pooled, self.fc2.weight, self.fc2.bias)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean softmax cross-entropy over the batch."""
        if self.backend == "torch":
            return F.cross_entropy(logits, labels)
        return twf.cross_entropy(logits, labels)
