"""What a training run is asked to do (``TrainConfig``), its checks, and the device and backend it
resolves to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where used: the CLI reads a TrainConfig before torch's import
    import torch


@dataclass
class TrainConfig:
    data_dir: str | None = None        # directory of train.tsv/dev.tsv (see tilewise.sst2.dataset)
    download: bool = False             # fetch through Hugging Face datasets when not found
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    embedding_lr: float | None = None  # learning rate of the embedding table (None: lr)
    weight_decay: float = 0.01
    # tilewise: sst2/adamw.py, torch.optim.AdamW's update without importing torch._dynamo (~4.5 s less
    # start-up on the H200 machine; docs/design.md, "Start-up"); torch: torch.optim.AdamW
    optimizer: str = "tilewise"
    hidden: int = 256
    embed_dim: int = 50
    embedding_init: str = "glove"      # glove | random
    glove_cache: str | None = None     # .npz extract (tilewise.sst2.glove); default: looked up
    dropout: float = 0.3               # on the pooled (B, H) features
    embed_dropout: float = 0.0         # on the embedded (B, T, E) vectors (0: none, no kernel)
    word_dropout: float = 0.0          # leave each training token out with this probability (dataset.drop_words)
    ema: float = 0.0                   # evaluate and save an exponential moving average of the weights
    #                                    with this decay per step (0: off; e.g. 0.999)
    lr_schedule: str = "constant"      # constant | cosine | linear: per step, from lr to 0 at the last step
    freeze_embeddings_epochs: int = 0  # the embedding's lr is 0 for this many first epochs
    min_count: int = 1
    max_len: int = 64                  # sentences are cut to this many tokens
    # pad batches to these lengths; None: to the longest, except with --graph or the tilewise
    # backend, which use (16, 32, 64, max_len) (fixed shapes for graphs; few autotunes for Triton)
    buckets: tuple[int, ...] | None = None
    backend: str = "auto"              # tilewise | torch | auto (tilewise on a GPU, torch on CPU)
    device: str = "auto"               # cuda | cpu | cuda:N | auto
    graph: bool | None = False         # CUDA-graph the whole step (needs a GPU); None: on a GPU, off on
    #                                    the CPU and under torchrun (the CLI's default)
    seed: int = 0
    output_dir: str = "runs/sst2"
    resume: bool = False               # continue from OUTPUT_DIR/checkpoint.pt
    log_every: int = 50
    progress: bool = True
    max_steps: int | None = None       # stop each epoch after this many steps (tests, smoke runs)
    plot: bool = True                  # write loss_curve.png (matplotlib: ~0.5 s; sweeps turn it off)
    prewarm: bool = True               # compile the kernels in child processes while the data loads (prewarm.py)


LR_SCHEDULES = ("constant", "cosine", "linear")
OPTIMIZERS = ("torch", "tilewise")
EVAL_BATCH_SIZE = 256
# SST-2's training vocabulary at min_count 1: the embedding's rows wherever a run is stood in for
# without the data (benches, warm-ups).
SST2_VOCAB = 14819
# The classifier's step split where its kernels are disjoint: `tilewise warmup`'s train.<part> tasks,
# which `tilewise train` also runs in the background (prewarm.py).
CLASSIFIER_PARTS = ("embedding", "fc1", "pool", "out", "loss")
# Parts split further, one task a bucket length: the first layer's GEMM autotunes per shape. The others'
# kernels do not depend on the length (the head's three ops compiled the same kernels at lengths 16 and
# 64 on the H200), so the head splits by op instead: its Triton compiles then run side by side.
PER_BUCKET_PARTS = ("fc1",)


def default_buckets(max_len: int) -> tuple[int, ...]:
    """The lengths batches are padded to when ``--buckets`` is not given but fixed shapes are wanted
    (``--graph``, or the tilewise backend): 16, 32, 64 below ``max_len``, then ``max_len``."""
    return tuple(b for b in (16, 32, 64) if b < max_len) + (max_len,)


def check_options(cfg: TrainConfig) -> None:
    """ValueError naming the option when a number of ``cfg`` is out of its range."""
    if cfg.epochs < 0 or cfg.batch_size < 1 or cfg.lr <= 0 or cfg.hidden < 1:
        raise ValueError(f"train: need epochs >= 0, batch_size >= 1, lr > 0, hidden >= 1; got epochs={cfg.epochs}, "
                         f"batch_size={cfg.batch_size}, lr={cfg.lr}, hidden={cfg.hidden}")
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"--lr-schedule must be one of {LR_SCHEDULES}, got {cfg.lr_schedule!r}")
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, got {cfg.optimizer!r}")
    if cfg.freeze_embeddings_epochs < 0:
        raise ValueError(f"--freeze-embeddings-epochs must be >= 0, got {cfg.freeze_embeddings_epochs}")
    if not 0.0 <= cfg.embed_dropout < 1.0:
        raise ValueError(f"--embed-dropout must be in [0, 1), got {cfg.embed_dropout}")
    if not 0.0 <= cfg.word_dropout < 1.0:
        raise ValueError(f"--word-dropout must be in [0, 1), got {cfg.word_dropout}")
    if not 0.0 <= cfg.ema < 1.0:
        raise ValueError(f"--ema must be in [0, 1), got {cfg.ema}")


def resolve_device_backend(cfg: TrainConfig) -> tuple[torch.device, str, list[str]]:
    """The device and backend to use, and notes to print. Raises ValueError on impossible asks."""
    import torch

    notes = []
    has_cuda = torch.cuda.is_available()
    if cfg.device == "auto":
        device = torch.device("cuda" if has_cuda else "cpu")
    else:
        device = torch.device(cfg.device)
        if device.type == "cuda" and not has_cuda:
            raise ValueError(f"--device {cfg.device}: no CUDA GPU is visible to PyTorch; use --device cpu")
    backend = cfg.backend
    if backend == "auto":
        backend = "tilewise" if device.type == "cuda" else "torch"
        if device.type != "cuda":
            notes.append("no GPU: training with --backend torch on the CPU")
    elif backend == "tilewise" and device.type != "cuda":
        raise ValueError("--backend tilewise needs a CUDA GPU (its kernels run only there); "
                         "use --backend torch to train on the CPU")
    elif backend not in ("torch", "tilewise"):
        raise ValueError(f"--backend must be tilewise, torch or auto, got {cfg.backend!r}")
    if cfg.graph and device.type != "cuda":
        raise ValueError("--graph captures CUDA graphs and needs a CUDA device")
    return device, backend, notes


def classifier_tasks() -> tuple[tuple[str, str, int | None], ...]:
    """(task name, part, bucket length or None for all) of the classifier's warm-up tasks at the
    default run's shapes: ``train.<part>`` for the parts at every length, ``train.<part>.<T>`` for each
    bucket T of ``PER_BUCKET_PARTS``."""
    buckets = default_buckets(TrainConfig().max_len)
    return tuple((f"train.{p}.{T}", p, T) if p in PER_BUCKET_PARTS else (f"train.{p}", p, None)
                 for p in CLASSIFIER_PARTS for T in (buckets if p in PER_BUCKET_PARTS else (None,)))
