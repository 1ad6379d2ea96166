"""``tilewise train --prewarm``: the classifier's kernels compiled in child processes, side by side,
while the run reads its data and builds its model, so its first steps find them in the caches.

The model's step is split into pieces whose kernels are disjoint (``CLASSIFIER_TASKS``: the embedding,
the first linear layer + ReLU, the pooling + output layer + loss), each run by ``python -m
tilewise.warmup --task train.<piece>`` through the same ``nn.functional`` entry points the model calls,
at every padded shape the default run uses. A marker file in the kernel cache says when a run can
skip it."""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
import time
from functools import partial
from pathlib import Path
from typing import Sequence

import torch
import triton

from .. import settings, verify
from ..nn import functional as twf
from .._files import write_atomic
from .._jobs import Task, default_jobs, jobs_for, run_jobs, triton_cache_dir
from .config import EVAL_BATCH_SIZE, SST2_VOCAB, TrainConfig, default_buckets

PARTS = ("embedding", "fc1", "head")


def _classifier_part(part: str) -> None:
    """One piece of the SST-2 classifier's step through the entry points its forward calls
    (nn/classifier.py), at every padded shape ``tilewise train`` runs with its default config:
    training batches forward and backward, evaluation batches forward. The pieces' kernels are
    disjoint, so three processes compile (and the GEMMs autotune) side by side what one step would
    do in turn. part: "embedding", "fc1" (linear + ReLU), "head" (pooling, output layer, loss)."""
    if part not in PARTS:
        raise ValueError(f"_classifier_part: part must be one of {PARTS}, got {part!r}")

    cfg, dev = TrainConfig(), torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    E, H, V = cfg.embed_dim, cfg.hidden, SST2_VOCAB

    def rand(*shape, grad=True):
        return torch.randn(*shape, device=dev, generator=g).requires_grad_(grad)

    w_emb, w1, b1, w2, b2 = rand(V, E), rand(H, E), rand(H), rand(2, H), rand(2)
    buckets = default_buckets(cfg.max_len)
    shapes = [(cfg.batch_size, T, True) for T in buckets] + [(EVAL_BATCH_SIZE, T, False) for T in buckets]
    for B, T, grad in shapes:
        with torch.set_grad_enabled(grad):
            if part == "embedding":
                y = twf.embedding(torch.randint(1, V, (B, T), device=dev, generator=g), w_emb, padding_idx=0)
            elif part == "fc1":
                y = twf.linear(rand(B, T, E, grad=grad), w1, b1, activation="relu")
            else:
                lengths = torch.randint(1, T + 1, (B,), device=dev, generator=g)
                logits = twf.linear(twf.masked_mean(rand(B, T, H, grad=grad), lengths), w2, b2)
                y = twf.cross_entropy(logits, torch.randint(0, 2, (B,), device=dev, generator=g))
            if grad:
                y.backward(torch.randn_like(y))
    if part == "head":
        twf.check_targets(dev)
    torch.cuda.synchronize()


CLASSIFIER_TASKS: tuple[Task, ...] = tuple(
    Task(f"train.{part}", "train", f"the classifier's {what} at the default run's shapes",
         partial(_classifier_part, part))
    for part, what in (("embedding", "embedding"), ("fc1", "first layer + ReLU"), ("head", "pooling, output, loss")))


def prewarm_marker(device_name: str) -> Path:
    """The file whose presence says the classifier's pieces were warmed into these caches: named by
    a hash over what would make them compile again (the GPU sources' sizes and times, Triton's and
    PyTorch's versions, the device, the Triton cache folder)."""
    h = hashlib.sha256()
    for f in verify.gpu_sources():
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    h.update(f"{triton.__version__}|{torch.__version__}|{device_name}|{triton_cache_dir()}".encode())
    return settings.cache_dir() / "warm" / f"train-{h.hexdigest()[:24]}.json"


class Prewarm:
    """The classifier's pieces (``CLASSIFIER_TASKS``) compiling in child processes while the run
    reads its data and builds its model; ``wait()`` joins them before the first step. A piece that
    fails costs nothing but time: the step compiles what is missing itself."""

    def __init__(self, marker: Path, n_jobs: int | None = None, tasks: Sequence[Task] = CLASSIFIER_TASKS):
        self.marker, self.t0 = marker, time.perf_counter()
        n = n_jobs or min(default_jobs(), len(tasks))
        self._results: list = []
        # A daemon thread: a run that fails before wait() exits at once (the children finish on their own).
        self._thread = threading.Thread(target=lambda: self._results.extend(run_jobs(jobs_for(tasks), n)),
                                        name="tilewise prewarm", daemon=True)
        self._thread.start()

    def wait(self) -> str:
        """Join the pieces; one line saying what they did (the run prints it)."""
        self._thread.join()
        results = self._results
        if not results:
            return "kernel warm-up: the pieces gave no result; the first steps compile what they need"
        secs = time.perf_counter() - self.t0
        failed = [r for r in results if not r.ok]
        if failed:
            first = failed[0].error.splitlines()[-1] if failed[0].error else "no message"
            return (f"kernel warm-up: {', '.join(r.name for r in failed)} failed ({first}); the first steps "
                    f"compile what is missing")
        try:
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.marker, json.dumps({"tasks": [r.name for r in results]}).encode())
        except OSError:
            pass  # a read-only cache: the next run warms again
        return (f"kernel warm-up: {len(results)} pieces of the model compiled side by side in {secs:.1f} s, "
                f"beside the run's own start-up")


def import_in_background(name: str) -> threading.Thread:
    """Import module ``name`` in a daemon thread, started now: a later ``import`` of it waits for this
    one (Python's per-module import lock) instead of doing the work then. For ``torch._dynamo``, which
    AdamW's constructor imports on its first call: 3.8 s of the classifier's 7.9 s warm start on the
    H200's host (research/cold_start_profile.py), here overlapping the data's reading. A failure is
    left to that later import to raise."""
    th = threading.Thread(target=_quiet_import, args=(name,), name=f"import {name}", daemon=True)
    th.start()
    return th


def _quiet_import(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - the import that needs the module raises it again, in its own thread
        pass


def start_prewarm(device_name: str) -> Prewarm | None:
    """A ``Prewarm`` of the classifier's pieces, or None when these caches already hold them."""
    marker = prewarm_marker(device_name)
    return None if marker.exists() else Prewarm(marker)


def start_for_run(cfg: TrainConfig, backend: str, device: torch.device, dist) -> tuple[Prewarm | None, str | None]:
    """For ``tilewise train --prewarm``: (a running ``Prewarm`` or None, a note for the run's log). The
    pieces run the default model's shapes, so another shape, backend or device skips them and says why."""
    if backend != "tilewise" or device.type != "cuda" or dist is not None:
        return None, "--prewarm: skipped (it warms the tilewise backend's kernels for one GPU process)"
    default = TrainConfig()
    fields = ("batch_size", "embed_dim", "hidden", "max_len")
    if any(getattr(cfg, f) != getattr(default, f) for f in fields) or \
            cfg.buckets not in (None, default_buckets(default.max_len)):
        return None, ("--prewarm: skipped (it warms the default model shape: --batch-size, --hidden, "
                      "--max-len and --buckets as their defaults)")
    pw = start_prewarm(torch.cuda.get_device_name(device))
    return pw, None if pw is not None else "--prewarm: the kernel caches already hold this model's kernels"
