"""embedding forward and forward + backward beside torch.nn.functional.embedding.

The classifier's shape first: 64 x 64 ids into a 20000 x 50 fp32 table (the whole step is a few
MB, far under L2, so what is timed is the launches and the backward's sort, which is what the
model pays). The full run adds a batch past the one-block sort (512 x 64 ids, so v2 falls back to
torch.sort) into GloVe's 400000-row table (80 MB, larger than L2).
"""

from __future__ import annotations

import torch

from ...ops import embedding as op
from ..harness import check, time_ms


def _fwd_bwd(fn, ids, w, gout):
    def run():
        w.grad = None
        fn(ids, w).backward(gout)
    return run


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
        del ids, w, gout, ref_out, ref_grad
        torch.cuda.empty_cache()
