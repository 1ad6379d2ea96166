"""The SST-2 sentiment classifier trained end to end on tilewise kernels (``tilewise train``,
``predict``, ``evaluate``).

    config      TrainConfig, its checks, the device and backend a run resolves to
    dataset     SST-2 TSV files, the vocabulary, padded (bucketed) batches, word dropout
    glove       GloVe 6B 50-d vectors for a vocabulary (the optional ``glove`` extra)
    loop        train(): the epoch and step loop, the lr schedule, the weight average, evaluation
    graph_step  one training step captured in a CUDA graph per batch shape
    ddp         data-parallel runs under torchrun
    checkpoint  the output directory's lock, checkpoints written atomically and loaded safely
    commands    the CLI's options and entry points; predict / evaluate a checkpoint
    step_bench  a training step apart from a run, for the train_step bench suite
"""

from .checkpoint import CheckpointError, OutputDirError, load_checkpoint
from .commands import evaluate_checkpoint, predict
from .config import TrainConfig
from .loop import evaluate, train

__all__ = ["CheckpointError", "OutputDirError", "TrainConfig", "evaluate", "evaluate_checkpoint",
           "load_checkpoint", "predict", "train"]
