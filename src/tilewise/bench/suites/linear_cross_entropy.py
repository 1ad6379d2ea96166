"""The LM head and its loss (tokens x hidden against a 128k vocabulary, bf16), forward + backward: HF's
way (the full logits, upcast to fp32, F.cross_entropy), torch.compile of it (full runs), Liger-Kernel's
fused linear cross-entropy (when its wheel is carried) and ours. Each candidate's peak memory beyond its
inputs goes to the log."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...ops.rowwise import linear_cross_entropy as op
from ..harness import check
from ._llama_ops import candidates, setup, time_rows


def _hf(x, w, t):
    # transformers' ForCausalLMLoss on the lm head's logits
    return F.cross_entropy(F.linear(x, w).float(), t, ignore_index=-100)


def _peak_mib(fn, x, w, t) -> float:
    xs, ws = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(xs, ws, t).backward()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def run(r) -> None:
    shapes = [(8192, 2048, 128256)] if r.quick else [(8192, 2048, 128256), (16384, 4096, 128256), (4096, 4096, 151936)]
    dtype = torch.bfloat16
    g, compiled, lig_cls = setup(r, _hf, "transformers.fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyLoss")
    lig = None
    if lig_cls is not None:
        m = lig_cls()
        lig = lambda x, w, t: m(w, x, t)  # noqa: E731 - Liger takes the weight first
    for N, H, V in shapes:
        shape = f"N={N},H={H},V={V}"
        x = (torch.randn(N, H, device="cuda", generator=g) / H ** 0.25).to(dtype)
        w = (torch.randn(V, H, device="cuda", generator=g) / H ** 0.25).to(dtype)
        t = torch.randint(0, V, (N,), device="cuda", generator=g)
        t[::17] = -100
        ref = op.reference(x, w, t)
        cands = candidates(r, _hf, compiled, op.linear_cross_entropy, lig)

        def check_out(name, loss):
            check(f"linear_cross_entropy {name}", loss.float().reshape(1), ref.reshape(1), dtype=dtype, tol=1e-2)

        # Eager time: the calls take 20-30 ms, so the host's share is small, and on the H200 neither ours
        # (a host-to-device copy) nor Liger's captured in a CUDA graph.
        time_rows(r, "linear_cross_entropy_fwd_bwd", shape, dtype, op.cost(N, H, V, dtype), cands, (x, w, t),
                  check_out, True, diff=(0, 1), graph=False)
        for name, fn in cands.items():
            r.log(f"  linear_cross_entropy {shape} {name}: peak memory beyond the inputs "
                  f"{_peak_mib(fn, x, w, t):.0f} MiB")
        del x, w, t, ref
        torch.cuda.empty_cache()
