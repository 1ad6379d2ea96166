"""Recomputation measured: three stacked sigmoids, forward + backward, with the activations
stored against recomputed in backward (ops.recompute), beside PyTorch eager autograd.

Rows (op sigmoid3): torch (eager: every intermediate saved), stored (baseline torch),
recomputed (baseline stored: its speedup column is t_stored / t_recomputed, to set beside the
bytes ratio: 8/5 = 1.6, the lecture's). Each row's bytes are its own version's
traffic (recompute.cost); the torch row is given the stored version's bytes.
"""

from __future__ import annotations

import torch

from ...cost import Cost
from ...ops.pointwise import recompute as op
from ..harness import check, time_ms


def run(r) -> None:
    n = 1 << 28  # 1 GiB fp32 a tensor: the ~30 us of autograd and launch per call stay ~1%
    dtypes = [torch.float32] if r.quick else [torch.float32, torch.bfloat16]
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in dtypes:
        shape = f"n={n}"
        r.status(f"sigmoid3 {shape} {dtype}")
        x = (torch.randn(n, device="cuda", dtype=dtype, generator=g) * 2).requires_grad_()
        dy = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        ref_dx = op.reference_backward(x.detach(), dy)

        def torch_eager():
            y = torch.sigmoid(torch.sigmoid(torch.sigmoid(x)))
            return torch.autograd.grad(y, x, dy)[0]

        t_torch = time_ms(torch_eager)
        stored_cost = op.cost(n, dtype, recompute=False)
        r.add("sigmoid3", "torch", shape, dtype, t_torch, stored_cost)

        times = {}
        for name, rec in (("stored", False), ("recomputed", True)):
            def fn(rec=rec):
                return torch.autograd.grad(op.sigmoid3(x, recompute=rec), x, dy)[0]

            check(f"sigmoid3.{name}", fn(), ref_dx)
            times[name] = time_ms(fn)
        r.add("sigmoid3", "stored", shape, dtype, times["stored"], stored_cost, baseline="torch",
              baseline_ms=t_torch)
        r.add("sigmoid3", "recomputed", shape, dtype, times["recomputed"],
              op.cost(n, dtype, recompute=True), baseline="stored", baseline_ms=times["stored"])
        # Each kernel alone (no autograd), against its own bytes: shows which one, if any, falls
        # short of copy bandwidth, apart from autograd's own traffic (docs/tuning/rowwise.md,
        # "Recompute: no zero gradients").
        b = x.element_size()
        xd = x.detach()
        y, a1, a2 = torch.ops.tilewise.sigmoid3_fwd(xd, True)
        for name, fn, nbytes in (
                ("stored", lambda: torch.ops.tilewise.sigmoid3_fwd(xd, True), 4 * n * b),
                ("recomputed", lambda: torch.ops.tilewise.sigmoid3_fwd(xd, False), 2 * n * b)):
            r.add("sigmoid3_fwd", name, shape, dtype, time_ms(fn), Cost(12 * n, nbytes))
        for name, fn, nbytes in (
                ("stored", lambda: torch.ops.tilewise.sigmoid3_bwd_stored(a1, a2, dy), 4 * n * b),
                ("recomputed", lambda: torch.ops.tilewise.sigmoid3_bwd_recompute(xd, dy), 3 * n * b)):
            r.add("sigmoid3_bwd", name, shape, dtype, time_ms(fn), Cost((14 if name == "stored" else 22) * n, nbytes))
        del y, a1, a2
        ratio = times["recomputed"] / times["stored"]
        r.log(f"  sigmoid3 {dtype}: time recomputed / stored = {ratio:.3f}; bytes counted "
              f"{op.BYTES_RATIO:.3f} (5/8), lecture {op.LECTURE_RATIO:.3f} (5/8); "
              f"off the lecture by {100 * (ratio / op.LECTURE_RATIO - 1):+.1f}%")
        del x, dy, ref_dx
        torch.cuda.empty_cache()
