"""sum / max along the last and the first dim of 32768 x 4096 (512 MiB fp32) beside torch.sum and
torch.amax (every version incl. v5_columns, and "auto" = what reduce() picks), and the masked mean of
padded sequences beside its PyTorch formulation."""

from __future__ import annotations

import torch

from ...ops.pointwise import reduce as op
from ..harness import check, time_ms


def run(r) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    dtypes = [torch.float32] if r.quick else [torch.float32, torch.bfloat16]
    for dtype in dtypes:
        x = torch.randn(32768, 4096, device="cuda", dtype=dtype, generator=g)
        for rop, tname, tfn in (("sum", "torch.sum", torch.sum), ("max", "torch.amax", torch.amax)):
            for dim in (1, 0):
                shape = f"{tuple(x.shape)} dim={dim}"
                r.status(f"reduce {rop} {shape} {dtype}")
                ref = tfn(x, dim)
                cost = op.cost(tuple(x.shape), dim, dtype)
                base_ms = time_ms(lambda: tfn(x, dim))
                r.add(f"reduce_{rop}", tname, shape, dtype, base_ms, cost)
                out = torch.empty_like(ref)
                # The slow naive versions are timed once per shape in the full run only.
                variants = ([None, "v3_warp", "v4_columns", "v5_columns"] if (r.quick or rop == "max")
                            else [None, *op.VARIANTS])
                for v in variants:
                    if v == "v5_columns" and dim == x.dim() - 1:
                        continue  # it would run v4_columns there (v5 reads whole 16-byte column groups)
                    out.fill_(float("nan"))
                    op.reduce(x, dim, rop, out=out, variant=v)
                    check(f"reduce_{rop}.{v}", out, ref)
                    ms = time_ms(lambda: op.reduce(x, dim, rop, out=out, variant=v))
                    r.add(f"reduce_{rop}", v or "auto", shape, dtype, ms, cost, baseline=tname, baseline_ms=base_ms)
                del ref, out
        del x

        B, T, E = 256, 512, 1024
        xs = torch.randn(B, T, E, device="cuda", dtype=dtype, generator=g)
        lengths = torch.randint(1, T + 1, (B,), device="cuda", generator=g)
        shape = f"B={B} T={T} E={E}"
        r.status(f"masked_mean {shape} {dtype}")
        cost = op.masked_mean_cost(B, T, E, dtype, lengths)
        ref = op.masked_mean_reference(xs, lengths)
        base_ms = time_ms(lambda: op.masked_mean_reference(xs, lengths))
        r.add("masked_mean", "torch_eager", shape, dtype, base_ms, cost)
        check("masked_mean.forward", op.masked_mean_forward(xs, lengths), ref)
        ms = time_ms(lambda: op.masked_mean_forward(xs, lengths))
        r.add("masked_mean", "forward", shape, dtype, ms, cost, baseline="torch_eager", baseline_ms=base_ms)
        del xs, ref
        torch.cuda.empty_cache()
