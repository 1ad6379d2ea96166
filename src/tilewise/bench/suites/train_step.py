"""train_step: one whole training step of the SST-2 classifier (forward, backward, AdamW).

One synthetic SST-2-shaped batch stream (vocabulary 14,819, batch 64, sentences of random length
padded to 64 tokens, E=50, H=256, 2 classes; no dataset needed), the same model and optimizer as
``tilewise train``, timed per path:

    torch_eager     plain PyTorch layers, one kernel launch per op from Python     (baseline row)
    torch_compile   torch.compile (default mode) of forward + loss, AdamW eager    (baseline row)
    torch_graph     the whole PyTorch step captured in one CUDA graph, replayed    (baseline row; the main one)
    tilewise_eager  the tilewise backend, eager                                    (ours, vs torch_graph)
    tilewise_graph  the tilewise backend's step in one CUDA graph (an op whose implementation
                    syncs with the host, nn/functional.py NOT_CAPTURABLE, runs PyTorch's version
                    there; cross-entropy is the sync-free cross_entropy_capturable, so ours
                    runs inside the graph; the log says which ops fell back)       (ours, vs torch_graph)

Check first: every path runs two steps from the same initial weights on the same two batches and
its two losses must match a float64 PyTorch model's (relative 1e-4 for PyTorch's float32 kernels;
1e-2 where tilewise.linear runs float32 GEMMs in TF32). Dropout is 0 in the bench: the paths draw
their dropout masks from different RNG streams (eager, Inductor, graph-safe Philox), so with it
on no two losses could be compared; at p=0 F.dropout launches nothing, and in the model it is a
mask and a multiply forward and one multiply backward in every path.

Timing: device events around ``steps`` back-to-back steps (batches rotating through 16, as a
training loop feeds them; graph paths copy each batch into their static inputs, as ``tilewise
train --graph`` does), median over repeats of ms per step; examples/s = B / ms is logged (the
CSV's columns are fixed: it is 64 / median_ms x 1000). The host's time to issue a step is logged
beside the device time: when they are equal the step is bound by launches, not by the GPU.
Kernels per step come from the profiler (and the graph's kernel nodes where PyTorch keeps the
graph). The whole step is a few MB (the 3 MB embedding table, its gradient and AdamW moments), so
it runs out of L2 as in training: no flush.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from ...cost import Cost
from ...sst2.config import SST2_VOCAB
from ..harness import CheckError, check

OP = "train_step"
V, B, T, E, H, C = SST2_VOCAB, 64, 64, 50, 256, 2
SHAPE = f"B={B} T={T} E={E} H={H} V={V}"
# Timed widths: the course's H=256, and H=1024, the most accurate width of the SST-2 sweep
# (docs/tuning/bench.md, "train_step: HIDDENS").
HIDDENS = (H, 1024)
BASELINE = "torch_graph"
# (variant, backend, mode), the baselines first: ours name torch_graph's time.
PATHS = (("torch_eager", "torch", "eager"), ("torch_compile", "torch", "compile"),
         ("torch_graph", "torch", "graph"), ("tilewise_eager", "tilewise", "eager"),
         ("tilewise_graph", "tilewise", "graph"))
N_BATCHES = 16
CHECK_STEPS = 2


def cost(batch: int = B, seq: int = T, vocab: int = V, embed: int = E, hidden: int = H,
         classes: int = C, dtype_bytes: int = 4) -> Cost:
    """The least one fp32 training step must do.

    FLOPs: forward GEMMs 2*B*T*E*H + 2*B*H*C, backward twice that (grad of input and of weight;
    the first layer's input grad too, since it feeds the embedding's grad), the embedding grad's
    adds B*T*E, and AdamW ~10 FLOPs per parameter.
    Bytes: ids and lengths read; the gathered rows (B*T*E) written and read; the hidden
    activations (B*T*H) written once and read once in backward; every parameter read, its grad
    written and read, AdamW reading parameter, grad and two moments and writing parameter and
    moments (7 passes over the parameters). The embedding grad is a dense (V, E) tensor in
    PyTorch's AdamW, so it counts in full.
    """
    n_params = vocab * embed + embed * hidden + hidden + hidden * classes + classes
    gemm = 2 * batch * seq * embed * hidden + 2 * batch * hidden * classes
    flops = 3 * gemm + batch * seq * embed + 10 * n_params
    tokens = batch * seq
    elems = (tokens * 8 // dtype_bytes + batch * 8 // dtype_bytes  # int64 ids, lengths
             + 2 * tokens * embed + 2 * tokens * hidden
             + n_params            # forward reads the weights (the table only at the rows: an upper bound)
             + 2 * n_params        # grads written, then read by AdamW
             + 6 * n_params)       # AdamW: read p, m, v; write p, m, v
    return Cost(float(flops), float(elems * dtype_bytes))


def tolerance(variant: str, linear_impl: str) -> float:
    """Relative tolerance of a path's losses against the float64 model: 1e-2 when the path's
    linear layers run tilewise.linear (float32 in TF32, 10-bit mantissa), else 1e-4."""
    return 1e-2 if variant.startswith("tilewise") and linear_impl.startswith("tilewise") else 1e-4


def summarize(ms_per_step: float, batch: int = B) -> dict[str, float]:
    """ms per step -> examples/s and us per example."""
    if not ms_per_step > 0:
        raise ValueError(f"summarize: ms_per_step must be > 0, got {ms_per_step}")
    return {"examples_per_second": batch * 1e3 / ms_per_step, "us_per_example": 1e3 * ms_per_step / batch}


def _reference_losses(batches, steps: int, device, sizes: dict) -> torch.Tensor:
    """The first ``steps`` losses of the same model and AdamW in float64 PyTorch."""
    from ...sst2 import loop, step_bench

    model, _ = step_bench.step_model("torch", "eager", dropout=0.0, device=device, **sizes)
    model.double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)  # step_model's settings
    return torch.stack([loop.eager_step(model, opt, b) for b in batches[:steps]])


def _time_steps(step, batches, steps: int, repeats: int, device) -> tuple[float, float]:
    """(median ms per step, median host ms to issue one step) over ``repeats`` runs of ``steps``
    back-to-back steps; device events on a GPU (the host clock on a CPU, for tests)."""
    cuda = torch.device(device).type == "cuda"
    dev_ms, host_ms = [], []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
        t0 = time.perf_counter()
        for i in range(steps):
            step(batches[i % len(batches)])
        t1 = time.perf_counter()
        if cuda:
            end.record()
            end.synchronize()
            dev_ms.append(start.elapsed_time(end) / steps)
        else:
            dev_ms.append(1e3 * (t1 - t0) / steps)
        host_ms.append(1e3 * (t1 - t0) / steps)
    return statistics.median(dev_ms), statistics.median(host_ms)


def run(r) -> None:
    if not torch.cuda.is_available():
        r.log("train_step: no CUDA device; suite skipped")
        return
    steps, repeats, warmup = (50, 5, 10) if r.quick else (200, 9, 20)
    for hidden in HIDDENS:
        run_paths(r, "cuda", PATHS, hidden=hidden, steps=steps, repeats=repeats, warmup=warmup)


def run_paths(r, device, paths=PATHS, *, batch: int = B, seq: int = T, vocab: int = V, embed: int = E,
              hidden: int = H, classes: int = C, steps: int = 50, repeats: int = 5, warmup: int = 10) -> list[dict]:
    """Check then time each (variant, backend, mode) of ``paths``; add rows to ``r``; return one
    dict per timed path (variant, ms, host_ms, kernels, graph_nodes, examples_per_second)."""
    from ...nn import functional as twf
    from ...sst2 import graph_step, step_bench

    dev = torch.device(device)
    sizes = dict(vocab_size=vocab, embed_dim=embed, hidden=hidden, num_classes=classes)
    shape = f"B={batch} T={seq} E={embed} H={hidden} V={vocab}"
    batches = step_bench.synthetic_batches(N_BATCHES, batch, seq, vocab, classes, device=dev)
    ref = _reference_losses(batches, CHECK_STEPS, dev, sizes)
    twf.reset()
    impl = twf.report()
    r.log(f"train_step {shape}: tilewise backend uses " + "; ".join(f"{k}: {v}" for k, v in impl.items()))
    c = cost(batch, seq, vocab, embed, hidden, classes)
    baseline_ms = None
    failures: list[str] = []
    results: list[dict] = []
    for variant, backend, mode in paths:
        r.status(f"train_step {variant}")
        try:
            model, opt = step_bench.step_model(backend, mode, dropout=0.0, device=dev, **sizes)
            step = step_bench.build_step(model, opt, mode, batch_size=batch, seq_len=seq, device=dev, keep_graph=True)
            t0 = time.perf_counter()
            # The first steps are the check (and compile / capture / autotune): losses poisoned,
            # then each step's loss copied out (a graph's loss tensor is overwritten by the next replay).
            losses = torch.full((CHECK_STEPS,), math.nan, device=dev, dtype=torch.float64)
            for i in range(CHECK_STEPS):
                losses[i] = step(batches[i]).detach().double()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            setup_s = time.perf_counter() - t0
            tol = tolerance(variant, impl.get("linear", "torch") if dev.type == "cuda" else "torch")
            err = check(f"train_step.{variant} losses {losses.tolist()} vs float64 {ref.tolist()}",
                        losses, ref, tol=tol)
        except CheckError as e:
            failures.append(str(e))
            r.log(f"  [red]{variant}: check failed, not timed[/red]: {e}")
            continue
        except Exception as e:  # a path that cannot run (capture refused, compile error): say why, go on
            msg = f"{variant}: {type(e).__name__}: {str(e)[:300]}"
            r.log(f"  {msg}; not timed")
            if variant != "tilewise_graph":  # the others are expected to run everywhere
                failures.append(msg)
            continue
        for i in range(warmup):
            step(batches[(CHECK_STEPS + i) % N_BATCHES])
        ms, host_ms = _time_steps(step, batches, steps, repeats, dev)
        k = step_bench.count_step_kernels(step, batches[0], dev) if dev.type == "cuda" else {
            "kernels": 0, "memcpy": 0, "memset": 0}
        nodes = graph_step.graph_kernel_nodes(step)
        s = summarize(ms, batch)
        if variant == BASELINE:
            baseline_ms = ms
        ours = variant.startswith("tilewise") and baseline_ms is not None
        r.add(OP, variant, shape, torch.float32, ms, c,
              baseline=BASELINE if ours else "", baseline_ms=baseline_ms if ours else None)
        r.log(f"  {variant}: {ms * 1e3:,.0f} us/step = {s['examples_per_second']:,.0f} examples/s; host issues a "
              f"step in {host_ms * 1e3:,.0f} us; {k['kernels']} kernels + {k['memcpy']} memcpy + {k['memset']} memset "
              f"per step (profiler)" + (f", {nodes} kernel nodes in the graph" if nodes is not None else "")
              + (f" = {1e3 * ms / k['kernels']:.1f} us per kernel" if k["kernels"] else "")
              + f"; loss rel. err {err:.1e}; first steps (check, compile/capture/autotune) {setup_s:.1f} s")
        if variant.endswith("_graph") and k["kernels"] == 0 and nodes is None:
            r.log(f"  {variant}: the profiler saw no kernels inside the graph replay")
        results.append({"variant": variant, "ms": ms, "host_ms": host_ms, "kernels": k["kernels"],
                        "graph_nodes": nodes, **s})
        del model, opt, step
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    graph_notes = {k: v for k, v in twf.report().items() if "graph" in k}
    if graph_notes:
        r.log("  inside CUDA graphs: " + "; ".join(f"{k}: {v}" for k, v in graph_notes.items()))
    if failures:
        raise CheckError("train_step: " + " | ".join(failures))
    return results
