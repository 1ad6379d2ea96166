"""The training run: ``train(TrainConfig(...)) -> metrics`` (also written to OUTPUT_DIR/metrics.json).

Per epoch: one pass over the shuffled training split (AdamW, the lr schedule, an optional moving
average of the weights), accuracy on the dev split, a checkpoint that ``--resume`` continues from
exactly (``checkpoint.py``). Throughput is examples per second of the training pass only, timed
with the device synchronized at both ends. The loss is kept on the device during an epoch (reading
it every step would stall the GPU) and shown on the progress bar every ``log_every`` steps.

``--graph`` replays each full-size step from a CUDA graph (``graph_step.py``); batches are padded to
the smallest bucket that fits and a short last batch runs eagerly. The tilewise backend pads to the
same buckets by default: its Triton GEMMs autotune once per shape.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from .._files import write_atomic
from .._startup import prefetch_triton_key, raise_if_interrupted
from ..nn import functional as twf
from ..nn.classifier import SentimentClassifier
from . import checkpoint, datacache, dataset, ddp, plot
from .adamw import AdamW
from .config import (EVAL_BATCH_SIZE, LR_SCHEDULES, TrainConfig, check_options, default_buckets,
                     resolve_device_backend)
from .graph_step import GraphedStep

if TYPE_CHECKING:
    from .plot import Plotter
    from .prewarm import Prewarm

# --------------------------------------------------------------------------- schedule and weight average


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


def group_lrs(cfg: TrainConfig, epoch: int, step: int, total_steps: int) -> tuple[float, float]:
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


class EMA:
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


# --------------------------------------------------------------------------- one step, evaluation


def eager_step(model, opt, batch: dataset.Batch, set_to_none: bool = True, fwd=None) -> torch.Tensor:
    """One step. ``fwd``: what runs the forward (the DistributedDataParallel wrapper under
    torchrun, whose backward averages the gradients over the processes); default the model."""
    # With captured graphs the .grad tensors must stay: the graphs hold their addresses.
    opt.zero_grad(set_to_none=set_to_none)
    loss = model.loss((fwd or model)(batch.ids, batch.lengths), batch.labels)
    loss.backward()
    opt.step()
    return loss.detach()


@torch.no_grad()
def evaluate(model: SentimentClassifier, data: dataset.EncodedSplit, batch_size: int = EVAL_BATCH_SIZE,
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- set-up


_DATA_CACHE: dict = {}


def _load_data(data_dir, download: bool) -> dict:
    """SST-2's splits, kept for the process while the files are unchanged: a sweep calls ``train``
    many times in one process, and reading and tokenizing the TSVs each time would cost more than
    a graphed epoch."""
    d = dataset.find_data_dir(data_dir, download=download)
    key = (str(d.resolve()),) + tuple((f.stat().st_mtime_ns, f.stat().st_size)
                                      for f in (d / "train.tsv", d / "dev.tsv") if f.is_file())
    if _DATA_CACHE.get("key") != key:
        _DATA_CACHE.clear()
        _DATA_CACHE.update(key=key, data=dataset.load_sst2(d), encoded={})
    return _DATA_CACHE["data"]


def _vocab(data: dict, min_count: int) -> dataset.Vocab:
    """The training split's vocabulary, kept per min_count for the cached data."""
    cache = _DATA_CACHE.setdefault("vocab", {}) if _DATA_CACHE.get("data") is data else {}
    if min_count not in cache:
        cache[min_count] = dataset.Vocab.build(data["train"].tokens, min_count=min_count)
    return cache[min_count]


def _encoded(data: dict, vocab: dataset.Vocab, max_len: int):
    """(train, dev) EncodedSplits of ``data``, kept for the last (vocabulary, max_len) of the cached data."""
    enc = _DATA_CACHE.get("encoded") if _DATA_CACHE.get("data") is data else None
    key = (tuple(vocab.itos), max_len)
    if enc is not None and key in enc:
        return enc[key]
    pair = (dataset.EncodedSplit(data["train"], vocab, max_len=max_len),
            dataset.EncodedSplit(data["dev"], vocab, max_len=max_len))
    if enc is not None:
        enc.clear()
        enc[key] = pair
    return pair


def _splits(cfg: TrainConfig, vocab: dataset.Vocab | None = None):
    """(vocabulary, train, dev, dev token coverage) for ``cfg``: from the on-disk cache (datacache)
    when the vocabulary is built from the data (not a resumed run's), else from the TSVs (then stored)."""
    path = None
    if vocab is None:
        path = datacache.path_for(dataset.find_data_dir(cfg.data_dir, download=cfg.download), cfg.min_count,
                                  cfg.max_len)
        memo = _DATA_CACHE.setdefault("stored", {})  # a sweep's later runs: the same objects, no reload
        hit = memo.get(path) or datacache.load(path)
        if hit is not None:
            memo.clear()
            memo[path] = hit
            return hit
    data = _load_data(cfg.data_dir, cfg.download)
    vocab = vocab if vocab is not None else _vocab(data, cfg.min_count)
    train_set, dev_set = _encoded(data, vocab, cfg.max_len)
    out = (vocab, train_set, dev_set, vocab.coverage(data["dev"].tokens))
    if path is not None:
        datacache.save(path, *out)
    return out


def _embedding_init(cfg: TrainConfig, vocab: dataset.Vocab, notes: list[str]) -> torch.Tensor | None:
    if cfg.embedding_init == "random":
        return None
    if cfg.embedding_init != "glove":
        raise ValueError(f"--embedding-init must be glove or random, got {cfg.embedding_init!r}")
    from . import glove

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


def _optimizer(model: SentimentClassifier, cfg: TrainConfig, device) -> tuple[Any, bool]:
    """AdamW over two groups (the embedding table, the rest), and whether their lrs are device
    tensors (what a captured step must read when the lrs change between steps)."""
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
    # capturable: the step's bookkeeping stays on the device, which a captured graph needs.
    adamw = AdamW if cfg.optimizer == "tilewise" else torch.optim.AdamW
    opt = adamw(groups, lr=groups[1].get("lr", cfg.lr) if tensor_lr else cfg.lr, weight_decay=cfg.weight_decay,
                capturable=cfg.graph)
    return opt, tensor_lr


def _console(cfg):
    from rich.console import Console

    return Console(highlight=False, quiet=not cfg.progress)


# --------------------------------------------------------------------------- train


def train(cfg: TrainConfig, prewarm: Prewarm | None = None, started: float | None = None,
          plotter: Plotter | None = None) -> dict[str, Any]:
    """Train, evaluate each epoch, write metrics.json, loss_curve.png and checkpoint.pt in
    ``cfg.output_dir``; return the metrics. Under torchrun (``torchrun --nproc_per_node N -m
    tilewise train ...``) it trains data-parallel with DistributedDataParallel: each process takes
    every N-th batch of the same shuffled order, gradients are averaged, and rank 0 evaluates and
    writes the outputs (the others return its metrics' shape with their own losses).

    ``metrics["startup"]``: ``setup_s``, seconds from this call to the first optimizer step's start
    (data, model, GloVe, graphs set up), and ``first_step_s``, that step's seconds with the device
    synchronized (its compiles, autotuning and graph capture); None when no step ran. ``prewarm``:
    the kernels' background compile the CLI started (``prewarm.start_early``), joined before the
    first step. ``started``: the ``time.perf_counter()`` that ``setup_s`` counts from (the CLI's
    start, before torch's import); default: this call. ``plotter``: loss_curve.png's child
    (``plot.Plotter``, started by the CLI), else the figure is drawn in this process."""
    started = time.perf_counter() if started is None else started
    try:
        cfg, dist, dist_notes = ddp.init_distributed(cfg)
        try:
            with contextlib.ExitStack() as held:  # the output directory's lock
                return _train(cfg, dist, dist_notes, held, started, prewarm, plotter)
        finally:
            ddp.shutdown(dist)
    finally:
        if prewarm is not None:  # a run that failed before its first step stops the children (else: joined)
            prewarm.cancel()


def _train(cfg: TrainConfig, dist: ddp.Dist | None, dist_notes: list[str], held: contextlib.ExitStack,
           started: float, prewarm: Prewarm | None = None, plotter: Plotter | None = None) -> dict[str, Any]:
    check_options(cfg)
    device, backend, notes = resolve_device_backend(cfg)
    if backend == "tilewise" and device.type == "cuda":
        prefetch_triton_key()  # while the data and the model are set up
    if cfg.graph is None:  # auto: every op of the step is capturable, so a GPU replays graphs
        cfg = replace(cfg, graph=device.type == "cuda")
        if cfg.graph:
            notes.append("each step is replayed from a CUDA graph (--no-graph runs it eagerly)")
    notes = dist_notes + notes
    rank, world = (dist.rank, dist.world_size) if dist is not None else (0, 1)
    lead = rank == 0  # prints, evaluates and writes
    con = _console(cfg)
    out = Path(cfg.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise checkpoint.OutputDirError(f"cannot create output directory {out} ({e.strerror or e})") from e
    if lead:  # before any data is read or step taken
        checkpoint.claim_output_dir(out, held)
    torch.manual_seed(cfg.seed)

    ckpt_path = out / checkpoint.CHECKPOINT_NAME
    ckpt = None
    if cfg.resume:
        if not ckpt_path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt_path}")
        ckpt = checkpoint.read_resumable(ckpt_path)
    vocab, train_set, dev_set, coverage = _splits(cfg, dataset.Vocab(ckpt["vocab"]) if ckpt is not None else None)
    notes.append(f"SST-2: {len(train_set)} train / {len(dev_set)} dev sentences, vocabulary {len(vocab)} "
                 f"(min count {cfg.min_count}), dev token coverage {100 * coverage:.1f}%")

    init = None if ckpt is not None else _embedding_init(cfg, vocab, notes)
    model = SentimentClassifier(len(vocab), cfg.embed_dim, cfg.hidden, 2, cfg.dropout, backend,
                                padding_idx=vocab.pad_id, embedding_init=init,
                                embed_dropout=cfg.embed_dropout).to(device)
    opt, tensor_lr = _optimizer(model, cfg, device)
    gen = torch.Generator().manual_seed(cfg.seed)
    # Word dropout draws on the device the batches are made on, from its own seeded stream.
    word_gen = torch.Generator(device=device).manual_seed(cfg.seed + 1) if cfg.word_dropout > 0 else None
    ema = EMA(model, cfg.ema) if cfg.ema > 0 else None
    history: list[dict] = []
    step_losses: list[float] = []
    start_epoch = 0
    if ckpt is not None:
        history, step_losses, start_epoch = checkpoint.restore_training_state(
            ckpt, ckpt_path, cfg, model=model, opt=opt, gen=gen, word_gen=word_gen, ema=ema, device=device,
            tensor_lr=tensor_lr, notes=notes)
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
        buckets = default_buckets(cfg.max_len)
        notes.append(f"batches padded to the bucket lengths {buckets}")
        con.print(notes[-1])
    if prewarm is not None:  # the kernels' background compile (prewarm.py): joined before the first step
        notes.append(prewarm.wait())
        con.print(notes[-1])
    graphed = GraphedStep(model, opt, cfg.batch_size, buckets, device) if cfg.graph else None
    fwd = ddp.wrap(model, dist, device)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # Each process takes every world-th batch of the same shuffled order, and all take the same
    # number of steps (a process with one more would wait in its all-reduce for ever).
    steps_per_epoch = train_set.num_batches(cfg.batch_size) // world
    if cfg.max_steps is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.max_steps)
    total_steps = steps_per_epoch * cfg.epochs
    scheduled = cfg.lr_schedule != "constant" or cfg.freeze_embeddings_epochs > 0
    startup: dict[str, float] | None = None
    model.train()
    with Progress(TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} ex/s"),
                  TimeRemainingColumn(), console=con, disable=not cfg.progress) as bar:
        for epoch in range(start_epoch, cfg.epochs):
            task = bar.add_task("train", total=steps_per_epoch, epoch=epoch + 1, loss="-", rate="-")
            losses: list[torch.Tensor] = []
            examples = 0
            sync(device)
            t0 = time.perf_counter()
            for step, b in enumerate(train_set.batches(cfg.batch_size, shuffle=True, generator=gen,
                                                       buckets=buckets, device=device, shard=(rank, world),
                                                       word_dropout=cfg.word_dropout, dropout_generator=word_gen)):
                if step >= steps_per_epoch:
                    break
                raise_if_interrupted()  # a Ctrl-C swallowed where it landed (_startup.latched_interrupts)
                if scheduled:
                    _set_lrs(opt, group_lrs(cfg, epoch, epoch * steps_per_epoch + step, total_steps))
                first = startup is None
                if first:
                    first_at = time.perf_counter()
                if graphed is not None and b.ids.shape[0] == cfg.batch_size:
                    loss = graphed(b).detach().clone()
                else:
                    loss = eager_step(model, opt, b, set_to_none=graphed is None, fwd=fwd)
                if first:  # one sync, so that the first step's time is its own (compiles, autotune, capture)
                    sync(device)
                    startup = {"setup_s": first_at - started, "first_step_s": time.perf_counter() - first_at}
                    con.print(f"start-up: {startup['setup_s']:.2f} s to the first step, which took "
                              f"{startup['first_step_s']:.2f} s")
                if ema is not None:
                    ema.update()
                losses.append(loss)
                examples += b.ids.shape[0]
                if (step + 1) % cfg.log_every == 0 or step + 1 == steps_per_epoch:
                    rate = examples / max(1e-9, time.perf_counter() - t0)
                    bar.update(task, completed=step + 1, loss=f"{loss.item():.4f}", rate=f"{rate:,.0f}")
            sync(device)
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
                checkpoint.save_checkpoint(ckpt_path, model=model, opt=opt, epoch=epoch + 1,
                                           rng=checkpoint.rng_state(gen, device, word_gen), history=history,
                                           step_losses=step_losses, ema=ema, vocab=vocab, cfg=cfg)

    metrics = {
        "config": asdict(cfg), "device": str(device), "backend": backend,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "ops": twf.report() if backend == "tilewise" else {}, "notes": notes, "vocab_size": len(vocab),
        "epochs": history, "step_losses": step_losses,
        # Chosen on dev, which is also what is reported: GLUE's test labels are hidden.
        "best_dev_accuracy": max((h["dev_accuracy"] for h in history), default=None),
        "best_epoch": max(history, key=lambda h: h["dev_accuracy"])["epoch"] if history else None,
        "final_dev_accuracy": history[-1]["dev_accuracy"] if history else None,
        "torch": torch.__version__, "world_size": world, "startup": startup,
        "bytecode_prefix": sys.pycache_prefix,  # where this run read Python bytecode (tilewise._bytecode)
    }
    if not lead:
        return metrics
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2).encode())
    if cfg.plot:  # without a child (none started, or it is gone) the Plotter draws in this process
        (plotter or plot.Plotter(None)).write(step_losses, history, out / "loss_curve.png")
    return metrics
