"""embedding forward and forward + backward beside torch.nn.functional.embedding.

The classifier's shape first: 64 x 64 ids into a 20000 x 50 fp32 table (the whole step is a few
MB, far under L2, so what is timed is the launches and the backward's sort, which is what the
model pays). The full run adds a batch past the one-block sort (512 x 64 ids, so v2 falls back to
torch.sort) into GloVe's 400000-row table (80 MB, larger than L2).

Eager rows (variant = the version's name, ``torch.embedding``) time what a Python caller pays:
at the classifier's shape that is host time (autograd, allocations, launches), not the GPU's.
``*_graph`` rows capture the same forward (and forward + backward, through
``torch.autograd.grad`` so the gradient is a static output) in a CUDA graph and time its replay:
device time of the kernels alone, PyTorch's and ours, in the same run. Each graph is checked
against the float64 reference on fresh ids (static inputs rewritten, outputs poisoned with NaN
before the replay) before it is timed.
"""

from __future__ import annotations

import torch

from ...ops.embedding import api as op
from ..harness import CheckError, check, host_us_per_call, time_ms


def _fwd_bwd(fn, ids, w, gout):
    def run():
        w.grad = None
        fn(ids, w).backward(gout)
    return run


def _capture(fn, ids, w, gout, backward: bool):
    """(graph, static out, static grad or None) of one ``fn(ids, w)`` (+ its weight gradient)."""
    def body():
        with torch.set_grad_enabled(backward):
            # A fresh leaf made on the capturing stream: a leaf made earlier keeps its
            # AccumulateGrad node on the default stream, and the engine's sync with that stream
            # is illegal during capture (cudaErrorStreamCaptureImplicit, seen on the H200).
            wl = w.detach().requires_grad_(backward)
            out = fn(ids, wl)
            gw = torch.autograd.grad(out, wl, gout)[0] if backward else None
        return out, gw

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up (kernel loading, allocator) off the capture
            body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, gw = body()
    return g, out, gw


def _graph_rows(r, name, fn, ids, w, gout, V, shape, dtype, c_fwd, c_all, base, gen):
    """Check then time ``fn`` captured in a CUDA graph, forward and forward + backward."""
    ms = {}
    for backward in (False, True):
        g, out, gw = _capture(fn, ids, w, gout, backward)
        new_ids = torch.randint(0, V, ids.shape, device="cuda", generator=gen)
        with torch.no_grad():
            ids.copy_(new_ids)
            out.fill_(float("nan"))
            if gw is not None:
                gw.fill_(float("nan"))
        g.replay()
        check(f"embedding.{name} forward (graph)", out.detach(), op.reference(new_ids, w.detach()))
        if gw is not None:
            check(f"embedding.{name} backward (graph)", gw, op.reference_backward(new_ids, gout, V).to(dtype))
        t = time_ms(g.replay)
        opname = "embedding_fwd_bwd" if backward else "embedding_fwd"
        if base is None:
            r.add(opname, f"{name}_graph", shape, dtype, t, c_all if backward else c_fwd)
        else:
            b = base[backward]
            r.add(opname, f"{name}_graph", shape, dtype, t, c_all if backward else c_fwd,
                  baseline="torch.embedding_graph", baseline_ms=b)
        ms[backward] = t
        del g, out, gw
    return ms


def run(r) -> None:
    cases = [((64, 64), 20000, 50)]
    if not r.quick:
        cases.append(((512, 64), 400000, 50))
    g = torch.Generator(device="cuda").manual_seed(0)
    dtype = torch.float32
    for (B, T), V, E in cases:
        shape = f"ids={B}x{T},table={V}x{E}"
        r.status(f"embedding {shape}")
        ids = torch.randint(0, V, (B, T), device="cuda", generator=g)
        w = torch.randn(V, E, device="cuda", generator=g, dtype=dtype, requires_grad=True)
        gout = torch.randn(B, T, E, device="cuda", generator=g, dtype=dtype)
        ref_out = op.reference(ids, w.detach())
        ref_grad = op.reference_backward(ids, gout, V)
        c_fwd = op.cost(B * T, V, E, dtype)
        c_all = op.cost(B * T, V, E, dtype, backward=True)

        def torch_emb(i, ww):
            return torch.nn.functional.embedding(i, ww)

        with torch.no_grad():
            base_fwd = time_ms(lambda: torch_emb(ids, w))
        r.add("embedding_fwd", "torch.embedding", shape, dtype, base_fwd, c_fwd)
        base_all = time_ms(_fwd_bwd(torch_emb, ids, w, gout))
        r.add("embedding_fwd_bwd", "torch.embedding", shape, dtype, base_all, c_all)
        host = {"torch.embedding": host_us_per_call(_fwd_bwd(torch_emb, ids, w, gout), calls=300, repeats=5)}

        for name, fn in op.VARIANTS.items():
            # Poison: a freed NaN block of the output's size is what the allocator hands out next,
            # so an element the kernel skips shows up as NaN.
            torch.full((V, E), float("nan"), device="cuda", dtype=dtype)
            torch.full((B, T, E), float("nan"), device="cuda", dtype=dtype)
            w.grad = None
            out = fn(ids, w)
            check(f"embedding.{name} forward", out.detach(), ref_out)
            out.backward(gout)
            check(f"embedding.{name} backward", w.grad, ref_grad.to(dtype))
            with torch.no_grad():
                ms = time_ms(lambda: fn(ids, w))
            r.add("embedding_fwd", name, shape, dtype, ms, c_fwd, baseline="torch.embedding", baseline_ms=base_fwd)
            ms = time_ms(_fwd_bwd(fn, ids, w, gout))
            r.add("embedding_fwd_bwd", name, shape, dtype, ms, c_all, baseline="torch.embedding",
                  baseline_ms=base_all)
            host[name] = host_us_per_call(_fwd_bwd(fn, ids, w, gout), calls=300, repeats=5)
        # Host time to issue one eager forward + backward (no sync between calls): when it is about
        # the eager row's time, the host, not the GPU, sets the pace.
        r.log(f"embedding {shape}: host us per eager fwd+bwd call: "
              + ", ".join(f"{k} {v:.0f}" for k, v in host.items()))

        # The same, each captured in a CUDA graph: device time, without the host's share.
        r.status(f"embedding {shape}: CUDA graphs")
        gids = ids.clone()
        try:
            base = _graph_rows(r, "torch.embedding", torch_emb, gids, w, gout, V, shape, dtype, c_fwd, c_all,
                               None, g)
        except Exception as e:  # noqa: BLE001 - a capture failure must not cost the eager rows above
            r.log(f"[red]embedding {shape}: CUDA-graph rows skipped, torch's capture failed: "
                  f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}[/red]")
            base = None
        for name, fn in op.VARIANTS.items():
            if base is None:
                break
            try:
                _graph_rows(r, name, fn, gids, w, gout, V, shape, dtype, c_fwd, c_all, base, g)
            except CheckError:
                raise  # a wrong answer is a failure, not a skip
            except Exception as e:  # noqa: BLE001
                r.log(f"[red]embedding.{name} {shape}: CUDA-graph rows skipped: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}[/red]")
        del ids, gids, w, gout, ref_out, ref_grad
        torch.cuda.empty_cache()
