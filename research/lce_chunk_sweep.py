"""linear_cross_entropy's chunk size at the Llama lm-head shapes: time and peak memory.

Why: in the Llama-3.2-1B step profile (H200, 4 x 4096 tokens, bench/results/logs/llama-step-profile-c0709cc.log)
our GEMM group is 170.2 ms a step against 161.4 ms for HF's default step in the same run. HF's step
holds the whole (N, V) logits, and the only GEMMs that differ between the two steps are the lm
head's. Ours runs three GEMMs a chunk of CHUNK_BYTES = 256 MB of logits (1,024 rows at V = 128,256),
so the dW product's inner dimension is 1,024 and there are 16 of each product.
Prediction: 2,048-4,096 rows a chunk take 5-10 % off the lm head + loss (~45 ms at N = 16,384,
H = 2,048). The logits cost 0.5-1 GB more; issue 31 allows 1.5 GiB of extra memory at H = 4,096.

Per shape: chunk_rows in {1024 (today's), 2048, 4096, 8192}. Each is checked against the default's
loss and gradients, then its forward + backward is timed (do_bench median) with its peak memory
beyond the inputs. The baseline is PyTorch's logits + F.cross_entropy, and Liger's fused linear
cross-entropy when its wheel is installed.

Second run (added 2026-12-04, not run yet): 3,072 rows, the largest multiple of 1,024 whose peak stays
under 1.5 GiB at H = 2,048 by the first run's slope (0.80 + 2 x 0.245 = 1.29 GiB): the candidate for a
chunk chosen by a memory budget. Prediction: 41-42 ms at H = 2,048 if 2,048's slowdown is that size's
alone, i.e. -2 to -3 ms of the Llama step.

Run on the GPU: . scripts/_wheels.sh; PYTHONPATH=src:$PYTHONPATH python3 research/lce_chunk_sweep.py
"""

from __future__ import annotations

import torch
import triton

from tilewise.ops.rowwise.linear_cross_entropy import linear_cross_entropy

SHAPES = [(16384, 2048, 128256), (16384, 4096, 128256)]  # (N, H, V): Llama-3.2-1B, the 8B-like
CHUNKS = [1024, 2048, 3072, 4096, 8192]


def _run(fn, x, w, t):
    x.grad = w.grad = None
    loss = fn(x, w, t)
    loss.backward()
    return loss.detach(), x.grad, w.grad


def _measure(fn, x, w, t):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    _run(fn, x, w, t)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    ms = triton.testing.do_bench(lambda: _run(fn, x, w, t), warmup=5, rep=50, return_mode="median")
    return ms, peak


def case(N, H, V):
    g = torch.Generator(device="cuda").manual_seed(N + H)
    x = (torch.randn(N, H, device="cuda", generator=g) * 0.5).bfloat16().requires_grad_(True)
    w = (torch.randn(V, H, device="cuda", generator=g) * H ** -0.5).bfloat16().requires_grad_(True)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    cands = {f"tilewise chunk_rows={c}": (lambda x, w, t, c=c: linear_cross_entropy(x, w, t, chunk_rows=c))
             for c in CHUNKS}
    cands["torch logits + cross_entropy"] = lambda x, w, t: torch.nn.functional.cross_entropy(
        (x @ w.T).float(), t)
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()
        cands["liger fused linear cross-entropy"] = lambda x, w, t: liger(w, x, t)
    except ImportError:
        print("  (no Liger wheel: its row is left out)")
    ref = _run(cands[f"tilewise chunk_rows={CHUNKS[0]}"], x, w, t)
    print(f"N {N} H {H} V {V} bf16 (forward + backward)", flush=True)
    for name, fn in cands.items():
        try:
            got = _run(fn, x, w, t)
        except torch.cuda.OutOfMemoryError:
            print(f"  {name:<36} out of memory", flush=True)
            torch.cuda.empty_cache()
            continue
        errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(got, ref)]
        if max(errs) > 2e-2:
            print(f"  {name:<36} FAILED check (loss / dx / dW rel err {errs})", flush=True)
            continue
        ms, peak = _measure(fn, x, w, t)
        print(f"  {name:<36} {ms:8.3f} ms  peak +{peak:.2f} GiB", flush=True)
        torch.cuda.empty_cache()


def main():
    for shape in SHAPES:
        case(*shape)


if __name__ == "__main__":
    main()
