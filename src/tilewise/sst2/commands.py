"""``tilewise train | predict | evaluate``: their options, and what each runs.

    train: loop.train(config_from_args(args)); a missing dataset or an impossible option is a
           message and exit 2; any other failure prints its traceback on stderr and stdout (exit 1).
    predict / evaluate: a checkpoint ``train`` wrote, on sentences or on a labelled split.

``--graph`` captures one whole step (forward, backward, AdamW) per bucket length in a CUDA graph
(``graph_step.py``). It needs a CUDA device; ``tilewise train`` turns it on by default there
(``--no-graph`` runs eagerly; it is off on the CPU and under torchrun).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import settings
from .._startup import end_process
from . import plot, prewarm
from .config import LR_SCHEDULES, OPTIMIZERS, TrainConfig

# torch and the modules that need it are imported where used: `tilewise train` starts its background
# compiles (prewarm.py) before the seconds of torch's import, not after them.

# --------------------------------------------------------------------------- train


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
                   help=f"directory with train.tsv/dev.tsv (default: ${settings.SST2_DIR}, ./.data/sst2, the cache)")
    p.add_argument("--download", action="store_true", help="fetch SST-2 through Hugging Face datasets if not found")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--embedding-lr", type=float, default=None, help="learning rate of the embedding (default: --lr)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer,
                   help="AdamW from torch.optim, or tilewise's (the same update; it skips torch.optim's "
                        "import of torch._dynamo at start-up)")
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
    p.add_argument("--no-prewarm", action="store_true",
                   help="compile the kernels in the first step, not in background processes while the data loads")


# The options that turn a TrainConfig field off: option dest -> field.
_NEGATED = {"no_progress": "progress", "no_plot": "plot", "no_prewarm": "prewarm"}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed ``add_arguments`` options (other attributes of ``args`` are ignored)."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    kw = {}
    for dest, v in vars(args).items():
        name = _NEGATED.get(dest, dest)
        if name in fields:
            kw[name] = not v if dest in _NEGATED else v
    return TrainConfig(**kw)


def train_args(fields: Mapping[str, Any]) -> list[str]:
    """The ``tilewise train`` options that give a TrainConfig these ``fields`` (name -> value), in
    their order: what ``config_from_args`` reads back, e.g. to print the command that reproduces a
    run. Read off ``add_arguments``' parser, so an option added there needs no second table. A None
    value leaves its option out (every such option defaults to None); ValueError for a field no
    option sets."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    # argparse has no public list of a parser's options.
    by_field = {_NEGATED.get(a.dest, a.dest): a for a in p._actions}
    out: list[str] = []
    for name, v in fields.items():
        a = by_field.get(name)
        if a is None:
            raise ValueError(f"train_args: no `tilewise train` option sets {name!r}")
        if isinstance(a, argparse.BooleanOptionalAction):  # --graph / --no-graph; None: the default
            if v is not None:
                out.append(a.option_strings[0 if v else 1])
        elif a.nargs == 0:  # a flag: given when the field is on, or for a --no- flag when it is off
            if bool(v) != (a.dest in _NEGATED):
                out.append(a.option_strings[0])
        elif v is not None:
            out += [a.option_strings[0], ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)]
    return out


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
    code = _main(args)  # cli.main runs it inside _startup.latched_interrupts (loop's steps check it)
    if settings.distributed()[0] > 1:
        end_process(code)
    return code


def _main(args: argparse.Namespace) -> int:
    from rich.console import Console

    started = time.perf_counter()  # start-up counts torch's import, which follows
    _enable_crash_reports()
    cfg = config_from_args(args)
    pre = prewarm.start_early(cfg)  # before torch's import (the children import it alongside)
    # loss_curve.png's child imports matplotlib while the run trains (rank 0 draws under torchrun)
    plotter = plot.Plotter.start() if cfg.plot and settings.distributed()[1] == 0 else None
    # numpy before torch (after the children above have started): torch imports numpy from C++ and turns
    # any exception raised inside that import into a warning, so a Ctrl-C landing there was lost (and
    # torch's NumPy support with it). Imported here, it raises as any import does.
    import numpy  # noqa: F401

    from . import dataset, loop
    from .checkpoint import OutputDirError

    try:
        m = loop.train(cfg, prewarm=pre, started=started, plotter=plotter)
    except (dataset.MissingDataError, ValueError, FileNotFoundError, OutputDirError) as e:
        Console(stderr=True, highlight=False).print(f"tilewise train: {e}", markup=False, soft_wrap=True)
        return 2
    except Exception as e:
        from .glove import GloveUnavailable

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
    finally:
        if plotter is not None:
            plotter.close()  # unused (a failed run, or the child already drew): ended, never left behind
    if not args.no_progress:
        Console(highlight=False).print(f"metrics: {Path(args.output_dir) / 'metrics.json'}; best dev accuracy "
                                       f"{100 * (m['best_dev_accuracy'] or 0):.2f}%")
    return 0


# --------------------------------------------------------------------------- predict / evaluate


LABELS = ("negative", "positive")


def predict(checkpoint: str | Path, sentences: Sequence[str], device: str = "auto",
            backend: str = "auto") -> list[tuple[str, float]]:
    """(class name, its probability) for each sentence (whitespace-tokenized, lower-cased)."""
    import torch

    from . import dataset
    from .checkpoint import load_checkpoint

    model, vocab, _ = load_checkpoint(checkpoint, device, backend)
    dev = next(model.parameters()).device
    split = dataset.Split("input", [s.lower().split() for s in sentences], [0] * len(sentences))
    enc = dataset.EncodedSplit(split, vocab)
    out = []
    with torch.no_grad():
        for b in enc.batches(256, device=dev):
            probs = torch.softmax(model(b.ids, b.lengths).float(), -1)
            p, k = probs.max(-1)
            out += [(LABELS[int(i)], float(q)) for i, q in zip(k.tolist(), p.tolist())]
    return out


def evaluate_checkpoint(checkpoint: str | Path, data_dir: str | None = None, split: str = "dev",
                        device: str = "auto", backend: str = "auto") -> dict[str, float]:
    """Accuracy and mean loss of a checkpoint on a labelled split of SST-2. ``data_dir``: default the
    directory the checkpoint was trained from (its config's data_dir), else the usual search."""
    from . import dataset, loop
    from .checkpoint import load_checkpoint

    model, vocab, c = load_checkpoint(checkpoint, device, backend)
    if data_dir is None and c.get("data_dir") and Path(c["data_dir"]).is_dir():
        data_dir = c["data_dir"]
    data = dataset.load_sst2(data_dir, splits=(split,))[split]
    if any(lab < 0 for lab in data.labels):
        raise ValueError(f"evaluate: the {split} split has no labels (GLUE hides the test labels)")
    enc = dataset.EncodedSplit(data, vocab, max_len=c.get("max_len"))
    return loop.evaluate(model, enc, device=next(model.parameters()).device)


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
    p.add_argument("--data-dir", default=None,
                   help="directory of train.tsv / dev.tsv (default: the one the checkpoint was trained from)")
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
