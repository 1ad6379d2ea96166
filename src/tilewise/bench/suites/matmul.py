"""matmul (CUDA C, fp32, no tensor cores): each version beside cuBLAS fp32 with TF32 off.

The ``speedup`` column of our rows is the share of cuBLAS (the classic SGEMM progression table).
Squares of 4096 and 8192 (every operand 64 MiB or more, past the 60 MiB L2 at 8192; at 4096 the
three matrices are 192 MiB together); the full run adds an odd size and a broadcast batch.
"""

from __future__ import annotations

import torch

from ...ops.gemm import sgemm as op
from ..harness import check, time_ms

_BASE = "cublas_fp32"
_TOL = 1e-4  # fp32 accumulation over K = 8192 against float64


def _row_set(r, a, b, shape, cost, slow_ok=True):
    ref = op.reference(a, b)
    out = torch.empty(ref.shape, device="cuda", dtype=torch.float32)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        base_ms = time_ms(lambda: torch.matmul(a, b, out=out))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    r.add("matmul", _BASE, shape, torch.float32, base_ms, cost)
    for name, fn in op.VARIANTS.items():
        if not slow_ok and name in ("v1_naive", "v2_coalesced"):
            continue
        r.status(f"matmul {name} {shape}")
        out.fill_(float("nan"))
        fn(a, b, out)
        check(f"matmul.{name}", out, ref, tol=_TOL)
        ms = time_ms(lambda: fn(a, b, out), warmup_ms=10 if name < "v3" else 25)
        r.add("matmul", name, shape, torch.float32, ms, cost, baseline=_BASE, baseline_ms=base_ms)
    del ref, out


def run(r) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    sizes = [4096, 8192]
    for n in sizes:
        a = torch.randn(n, n, device="cuda", generator=g)
        b = torch.randn(n, n, device="cuda", generator=g)
        # v1/v2 at 8192 take seconds per call: full run only.
        _row_set(r, a, b, f"{n}x{n}x{n}", op.cost(n, n, n), slow_ok=not (r.quick and n > 4096))
        del a, b
        torch.cuda.empty_cache()
    if r.quick:
        return
    # An odd size (partial tiles everywhere) and a batch sharing one B (broadcast, read once).
    M = N = K = 4097
    a = torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(K, N, device="cuda", generator=g)
    _row_set(r, a, b, f"{M}x{N}x{K}", op.cost(M, N, K), slow_ok=False)
    a = torch.randn(16, 1024, 2048, device="cuda", generator=g)
    w = torch.randn(1, 2048, 1024, device="cuda", generator=g)
    _row_set(r, a, w, "16x1024x1024x2048(bcast B)", op.cost(1024, 1024, 2048, batch=16, batch_b=1),
             slow_ok=False)
    torch.cuda.empty_cache()
