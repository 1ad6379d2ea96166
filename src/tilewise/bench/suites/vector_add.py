"""vector_add beside torch.add and a plain device copy, at sizes far larger than L2."""

from __future__ import annotations

import torch

from ...cost import Cost
from ...ops.pointwise import vector_add as op
from ..harness import check, time_ms


def run(r) -> None:
    sizes = [2**28] if r.quick else [2**24, 2**28]
    dtypes = [torch.float32] if r.quick else [torch.float32, torch.bfloat16]
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in dtypes:
        for n in sizes:
            shape = f"n={n}"
            r.status(f"vector_add {shape} {dtype}")
            a = torch.randn(n, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(n, device="cuda", dtype=dtype, generator=g)
            out = torch.empty_like(a)
            ref = op.reference(a, b)
            itemsize = a.element_size()

            # The bandwidth bar in this very run: a copy of the same bytes per operand.
            copy_ms = time_ms(lambda: out.copy_(a))
            r.add("copy", "torch.copy_", shape, dtype, copy_ms, Cost(0, 2 * n * itemsize))

            base_ms = time_ms(lambda: torch.add(a, b, out=out))
            r.add("vector_add", "torch.add", shape, dtype, base_ms, op.cost(n, dtype))

            for name, fn in op.VARIANTS.items():
                out.fill_(float("nan"))
                fn(a, b, out)
                check(f"vector_add.{name}", out, ref)
                ms = time_ms(lambda: fn(a, b, out))
                r.add("vector_add", name, shape, dtype, ms, op.cost(n, dtype),
                      baseline="torch.add", baseline_ms=base_ms)
            del a, b, out, ref
            torch.cuda.empty_cache()
