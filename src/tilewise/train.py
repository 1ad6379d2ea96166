"""``tilewise train``: the SST-2 classifier, trained end to end.

    train(TrainConfig(...)) -> metrics dict      (also written to OUTPUT_DIR/metrics.json)
    add_arguments(parser); main(args) -> exit code   (the CLI hooks these up)

Per epoch: one pass over the shuffled training split (AdamW), accuracy on the dev split, a
checkpoint (model, optimizer, RNG states, vocabulary) that ``--resume`` continues from exactly.
Every output file is written whole or not at all (a temporary file renamed into place), a run
holds a lock on its output directory, and checkpoints load with ``weights_only`` (tensors and
plain data: a file that would need other objects, which could run code, is refused).
Throughput is examples per second of the training pass only, timed with the device synchronized
at both ends. The loss is kept on the device during an epoch (reading it every step would stall
the GPU) and shown on the progress bar every ``log_every`` steps.

``--graph`` captures one whole step (forward, backward, AdamW) per bucket length in a CUDA graph
and replays it from static input buffers; batches are padded to the smallest bucket that fits, a
short last batch runs eagerly. It needs a CUDA device; ``tilewise train`` turns it on by default
there (``--no-graph`` runs eagerly; it is off on the CPU and under torchrun). The tilewise backend
pads to the same buckets by default: its Triton GEMMs autotune once per shape. A failure other than
a bad option or missing data prints its traceback on stderr and stdout (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import pickle
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from ._files import write_atomic
from .data import sst2
from .nn import functional as twf
from .nn.classifier import SentimentClassifier


@dataclass
class TrainConfig:
    data_dir: str | None = None        # directory of train.tsv/dev.tsv (see tilewise.data.sst2)
    download: bool = False             # fetch through Hugging Face datasets when not found
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    embedding_lr: float | None = None  # learning rate of the embedding table (None: lr)
    weight_decay: float = 0.01
    hidden: int = 256
    embed_dim: int = 50
    embedding_init: str = "glove"      # glove | random
    glove_cache: str | None = None     # .npz extract (tilewise.data.glove); default: looked up
    dropout: float = 0.3               # on the pooled (B, H) features
    embed_dropout: float = 0.0         # on the embedded (B, T, E) vectors (0: none, no kernel)
    word_dropout: float = 0.0          # leave each training token out with this probability (sst2.drop_words)
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


LR_SCHEDULES = ("constant", "cosine", "linear")


class CheckpointError(ValueError):
    """A file that is not a tilewise checkpoint, or one that would need more than tensors and plain
    data to load (unpickling anything else can run code)."""


class OutputDirError(RuntimeError):
    """The output directory cannot be created or written, or another run holds it."""


def lr_factor(schedule: str, step: int, total_steps: int) -> float:
    """The multiplier of the base learning rate at optimizer step ``step`` (0-based) of
    ``total_steps``: constant 1; cosine 0.5 (1 + cos(pi step / total)); linear 1 - step / total.
    Both decays start at 1 and reach 0 only after the last step (step = total_steps)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    if schedule == "constant" or total_steps <= 0:
        return 1.0
    t = min(max(step, 0), total_steps) / total_steps
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * t))
    return 1.0 - t


def group_lrs(cfg: "TrainConfig", epoch: int, step: int, total_steps: int) -> tuple[float, float]:
    """(embedding lr, lr of the other parameters) for ``step`` (0-based, over the whole run) of
    ``epoch`` (0-based): the base rates times ``lr_factor``; the embedding's is 0 while
    ``epoch < freeze_embeddings_epochs`` (AdamW with lr 0 neither moves nor decays the table; its
    moments still follow the gradients)."""
    f = lr_factor(cfg.lr_schedule, step, total_steps)
    emb = cfg.lr if cfg.embedding_lr is None else cfg.embedding_lr
    if epoch < cfg.freeze_embeddings_epochs:
        emb = 0.0
    return emb * f, cfg.lr * f


def _set_lrs(opt, lrs: Sequence[float]) -> None:
    # A tensor lr (graph mode) is updated in place: captured graphs read it from its address.
    for grp, lr in zip(opt.param_groups, lrs):
        if torch.is_tensor(grp["lr"]):
            grp["lr"].fill_(lr)
        else:
            grp["lr"] = lr


# --------------------------------------------------------------------------- set-up


def resolve_device_backend(cfg: TrainConfig) -> tuple[torch.device, str, list[str]]:
    """The device and backend to use, and notes to print. Raises ValueError on impossible asks."""
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


def _embedding_init(cfg: TrainConfig, vocab: sst2.Vocab, notes: list[str]) -> torch.Tensor | None:
    if cfg.embedding_init == "random":
        return None
    if cfg.embedding_init != "glove":
        raise ValueError(f"--embedding-init must be glove or random, got {cfg.embedding_init!r}")
    from .data import glove

    if cfg.embed_dim != glove.DIM:
        raise ValueError(f"--embedding-init glove gives {glove.DIM}-d vectors; --embed-dim is {cfg.embed_dim}")
    cache = cfg.glove_cache
    if cache is None:
        local = Path(".data") / "glove50_sst2.npz"  # the extract that travels with the repo's ignored .data/
        try:
            if local.is_file() and glove.subset(glove.load(local), vocab.itos) is not None:
                cache = str(local)
        except ValueError as e:  # not an extract this version reads (e.g. one stored with pickle): skip it
            notes.append(f"GloVe: {local} not used ({e})")
    g = glove.glove_vectors(vocab.itos, cache)
    notes.append(f"GloVe 6B 50-d: {g.found.sum()} of {len(vocab) - 2} vocabulary words found "
                 f"({100 * g.coverage:.1f}% coverage)")
    return torch.from_numpy(glove.init_matrix(g, seed=cfg.seed))


def _console(cfg):
    from rich.console import Console

    return Console(highlight=False, quiet=not cfg.progress)


# --------------------------------------------------------------------------- steps


class _GraphedStep:
    """One captured training step per bucket length: static ids/lengths/labels in, loss out."""

    def __init__(self, model, opt, batch_size: int, buckets: Sequence[int], device, keep_graph: bool = False):
        self.model, self.opt, self.B = model, opt, batch_size
        self.graphs: dict[int, tuple] = {}
        self.device = device
        self.buckets = list(buckets)
        # keep_graph: keep each cudaGraph_t after capture so that graph_kernel_nodes() can count its
        # nodes (needs PyTorch's CUDAGraph(keep_graph=...); older versions capture without it).
        self.keep_graph = keep_graph

    def _capture(self, T: int):
        B, dev = self.B, self.device
        ids = torch.zeros(B, T, dtype=torch.int64, device=dev)
        lengths = torch.ones(B, dtype=torch.int64, device=dev)
        labels = torch.zeros(B, dtype=torch.int64, device=dev)
        # Warm-up on a side stream (what capture requires), on a copy of the state: the warm-up
        # steps must not change the weights or the optimizer's moments.
        saved_model = {k: v.clone() for k, v in self.model.state_dict().items()}
        saved_opt = _clone_opt_state(self.opt)
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):
                self.opt.zero_grad(set_to_none=False)
                loss = self.model.loss(self.model(ids, lengths), labels)
                loss.backward()
                self.opt.step()
        torch.cuda.current_stream(dev).wait_stream(s)
        g = None
        if self.keep_graph:
            try:
                g = torch.cuda.CUDAGraph(keep_graph=True)
            except TypeError:
                g = None
        g = g if g is not None else torch.cuda.CUDAGraph()
        # The grads exist (warm-up), so backward adds into them: zeroing them is part of the step.
        # Each bucket's graph has its own memory pool: graphs replay in any order.
        with torch.cuda.graph(g):
            self.opt.zero_grad(set_to_none=False)
            loss = self.model.loss(self.model(ids, lengths), labels)
            loss.backward()
            self.opt.step()
        with torch.no_grad():
            self.model.load_state_dict(saved_model)
        _restore_opt_state(self.opt, saved_opt)
        self.graphs[T] = (g, ids, lengths, labels, loss)

    def __call__(self, batch: sst2.Batch) -> torch.Tensor:
        T = batch.ids.shape[1]
        if T not in self.graphs:
            self._capture(T)
        g, ids, lengths, labels, loss = self.graphs[T]
        ids.copy_(batch.ids, non_blocking=True)
        lengths.copy_(batch.lengths, non_blocking=True)
        labels.copy_(batch.labels, non_blocking=True)
        g.replay()
        return loss


class _EMA:
    """An exponential moving average of the model's parameters, updated after each optimizer step
    (one fused foreach kernel; outside any captured graph, so eager and graphed steps share it).
    The decay ramps up as min(decay, (1 + n) / (10 + n)) over the first steps n, so the early
    average does not hold on to the initial weights. ``applied()`` swaps the average in (in place:
    captured graphs keep the parameters' addresses) and swaps the trained weights back after."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.params = [p.detach() for p in model.parameters()]  # views of the weights, no autograd
        self.shadow = [p.clone() for p in self.params]
        self.decay, self.n = float(decay), 0

    @torch.no_grad()
    def update(self) -> None:
        d = min(self.decay, (1 + self.n) / (10 + self.n))
        torch._foreach_lerp_(self.shadow, self.params, 1.0 - d)
        self.n += 1

    @contextlib.contextmanager
    def applied(self):
        with torch.no_grad():
            saved = [p.clone() for p in self.params]
            for p, a in zip(self.params, self.shadow):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, w in zip(self.params, saved):
                    p.copy_(w)

    def state_dict(self) -> dict:
        return {"shadow": [a.detach().cpu() for a in self.shadow], "n": self.n, "decay": self.decay}

    def load_state_dict(self, st: dict) -> None:
        with torch.no_grad():
            for a, b in zip(self.shadow, st["shadow"]):
                a.copy_(b)
        self.n = int(st["n"])


def _clone_opt_state(opt) -> dict:
    return {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}
            for p, st in opt.state.items()}


def _restore_opt_state(opt, saved: dict) -> None:
    for p, st in opt.state.items():
        old = saved.get(id(p))
        for k, v in st.items():
            if torch.is_tensor(v):
                if old is not None and k in old:
                    v.copy_(old[k])
                else:
                    v.zero_()


def _eager_step(model, opt, batch: sst2.Batch, set_to_none: bool = True, fwd=None) -> torch.Tensor:
    """One step. ``fwd``: what runs the forward (the DistributedDataParallel wrapper under
    torchrun, whose backward averages the gradients over the processes); default the model."""
    # With captured graphs the .grad tensors must stay: the graphs hold their addresses.
    opt.zero_grad(set_to_none=set_to_none)
    loss = model.loss((fwd or model)(batch.ids, batch.lengths), batch.labels)
    loss.backward()
    opt.step()
    return loss.detach()


@torch.no_grad()
def evaluate(model: SentimentClassifier, data: sst2.EncodedSplit, batch_size: int = 256,
             device=None, buckets=None) -> dict[str, float]:
    """Accuracy and mean loss of ``model`` on ``data`` (eval mode; restores the mode after)."""
    was = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for b in data.batches(batch_size, device=device, buckets=buckets):
        logits = model(b.ids, b.lengths)
        loss_sum += model.loss(logits, b.labels).double() * b.labels.numel()
        correct += (logits.argmax(-1) == b.labels).sum()
    model.train(was)
    n = max(1, len(data))
    return {"accuracy": correct.item() / n, "loss": loss_sum.item() / n}


# --------------------------------------------------------------------------- files


LOCK_NAME = "train.lock"
_OUTPUTS = ("checkpoint.pt", "metrics.json", "loss_curve.png")
_PROBE = ".write-check"


def _save_atomic(obj, path: Path) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    write_atomic(path, buf.getbuffer())


def _claim_output_dir(out: Path, held: contextlib.ExitStack) -> None:
    """Lock ``out`` for this run (held until ``held`` closes; a second run into it fails at once),
    check that files can be created in it, and remove temporary files that killed runs left."""
    import fcntl

    try:
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutputDirError(f"output directory {out} is not writable ({e.strerror})") from e
    held.callback(os.close, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputDirError(f"output directory {out} is in use by another training run (it holds "
                             f"{out / LOCK_NAME}); wait for it or choose another --output-dir") from None
    except OSError as e:
        raise OutputDirError(f"cannot lock output directory {out} ({e.strerror})") from e
    held.callback(fcntl.flock, fd, fcntl.LOCK_UN)
    for name in _OUTPUTS + (_PROBE,):
        for p in out.glob(f".{name}.*.tmp"):
            with contextlib.suppress(OSError):
                p.unlink()
    try:  # the lock file may exist already: only creating a file proves the directory writable
        pfd, probe = tempfile.mkstemp(dir=out, prefix=f".{_PROBE}.", suffix=".tmp")
        os.close(pfd)
        os.unlink(probe)
    except OSError as e:
        raise OutputDirError(f"output directory {out} is not writable ({e.strerror})") from e


_CKPT_KEYS = ("model", "vocab", "config")
_RESUME_KEYS = _CKPT_KEYS + ("optimizer", "epoch", "rng", "history", "step_losses")


def _read_checkpoint(path: Path, keys: Sequence[str] = _CKPT_KEYS) -> dict:
    """The dict a checkpoint file holds, unpickled with ``weights_only``; CheckpointError naming
    the file when it is unreadable, not a checkpoint, or needs other objects to load."""
    try:
        with warnings.catch_warnings():  # a pickle protocol note on files that are refused anyway
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path} ({e.strerror or e})") from e
    except pickle.UnpicklingError as e:
        why = str(e).partition("WeightsUnpickler error:")[2].split(" Please use")[0].strip()
        why = next((ln.strip() for ln in why.splitlines() if ln.strip()), "")[:200]
        raise CheckpointError(f"{path} is not a tilewise checkpoint, or not one that loads safely: torch.load with "
                              f"weights_only (tensors and plain data; anything else could run code when unpickled) "
                              f"refused it" + (f" ({why})" if why else "")) from e
    except Exception as e:  # torch.load's errors on other files: EOFError, KeyError, RuntimeError, ...
        why = (str(e).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"{path} is not a tilewise checkpoint (torch.load: {type(e).__name__}"
                              + (f": {why})" if why else ")")) from e
    missing = [k for k in keys if k not in ck] if isinstance(ck, dict) else list(keys)
    if missing:
        raise CheckpointError(f"{path} is not a tilewise checkpoint (it lacks {', '.join(missing)})")
    return ck


# --------------------------------------------------------------------------- train


def _rng_state(gen: torch.Generator, device) -> dict:
    st = {"shuffle": gen.get_state(), "cpu": torch.get_rng_state()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def _set_rng_state(st: dict, gen: torch.Generator, device) -> None:
    gen.set_state(st["shuffle"])
    torch.set_rng_state(st["cpu"])
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


_DATA_CACHE: dict = {}


def _load_data(data_dir, download: bool) -> dict:
    """SST-2's splits, kept for the process while the files are unchanged: a sweep calls ``train``
    many times in one process, and reading and tokenizing the TSVs each time would cost more than
    a graphed epoch."""
    d = sst2.find_data_dir(data_dir, download=download)
    key = (str(d.resolve()),) + tuple((f.stat().st_mtime_ns, f.stat().st_size)
                                      for f in (d / "train.tsv", d / "dev.tsv") if f.is_file())
    if _DATA_CACHE.get("key") != key:
        _DATA_CACHE.clear()
        _DATA_CACHE.update(key=key, data=sst2.load_sst2(d), encoded={})
    return _DATA_CACHE["data"]


def _vocab(data: dict, min_count: int) -> sst2.Vocab:
    """The training split's vocabulary, kept per min_count for the cached data."""
    cache = _DATA_CACHE.setdefault("vocab", {}) if _DATA_CACHE.get("data") is data else {}
    if min_count not in cache:
        cache[min_count] = sst2.Vocab.build(data["train"].tokens, min_count=min_count)
    return cache[min_count]


def _encoded(data: dict, vocab: sst2.Vocab, max_len: int):
    """(train, dev) EncodedSplits of ``data``, kept for the last (vocabulary, max_len) of the cached data."""
    enc = _DATA_CACHE.get("encoded") if _DATA_CACHE.get("data") is data else None
    key = (tuple(vocab.itos), max_len)
    if enc is not None and key in enc:
        return enc[key]
    pair = (sst2.EncodedSplit(data["train"], vocab, max_len=max_len),
            sst2.EncodedSplit(data["dev"], vocab, max_len=max_len))
    if enc is not None:
        enc.clear()
        enc[key] = pair
    return pair


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Dist:
    """Data-parallel run under torchrun: this process's rank among world_size."""

    rank: int
    world_size: int


def _init_distributed(cfg: TrainConfig) -> tuple[TrainConfig, "_Dist | None", list[str]]:
    """Under torchrun (WORLD_SIZE > 1 in the environment): join the process group (NCCL on GPUs,
    gloo on the CPU), pin this process to its GPU (LOCAL_RANK), and return the config adjusted for
    a data-parallel run: rank 0 alone prints, plots, evaluates and writes; CUDA graphs are off (a
    step's gradient all-reduce is not captured). Outside torchrun: (cfg, None, [])."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return cfg, None, []
    import torch.distributed as dist

    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    notes = [f"data-parallel: rank {rank} of {world} ({'NCCL' if on_gpu else 'gloo'}), batch {cfg.batch_size} "
             f"per process, {cfg.batch_size * world} a step in all"]
    if on_gpu:
        if not torch.cuda.is_available():
            raise ValueError(f"--device {cfg.device} under torchrun: no CUDA GPU is visible to PyTorch")
        torch.cuda.set_device(local)
        cfg = replace(cfg, device=f"cuda:{local}")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if on_gpu else "gloo")
    if cfg.graph:
        notes.append("--graph is off under torchrun (the gradient all-reduce is not captured)")
    cfg = replace(cfg, graph=False)
    if rank != 0:
        cfg = replace(cfg, progress=False, plot=False)
    return cfg, _Dist(rank, world), notes


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train, evaluate each epoch, write metrics.json, loss_curve.png and checkpoint.pt in
    ``cfg.output_dir``; return the metrics. Under torchrun (``torchrun --nproc_per_node N -m
    tilewise train ...``) it trains data-parallel with DistributedDataParallel: each process takes
    every N-th batch of the same shuffled order, gradients are averaged, and rank 0 evaluates and
    writes the outputs (the others return its metrics' shape with their own losses)."""
    cfg, ddp, dist_notes = _init_distributed(cfg)
    try:
        with contextlib.ExitStack() as held:  # the output directory's lock
            return _train(cfg, ddp, dist_notes, held)
    finally:
        if ddp is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _train(cfg: TrainConfig, ddp: "_Dist | None", dist_notes: list[str], held: contextlib.ExitStack
           ) -> dict[str, Any]:
    if cfg.epochs < 0 or cfg.batch_size < 1 or cfg.lr <= 0 or cfg.hidden < 1:
        raise ValueError(f"train: need epochs >= 0, batch_size >= 1, lr > 0, hidden >= 1; got epochs={cfg.epochs}, "
                         f"batch_size={cfg.batch_size}, lr={cfg.lr}, hidden={cfg.hidden}")
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"--lr-schedule must be one of {LR_SCHEDULES}, got {cfg.lr_schedule!r}")
    if cfg.freeze_embeddings_epochs < 0:
        raise ValueError(f"--freeze-embeddings-epochs must be >= 0, got {cfg.freeze_embeddings_epochs}")
    if not 0.0 <= cfg.embed_dropout < 1.0:
        raise ValueError(f"--embed-dropout must be in [0, 1), got {cfg.embed_dropout}")
    if not 0.0 <= cfg.word_dropout < 1.0:
        raise ValueError(f"--word-dropout must be in [0, 1), got {cfg.word_dropout}")
    if not 0.0 <= cfg.ema < 1.0:
        raise ValueError(f"--ema must be in [0, 1), got {cfg.ema}")
    device, backend, notes = resolve_device_backend(cfg)
    if cfg.graph is None:  # auto: every op of the step is capturable, so a GPU replays graphs
        cfg = replace(cfg, graph=device.type == "cuda")
        if cfg.graph:
            notes.append("each step is replayed from a CUDA graph (--no-graph runs it eagerly)")
    notes = dist_notes + notes
    rank, world = (ddp.rank, ddp.world_size) if ddp is not None else (0, 1)
    lead = rank == 0  # prints, evaluates and writes
    con = _console(cfg)
    out = Path(cfg.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputDirError(f"cannot create output directory {out} ({e.strerror or e})") from e
    if lead:  # before any data is read or step taken
        _claim_output_dir(out, held)
    torch.manual_seed(cfg.seed)

    data = _load_data(cfg.data_dir, cfg.download)
    ckpt_path = out / "checkpoint.pt"
    ckpt = None
    if cfg.resume:
        if not ckpt_path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt_path}")
        ckpt = _read_checkpoint(ckpt_path, _RESUME_KEYS)
        vocab = sst2.Vocab(ckpt["vocab"])
    else:
        vocab = _vocab(data, cfg.min_count)
    train_set, dev_set = _encoded(data, vocab, cfg.max_len)
    notes.append(f"SST-2: {len(train_set)} train / {len(dev_set)} dev sentences, vocabulary {len(vocab)} "
                 f"(min count {cfg.min_count}), dev token coverage {100 * vocab.coverage(data['dev'].tokens):.1f}%")

    init = None if ckpt is not None else _embedding_init(cfg, vocab, notes)
    model = SentimentClassifier(len(vocab), cfg.embed_dim, cfg.hidden, 2, cfg.dropout, backend,
                                padding_idx=vocab.pad_id, embedding_init=init,
                                embed_dropout=cfg.embed_dropout).to(device)
    # capturable: the step's bookkeeping stays on the device, which a captured graph needs.
    emb = [model.embedding.weight]
    rest = [p for n, p in model.named_parameters() if n != "embedding.weight"]
    groups = [{"params": emb, "lr": cfg.lr if cfg.embedding_lr is None else cfg.embedding_lr},
              {"params": rest}]
    # A schedule or a freeze changes the lrs between steps; a captured graph keeps the lr it was
    # captured with unless the lr is a device tensor it reads (AdamW allows that when capturable).
    tensor_lr = cfg.graph and (cfg.lr_schedule != "constant" or cfg.freeze_embeddings_epochs > 0)
    if tensor_lr:
        for grp in groups:
            grp["lr"] = torch.tensor(float(grp.get("lr", cfg.lr)), dtype=torch.float32, device=device)
    opt = torch.optim.AdamW(groups, lr=groups[1].get("lr", cfg.lr) if tensor_lr else cfg.lr,
                            weight_decay=cfg.weight_decay, capturable=cfg.graph)
    gen = torch.Generator().manual_seed(cfg.seed)
    # Word dropout draws on the device the batches are made on, from its own seeded stream.
    word_gen = torch.Generator(device=device).manual_seed(cfg.seed + 1) if cfg.word_dropout > 0 else None
    ema = _EMA(model, cfg.ema) if cfg.ema > 0 else None
    history: list[dict] = []
    step_losses: list[float] = []
    start_epoch = 0
    if ckpt is not None:
        try:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            why = (str(e).strip().splitlines() or [""])[0][:300]
            raise CheckpointError(f"--resume: {ckpt_path} does not fit this model and optimizer ({why}); resume "
                                  "with the options it was trained with") from e
        # The checkpoint may come from a run with(out) --graph: capturable AdamW keeps its step
        # counters on the device, the plain one on the CPU. Its groups also carry the old run's
        # lr and weight decay: this run's options apply (a schedule sets the lrs again each step).
        base_lrs = (cfg.lr if cfg.embedding_lr is None else cfg.embedding_lr, cfg.lr)
        for grp, lr in zip(opt.param_groups, base_lrs):
            grp["capturable"] = cfg.graph
            grp["weight_decay"] = cfg.weight_decay
            grp["lr"] = torch.tensor(lr, dtype=torch.float32, device=device) if tensor_lr else lr
        old = ckpt["config"] if isinstance(ckpt["config"], dict) else {}
        changed = [f"{k} {old[k]} -> {getattr(cfg, k)}" for k in ("lr", "embedding_lr", "weight_decay")
                   if k in old and old[k] != getattr(cfg, k)]
        if changed:
            notes.append(f"--resume: {', '.join(changed)} from epoch {int(ckpt['epoch']) + 1} on")
        for st in opt.state.values():
            if "step" in st and torch.is_tensor(st["step"]):
                st["step"] = st["step"].to(device if cfg.graph else "cpu", torch.float32)
        _set_rng_state(ckpt["rng"], gen, device)
        if word_gen is not None and "words" in ckpt["rng"]:
            word_gen.set_state(ckpt["rng"]["words"])
        if ema is not None and ckpt.get("ema") is not None:
            ema.load_state_dict(ckpt["ema"])
        history, step_losses, start_epoch = ckpt["history"], ckpt["step_losses"], ckpt["epoch"]
        notes.append(f"resumed from {ckpt_path} after epoch {start_epoch}")
    if backend == "tilewise":
        notes.append("tilewise backend: " + "; ".join(f"{k}: {v}" for k, v in twf.report().items()))
    for n in notes:
        con.print(n)

    buckets = cfg.buckets
    if buckets is None and (cfg.graph or backend == "tilewise"):
        # Graphs need fixed shapes. The tilewise backend's Triton GEMMs autotune once per (M, N, K):
        # padding each batch to its own longest sentence gives up to max_len different M = B x T
        # (and as many for evaluation), each a fresh autotune of several kernels; a few bucket
        # lengths bound that to a few.
        buckets = tuple(b for b in (16, 32, 64) if b < cfg.max_len) + (cfg.max_len,)
        notes.append(f"batches padded to the bucket lengths {buckets}")
        con.print(notes[-1])
    graphed = _GraphedStep(model, opt, cfg.batch_size, buckets, device) if cfg.graph else None
    fwd = model
    if ddp is not None:
        from torch.nn.parallel import DistributedDataParallel

        fwd = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # Each process takes every world-th batch of the same shuffled order, and all take the same
    # number of steps (a process with one more would wait in its all-reduce for ever).
    steps_per_epoch = train_set.num_batches(cfg.batch_size) // world
    if cfg.max_steps is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.max_steps)
    total_steps = steps_per_epoch * cfg.epochs
    scheduled = cfg.lr_schedule != "constant" or cfg.freeze_embeddings_epochs > 0
    model.train()
    with Progress(TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} ex/s"),
                  TimeRemainingColumn(), console=con, disable=not cfg.progress) as bar:
        for epoch in range(start_epoch, cfg.epochs):
            task = bar.add_task("train", total=steps_per_epoch, epoch=epoch + 1, loss="-", rate="-")
            losses: list[torch.Tensor] = []
            examples = 0
            _sync(device)
            t0 = time.perf_counter()
            for step, b in enumerate(train_set.batches(cfg.batch_size, shuffle=True, generator=gen,
                                                       buckets=buckets, device=device, shard=(rank, world),
                                                       word_dropout=cfg.word_dropout, dropout_generator=word_gen)):
                if step >= steps_per_epoch:
                    break
                if scheduled:
                    _set_lrs(opt, group_lrs(cfg, epoch, epoch * steps_per_epoch + step, total_steps))
                if graphed is not None and b.ids.shape[0] == cfg.batch_size:
                    loss = graphed(b).detach().clone()
                else:
                    loss = _eager_step(model, opt, b, set_to_none=graphed is None, fwd=fwd)
                if ema is not None:
                    ema.update()
                losses.append(loss)
                examples += b.ids.shape[0]
                if (step + 1) % cfg.log_every == 0 or step + 1 == steps_per_epoch:
                    rate = examples / max(1e-9, time.perf_counter() - t0)
                    bar.update(task, completed=step + 1, loss=f"{loss.item():.4f}", rate=f"{rate:,.0f}")
            _sync(device)
            secs = time.perf_counter() - t0
            if backend == "tilewise":
                # The sync-free cross-entropy counts bad labels on the device; one check per epoch.
                twf.check_targets(device)
            epoch_losses = torch.stack(losses).float().cpu().tolist() if losses else []
            step_losses += epoch_losses
            # The replicas hold the same weights: rank 0 evaluates for all.
            if lead:
                with ema.applied() if ema is not None else contextlib.nullcontext():
                    ev = evaluate(model, dev_set, device=device, buckets=buckets)
            else:
                ev = {"accuracy": math.nan, "loss": math.nan}
            rec = {"epoch": epoch + 1, "train_loss": sum(epoch_losses) / max(1, len(epoch_losses)),
                   "lr_end": [float(g["lr"]) for g in opt.param_groups],
                   "weight_decay": [float(g["weight_decay"]) for g in opt.param_groups],
                   "dev_accuracy": ev["accuracy"], "dev_loss": ev["loss"], "train_seconds": secs,
                   # all processes' examples (each took as many steps in the same time)
                   "examples_per_second": world * examples / secs if secs > 0 else math.nan, "steps": len(losses)}
            history.append(rec)
            bar.update(task, completed=steps_per_epoch)
            con.print(f"epoch {epoch + 1}: train loss {rec['train_loss']:.4f}, dev accuracy "
                      f"{100 * rec['dev_accuracy']:.2f}%, {rec['examples_per_second']:,.0f} ex/s")
            if lead:
                rng = _rng_state(gen, device)
                if word_gen is not None:
                    rng["words"] = word_gen.get_state()
                # Plain data only (the config through JSON): loadable with weights_only.
                _save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1,
                              "rng": rng, "history": history, "step_losses": step_losses,
                              "ema": ema.state_dict() if ema is not None else None,
                              "vocab": list(vocab.itos), "config": json.loads(json.dumps(asdict(cfg)))}, ckpt_path)

    metrics = {
        "config": asdict(cfg), "device": str(device), "backend": backend,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "ops": twf.report() if backend == "tilewise" else {}, "notes": notes, "vocab_size": len(vocab),
        "epochs": history, "step_losses": step_losses,
        # Chosen on dev, which is also what is reported: GLUE's test labels are hidden.
        "best_dev_accuracy": max((h["dev_accuracy"] for h in history), default=None),
        "best_epoch": max(history, key=lambda h: h["dev_accuracy"])["epoch"] if history else None,
        "final_dev_accuracy": history[-1]["dev_accuracy"] if history else None,
        "torch": torch.__version__, "world_size": world,
    }
    if not lead:
        return metrics
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2).encode())
    if cfg.plot:
        _plot(step_losses, history, out / "loss_curve.png")
    return metrics


def _plot(step_losses: list[float], history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if step_losses:
        ax.plot(range(1, len(step_losses) + 1), step_losses, lw=0.5, alpha=0.4, label="train loss (step)")
        w = max(1, len(step_losses) // 100)
        if w > 1:
            sm = [sum(step_losses[i:i + w]) / w for i in range(0, len(step_losses) - w + 1, w)]
            ax.plot([i + w for i in range(0, len(step_losses) - w + 1, w)], sm, lw=1.5, label=f"mean of {w}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    if history:
        ax2 = ax.twinx()
        steps, acc, total = [], [], 0
        for h in history:
            total += h["steps"]
            steps.append(total)
            acc.append(100 * h["dev_accuracy"])
        ax2.plot(steps, acc, "o-", color="tab:green", label="dev accuracy")
        ax2.set_ylabel("dev accuracy (%)")
        ax2.legend(loc="upper right")
    ax.legend(loc="upper left")
    ax.set_title("SST-2 classifier")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, buf.getbuffer())


# --------------------------------------------------------------------------- predict / evaluate


LABELS = ("negative", "positive")


def load_checkpoint(path: str | Path, device: str = "auto", backend: str = "auto"):
    """(model in eval mode, vocab, config dict) from a checkpoint ``train`` wrote."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    ck = _read_checkpoint(path)
    c = ck["config"]
    dev, be, _ = resolve_device_backend(TrainConfig(device=device, backend=backend))
    try:
        vocab = sst2.Vocab(ck["vocab"])
        model = SentimentClassifier(len(vocab), c["embed_dim"], c["hidden"], 2, c["dropout"], be,
                                    padding_idx=vocab.pad_id)
        model.load_state_dict(ck["model"])
        if ck.get("ema") is not None:  # the averaged weights are the ones train evaluated
            with torch.no_grad():
                for p, a in zip(model.parameters(), ck["ema"]["shadow"], strict=True):
                    p.copy_(a)
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        why = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"{path} is not a tilewise checkpoint of this model ({type(e).__name__}: {why})") from e
    return model.to(dev).eval(), vocab, c


@torch.no_grad()
def predict(checkpoint: str | Path, sentences: Sequence[str], device: str = "auto",
            backend: str = "auto") -> list[tuple[str, float]]:
    """(class name, its probability) for each sentence (whitespace-tokenized, lower-cased)."""
    model, vocab, _ = load_checkpoint(checkpoint, device, backend)
    dev = next(model.parameters()).device
    split = sst2.Split("input", [s.lower().split() for s in sentences], [0] * len(sentences))
    enc = sst2.EncodedSplit(split, vocab)
    out = []
    for b in enc.batches(256, device=dev):
        probs = torch.softmax(model(b.ids, b.lengths).float(), -1)
        p, k = probs.max(-1)
        out += [(LABELS[int(i)], float(q)) for i, q in zip(k.tolist(), p.tolist())]
    return out


def evaluate_checkpoint(checkpoint: str | Path, data_dir: str | None = None, split: str = "dev",
                        device: str = "auto", backend: str = "auto") -> dict[str, float]:
    """Accuracy and mean loss of a checkpoint on a labelled split of SST-2."""
    model, vocab, c = load_checkpoint(checkpoint, device, backend)
    data = sst2.load_sst2(data_dir, splits=(split,))[split]
    if any(lab < 0 for lab in data.labels):
        raise ValueError(f"evaluate: the {split} split has no labels (GLUE hides the test labels)")
    enc = sst2.EncodedSplit(data, vocab, max_len=c.get("max_len"))
    return evaluate(model, enc, device=next(model.parameters()).device)


def add_predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint.pt (or the output directory holding it)")
    p.add_argument("sentences", nargs="+", help="one or more sentences")
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", choices=("auto", "tilewise", "torch"), default="auto")


def main_predict(args: argparse.Namespace) -> int:
    from rich.console import Console

    try:
        res = predict(args.checkpoint, args.sentences, args.device, args.backend)
    except (FileNotFoundError, ValueError) as e:
        Console(stderr=True, highlight=False).print(f"tilewise predict: {e}", markup=False, soft_wrap=True)
        return 2
    for s, (label, prob) in zip(args.sentences, res):
        print(f"{label}\t{prob:.3f}\t{s}")  # plain tabs: meant for scripts too
    return 0


def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint.pt (or the output directory holding it)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--split", choices=("train", "dev"), default="dev")
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", choices=("auto", "tilewise", "torch"), default="auto")


def main_evaluate(args: argparse.Namespace) -> int:
    from rich.console import Console

    try:
        r = evaluate_checkpoint(args.checkpoint, args.data_dir, args.split, args.device, args.backend)
    except (FileNotFoundError, ValueError) as e:
        Console(stderr=True, highlight=False).print(f"tilewise evaluate: {e}", markup=False, soft_wrap=True)
        return 2
    Console(highlight=False).print(f"{args.split}: accuracy {100 * r['accuracy']:.2f}%, loss {r['loss']:.4f}")
    return 0


# --------------------------------------------------------------------------- step throughput

STEP_MODES = ("eager", "compile", "graph")


def synthetic_batches(n_batches: int, batch_size: int = 64, seq_len: int = 64, vocab_size: int = 14819,
                      num_classes: int = 2, *, pad_id: int = 0, min_len: int = 1, seed: int = 0,
                      device="cpu") -> list[sst2.Batch]:
    """``n_batches`` SST-2-shaped batches: ids (B, T) int64, every sentence padded to ``seq_len``.

    Lengths are uniform in [min_len, seq_len]; positions at or past a sentence's length hold
    ``pad_id``; the tokens before it are uniform over the vocabulary without ``pad_id``; labels
    uniform in [0, num_classes). Drawn on the CPU from ``seed`` (the same batches on any device),
    then moved to ``device``.
    """
    for n, v in (("n_batches", n_batches), ("batch_size", batch_size), ("seq_len", seq_len),
                 ("num_classes", num_classes)):
        if v < 1:
            raise ValueError(f"synthetic_batches: {n} must be >= 1, got {v}")
    if vocab_size < 2:
        raise ValueError(f"synthetic_batches: vocab_size must be >= 2 (a pad id and a token), got {vocab_size}")
    if not 0 <= pad_id < vocab_size:
        raise ValueError(f"synthetic_batches: pad_id must be in [0, {vocab_size}), got {pad_id}")
    if not 1 <= min_len <= seq_len:
        raise ValueError(f"synthetic_batches: min_len must be in [1, seq_len={seq_len}], got {min_len}")
    g = torch.Generator().manual_seed(seed)
    shape = (n_batches, batch_size, seq_len)
    ids = torch.randint(0, vocab_size - 1, shape, generator=g)
    ids += (ids >= pad_id).long()  # skip pad_id: tokens cover [0, V) minus pad_id
    lengths = torch.randint(min_len, seq_len + 1, shape[:2], generator=g)
    ids[torch.arange(seq_len)[None, None, :] >= lengths[:, :, None]] = pad_id
    labels = torch.randint(0, num_classes, shape[:2], generator=g)
    ids, lengths, labels = ids.to(device), lengths.to(device), labels.to(device)
    return [sst2.Batch(ids[i], lengths[i], labels[i]) for i in range(n_batches)]


def step_model(backend: str, mode: str, *, vocab_size: int = 14819, embed_dim: int = 50, hidden: int = 256,
               num_classes: int = 2, dropout: float = 0.3, lr: float = 1e-3, weight_decay: float = 0.01,
               seed: int = 0, device="cuda"):
    """(model in train mode, AdamW) as ``train`` builds them; one ``seed`` gives every backend and
    mode the same initial weights. AdamW is ``capturable`` for ``mode="graph"``."""
    if mode not in STEP_MODES:
        raise ValueError(f"step_model: mode must be one of {STEP_MODES}, got {mode!r}")
    torch.manual_seed(seed)
    model = SentimentClassifier(vocab_size, embed_dim, hidden, num_classes, dropout, backend).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, capturable=(mode == "graph"))
    return model, opt


def build_step(model, opt, mode: str, *, batch_size: int, seq_len: int, device, keep_graph: bool = False):
    """A function ``step(batch) -> loss`` running one training step (zero grads, forward, backward,
    AdamW) of ``model`` for batches of (batch_size, seq_len).

    mode "eager"; "compile": ``torch.compile`` (default mode) of forward + loss, AdamW eager;
    "graph": the whole step captured in a CUDA graph on the first call, replayed from static input
    buffers (the returned loss is the graph's static output: clone it to keep it). ``step.graphed``
    is the ``_GraphedStep`` for mode "graph", else None.
    """
    if mode not in STEP_MODES:
        raise ValueError(f"build_step: mode must be one of {STEP_MODES}, got {mode!r}")
    dev = torch.device(device)
    graphed = None
    if mode == "graph":
        graphed = _GraphedStep(model, opt, batch_size, (seq_len,), dev, keep_graph=keep_graph)

        def step(b):
            return graphed(b)
    elif mode == "compile":
        fwd = torch.compile(lambda i, l, y: model.loss(model(i, l), y))

        def step(b):
            opt.zero_grad(set_to_none=True)
            loss = fwd(b.ids, b.lengths, b.labels)
            loss.backward()
            opt.step()
            return loss.detach()
    else:
        def step(b):
            return _eager_step(model, opt, b)
    step.graphed = graphed
    return step


def count_step_kernels(step, batch, device="cuda") -> dict[str, int]:
    """GPU work one ``step(batch)`` puts on the device, from the profiler (CUPTI): kernels, and
    memcpy / memset operations apart. Kernels replayed from a CUDA graph are counted one by one."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device)
    _sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(batch)
        _sync(dev)
    out = {"kernels": 0, "memcpy": 0, "memset": 0}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.lower()
        key = "memcpy" if "memcpy" in name else "memset" if "memset" in name else "kernels"
        out[key] += 1
    return out


def graph_kernel_nodes(step) -> int | None:
    """Kernel nodes in the CUDA graph of a ``build_step(..., mode="graph", keep_graph=True)`` step
    (after its first call); None where PyTorch or cuda.bindings cannot say."""
    graphed = getattr(step, "graphed", None)
    if graphed is None or not graphed.graphs:
        return None
    try:
        from cuda.bindings import runtime as cudart

        g = next(iter(graphed.graphs.values()))[0]
        raw = cudart.cudaGraph_t(init_value=int(g.raw_cuda_graph()))
        err, nodes, n = cudart.cudaGraphGetNodes(raw, 0)
        if err != cudart.cudaError_t.cudaSuccess:
            return None
        err, nodes, n = cudart.cudaGraphGetNodes(raw, n)
        kinds = [cudart.cudaGraphNodeGetType(nd)[1] for nd in nodes]
        return sum(1 for k in kinds if k == cudart.cudaGraphNodeType.cudaGraphNodeTypeKernel)
    except Exception:  # no keep_graph in this PyTorch, no cuda.bindings, a changed binding API
        return None


def step_throughput(backend: str = "tilewise", mode: str = "eager", *, vocab_size: int = 20000,
                    embed_dim: int = 50, hidden: int = 256, batch_size: int = 64, seq_len: int = 64,
                    steps: int = 200, dropout: float = 0.3, device: str = "cuda",
                    count_kernels: bool = False) -> dict[str, float]:
    """Time whole training steps (forward, backward, AdamW) on synthetic batches of one shape.

    mode: "eager"; "compile" (``torch.compile`` of forward + loss, default mode); "graph" (the
    whole step captured in a CUDA graph and replayed). Returns ms per step, examples/s and, with
    ``count_kernels``, the GPU kernels one step launches (from the profiler). The bench suite
    ``train_step`` times the same steps with device events and checks their losses first.
    """
    if mode not in STEP_MODES:
        raise ValueError(f"step_throughput: mode must be eager, compile or graph, got {mode!r}")
    dev = torch.device(device)
    model, opt = step_model(backend, mode, vocab_size=vocab_size, embed_dim=embed_dim, hidden=hidden,
                            dropout=dropout, device=dev)
    n_batches = 8
    batches = synthetic_batches(n_batches, batch_size, seq_len, vocab_size, device=dev)
    step = build_step(model, opt, mode, batch_size=batch_size, seq_len=seq_len, device=dev)

    for i in range(10):  # warm-up: compile, capture, autotune
        step(batches[i % n_batches])
    _sync(dev)
    t0 = time.perf_counter()
    for i in range(steps):
        step(batches[i % n_batches])
    _sync(dev)
    secs = time.perf_counter() - t0
    out = {"ms_per_step": 1e3 * secs / steps, "examples_per_second": steps * batch_size / secs}
    if count_kernels:
        out["kernels_per_step"] = count_step_kernels(step, batches[0], dev)["kernels"]
    return out


# --------------------------------------------------------------------------- CLI


def _buckets(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--buckets wants comma-separated lengths, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"--buckets wants positive lengths, got {s!r}")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--data-dir", default=None,
                   help=f"directory with train.tsv/dev.tsv (default: ${sst2.ENV_DATA_DIR}, ./.data/sst2, the cache)")
    p.add_argument("--download", action="store_true", help="fetch SST-2 through Hugging Face datasets if not found")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--embedding-lr", type=float, default=None, help="learning rate of the embedding (default: --lr)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--hidden", type=int, default=d.hidden, help="hidden size H")
    p.add_argument("--embedding-init", choices=("glove", "random"), default=d.embedding_init)
    p.add_argument("--glove-cache", default=None, help="GloVe extract (.npz) for this vocabulary")
    p.add_argument("--dropout", type=float, default=d.dropout, help="dropout on the pooled features")
    p.add_argument("--embed-dropout", type=float, default=d.embed_dropout,
                   help="dropout on the embedded token vectors (default 0: off)")
    p.add_argument("--word-dropout", type=float, default=d.word_dropout,
                   help="leave each training token out of its sentence with this probability (default 0)")
    p.add_argument("--ema", type=float, default=d.ema,
                   help="evaluate and save a moving average of the weights with this decay per step, "
                        "e.g. 0.999 (default 0: off)")
    p.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=d.lr_schedule,
                   help="per-step decay of every lr to 0 at the last step (default: constant)")
    p.add_argument("--freeze-embeddings-epochs", type=int, default=d.freeze_embeddings_epochs,
                   help="keep the embedding table fixed for this many first epochs (default 0)")
    p.add_argument("--min-count", type=int, default=d.min_count, help="vocabulary: least count in train")
    p.add_argument("--max-len", type=int, default=d.max_len, help="cut sentences to this many tokens")
    p.add_argument("--buckets", type=_buckets, default=None, help="pad batches to these lengths, e.g. 16,32,64")
    p.add_argument("--backend", choices=("auto", "tilewise", "torch"), default=d.backend)
    p.add_argument("--device", default=d.device, help="cuda, cuda:N, cpu or auto")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="capture each step in a CUDA graph (default: on a GPU, off on the CPU and under "
                        "torchrun)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--output-dir", default=d.output_dir)
    p.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/checkpoint.pt")
    p.add_argument("--max-steps", type=int, default=None, help="at most this many steps per epoch")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or messages")
    p.add_argument("--no-plot", action="store_true", help="do not write loss_curve.png")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(data_dir=args.data_dir, download=args.download, epochs=args.epochs,
                       batch_size=args.batch_size, lr=args.lr, embedding_lr=args.embedding_lr,
                       weight_decay=args.weight_decay, hidden=args.hidden,
                       embedding_init=args.embedding_init, glove_cache=args.glove_cache, dropout=args.dropout,
                       embed_dropout=args.embed_dropout, word_dropout=args.word_dropout, ema=args.ema,
                       lr_schedule=args.lr_schedule,
                       freeze_embeddings_epochs=args.freeze_embeddings_epochs, plot=not args.no_plot,
                       min_count=args.min_count, max_len=args.max_len, buckets=args.buckets,
                       backend=args.backend, device=args.device, graph=args.graph, seed=args.seed,
                       output_dir=args.output_dir, resume=args.resume, max_steps=args.max_steps,
                       progress=not args.no_progress)


def _enable_crash_reports() -> None:
    """A crash Python cannot catch (SIGSEGV, SIGABRT from a CUDA assert) or a kill by a timeout
    (SIGTERM) dumps every thread's Python stack to stderr, instead of leaving an empty log."""
    import faulthandler
    import signal

    try:
        if not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)
        if hasattr(signal, "SIGTERM") and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    except (AttributeError, ValueError, RuntimeError, OSError):  # no fileno (captured stderr), or Windows
        pass


def main(args: argparse.Namespace) -> int:
    """Run ``tilewise train``; a missing dataset or an impossible option is a message, exit 2;
    any other failure prints its traceback (stderr and stdout) and exits 1. A data-parallel worker
    (under torchrun) leaves with os._exit once its outputs are written and flushed: the CI saw a
    worker abort (SIGABRT while Python collected garbage at shutdown, no Python frame) after
    training in 2 of about 10 runs of the gloo test, which turned a finished run into a failure."""
    code = _main(args)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(args: argparse.Namespace) -> int:
    from rich.console import Console

    _enable_crash_reports()
    try:
        m = train(config_from_args(args))
    except (sst2.MissingDataError, ValueError, FileNotFoundError, OutputDirError) as e:
        Console(stderr=True, highlight=False).print(f"tilewise train: {e}", markup=False, soft_wrap=True)
        return 2
    except Exception as e:
        from .data.glove import GloveUnavailable

        if isinstance(e, GloveUnavailable):
            Console(stderr=True, highlight=False).print(f"tilewise train: {e}", markup=False, soft_wrap=True)
            return 2
        # Anything else (a kernel error, a CUDA fault): the full traceback, on stderr AND stdout,
        # so that a log that keeps only one of them (and --no-progress) still shows why it stopped.
        import traceback

        tb = traceback.format_exc()
        msg = f"tilewise train: failed with {type(e).__name__}: {e}\n{tb}"
        for stream in (sys.stderr, sys.stdout):
            print(msg, file=stream, flush=True)
        return 1
    if not args.no_progress:
        Console(highlight=False).print(f"metrics: {Path(args.output_dir) / 'metrics.json'}; best dev accuracy "
                                       f"{100 * (m['best_dev_accuracy'] or 0):.2f}%")
    return 0


if __name__ == "__main__":  # python -m tilewise.train ...
    ap = argparse.ArgumentParser(prog="tilewise train", description=__doc__.split("\n")[0])
    add_arguments(ap)
    raise SystemExit(main(ap.parse_args()))
