"""``tilewise warmup``: compile what op families and workloads need into the kernel caches before
their first real call.

A first call pays for NVRTC compiles (tilewise's cache, ``settings.cache_dir()``), Triton compiles
(Triton's cache, ``TRITON_CACHE_DIR``), Triton autotuning (the GEMMs) and CUDA-graph capture. The
caches outlive the process, so running every kernel once ahead of time moves the compiles out of
the run that matters.

Task table: ``FAMILY_TASKS`` (one or more tasks per op family, ``tilewise/ops/<family>``) and
``WORKLOAD_TASKS`` (``train``: what ``tilewise train`` runs with its default config). A task runs
its ops once on small CUDA inputs, forward and backward, at the dtypes and shapes that reach each
kernel the op would pick. Each task runs in its own spawned Python (``python -m tilewise.warmup
--task NAME``, environment from ``settings.child_environment``): compiles in separate processes
run in parallel, where threads would share one GIL and Triton's compile lock. Tasks that autotune
(``alone``) run after the others, one at a time, so their timings are not taken on a CPU busy
with other compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Sequence

from . import settings
from ._startup import prefetch_triton_key
from ._jobs import (STDERR_TAIL, TASK_TIMEOUT_S, Job, Result, Task, child_command, default_jobs,  # noqa: F401
                    jobs_for, run_job, run_jobs, triton_cache_dir)
from .sst2.config import CLASSIFIER_PARTS, SST2_VOCAB, TrainConfig, classifier_tasks, default_buckets

FLOATS = ("float32", "float16", "bfloat16")
HALVES = ("bfloat16", "float16")


# --------------------------------------------------------------------------- what each task runs (in the child)


def _dt(name: str):
    import torch

    return getattr(torch, name)


def _rand(shape, dtype: str, grad: bool = False):
    import torch

    return torch.randn(shape, device="cuda", dtype=_dt(dtype)).requires_grad_(grad)


def _backward(y) -> None:
    # a contiguous gradient of y's dtype, as a loss upstream gives (sum().backward() gives a stride-0 one)
    import torch

    y.backward(torch.randn_like(y))


def _pointwise_cuda(dtype: str) -> None:
    """vector_add, elementwise map / zip, reduce and masked_mean, forward and backward; first every
    kernel of elementwise.cu and reduce.cu for the dtype, each file as one module (a first call
    without this compiles only the kernels it launches: runtime/lazy.py)."""
    import torch

    import tilewise as tw
    from .ops.pointwise import elementwise, reduce

    for m in (elementwise, reduce):
        m._module(_dt(dtype), torch.cuda.current_device()).compile_all()
    tw.vector_add(_rand(4096, dtype), _rand(4096, dtype))
    x, row = _rand((256, 1024), dtype, grad=True), _rand(1024, dtype, grad=True)
    other = _rand((1024, 256), dtype, grad=True)
    y = tw.mul(tw.relu(tw.add(x, row)), other.t())  # a broadcast row, then a transposed operand
    y = tw.add(tw.sum(y, 1, keepdim=True), tw.amax(y, 0)) + tw.mean(y, 0)
    _backward(y)
    h = _rand((64, 64, 256), dtype, grad=True)
    for lengths in (torch.randint(1, 65, (64,), device="cuda"), torch.randint(1, 65, (64,), device="cuda").int()):
        _backward(tw.masked_mean(h, lengths))


def _pointwise_triton() -> None:
    """sigmoid3 (stored and recomputed) and swiglu, forward and backward."""
    import tilewise as tw

    for dtype in FLOATS:
        x = _rand(1 << 16, dtype, grad=True)
        for recompute in (True, False):
            _backward(tw.sigmoid3(x, recompute=recompute))
        _backward(tw.swiglu(_rand((64, 1024), dtype, grad=True), _rand((64, 1024), dtype, grad=True)))


def _transpose() -> None:
    import tilewise as tw

    for dtype in FLOATS:
        for shape in ((1000, 999), (1024, 2048), (4, 256, 320)):
            tw.transpose(_rand(shape, dtype))


def _spmv() -> None:
    """Every spmv kernel on one random CSR (and the formats it converts to), then spmv's own pick."""
    import torch

    from .ops.spmv import api

    d = torch.rand(2048, 2048, device="cuda")
    d[d > 0.01] = 0  # ~20 nonzeros a row
    A = api.CSR.from_dense(d)
    x = torch.randn(2048, device="cuda")
    clusters = torch.cuda.get_device_capability() >= (9, 0)  # Panels' kernels use thread-block clusters
    for name, fmt in api.FORMAT_OF.items():
        if fmt is api.Panels and not clusters:
            continue
        M = A if fmt is api.CSR else api.converted(A, fmt)
        if M is not None:
            api.spmv(M, x, variant=name)
    api.spmv(A, x)


def _embedding() -> None:
    import torch

    import tilewise as tw
    from .ops.embedding import api

    api._module(torch.cuda.current_device()).compile_all()  # every kernel, one module (runtime/lazy.py)
    for dtype in FLOATS:
        w = _rand((1000, 64), dtype, grad=True)
        for id_dtype in (torch.int64, torch.int32):
            ids = torch.randint(0, 1000, (32, 40), device="cuda", dtype=id_dtype)
            _backward(tw.embedding(ids, w, padding_idx=0))
    # the classifier's table and batch
    w = _rand((SST2_VOCAB, 50), "float32", grad=True)
    _backward(tw.embedding(torch.randint(0, SST2_VOCAB, (64, 64), device="cuda"), w, padding_idx=0))


def _rowwise() -> None:
    """softmax / log_softmax (short rows fused; long rows on the cluster kernels), cross_entropy
    (checked and capturable), linear_cross_entropy; forward and backward."""
    import torch

    import tilewise as tw
    from .ops.rowwise import cluster
    from .ops.rowwise.cross_entropy import MAX_FUSED, check_targets, cross_entropy_capturable

    dev = torch.cuda.current_device()
    if cluster._cc_ok(dev):
        cluster._module(dev).compile_all()  # every cluster kernel, one module (runtime/lazy.py)
    for dtype in FLOATS:
        for shape in ((64, 1000), (8, 65536)):
            for fn in (tw.softmax, tw.log_softmax):
                _backward(fn(_rand(shape, dtype, grad=True)))
        for n, c in ((64, 2), (128, 32000)):
            logits = _rand((n, c), dtype, grad=True)
            target = torch.randint(0, c, (n,), device="cuda")
            tw.cross_entropy(logits, target).backward()
            if c <= MAX_FUSED:  # the capturable form is one-pass only
                cross_entropy_capturable(logits, target).backward()
        x, w = _rand((256, 512), dtype, grad=True), _rand((4096, 512), dtype, grad=True)
        tw.linear_cross_entropy(x, w, torch.randint(0, 4096, (256,), device="cuda")).backward()
    check_targets("cuda")


def _norm() -> None:
    import tilewise as tw

    for dtype in FLOATS:
        for n in (128, 4096):
            for mode in ("llama", "gemma"):
                _backward(tw.rms_norm(_rand((64, n), dtype, grad=True), _rand(n, dtype, grad=True), mode=mode))


def _optim() -> None:
    import tilewise as tw

    for dtype in FLOATS:
        params = [_rand(n, dtype, grad=True) for n in (4096, 1000)]  # the element count 16-divisible and not
        for p in params:
            p.grad = _rand(p.shape[0], dtype)
        tw.AdamW(params).step()


def _rope() -> None:
    import torch

    import tilewise as tw

    for dtype in FLOATS:
        for d in (64, 128):
            q, k = _rand((1, 8, 128, d), dtype, grad=True), _rand((1, 2, 128, d), dtype, grad=True)
            qe, ke = tw.apply_rotary(q, k, _rand((1, 128, d), dtype), _rand((1, 128, d), dtype))
            torch.autograd.backward([qe, ke], [torch.randn_like(qe), torch.randn_like(ke)])


def _gemm() -> None:
    """gemm on each route (small, TMA tiles, the sm_90a CUDA C kernels, split-K, odd K padded),
    linear with each epilogue, forward and backward, matmul; every autotuned kernel is tuned at
    these shapes."""
    import torch

    import tilewise as tw

    shapes = ((256, 256, 256), (1000, 1000, 999), (1024, 1024, 1024), (2048, 2048, 2048), (1024, 1024, 16384))
    for dtype in HALVES + ("float32",):
        for m, n, k in shapes:
            tw.gemm(_rand((m, k), dtype), _rand((k, n), dtype))
        x, w = _rand((512, 1024), dtype, grad=True), _rand((1024, 1024), dtype, grad=True)
        b = _rand(1024, dtype, grad=True)
        for act in (None, "relu", "gelu"):
            _backward(tw.linear(x, w, b, activation=act))
    if torch.cuda.get_device_capability() >= (8, 9):  # fp8 tensor cores
        one = torch.ones(1, device="cuda")
        a = _rand((1024, 1024), "float32").to(torch.float8_e4m3fn)
        w8 = _rand((1024, 1024), "float32").to(torch.float8_e4m3fn)
        tw.gemm(a, w8.t(), scale_a=one, scale_b=one)
    tw.matmul(_rand((512, 512), "float32"), _rand((512, 512), "float32"))
    tw.matmul(_rand((4, 256, 256), "float32"), _rand((256, 256), "float32"))


def _attention(dtype: str) -> None:
    """flash_attention forward + backward at D 64 / 128, causal or not, grouped-query heads, the
    Llama-like bench shape, a padding mask, the atomic backward, and the packed (varlen) form."""
    import torch

    import tilewise as tw

    for d in (64, 128):
        for causal in (False, True):
            q = _rand((1, 8, 512, d), dtype, grad=True)
            k, v = _rand((1, 2, 512, d), dtype, grad=True), _rand((1, 2, 512, d), dtype, grad=True)
            _backward(tw.flash_attention(q, k, v, causal=causal))
            if d == 128:
                _backward(tw.flash_attention(q, k, v, causal=causal, deterministic=False))
    q = _rand((1, 32, 2048, 128), dtype, grad=True)
    k, v = _rand((1, 8, 2048, 128), dtype, grad=True), _rand((1, 8, 2048, 128), dtype, grad=True)
    _backward(tw.flash_attention(q, k, v, causal=True))
    q, k, v = (_rand((2, 8, 256, 128), dtype, grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 1, 256, dtype=torch.bool, device="cuda")
    mask[1, ..., 200:] = False
    _backward(tw.flash_attention(q, k, v, mask=mask))
    cu = torch.tensor([0, 100, 300, 512], dtype=torch.int32, device="cuda")
    q, k, v = (_rand((512, 8, 128), dtype, grad=True) for _ in range(3))
    _backward(tw.flash_attention_varlen(q, k, v, cu, cu, 212, 212, causal=True))


def _train_workload() -> None:
    """What ``tilewise train`` runs with its default config: the model and AdamW as train builds
    them, one graphed training step per bucket length it pads to (each step's warm-up, autotune
    and capture), and one evaluation batch per bucket."""
    import torch

    from .nn import functional as twf
    from .sst2 import step_bench
    from .sst2.config import EVAL_BATCH_SIZE

    cfg = TrainConfig()
    dev = torch.device("cuda")
    buckets = default_buckets(cfg.max_len)
    model, opt = step_bench.step_model("tilewise", "graph", vocab_size=SST2_VOCAB, embed_dim=cfg.embed_dim,
                                       hidden=cfg.hidden, dropout=cfg.dropout, lr=cfg.lr,
                                       weight_decay=cfg.weight_decay, seed=cfg.seed, device=dev,
                                       optimizer=cfg.optimizer)
    step = step_bench.build_step(model, opt, "graph", batch_size=cfg.batch_size, seq_len=buckets[-1], device=dev)
    for T in buckets:
        step(step_bench.synthetic_batches(1, cfg.batch_size, T, SST2_VOCAB, device=dev)[0])
    model.eval()
    with torch.no_grad():
        for T in buckets:
            b = step_bench.synthetic_batches(1, EVAL_BATCH_SIZE, T, SST2_VOCAB, device=dev)[0]
            model.loss(model(b.ids, b.lengths), b.labels)
    twf.check_targets(dev)
    torch.cuda.synchronize()


def _classifier_part(part: str, bucket: int | None = None) -> None:
    """One piece of the SST-2 classifier's step through the entry points its forward calls
    (nn/classifier.py), at every padded shape ``tilewise train`` runs with its default config
    (``bucket``: those of that length only): training batches forward and backward, evaluation
    batches forward. The pieces' kernels are disjoint, so processes compile (and the GEMMs autotune)
    side by side what one step would do in turn. part: "embedding", "fc1" (linear + ReLU), "pool"
    (masked mean over the lengths), "out" (the output layer), "loss" (cross-entropy)."""
    cfg = TrainConfig()
    buckets = default_buckets(cfg.max_len)
    if part not in CLASSIFIER_PARTS:
        raise ValueError(f"_classifier_part: part must be one of {CLASSIFIER_PARTS}, got {part!r}")
    if bucket is not None and bucket not in buckets:
        raise ValueError(f"_classifier_part: bucket must be one of {buckets}, got {bucket!r}")
    import torch

    from .nn import functional as twf
    from .sst2.config import EVAL_BATCH_SIZE

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    E, H, V = cfg.embed_dim, cfg.hidden, SST2_VOCAB

    def rand(*shape, grad=True):
        return torch.randn(*shape, device=dev, generator=g).requires_grad_(grad)

    w_emb, w1, b1, w2, b2 = rand(V, E), rand(H, E), rand(H), rand(2, H), rand(2)
    shapes = [(cfg.batch_size, T, True) for T in buckets] + [(EVAL_BATCH_SIZE, T, False) for T in buckets]
    if bucket is not None:
        shapes = [s for s in shapes if s[1] == bucket]
    for B, T, grad in shapes:
        with torch.set_grad_enabled(grad):
            if part == "embedding":
                y = twf.embedding(torch.randint(1, V, (B, T), device=dev, generator=g), w_emb, padding_idx=0)
            elif part == "fc1":
                y = twf.linear(rand(B, T, E, grad=grad), w1, b1, activation="relu")
            elif part == "pool":
                y = twf.masked_mean(rand(B, T, H, grad=grad), torch.randint(1, T + 1, (B,), device=dev, generator=g))
            elif part == "out":
                y = twf.linear(rand(B, H, grad=grad), w2, b2)
            else:
                y = twf.cross_entropy(rand(B, 2, grad=grad), torch.randint(0, 2, (B,), device=dev, generator=g))
            if grad:
                # A scalar's backward without a grad argument: y.backward(g) imports sympy (autograd's
                # shape check), 3.3 s of a child's cold run on the H200 machine; the step's loss needs none.
                (y * torch.randn_like(y)).sum().backward()
    if part == "loss":
        twf.check_targets(dev)
    torch.cuda.synchronize()


# The train workload's pieces: the classifier's step split where the kernels are disjoint, so their
# compiles run side by side before the whole step (``train``) compiles whatever they missed.
_PART_WHAT = {"embedding": "embedding", "fc1": "first layer + ReLU", "pool": "pooling", "out": "output layer",
              "loss": "loss"}
CLASSIFIER_TASKS: tuple[Task, ...] = tuple(
    Task(name, "train", f"the classifier's {_PART_WHAT[part]} at the default run's "
         + ("shapes" if bucket is None else f"length-{bucket} shapes"), partial(_classifier_part, part, bucket))
    for name, part, bucket in classifier_tasks())


FAMILY_TASKS: tuple[Task, ...] = (
    *(Task(f"pointwise.{d}", "pointwise", "vector_add, elementwise, reduce, masked_mean (CUDA C)",
           partial(_pointwise_cuda, d)) for d in FLOATS),
    Task("pointwise.triton", "pointwise", "sigmoid3, swiglu (Triton)", _pointwise_triton),
    Task("transpose", "transpose", "transpose, 2-D and batched", _transpose),
    Task("spmv", "spmv", "every spmv kernel and format", _spmv),
    Task("embedding", "embedding", "embedding forward and backward, int32 / int64 ids", _embedding),
    Task("rowwise", "rowwise", "softmax, log_softmax, cross_entropy, linear_cross_entropy", _rowwise),
    Task("norm", "norm", "rms_norm, llama and gemma modes", _norm),
    Task("rope", "rope", "apply_rotary", _rope),
    Task("optim", "optim", "AdamW's fused update", _optim),
    *(Task(f"attention.{d}", "attention", "flash_attention, flash_attention_varlen", partial(_attention, d))
      for d in HALVES),
    Task("gemm", "gemm", "gemm on each route, linear with each epilogue, matmul", _gemm, alone=True),
)
WORKLOAD_TASKS: tuple[Task, ...] = (
    *CLASSIFIER_TASKS,
    Task("train", "train", "the whole model: a graphed step per bucket, evaluation (what the pieces missed)",
         _train_workload, alone=True),
)
TASKS: dict[str, Task] = {t.name: t for t in FAMILY_TASKS + WORKLOAD_TASKS}


def families() -> dict[str, list[Task]]:
    out: dict[str, list[Task]] = {}
    for t in FAMILY_TASKS:
        out.setdefault(t.family, []).append(t)
    return out


def workloads() -> dict[str, list[Task]]:
    out: dict[str, list[Task]] = {}
    for t in WORKLOAD_TASKS:
        out.setdefault(t.family, []).append(t)
    return out


def select(ops: Sequence[str] | None, workload_names: Sequence[str] | None) -> list[Task]:
    """The tasks of the named families and workloads; every one when neither is named. ValueError
    naming an unknown one and the choices."""
    fams, wls = families(), workloads()
    for given, table, what in ((ops, fams, "--ops family"), (workload_names, wls, "--workload")):
        bad = [n for n in given or () if n not in table]
        if bad:
            raise ValueError(f"unknown {what} {', '.join(map(repr, bad))}; choose from {', '.join(table)}")
    if not ops and not workload_names:
        return list(FAMILY_TASKS + WORKLOAD_TASKS)
    names = [*(ops or ()), *(workload_names or ())]
    return [t for n in dict.fromkeys(names) for t in {**fams, **wls}[n]]


# --------------------------------------------------------------------------- running tasks (in the parent)


def folder_stats(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path``; (0, 0) when it does not exist."""
    files = size = 0
    for root, _, names in os.walk(path):
        for n in names:
            try:
                size += os.stat(os.path.join(root, n)).st_size
                files += 1
            except OSError:  # removed while walking (another process's temporary)
                pass
    return files, size


def list_tasks(console) -> None:
    console.print("op families (--ops):")
    for fam, tasks in families().items():
        parts = f" [{len(tasks)} tasks]" if len(tasks) > 1 else ""
        alone = " (autotunes: runs alone, after the others)" if any(t.alone for t in tasks) else ""
        console.print(f"  {fam:<10} {'; '.join(dict.fromkeys(t.what for t in tasks))}{parts}{alone}")
    console.print("workloads (--workload), their tasks in order:")
    for name, tasks in workloads().items():
        console.print(f"  {name}")
        for t in tasks:
            console.print(f"    {t.name:<16} {t.what}{' (alone, last)' if t.alone else ''}")


def run(tasks: Sequence[Task], n_jobs: int, console) -> int:
    """Run ``tasks`` with a progress bar; print seconds per task and what the caches gained.
    0 when every task passed, else 1 (each failure named with its stderr's tail)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    jobs = jobs_for(tasks)
    folders = {"tilewise kernel cache": settings.cache_dir(), "Triton cache": triton_cache_dir()}
    before = {k: folder_stats(p) for k, p in folders.items()}
    running: list[str] = []
    t0 = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as prog:
        bar = prog.add_task("warmup", total=len(jobs))

        def show() -> None:
            prog.update(bar, description="warmup: " + (", ".join(running) or "..."))

        def started(name: str) -> None:
            running.append(name)
            show()

        def done(r: Result) -> None:
            running.remove(r.name)
            prog.advance(bar)
            show()
            if not r.ok:
                prog.console.print(f"[red]{r.name} failed[/red] ({r.seconds:.1f} s)")

        results = run_jobs(jobs, n_jobs, on_start=started, on_done=done)
    total = time.perf_counter() - t0
    t = Table()
    t.add_column("task")
    t.add_column("seconds", justify="right")
    t.add_column("status")
    for r in results:
        t.add_row(r.name, f"{r.seconds:.1f}", "ok" if r.ok else "[red]failed[/red]")
    console.print(t)
    console.print(f"tilewise warmup: {len(results)} tasks in {total:.1f} s ({n_jobs} at once; the autotuning "
                  f"ones alone)")
    for k, p in folders.items():
        (f0, b0), (f1, b1) = before[k], folder_stats(p)
        console.print(f"{k} {p}: {f1} files, {b1 / 2**20:.1f} MiB (+{f1 - f0} files, "
                      f"+{(b1 - b0) / 2**20:.1f} MiB)")
    failed = [r for r in results if not r.ok]
    for r in failed:  # stderr may hold [brackets]: no markup
        console.print(f"task {r.name} failed: {r.error}", style="red", markup=False, highlight=False)
    if failed:
        console.print(f"[red]{len(failed)} of {len(results)} warmup task(s) failed: "
                      f"{', '.join(r.name for r in failed)}[/red]")
        return 1
    return 0


# --------------------------------------------------------------------------- the child


def main(argv: list[str] | None = None) -> int:
    """``python -m tilewise.warmup --task NAME``: run one task; one JSON line with its seconds."""
    from . import _bytecode

    _bytecode.enable()  # before the task imports torch (as the parent command did)
    p = argparse.ArgumentParser(prog="python -m tilewise.warmup")
    p.add_argument("--task", action="append", required=True, choices=sorted(TASKS))
    args = p.parse_args(argv)
    prefetch_triton_key()  # beside the task's imports (torch's above all)
    for name in args.task:
        t0 = time.perf_counter()
        TASKS[name].fn()
        print(json.dumps({"task": name, "seconds": round(time.perf_counter() - t0, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
