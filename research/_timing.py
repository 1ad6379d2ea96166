"""Timing for the experiment scripts that need it without an L2 flush between calls: events around
each call after a warm-up, the median in ms (triton's do_bench, which the others use, flushes L2)."""
import json
import os
import tempfile
import time

import torch


def median_event_ms(fn, reps: int = 50, warmup: int = 5, sync_each: bool = True) -> float:
    """sync_each=False: calls back to back (the host's time shows where it is the slower side), as
    the bench's eager rows."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        if sync_each:
            b.synchronize()
        pairs.append((a, b))
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in pairs)[reps // 2]


def bias_attention_case(B: int, H: int, S: int, D: int, g: "torch.Generator", bench):
    """bf16 q, k, v (B, H, S, D) and a (1, H, S, S) bias from g; SDPA cuDNN's output with that bias
    (the reference) and its time by ``bench``; the FLOPs 4 B H S^2 D. For the bias-forward
    experiments (attention_bias_pair, attention_bias_dot)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    bias = torch.randn(1, H, S, S, device="cuda", dtype=torch.bfloat16, generator=g)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        t_cudnn = bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    return q, k, v, bias, ref, t_cudnn, 4 * B * H * S * S * D


def square_gemm_case(n: int, dtype):
    """(a, b, out, ref) for an n^3 GEMM experiment: a, b from a generator seeded with n, out empty,
    ref = a @ b in fp32 (gemm_tma_configs, gemm_split_tiles)."""
    g = torch.Generator(device="cuda").manual_seed(n)
    a = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
    out = torch.empty(n, n, device="cuda", dtype=dtype)
    return a, b, out, a.float() @ b.float()


def run_checked(fn, out, ref):
    """out poisoned with NaN, fn() run and synchronized: (relative error against ref, None), or
    (None, the exception) when the config fails to compile or launch."""
    out.fill_(float("nan"))
    try:
        fn()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported by the caller
        return None, e
    return ((out.float() - ref).norm() / ref.norm()).item(), None


def softmax_case(bench, M: int = 4096, N: int = 131072):
    """x = 2 * randn (M, N) bf16 from seed 0, an empty y like it, the bytes of reading x and
    writing y once, and ``bench``'s time of y.copy_(x) (the copy ceiling) for the row-wise kernel
    experiments (softmax_tma, rowwise_cluster_configs)."""
    torch.manual_seed(0)
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 2
    y = torch.empty_like(x)
    return x, y, 2 * x.numel() * x.element_size(), bench(lambda: y.copy_(x))


def interleaved_rounds(title: str, cands: dict, call, ref, flops: float, bench, baselines=("cudnn",),
                       rounds: int = 3, tol: float = 2e-2) -> dict:
    """Times ``call(fn)`` for every candidate fn of ``cands`` (name -> fn) round by round, so that
    all of them run under the same clocks; a candidate that raises or is off ``ref`` by more than
    ``tol`` (relative) is reported and dropped first. Prints the table under ``title`` (median of
    the rounds, TFLOP/s from ``flops``, the ratio to each of ``baselines``, each round) and returns the
    medians (attention_bias_ab, attention_d64_tiles, attention_fwd_tiles)."""
    import statistics

    for name in list(cands):
        try:
            got = call(cands[name]).float()
        except Exception as e:  # noqa: BLE001 - e.g. a tile that does not fit: reported, dropped
            print(f"{title} {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            del cands[name]
            continue
        err = ((got - ref.float()).norm() / ref.float().norm()).item()
        if err > tol:
            print(f"{title} {name}: rel err {err:.2e}: dropped", flush=True)
            del cands[name]
    times = {n: [] for n in cands}
    for _ in range(rounds):
        for name, fn in cands.items():
            times[name].append(bench(lambda fn=fn: call(fn)))
    med = {n: statistics.median(t) for n, t in times.items()}
    print(f"== {title}", flush=True)
    width = max(len(n) for n in med)
    for name in sorted(med, key=med.get):
        ratios = "  ".join(f"{med[b] / med[name]:.3f}x {b}" for b in baselines)
        print(f"  {name:{width}s} {med[name]:.4f} ms {flops / med[name] / 1e9:5.0f} TFLOP/s {ratios}  "
              f"rounds {' '.join(f'{x:.4f}' for x in times[name])}", flush=True)
    return med


def abba_ms(fns: dict, bench, rounds: int = 4) -> tuple[dict, dict]:
    """Each fn of ``fns`` (name -> fn) timed by ``bench`` in rounds whose order alternates A B, B A, B A, A B
    (a variant timed later in a round ran slower at long shapes: docs/tuning/attention.md, "v6 dK / dV: LSE and
    Delta staged by the loader"). Returns (name -> the mean of the rounds' middle two, name -> every round's)."""
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 4 in (0, 3) else names[::-1]):
            times[n].append(bench(fns[n]))
    mid = {n: sum(sorted(ts)[rounds // 2 - 1:rounds // 2 + 1]) / 2 for n, ts in times.items()}
    return mid, times


def per_call_us(fn, n: int = 2000) -> float:
    """Host microseconds per call of ``fn`` over n back-to-back calls after one warm-up call (no
    sync: for pieces of a launch path whose kernels are shorter than their host cost)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def linear_step_case(M: int = 2048, N: int = 512, K: int = 512):
    """(torch_step, tilewise_step): relu(x @ w.T + b).sum().backward() on bf16 (M, K) x (N, K), in
    PyTorch and through tilewise.linear, for the host-time experiments (host_overhead, gemm_plans)."""
    from tilewise.ops.gemm import api as g

    xs = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ws = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bs = torch.randn(N, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def torch_step():
        torch.relu(xs @ ws.T + bs).sum().backward()

    def tilewise_step():
        g.linear(xs, ws, bs, activation="relu").sum().backward()

    return torch_step, tilewise_step


def warm_clocks(n: int = 8192, reps: int = 50):
    """Busy the GPU with bf16 n^3 products for a moment so the clocks are up before the first timing."""
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(reps):
        x @ x
    torch.cuda.synchronize()


def v6_backward_inputs(B: int, H: int, Hkv: int, S: int, D: int, causal: bool, seed: int):
    """bf16 q (B, H, S, D), k, v (B, Hkv, S, D) and dO from ``seed``, the library's forward (out, LSE) and
    Delta = rowsum(out * dO): what v6's two kernels (``gluon_bwd.dkdv`` / ``dq``) take, with the scale.
    For the v6 backward experiments (attention_causal_order, attention_bwd_operands)."""
    from tilewise.ops.attention import api as A

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = D ** -0.5
    out, lse = A._fwd_impl(q, k, v, None, None, causal, scale, A.default_policy(q, k, causal=causal))
    delta = (out.float() * do.float()).sum(-1).contiguous()
    return q, k, v, do, scale, lse, delta


def v6_grads(mods: dict, q, k, v, do, lse, delta, causal: bool, scale: float) -> dict:
    """{name: (dK, dV, dQ)} of each module's ``dkdv`` and ``dq`` (gluon_bwd or a variant of it) from the same
    inputs, into NaN-poisoned outputs (attention_v6_stats_ab, attention_exp2_poly --backward)."""
    grads = {}
    for n, m in mods.items():
        dk, dv, dq = (torch.full_like(t, float("nan")) for t in (k, v, q))
        m.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv)
        m.dq(q, k, v, do, lse, delta, causal, scale, dq)
        grads[n] = (dk, dv, dq)
    return grads


def cudnn_backward_ms(q, k, v, do, causal: bool, bench) -> float:
    """SDPA's cuDNN backward (dQ, dK, dV from dO; GQA by ``enable_gqa``) timed by ``bench``, after one
    forward with graph."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    return bench(lambda: torch.autograd.grad(oc, (qq, kk, vv), do, retain_graph=True))


def load_attention_module(path: str, name: str):
    """The Python file at ``path`` (another commit's copy of a library module, or an edited one) loaded as module
    ``tilewise.ops.attention.<name>``, so its relative imports resolve inside the attention package."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"tilewise.ops.attention.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def profiled(fn, reps: int, warmup: int):
    """torch.profiler's record (CUDA activity) of ``reps`` calls of ``fn`` after ``warmup`` unrecorded ones
    (cublas_kernels, attention_cudnn_bwd_kernels: which kernels a call launches)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return prof


def kernel_rows(fn, reps: int = 3) -> list:
    """(name, launches a call, us a call, grid, block, registers, shared bytes) of each kernel ``fn`` launches."""
    prof = profiled(fn, reps, warmup=2)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    rows = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        key = (e["name"], str(a.get("grid")), str(a.get("block")), a.get("registers per thread"),
               a.get("shared memory"))
        n, us = rows.get(key, (0, 0.0))
        rows[key] = (n + 1, us + float(e.get("dur", 0.0)))
    return [(k[0], n / reps, us / reps, *k[1:]) for k, (n, us) in rows.items()]


def print_kernel_rows(rows: list) -> None:
    """``kernel_rows``' rows, longest first, a line each."""
    for name, n, us, grid, block, regs, smem in sorted(rows, key=lambda r: -r[2]):
        print(f"  {us:9.1f} us x{n:g} grid {grid} block {block} regs {regs} smem {smem}  {name[:160]}", flush=True)
