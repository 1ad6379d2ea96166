"""gemm_triton: Triton tensor-core GEMM beside cuBLAS (torch.matmul), torch._scaled_mm (fp8) and
PyTorch's unfused linear + ReLU, in one run.

quick: bf16 squares 4096 and 8192 (gemm() as routed, v1, v3), fp8 8192 (v3), fused linear + bias + ReLU, a
       short sweep (512, 1000, 1536, 2999, 3072, 4096, 5000, 5003; bf16 and fp16) of gemm() vs cuBLAS,
       and two long-K products (1024 x 1024 x 16384, 768 x 768 x 8192: gemm_sm90 split in K), tf32
       4096 (gemm() vs cuBLAS TF32, row-major B).
full:  also fp16 squares, tf32 with the variants, the sweep 512 .. 8192 with odd sizes (bf16, fp16), torch.compile
       of the unfused linear.
fp8 baselines: torch._scaled_mm as called by default (use_fast_accum=False: cuBLASLt promotes the
fp8 tensor-core partial sums to fp32 at intervals) and with use_fast_accum=True (partial sums stay
in the tensor core's accumulator, as Triton's fp8 tl.dot does); our fp8 rows name the fast one as
their baseline, so the speed-up compares like with like.
Autotuning happens in the first call of each shape (the check), before timing.
"""

from __future__ import annotations

import torch

from ...ops.gemm import sm90 as sm
from ...ops.gemm import api as op
from ...ops.gemm import triton_kernels as tk
from ..harness import CheckError, check, time_ms, time_ms_graphs

# A version that fails to compile or launch (say a Triton release that rejects a TMA layout) is
# logged and skipped so the other rows still come; run() raises CheckError at the end naming it.
_failures: list[str] = []


def _guarded(r, label, fn):
    try:
        fn()
    except CheckError:
        raise
    except Exception as e:  # noqa: BLE001 - reported below, and the suite fails at the end
        msg = f"{label}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        _failures.append(msg)
        r.log(f"[red]{msg}[/red]")


_SWEEP = [512, 1000, 1536, 2048, 2999, 3072, 4096, 5000, 5003, 6144, 8192]
# The quick run's sweep: both ends of the TMA rule (1000: 2,000-byte rows take TMA; 2999 and 5003
# do not and run v1_tiled), the two sizes where wave quantization costs most (1536: 144 tiles of
# 128 x 128 on 132 SMs; 3072: 576 = 4.4 waves), and few enough others to keep compile and autotune
# time within the quick budget; 5000 (N a multiple of 8, so gemm_sm90 takes it, but rows of 10,000
# bytes, not whole 128-byte lines), where the large-tile route ran furthest below cuBLAS.
_QUICK_SWEEP = [512, 1000, 1536, 2999, 3072, 4096, 5000, 5003]
# Long K over a small output (a weight gradient's shape: K the tokens): gemm_sm90 split in K.
_LONG_K = [(1024, 1024, 16384), (768, 768, 8192)]
_SCALED_MM = "torch._scaled_mm"
_SCALED_MM_FAST = "torch._scaled_mm(fast_accum)"


def _graph_rows(r, op_name, shape, dtype, cost, fns, baseline, ceiling_dtype=None, **kw):
    """``fns`` graph-replayed in interleaved rounds (``time_ms_graphs``, the same clock for all):
    a row each, named "<key>[graph]", every other one against ``baseline``'s."""
    t = time_ms_graphs(fns, **kw)
    extra = {} if ceiling_dtype is None else {"ceiling_dtype": ceiling_dtype}
    r.add(op_name, f"{baseline}[graph]", shape, dtype, t[baseline], cost, **extra)
    for k, ms in t.items():
        if k != baseline:
            r.add(op_name, f"{k}[graph]", shape, dtype, ms, cost, baseline=f"{baseline}[graph]",
                  baseline_ms=t[baseline], **extra)


def _versions(a, b):
    """The variants that take these operands: v3_tma_persistent where TMA applies, v3_tma_split for
    16-bit inputs only (it refuses fp8 and fp32 with an error, by design)."""
    two_byte = a.dtype in (torch.float16, torch.bfloat16)
    return {n: fn for n, fn in op.VARIANTS.items()
            if (n != "v3_tma_persistent" or tk.tma_applies(a, b)) and (n != "v3_tma_split" or two_byte)}


def _squares(r, dtype, n, g, variants=None):
    a = torch.randn(n, n, device="cuda", generator=g).to(dtype)
    b = torch.randn(n, n, device="cuda", generator=g).to(dtype)
    shape, cost = f"{n}x{n}x{n}", op.cost(n, n, n, dtype)
    out = torch.empty(n, n, device="cuda", dtype=dtype)
    base_ms = time_ms(lambda: torch.matmul(a, b, out=out))
    r.add("gemm", "cublas", shape, dtype, base_ms, cost)
    ref = torch.matmul(a.float(), b.float())
    versions = {n: fn for n, fn in _versions(a, b).items() if variants is None or n in variants}
    _square_rows(r, a, b, out, ref, shape, dtype, cost, versions, "cublas", base_ms)
    del a, b, out, ref
    torch.cuda.empty_cache()


def _square_rows(r, a, b, out, ref, shape, dtype, cost, versions, baseline, base_ms, ceiling_dtype=None):
    """gemm(auto) (what a user calls: its route may pick gemm_sm90 or one of the variants) and
    ``versions``, each checked into a NaN-poisoned out and timed eager against ``baseline``'s
    base_ms; then gemm(auto) and torch.matmul graph-replayed in interleaved rounds (the rows the
    targets read: both sides at the same clock, see time_ms_graphs)."""
    extra = {} if ceiling_dtype is None else {"ceiling_dtype": ceiling_dtype}
    for name, fn in {"gemm(auto)": lambda a, b, out: op.gemm(a, b, out=out), **versions}.items():
        r.status(f"gemm {name} {shape} {dtype}")

        def one(name=name, fn=fn):
            out.fill_(float("nan"))
            fn(a, b, out=out)
            check(f"gemm.{name} {dtype}", out, ref, dtype=dtype)
            ms = time_ms(lambda: fn(a, b, out=out))
            r.add("gemm", name, shape, dtype, ms, cost, baseline=baseline, baseline_ms=base_ms, **extra)

        _guarded(r, f"gemm.{name} {shape} {dtype}", one)

    def graphs():
        _graph_rows(r, "gemm", shape, dtype, cost, {baseline: lambda: torch.matmul(a, b, out=out),
                                                    "gemm(auto)": lambda: op.gemm(a, b, out=out)},
                    baseline, ceiling_dtype=ceiling_dtype)

    _guarded(r, f"gemm(auto) graphs {shape} {dtype}", graphs)


def _tf32(r, n, g, variants=True):
    a = torch.randn(n, n, device="cuda", generator=g)
    b = torch.randn(n, n, device="cuda", generator=g)
    shape, cost = f"{n}x{n}x{n}", op.cost(n, n, n, torch.float32)
    out = torch.empty(n, n, device="cuda")
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        base_ms = time_ms(lambda: torch.matmul(a, b, out=out))
        r.add("gemm", "cublas_tf32", shape, "tf32", base_ms, cost, ceiling_dtype="tf32")
        ref = a.double() @ b.double()
        # gemm(auto) takes this row-major B to gemm_sm90.gemm_tf32 on an sm_90 GPU (elsewhere it
        # transposes B first: wgmma's tf32 operands are K-major only); the variants take B as given.
        # cuBLAS's graph is captured with TF32 on.
        _square_rows(r, a, b, out, ref, shape, "tf32", cost, _versions(a, b) if variants else {}, "cublas_tf32",
                     base_ms, ceiling_dtype="tf32")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    del a, b, out, ref
    torch.cuda.empty_cache()


def _fp8(r, n, g, variants=None):
    f8 = torch.float8_e4m3fn
    a = torch.randn(n, n, device="cuda", generator=g).to(f8)
    w = torch.randn(n, n, device="cuda", generator=g).to(f8)  # (N, K): B = w.t() is K-major
    sa = torch.tensor(0.5, device="cuda")
    sb = torch.tensor(0.25, device="cuda")
    shape, cost = f"{n}x{n}x{n}", op.cost(n, n, n, f8)
    base_ms = time_ms(lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
    r.add("gemm", _SCALED_MM, shape, f8, base_ms, cost)
    ref = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16).float()

    def fast():
        return torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=True)

    # The like-for-like baseline, checked for sanity at the fp8 tolerance (fast accumulation trades
    # accuracy; its error against the default mode is logged for the notes).
    fast_ms = None
    try:
        err = check("torch._scaled_mm(fast_accum)", fast(), ref, dtype=f8)
        r.log(f"torch._scaled_mm(fast_accum) {shape}: relative error vs use_fast_accum=False {err:.2e}")
        fast_ms = time_ms(fast)
        r.add("gemm", _SCALED_MM_FAST, shape, f8, fast_ms, cost)
    except Exception as e:  # noqa: BLE001 - e.g. a PyTorch without the flag: fall back, say so
        _failures.append(f"{_SCALED_MM_FAST}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        r.log(f"[red]{_failures[-1]}[/red]")
    base_name, base_for_ours = (_SCALED_MM_FAST, fast_ms) if fast_ms is not None else (_SCALED_MM, base_ms)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for name, fn in _versions(a, w.t()).items():
        if variants is not None and name not in variants:
            continue
        r.status(f"gemm {name} {shape} fp8")

        def one(name=name, fn=fn):
            out.fill_(float("nan"))
            fn(a, w.t(), scale_a=sa, scale_b=sb, out=out)
            check(f"gemm.{name} fp8", out, ref, tol=1e-2)
            ms = time_ms(lambda: fn(a, w.t(), scale_a=sa, scale_b=sb, out=out))
            r.add("gemm", name, shape, f8, ms, cost, baseline=base_name, baseline_ms=base_for_ours)

        _guarded(r, f"gemm.{name} {shape} fp8", one)
    del a, w, out, ref
    torch.cuda.empty_cache()


def _linear(r, g, tokens=8192, k=4096, n=4096, dtype=torch.bfloat16, with_compile=False):
    x = torch.randn(tokens, k, device="cuda", generator=g).to(dtype)
    w = (0.02 * torch.randn(n, k, device="cuda", generator=g)).to(dtype)
    b = torch.randn(n, device="cuda", generator=g).to(dtype)
    shape, cost = f"{tokens}x{n}x{k}", op.cost(tokens, n, k, dtype, bias=True)

    def unfused():
        return torch.relu(x @ w.t() + b)

    base_ms = time_ms(unfused)
    r.add("linear_relu", "torch_unfused", shape, dtype, base_ms, cost)
    if with_compile:
        comp = torch.compile(unfused)
        comp()
        r.add("linear_relu", "torch.compile", shape, dtype, time_ms(comp), cost)
    ref = unfused().float()

    def one():
        with torch.no_grad():
            y = op.linear(x, w, b, activation="relu")
            check("linear relu", y, ref, dtype=dtype)
            ms = time_ms(lambda: op.linear(x, w, b, activation="relu"))
        r.add("linear_relu", "tilewise.linear", shape, dtype, ms, cost, baseline="torch_unfused",
              baseline_ms=base_ms)

    def graphs():
        # The same pair graph-replayed in interleaved rounds: the eager rows above are timed one
        # after the other, so the clock's drift at the power limit lands on one side (see
        # time_ms_graphs); these compare both at the same clock.
        with torch.no_grad():
            _graph_rows(r, "linear_relu", shape, dtype, cost,
                        {"torch_unfused": unfused, "tilewise.linear": lambda: op.linear(x, w, b, activation="relu")},
                        "torch_unfused", calls=10)

    _guarded(r, f"linear_relu {shape}", one)
    _guarded(r, f"linear_relu graphs {shape}", graphs)
    del x, w, b
    torch.cuda.empty_cache()


def _sweep(r, dtype, g, sizes, name="gemm_sweep"):
    """gemm() (and gemm_sm90 where it applies) against cuBLAS on squares n (an int) or (m, n, k)
    products, eager and graph-replayed."""
    for size in sizes:
        m, n, k = (size, size, size) if isinstance(size, int) else size
        a = torch.randn(m, k, device="cuda", generator=g).to(dtype)
        b = torch.randn(k, n, device="cuda", generator=g).to(dtype)
        shape, cost = f"{m}x{n}x{k}", op.cost(m, n, k, dtype)
        out = torch.empty(m, n, device="cuda", dtype=dtype)
        base_ms = time_ms(lambda: torch.matmul(a, b, out=out))
        r.add(name, "cublas", shape, dtype, base_ms, cost)
        ref = torch.matmul(a.float(), b.float())
        r.status(f"gemm sweep {shape} {dtype}")
        graphed = {"cublas": lambda: torch.matmul(a, b, out=out)}

        def one():
            out.fill_(float("nan"))
            op.gemm(a, b, out=out)
            check("gemm sweep", out, ref, dtype=dtype)
            ms = time_ms(lambda: op.gemm(a, b, out=out))
            r.add(name, "gemm(auto)", shape, dtype, ms, cost, baseline="cublas", baseline_ms=base_ms)
            graphed["gemm(auto)"] = lambda: op.gemm(a, b, out=out)

        def sm90():
            # The CUDA C wgmma + TMA-multicast kernel (ops/gemm_sm90), its own tile rule, same run.
            out.fill_(float("nan"))
            sm.gemm_sm90(a, b, out=out)
            check("gemm_sm90 sweep", out, ref, dtype=dtype)
            r.add(name, "gemm_sm90", shape, dtype, time_ms(lambda: sm.gemm_sm90(a, b, out=out)), cost,
                  baseline="cublas", baseline_ms=base_ms)
            graphed["gemm_sm90"] = lambda: sm.gemm_sm90(a, b, out=out)

        def graphs():
            # Device time without the host: small sizes are host-bound in eager timing (a Triton
            # launch costs more host time than the kernel runs), so every version again,
            # graph-replayed in interleaved rounds (the same clock for all, see time_ms_graphs).
            _graph_rows(r, name, shape, dtype, cost, graphed, "cublas")

        _guarded(r, f"gemm sweep {shape} {dtype}", one)
        if sm.applies(a, b):
            _guarded(r, f"gemm_sm90 sweep {shape} {dtype}", sm90)
        if len(graphed) > 1:
            _guarded(r, f"gemm sweep graphs {shape} {dtype}", graphs)
        del a, b, out, ref
    torch.cuda.empty_cache()


def run(r) -> None:
    _failures.clear()
    try:
        _run(r)
    finally:
        if _failures:
            raise CheckError(f"{len(_failures)} gemm version(s) failed to run: " + "; ".join(_failures))


def _run(r) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    # quick: v2_persistent (pointer loads, persistent) only in the full run, to keep compile and
    # autotune time of the quick run near a minute.
    for n in (4096, 8192):
        _squares(r, torch.bfloat16, n, g, variants=("v1_tiled", "v3_tma_persistent") if r.quick else None)
    _fp8(r, 8192, g, variants=None if not r.quick else ("v3_tma_persistent",))
    # An MLP up-projection of a d_model = 1024 model (the epilogue is ~40% of the unfused time), and
    # in the full run a K = 4096 one where the GEMM dominates.
    _linear(r, g, tokens=8192, k=1024, n=4096, with_compile=not r.quick)
    if r.quick:
        _tf32(r, 4096, g, variants=False)
        # The >= 0.85x-over-a-sweep target, measured in every quick run on a few sizes.
        for dtype in (torch.bfloat16, torch.float16):
            _sweep(r, dtype, g, _QUICK_SWEEP)
            _sweep(r, dtype, g, _LONG_K, "gemm_long_k")
        return
    _linear(r, g, tokens=8192, k=4096, n=4096, with_compile=True)
    for n in (4096, 8192):
        _squares(r, torch.float16, n, g)
    _tf32(r, 4096, g)
    for dtype in (torch.bfloat16, torch.float16):
        _sweep(r, dtype, g, _SWEEP)
        _sweep(r, dtype, g, _LONG_K, "gemm_long_k")
