"""transpose beside a copy of the same bytes, PyTorch eager ``x.t().contiguous()`` and its
``torch.compile``d form, every version, all in one run; plus one row of v3_padded against v2_smem
(op ``transpose_bank_conflict``) that prices the bank conflicts, and v4 in the predicted
configuration that lost (``v4_vec/tried``, ``V4_TRIED``) beside its default. The sweep over v4
configurations is research/transpose_variants.py."""

from __future__ import annotations

import torch

from ...cost import Cost
from ...ops.transpose import api as op
from ...ops.transpose import configs as cf
from ..harness import check, time_ms


def _eager(x):
    return x.transpose(-2, -1).contiguous()


def run(r) -> None:
    shapes = [(16384, 16384)]
    if not r.quick:
        shapes += [(8192, 32768), (16383, 16385), (64, 2048, 2048)]
    dtypes = [torch.float32, torch.bfloat16] if r.quick else [torch.float32, torch.float16, torch.bfloat16]
    compiled = torch.compile(_eager, dynamic=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in dtypes:
        for shp in shapes:
            shape = "x".join(map(str, shp))
            r.status(f"transpose {shape} {dtype}")
            x = torch.randn(shp, device="cuda", dtype=dtype, generator=g)
            out = torch.empty(*shp[:-2], shp[-1], shp[-2], device="cuda", dtype=dtype)
            ref = op.reference(x)
            c = op.cost(shp, dtype)

            # The bandwidth bar in this very run: a copy of the same bytes.
            flat_out = out.view(-1)
            copy_ms = time_ms(lambda: flat_out.copy_(x.view(-1)))
            r.add("copy", "torch.copy_", shape, dtype, copy_ms, Cost(0, c.bytes))

            eager_ms = time_ms(lambda: _eager(x))
            r.add("transpose", "torch.eager", shape, dtype, eager_ms, c)
            check("transpose.torch.compile", compiled(x), ref)
            comp_ms = time_ms(lambda: compiled(x))
            r.add("transpose", "torch.compile", shape, dtype, comp_ms, c)

            times = {}
            runs = dict(op.VARIANTS)
            # V4_TRIED (plain stores, launch groups of 8 tile rows) beside the default, in the same
            # run: the pair says whether the default still wins (docs/tuning/transpose.md, "V4_TRIED").
            runs["v4_vec/tried"] = lambda x_, o_: op.v4_vec(x_, o_, config=cf.V4_TRIED[dtype])
            for name, fn in runs.items():
                out.fill_(float("nan"))
                fn(x, out)
                check(f"transpose.{name}", out, ref, tol=0.0)
                times[name] = ms = time_ms(lambda: fn(x, out))
                r.add("transpose", name, shape, dtype, ms, c, baseline="torch.eager", baseline_ms=eager_ms)
            r.add("transpose_bank_conflict", "v3_padded", shape, dtype, times["v3_padded"], c,
                  baseline="v2_smem", baseline_ms=times["v2_smem"])
            best = min(times, key=times.get)
            r.log(f"transpose {shape} {dtype}: best {best} at {100 * copy_ms / times[best]:.1f}% of copy, "
                  f"{eager_ms / times[best]:.2f}x eager, {comp_ms / times[best]:.2f}x torch.compile")
            del x, out, ref, flat_out
            torch.cuda.empty_cache()
