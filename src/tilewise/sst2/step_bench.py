"""A training step apart from a training run, for the ``train_step`` bench suite and experiments:
the model and AdamW as ``train`` builds them, a step function per mode (eager, ``torch.compile``,
one CUDA graph), synthetic SST-2-shaped batches (no dataset needed), kernels counted per step and
steps timed."""

from __future__ import annotations

import time

import torch

from ..nn.classifier import SentimentClassifier
from . import dataset
from .adamw import AdamW
from .config import OPTIMIZERS, SST2_VOCAB
from .graph_step import GraphedStep
from .loop import eager_step, sync

STEP_MODES = ("eager", "compile", "graph")


def synthetic_batches(n_batches: int, batch_size: int = 64, seq_len: int = 64, vocab_size: int = SST2_VOCAB,
                      num_classes: int = 2, *, pad_id: int = 0, min_len: int = 1, seed: int = 0,
                      device="cpu") -> list[dataset.Batch]:
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
    return [dataset.Batch(ids[i], lengths[i], labels[i]) for i in range(n_batches)]


def step_model(backend: str, mode: str, *, vocab_size: int = SST2_VOCAB, embed_dim: int = 50, hidden: int = 256,
               num_classes: int = 2, dropout: float = 0.3, lr: float = 1e-3, weight_decay: float = 0.01,
               seed: int = 0, device="cuda", optimizer: str = "torch"):
    """(model in train mode, AdamW) as ``train`` builds them; one ``seed`` gives every backend and
    mode the same initial weights. AdamW is ``capturable`` for ``mode="graph"``. ``optimizer``: "torch"
    (default: torch.optim's for every backend, so the step rows compare the backends' kernels) or
    "tilewise" (``sst2.adamw.AdamW``, ``train``'s default: the same update without the import of
    torch._dynamo that constructing a torch.optim optimizer makes, seconds at start-up)."""
    if mode not in STEP_MODES:
        raise ValueError(f"step_model: mode must be one of {STEP_MODES}, got {mode!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"step_model: optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    torch.manual_seed(seed)
    model = SentimentClassifier(vocab_size, embed_dim, hidden, num_classes, dropout, backend).to(device)
    model.train()
    adamw = AdamW if optimizer == "tilewise" else torch.optim.AdamW
    opt = adamw(model.parameters(), lr=lr, weight_decay=weight_decay, capturable=(mode == "graph"))
    return model, opt


def build_step(model, opt, mode: str, *, batch_size: int, seq_len: int, device, keep_graph: bool = False):
    """A function ``step(batch) -> loss`` running one training step (zero grads, forward, backward,
    AdamW) of ``model`` for batches of (batch_size, seq_len).

    mode "eager"; "compile": ``torch.compile`` (default mode) of forward + loss, AdamW eager;
    "graph": the whole step captured in a CUDA graph on the first call, replayed from static input
    buffers (the returned loss is the graph's static output: clone it to keep it). ``step.graphed``
    is the ``GraphedStep`` for mode "graph", else None.
    """
    if mode not in STEP_MODES:
        raise ValueError(f"build_step: mode must be one of {STEP_MODES}, got {mode!r}")
    dev = torch.device(device)
    graphed = None
    if mode == "graph":
        graphed = GraphedStep(model, opt, batch_size, (seq_len,), dev, keep_graph=keep_graph)

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
            return eager_step(model, opt, b)
    step.graphed = graphed
    return step


def count_step_kernels(step, batch, device="cuda") -> dict[str, int]:
    """GPU work one ``step(batch)`` puts on the device, from the profiler (CUPTI): kernels, and
    memcpy / memset operations apart. Kernels replayed from a CUDA graph are counted one by one."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device)
    sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(batch)
        sync(dev)
    out = {"kernels": 0, "memcpy": 0, "memset": 0}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.lower()
        key = "memcpy" if "memcpy" in name else "memset" if "memset" in name else "kernels"
        out[key] += 1
    return out


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
    sync(dev)
    t0 = time.perf_counter()
    for i in range(steps):
        step(batches[i % n_batches])
    sync(dev)
    secs = time.perf_counter() - t0
    out = {"ms_per_step": 1e3 * secs / steps, "examples_per_second": steps * batch_size / secs}
    if count_kernels:
        out["kernels_per_step"] = count_step_kernels(step, batches[0], dev)["kernels"]
    return out
