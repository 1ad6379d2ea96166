"""A run's files: the lock on its output directory, the checkpoint it writes after every epoch
(model, optimizer, RNG states, history, vocabulary, config), and loading one back, to resume or to
predict.

Every file is written whole or not at all (``write_atomic``). Checkpoints load with
``weights_only`` (tensors and plain data): a file that would need other objects, which could run
code when unpickled, is refused with a CheckpointError naming it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from .._files import LockUnavailable, exclusive_lock, write_atomic
from ..nn.classifier import SentimentClassifier
from .config import TrainConfig, resolve_device_backend
from .dataset import Vocab


class CheckpointError(ValueError):
    """A file that is not a tilewise checkpoint, or one that would need more than tensors and plain
    data to load (unpickling anything else can run code)."""


class OutputDirError(RuntimeError):
    """The output directory cannot be created or written, or another run holds it."""


LOCK_NAME = "train.lock"
CHECKPOINT_NAME = "checkpoint.pt"
_OUTPUTS = (CHECKPOINT_NAME, "metrics.json", "loss_curve.png")
_PROBE = ".write-check"
_CKPT_KEYS = ("model", "vocab", "config")
_RESUME_KEYS = _CKPT_KEYS + ("optimizer", "epoch", "rng", "history", "step_losses")


# --------------------------------------------------------------------------- the output directory


def claim_output_dir(out: Path, held: contextlib.ExitStack) -> None:
    """Lock ``out`` for this run (held until ``held`` closes; a second run into it fails at once),
    check that files can be created in it, and remove temporary files that killed runs left."""
    try:
        held.enter_context(exclusive_lock(out / LOCK_NAME, wait=False, create=True))
    except BlockingIOError:
        raise OutputDirError(f"output directory {out} is in use by another training run (it holds "
                             f"{out / LOCK_NAME}); wait for it or choose another --output-dir") from None
    except LockUnavailable as e:
        raise OutputDirError(f"cannot lock output directory {out} ({e.strerror})") from e
    except OSError as e:
        raise OutputDirError(f"output directory {out} is not writable ({e.strerror})") from e
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


# --------------------------------------------------------------------------- writing


def rng_state(gen: torch.Generator, device, word_gen: torch.Generator | None = None) -> dict:
    """The random streams a resumed run must continue: the shuffle's, PyTorch's CPU and CUDA ones
    (dropout), and word dropout's when it is on."""
    st = {"shuffle": gen.get_state(), "cpu": torch.get_rng_state()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    if word_gen is not None:
        st["words"] = word_gen.get_state()
    return st


def save_checkpoint(path: Path, *, model, opt, epoch: int, rng: dict, history: list, step_losses: list,
                    ema, vocab: Vocab, cfg: TrainConfig) -> None:
    """Write the state after ``epoch`` (1-based) epochs, replacing ``path`` atomically."""
    # Plain data only (the config through JSON): loadable with weights_only.
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch,
             "rng": rng, "history": history, "step_losses": step_losses,
             "ema": ema.state_dict() if ema is not None else None,
             "vocab": list(vocab.itos), "config": json.loads(json.dumps(asdict(cfg)))}
    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(path, buf.getbuffer())


# --------------------------------------------------------------------------- reading


def read_checkpoint(path: Path, keys: Sequence[str] = _CKPT_KEYS) -> dict:
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


def read_resumable(path: Path) -> dict:
    """A checkpoint with everything ``--resume`` continues from (see ``read_checkpoint``)."""
    return read_checkpoint(path, _RESUME_KEYS)


def restore_training_state(ck: dict, path: Path, cfg: TrainConfig, *, model, opt, gen: torch.Generator,
                           word_gen: torch.Generator | None, ema, device, tensor_lr: bool,
                           notes: list[str]) -> tuple[list, list, int]:
    """Load a resumable checkpoint ``ck`` (read from ``path``) into this run's model, optimizer,
    random streams and weight average; this run's lr and weight decay apply from here on. Returns
    (history, step_losses, epochs done); adds what changed to ``notes``."""
    try:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        why = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"--resume: {path} does not fit this model and optimizer ({why}); resume "
                              "with the options it was trained with") from e
    # The checkpoint may come from a run with(out) --graph: capturable AdamW keeps its step
    # counters on the device, the plain one on the CPU. Its groups also carry the old run's
    # lr and weight decay: this run's options apply (a schedule sets the lrs again each step).
    base_lrs = (cfg.lr if cfg.embedding_lr is None else cfg.embedding_lr, cfg.lr)
    for grp, lr in zip(opt.param_groups, base_lrs):
        grp["capturable"] = cfg.graph
        grp["weight_decay"] = cfg.weight_decay
        grp["lr"] = torch.tensor(lr, dtype=torch.float32, device=device) if tensor_lr else lr
    old = ck["config"] if isinstance(ck["config"], dict) else {}
    changed = [f"{k} {old[k]} -> {getattr(cfg, k)}" for k in ("lr", "embedding_lr", "weight_decay")
               if k in old and old[k] != getattr(cfg, k)]
    if changed:
        notes.append(f"--resume: {', '.join(changed)} from epoch {int(ck['epoch']) + 1} on")
    for st in opt.state.values():
        if "step" in st and torch.is_tensor(st["step"]):
            st["step"] = st["step"].to(device if cfg.graph else "cpu", torch.float32)
    rng = ck["rng"]
    gen.set_state(rng["shuffle"])
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)
    if word_gen is not None and "words" in rng:
        word_gen.set_state(rng["words"])
    if ema is not None and ck.get("ema") is not None:
        ema.load_state_dict(ck["ema"])
    history, step_losses, start_epoch = ck["history"], ck["step_losses"], ck["epoch"]
    notes.append(f"resumed from {path} after epoch {start_epoch}")
    return history, step_losses, start_epoch


def load_checkpoint(path: str | Path, device: str = "auto", backend: str = "auto"):
    """(model in eval mode, vocab, config dict) from a checkpoint ``train`` wrote."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    ck = read_checkpoint(path)
    c = ck["config"]
    dev, be, _ = resolve_device_backend(TrainConfig(device=device, backend=backend))
    try:
        vocab = Vocab(ck["vocab"])
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
