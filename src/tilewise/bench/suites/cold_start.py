"""cold_start: seconds to the first result in a fresh process, with empty kernel caches and warm ones.

Every measurement is a child Python process (``settings.child_environment``) whose
TILEWISE_CACHE_DIR and TRITON_CACHE_DIR point into a new temporary folder: the first run finds
them empty ("empty caches"), the next WARM_RUNS find what it compiled ("warm caches", the median
reported). The clock starts in the child before its first import (torch, tilewise) and stops once
the first result is on the host (device synchronized): imports, NVRTC and Triton compiles (or
cache loads), Triton autotuning and CUDA-graph capture are all in it. The same is measured for
what a user would run instead, with its own fresh caches:

    classifier_step          the SST-2 classifier built as ``tilewise train`` builds it (model,
                             AdamW, graph mode) and its first training step on a synthetic batch
                             of 64 x 64: the tilewise backend with train's default optimizer
                             (``tilewise_adamw``) vs the torch backend with torch.optim's. Older
                             rows named ``tilewise`` timed torch.optim's AdamW for both, and with it
                             an import of torch._dynamo that train does not make (docs/design.md,
                             "Start-up")
    flash_attention_fwd_bwd  tilewise.flash_attention forward + backward at a Llama-like shape
                             vs F.scaled_dot_product_attention
    train_100_steps          ``tilewise train --data-dir DIR --epochs 1 --max-steps 100
                             --embedding-init random`` (only when TILEWISE_SST2_DIR names the
                             data): the process's wall time, and the seconds to the end of its
                             first step (the child's imports + the ``startup`` that train records
                             in metrics.json, counted from the CLI's start: torch's import in it); the
                             tilewise backend with train's default optimizer (``tilewise_adamw``) vs
                             the torch backend with torch.optim's. Older rows that left torch's
                             import out say so in their shape (docs/design.md, "Start-up").

Rows: op ``cold_start``; shape "<case> <sizes>: <what>, empty caches" (or warm caches); variant
``tilewise`` against the baseline's row of the same shape (``torch`` or ``torch_sdpa``);
median_ms is the seconds x 1000. Full bench only: a run takes minutes (cold compiles in child
processes), so ``run`` returns at once under ``tilewise bench --quick``. Each child prints one JSON
line with its timings; a child that fails raises ``ChildError`` with its stderr's tail (reported
with the others as the suite's failure, after the cases that ran have added their rows).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ... import settings
from ..harness import CheckError

OP = "cold_start"
WARM_RUNS = 3
CHILD_TIMEOUT_S = 1200.0
STDERR_TAIL = 2000
# The classifier's batch (train_step's sizes); V is sst2.config.SST2_VOCAB, written out because what this
# module imports is timed in every child, and importing tilewise.sst2 would weigh on the attention case.
B, T, V = 64, 64, 14819
ATTN = dict(B=1, H=32, Hkv=8, S=2048, D=128)  # Llama-3-8B-like heads, one 2k sequence
# Random embeddings: GloVe's extract is kept in the tilewise cache folder, so with GloVe an empty cache
# would also time rebuilding it (and the GloVe package is not on every GPU machine).
TRAIN_ARGS = ("--epochs", "1", "--max-steps", "100", "--embedding-init", "random")
# Each variant's (backend, optimizer), the optimizer spelled out so a row keeps its meaning: tilewise_adamw
# (train's default) with tilewise's AdamW, which skips torch.optim's import of torch._dynamo
CLASSIFIER_VARIANTS = {"torch": ("torch", "torch"), "tilewise_adamw": ("tilewise", "tilewise")}
# The same as train options
TRAIN_VARIANTS = {name: ("--backend", backend, "--optimizer", optimizer)
                  for name, (backend, optimizer) in CLASSIFIER_VARIANTS.items()}


@dataclass(frozen=True)
class Case:
    name: str
    shape: str
    dtype: str
    baseline: str                          # the variant name of the PyTorch path
    measures: tuple[tuple[str, str], ...]  # (what a row reports, the child's JSON key)
    variants: tuple[str, ...] = ("tilewise",)  # ours, each timed beside the baseline


CASES: tuple[Case, ...] = (
    Case("classifier_step", f"B={B} T={T} E=50 H=256 V={V}", "float32", "torch",
         (("build + first step", "first_s"),), ("tilewise_adamw",)),
    Case("flash_attention_fwd_bwd", "B={B} H={H} Hkv={Hkv} S={S} D={D} causal".format(**ATTN), "bfloat16",
         "torch_sdpa", (("forward + backward", "first_s"),)),
    Case("train_100_steps", " ".join(TRAIN_ARGS), "float32", "torch",
         (("wall", "process_s"), ("to the first step's end", "first_s")), ("tilewise_adamw",)),
)

# The child: the clock starts before any import.
_CHILD = ("import time; t0 = time.perf_counter(); import sys; from tilewise.bench.suites import cold_start; "
          "sys.exit(cold_start.child_main(t0, sys.argv[1:]))")


class ChildError(RuntimeError):
    """A child process failed or printed no result; the message holds its stderr's tail."""


# --------------------------------------------------------------------------- the child


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _child_classifier(backend: str, t0: float, extra: Sequence[str]) -> dict:
    import torch

    from ...sst2 import step_bench

    t_imp = time.perf_counter()
    dev = torch.device("cuda")
    model_backend, optimizer = CLASSIFIER_VARIANTS[backend]
    model, opt = step_bench.step_model(model_backend, "graph", vocab_size=V, device=dev, optimizer=optimizer)
    step = step_bench.build_step(model, opt, "graph", batch_size=B, seq_len=T, device=dev)
    batch = step_bench.synthetic_batches(1, B, T, V, device=dev)[0]
    _sync()
    t_built = time.perf_counter()
    loss = float(step(batch))  # the host read waits for the step
    t1 = time.perf_counter()
    return {"imports_s": t_imp - t0, "build_s": t_built - t_imp, "step_s": t1 - t_built, "first_s": t1 - t0,
            "loss": loss}


def _child_attention(backend: str, t0: float, extra: Sequence[str]) -> dict:
    import torch
    import torch.nn.functional as F

    import tilewise

    t_imp = time.perf_counter()
    b, h, hkv, s, d = (ATTN[k] for k in ("B", "H", "Hkv", "S", "D"))
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    if backend == "tilewise":
        o = tilewise.flash_attention(q, k, v, causal=True)
    else:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    o.backward(do)
    _sync()
    t1 = time.perf_counter()
    return {"imports_s": t_imp - t0, "first_s": t1 - t0}


def _child_train(backend: str, t0: float, extra: Sequence[str]) -> dict:
    from ... import cli
    from ...sst2 import commands  # noqa: F401 - the options (torch is imported in the run, inside setup_s)

    data_dir, out_dir = extra
    t_imp = time.perf_counter()
    code = cli.main(["train", "--data-dir", data_dir, *TRAIN_ARGS, *TRAIN_VARIANTS[backend], "--output-dir", out_dir,
                     "--no-progress"])
    if code != 0:
        raise SystemExit(f"tilewise train exited with status {code}")
    startup = json.loads((Path(out_dir) / "metrics.json").read_text())["startup"]
    return {"imports_s": t_imp - t0, **startup,
            "first_s": t_imp - t0 + startup["setup_s"] + startup["first_step_s"],
            "total_s": time.perf_counter() - t0}


_CHILDREN = {"classifier_step": _child_classifier, "flash_attention_fwd_bwd": _child_attention,
             "train_100_steps": _child_train}


def child_main(t0: float, argv: Sequence[str]) -> int:
    """In the child: ``CASE BACKEND [ARGS...]``; prints one JSON line of seconds."""
    case, backend, *extra = argv
    out = _CHILDREN[case](backend, t0, extra)
    print(json.dumps({"cold_start": case, "backend": backend, **out}), flush=True)
    if case == "train_100_steps":  # it ends as `tilewise train` does (cli.run)
        from ... import _startup

        if _startup.skips_teardown():
            _startup.end_process(0)
    return 0


# --------------------------------------------------------------------------- the parent


def child_argv(case: str, backend: str, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-c", _CHILD, case, backend, *extra]


def parse_child(stdout: str, what: str) -> dict:
    """The child's result: its last stdout line that is a JSON object with a ``cold_start`` key
    (other output may come before it). ChildError naming ``what`` when there is none."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and "cold_start" in d:
            return d
    raise ChildError(f"{what}: the child printed no result line; stdout ends: {stdout[-500:]!r}")


def run_child(case: str, backend: str, caches: Path, extra: Sequence[str] = (),
              timeout_s: float = CHILD_TIMEOUT_S) -> dict:
    """One child process with its caches under ``caches``: its JSON result, plus ``process_s`` (the
    process's wall time, from spawn to exit)."""
    what = f"cold_start {case} ({backend})"
    env = settings.child_environment(cache_dir=caches / "tilewise", triton_cache_dir=caches / "triton")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(child_argv(case, backend, extra), env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ChildError(f"{what}: no result within {timeout_s:.0f} s") from None
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        raise ChildError(f"{what}: the child exited with status {p.returncode}; stderr ends:\n"
                         f"{p.stderr[-STDERR_TAIL:]}")
    return {**parse_child(p.stdout, what), "process_s": secs}


def _extra(case: Case, tmp: Path, i: int) -> list[str]:
    if case.name == "train_100_steps":
        return [str(settings.sst2_dir()), str(tmp / f"run{i}")]  # a fresh output folder per run
    return []


def measure_backend(case: Case, backend: str) -> dict:
    """``{"empty": result, "warm": [WARM_RUNS results]}``: one child on new empty caches, then
    WARM_RUNS children on the caches it filled."""
    with tempfile.TemporaryDirectory(prefix="tilewise-cold-start-") as d:
        tmp = Path(d)
        empty = run_child(case.name, backend, tmp / "caches", _extra(case, tmp, 0))
        warm = [run_child(case.name, backend, tmp / "caches", _extra(case, tmp, i + 1)) for i in range(WARM_RUNS)]
    return {"empty": empty, "warm": warm}


def seconds(runs: dict, state: str, key: str) -> float:
    """The empty run's ``key``, or the median of the warm runs'."""
    if state == "empty":
        return float(runs["empty"][key])
    return float(statistics.median(float(w[key]) for w in runs["warm"]))


def measure(r, cases: Sequence[Case]) -> None:
    failures: list[str] = []
    for case in cases:
        got: dict[str, dict] = {}
        for backend in ("torch", *case.variants):  # the baseline first: ours names its time
            r.status(f"cold_start {case.name} {backend}")
            try:
                got[backend] = measure_backend(case, backend)
            except ChildError as e:
                failures.append(str(e))
                r.log(f"  [red]{case.name} {backend} failed[/red]: {str(e)[-600:]}")
                continue
            parts = [f"{label}: empty {seconds(got[backend], 'empty', key):.2f} s, warm "
                     f"{seconds(got[backend], 'warm', key):.2f} s" for label, key in case.measures]
            r.log(f"  cold_start {case.name} {backend}: " + "; ".join(parts) + f" (warm: median of {WARM_RUNS})")
        for label, key in case.measures:
            for state in ("empty", "warm"):
                shape = f"{case.name} {case.shape}: {label}, {state} caches"
                base_ms = None
                if "torch" in got:
                    base_ms = 1e3 * seconds(got["torch"], state, key)
                    r.add(OP, case.baseline, shape, case.dtype, base_ms)
                for ours in case.variants:
                    if ours in got:
                        r.add(OP, ours, shape, case.dtype, 1e3 * seconds(got[ours], state, key),
                              baseline=case.baseline if base_ms is not None else "", baseline_ms=base_ms)
    if failures:
        raise CheckError("cold_start: " + " | ".join(f[-800:] for f in failures))


def cases() -> list[Case]:
    """The cases to run: those ``TILEWISE_BENCH_COLD_START_CASES`` names (default all), train_100_steps
    only where the SST-2 folder is set."""
    chosen = [c.name for c in CASES]
    env = settings.bench_cold_start_cases()
    if env:
        chosen = [n.strip() for n in env.split(",") if n.strip()]
        unknown = sorted(set(chosen) - {c.name for c in CASES})
        if unknown or not chosen:
            raise ValueError(f"{settings.BENCH_COLD_START_CASES}={env!r}: unknown cases {unknown}; "
                             f"known: {', '.join(c.name for c in CASES)}")
    return [c for c in CASES
            if c.name in chosen and (c.name != "train_100_steps" or settings.sst2_dir() is not None)]


def run(r) -> None:
    if r.quick:
        r.log("cold_start: full bench only (child processes with cold compiles take minutes); "
              "skipped under --quick")
        return
    import torch

    if not torch.cuda.is_available():
        r.log("cold_start: no CUDA device; suite skipped")
        return
    if settings.sst2_dir() is None:
        r.log(f"cold_start: train_100_steps needs {settings.SST2_DIR}; skipped")
    measure(r, cases())
