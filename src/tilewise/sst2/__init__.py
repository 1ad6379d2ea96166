"""The SST-2 sentiment classifier trained end to end on tilewise kernels (``tilewise train``,
``predict``, ``evaluate``).

    config      TrainConfig, its checks, the device and backend a run resolves to
    dataset     SST-2 TSV files, the vocabulary, padded (bucketed) batches, word dropout
    datacache   the vocabulary and encoded splits kept on disk between runs (start-up)
    glove       GloVe 6B 50-d vectors for a vocabulary (the optional ``glove`` extra)
    loop        train(): the epoch and step loop, the lr schedule, the weight average, evaluation
    graph_step  one training step captured in a CUDA graph per batch shape
    ddp         data-parallel runs under torchrun
    checkpoint  the output directory's lock, checkpoints written atomically and loaded safely
    commands    the CLI's options and entry points; predict / evaluate a checkpoint
    step_bench  a training step apart from a run, for the train_step bench suite
    prewarm     the kernels compiled in child processes while ``tilewise train`` starts up
"""

import importlib

# Names are imported on first use: the CLI reads its options and starts the kernels' background
# compile (prewarm.py) before torch's import, which the modules behind these names need.
_LAZY = {"CheckpointError": "checkpoint", "OutputDirError": "checkpoint", "load_checkpoint": "checkpoint",
         "evaluate_checkpoint": "commands", "predict": "commands", "TrainConfig": "config",
         "evaluate": "loop", "train": "loop"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
