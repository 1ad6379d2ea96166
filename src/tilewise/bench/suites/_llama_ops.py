"""What the rmsnorm, rope and swiglu suites share: Liger-Kernel's version when its wheel is carried,
and one row a candidate, each checked and timed forward or forward + backward; ours against the
fastest of the others.

Rows hold device time with the host out of the picture (``time_ms_graph``: back-to-back calls in a CUDA
graph; the inputs, 128 MiB a tensor, are far larger than L2 either way): events around eager calls
timed the host, whose forward + backward through autograd can cost more than these kernels need on
the device (docs/tuning/norm.md, "Bench rows: device time"). The eager time is logged beside each
row, so a host-bound case stays visible."""

from __future__ import annotations

import importlib

import torch

from ..harness import time_ms, time_ms_graph

OURS = "tilewise"  # the candidate whose row names a baseline (report.best_of_ours reads such rows as ours)


def liger(module: str, name: str, r):
    """``liger_kernel.<module>.<name>``, or None (logged) where Liger-Kernel is not installed."""
    try:
        return getattr(importlib.import_module(f"liger_kernel.{module}"), name)
    except ImportError:
        r.log("  liger: not installed (carry its wheel in .whl/): no row")
        return None


def setup(r, reference, liger_module: str, liger_name: str):
    """A suite's seeded CUDA generator, torch.compile of its reference (compiled on first call) and
    Liger's version (or None)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    return g, torch.compile(reference, dynamic=False), liger(liger_module, liger_name, r)


def candidates(r, eager, compiled, ours, liger_fn) -> dict:
    """The candidates of a case: HF's eager formula, torch.compile of it (full runs only: in quick runs
    its compile time would push gpu-check past 9 minutes), ours, Liger's."""
    cands = {"torch_eager": eager}
    if not r.quick:
        cands["torch.compile"] = compiled
    cands["tilewise"] = ours
    if liger_fn is not None:
        cands["liger"] = liger_fn
    return cands


def time_rows(r, opname, shape, dtype, cost, cands, args, check_out, backward, diff=(), grad_outputs=None,
              graph=True):
    """For each candidate: ``check_out(name, fn(*args))``, then its time (forward, or with ``backward``
    the gradients of the arguments at positions ``diff`` from ``grad_outputs``), one row. Only ours names
    a baseline: the fastest of the others in the case (eager, torch.compile, Liger), what a user would
    otherwise run. ``graph=False``: eager time alone, for calls that cannot be captured (a capture that
    fails part-way can leave the CUDA generator in capture mode, breaking every later suite)."""
    times = {}
    for name, fn in cands.items():
        r.status(f"{opname} {shape} {name}")
        check_out(name, fn(*args))
        if backward:
            ins = [a.detach().requires_grad_(True) if i in diff else a for i, a in enumerate(args)]
            leaves = [ins[i] for i in diff]
            call = (lambda fn=fn, ins=ins, leaves=leaves:
                    torch.autograd.grad(fn(*ins), leaves, grad_outputs, allow_unused=True))
        else:
            call = (lambda fn=fn: fn(*args))
        times[name] = device_ms(r, f"{opname} {shape} {name}", call) if graph else time_ms(call)
    others = {n: ms for n, ms in times.items() if n != OURS}
    best = min(others, key=others.get) if others else ""
    for name, ms in times.items():
        base = best if name == OURS else ""
        r.add(opname, name, shape, dtype, ms, cost, baseline=base, baseline_ms=others.get(base) if base else None)


def device_ms(r, what: str, call) -> float:
    """``call``'s device time (``time_ms_graph``), its eager time (events, host included) logged beside
    it; eager alone, said so, where the call cannot be captured in a CUDA graph."""
    eager = time_ms(call)
    try:
        ms = time_ms_graph(call, calls=10, repeats=11)
    except Exception as e:  # noqa: BLE001 - a candidate that does not capture keeps its eager row
        torch.cuda.synchronize()
        r.log(f"  {what}: {eager:.4f} ms eager; no CUDA graph ({type(e).__name__}: {str(e)[:120]}), "
              f"so the row holds the eager time")
        return eager
    r.log(f"  {what}: {ms:.4f} ms device (graph), {eager:.4f} ms eager")
    return ms
