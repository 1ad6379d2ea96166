"""Datasets for the classifier: SST-2 (``sst2``) and optional GloVe word vectors (``glove``)."""

from .sst2 import Batch, EncodedSplit, MissingDataError, Split, Vocab, fetch_sst2, find_data_dir, load_sst2, read_tsv

__all__ = ["Batch", "EncodedSplit", "MissingDataError", "Split", "Vocab", "fetch_sst2", "find_data_dir",
           "load_sst2", "read_tsv"]
