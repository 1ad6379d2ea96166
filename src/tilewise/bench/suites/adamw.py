"""AdamW's step over a Llama-3.2-1B's parameters (bf16 parameters, gradients and moments; the embedding tied
to the head: 1.24 B parameters, 16 layers; quick runs: 2 layers, 0.39 B) beside torch.optim.AdamW, fused (what
the llama suite and most training scripts run) and foreach. Rows ``adamw``: the time of one ``step()``
(``tilewise``: one multi-tensor launch; ``tilewise_v2_fused``: one launch a parameter);
GB/s from the pass's minimum traffic (p, g, m, v read, p, m, v written: 14 bytes a parameter). Each optimizer
starts from the same parameters and moments, and one step of each is checked against torch's fused step
first."""

from __future__ import annotations

import torch

from ...cost import Cost
from ...ops.optim import api as op
from ..harness import check, time_ms


def llama_shapes(layers: int) -> list[tuple[int, ...]]:
    """Parameter shapes of Llama-3.2-1B with ``layers`` decoder layers (hidden 2048, 32 / 8 heads of 64,
    intermediate 8192, vocabulary 128256, embedding tied to the head)."""
    H, I, KV, V = 2048, 8192, 512, 128256
    layer = [(H, H), (KV, H), (KV, H), (H, H), (I, H), (I, H), (H, I), (H,), (H,)]
    return [(V, H), *(layer * layers), (H,)]


def run(r) -> None:
    dtype = torch.bfloat16
    shapes = llama_shapes(2 if r.quick else 16)
    n = sum(torch.Size(s).numel() for s in shapes)
    g = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=dtype, generator=g) * 0.02) for s in shapes]
    grads = [torch.randn(s, device="cuda", dtype=dtype, generator=g) * 1e-3 for s in shapes]
    kw = dict(lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    cands = {"torch_fused": lambda ps: torch.optim.AdamW(ps, fused=True, **kw),
             "torch_foreach": lambda ps: torch.optim.AdamW(ps, foreach=True, **kw),
             "tilewise": lambda ps: op.AdamW(ps, **kw),  # v3_multi_tensor: one launch
             "tilewise_v2_fused": lambda ps: op.AdamW(ps, variant="v2_fused", **kw)}  # a launch a parameter
    shape = f"llama-3.2-1b,layers={len(shapes) // 9},params={n / 1e9:.2f}B"
    cost = Cost(flops=12 * n, bytes=14 * n)
    times: dict[str, float] = {}
    start = [p.detach().clone() for p in params]
    want = None
    for name, make in cands.items():
        r.status(f"adamw {name}")
        with torch.no_grad():
            for p, s0, gr in zip(params, start, grads):
                p.copy_(s0)
                p.grad = gr
        opt = make(params)
        opt.step()  # the moments from zero, as a run's first step: the check
        got = torch.cat([p.detach().reshape(-1)[:4096].float() for p in params])
        if want is None:
            want = got
        else:
            check(f"adamw {name}", got, want, dtype=dtype, tol=2e-2)
        times[name] = time_ms(opt.step, warmup_ms=50, rep_ms=400)
        base = "torch_fused" if name != "torch_fused" else ""
        r.add("adamw", name, shape, dtype, times[name], cost, baseline=base, baseline_ms=times.get(base))
        r.log(f"  adamw {name}: {times[name]:.3f} ms a step, {cost.bytes / times[name] / 1e6:,.0f} GB/s")
        del opt
        torch.cuda.empty_cache()
