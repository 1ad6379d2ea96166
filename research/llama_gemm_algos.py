"""The llama step's GEMMs (issue 31), each timed as the step calls it (torch's cuBLAS, PyTorch's default
pick) against the other algorithms a user or tilewise could pick per shape: torch with cuBLASLt preferred
(``torch.backends.cuda.preferred_blas_library("cublaslt")``), PyTorch's TunableOp (times cuBLAS's and
cuBLASLt's candidates once per shape) and ``blas.lt_matmul(autotune=True)`` (nvmath-python's cuBLASLt
plan, its heuristic's candidates timed once).

Why: GEMMs are ~47 % of the 1 x 16384 step (163.5 of 350.2 ms device time, docs/tuning/bench.md, "llama:
2026-12-05's rows") and the same cuBLAS kernels for hf_tilewise and hf_liger; issue 31 asks 1.05x Liger's
step and the H200 gave 1.043x (4 x 4096) and 1.038x (1 x 16384). 1 % of the GEMMs is ~1.6 ms a step.
Prediction (2026-12-05, before any run): the square-ish forward GEMMs within +-1 % (cuBLAS's heuristic
is tuned for them); the weight gradients (K = 16384 tokens, small M x N: o_dw 2048 x 2048) and the
LM head's chunked dX / dW 0-5 % faster with a timed pick; the whole step's GEMMs 0.5-2 % (1-3 ms).

Shapes: Llama-3.2-1B (hidden 2048, 32 / 8 heads of 64, intermediate 8192, vocab 128256), 16384 tokens a
step (both of the bench's shapes), the LM head in the fused loss's chunks of 3072 rows; layouts as the step
passes them (x @ W^T with W's storage; weight gradients g^T @ x). Each output compared with torch's
default (relative error < 1e-2) before timing; rounds in the order A B, B A, B A, A B (``_timing.abba_ms``),
the mean of the middle two rounds' medians; the table gives ms, TFLOP/s and each variant against torch's
default, then the step's sum (layer GEMMs x 16, the head's x 16384 / 3072).
Run on the GPU: source scripts/_wheels.sh; PYTHONPATH=src python3 research/llama_gemm_algos.py [--rounds 4]
"""
import argparse

import torch

from _timing import abba_ms, median_event_ms

TOK, HID, HEADS, KV, HD, INTER, VOCAB, CHUNK, LAYERS = 16384, 2048, 32, 8, 64, 8192, 128256, 3072, 16


def bench(fn):
    return median_event_ms(fn, reps=30, warmup=3)


def cases(g):
    """(name, calls a step, flops, A, B, strided output or None): the step's product A @ B as it passes them."""
    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05

    qkv_out = (HEADS + 2 * KV) * HD
    x = rnd(TOK, HID)
    w_qkv, w_o, w_g, w_d = rnd(qkv_out, HID), rnd(HID, HID), rnd(INTER, HID), rnd(HID, INTER)
    h = rnd(TOK, INTER)
    g_qkv, g_h, g2 = rnd(TOK, qkv_out), rnd(TOK, HID), rnd(TOK, 2 * INTER)
    w_gu = rnd(2 * INTER, HID)
    xc, w_lm, lg = rnd(CHUNK, HID), rnd(VOCAB, HID), rnd(CHUNK, VOCAB)
    gate_up = torch.empty(TOK, 2 * INTER, device="cuda", dtype=torch.bfloat16)
    head_calls = TOK / CHUNK
    out = []

    def add(name, calls, a, b, strided=None):
        flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
        out.append((name, calls, flops, a, b, strided))

    add("qkv fwd x W^T", LAYERS, x, w_qkv.t())
    add("o fwd", LAYERS, x, w_o.t())
    add("gate fwd (into gate|up)", 2 * LAYERS, x, w_g.t(), strided=gate_up[:, :INTER])
    add("down fwd", LAYERS, h, w_d.t())
    add("down dX g W", LAYERS, g_h, w_d)
    add("down dW g^T h", LAYERS, g_h.t(), h)
    add("gate|up dX g2 Wcat", LAYERS, g2, w_gu)
    add("gate|up dW g2^T x", LAYERS, g2.t(), x)
    add("o dX", LAYERS, g_h, w_o)
    add("o dW", LAYERS, g_h.t(), x)
    add("qkv dX", LAYERS, g_qkv, w_qkv)
    add("qkv dW", LAYERS, g_qkv.t(), x)
    add("head fwd xc W^T", head_calls, xc, w_lm.t())
    add("head dX lg W", head_calls, lg, w_lm)
    add("head dW lg^T xc", head_calls, lg.t(), xc)
    return out


def variants(a, b, strided):
    from tilewise.ops.gemm import blas

    def torch_default():
        if strided is not None:
            return torch.mm(a, b, out=strided)
        return torch.mm(a, b)

    def torch_lt():
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            return torch_default()
        finally:
            torch.backends.cuda.preferred_blas_library("cublas")

    def tunable():
        torch.cuda.tunable.enable(True)
        try:
            return torch_default()
        finally:
            torch.cuda.tunable.enable(False)

    def lt_auto():
        return blas.lt_matmul(a, b, autotune=True)

    return {"torch": torch_default, "torch cublaslt": torch_lt, "tunableop": tunable, "lt autotune": lt_auto}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    torch.cuda.tunable.set_filename("/tmp/tunableop_results.csv")
    torch.cuda.tunable.tuning_enable(True)
    torch.cuda.tunable.set_max_tuning_duration(200)  # ms a shape
    g = torch.Generator(device="cuda").manual_seed(31)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuBLASLt {torch.backends.cuda.preferred_blas_library()}", flush=True)
    rows = []  # (calls, {variant: median ms})
    names_all = ("torch", "torch cublaslt", "tunableop", "lt autotune")
    print(f"{'GEMM':26} {'M x N x K':>22} {'calls':>6} " + " ".join(f"{n:>22}" for n in names_all))
    for name, calls, flops, a, b, strided in cases(g):
        fns = variants(a, b, strided)
        ref = fns["torch"]().float()
        ok = {}
        for n, fn in fns.items():
            try:
                y = fn()  # also the tuning call (TunableOp, lt autotune)
                torch.cuda.synchronize()
                err = ((y.float() - ref).norm() / ref.norm()).item()
                if err < 1e-2:
                    ok[n] = fn
                else:
                    print(f"  {name}: {n} off by {err:.2e}, dropped")
            except Exception as e:  # noqa: BLE001 - a variant that does not run here is reported
                print(f"  {name}: {n} failed: {type(e).__name__}: {str(e)[:120]}")
        torch.cuda.tunable.tuning_enable(False)  # tuned once above; timing only from here
        med, _ = abba_ms(ok, bench, args.rounds)
        torch.cuda.tunable.tuning_enable(True)
        rows.append((calls, med))
        base = med.get("torch")
        cells = [f"{med[n]:.4f} {flops / med[n] / 1e9:5.0f}" + (f" {base / med[n]:.3f}x" if base else "")
                 if n in med else "-" for n in names_all]
        mnk = f"{a.shape[0]}x{b.shape[1]}x{a.shape[1]}"
        print(f"{name:26} {mnk:>22} {calls:6.1f} " + " ".join(f"{c:>22}" for c in cells), flush=True)
    print("the step's GEMMs, ms (calls x median, summed; a variant missing a shape counts torch's time there):")
    base = sum(c * m["torch"] for c, m in rows)
    for n in names_all:
        ms = sum(c * m.get(n, m["torch"]) for c, m in rows)
        print(f"  {n:16} {ms:8.2f}  ({base - ms:+.2f} ms against torch)")
    best = sum(c * min(m.values()) for c, m in rows)
    print(f"  {'best per shape':16} {best:8.2f}  ({base - best:+.2f} ms against torch)")
    packed_dx(g, args.rounds)


def packed_dx(g, rounds):
    """``linear_packed``'s input gradient for gate / up (nn/packed.py): the weights concatenated for one
    GEMM (K = 2 x 8192; the concatenation, 64 MiB read and written, each backward) against two GEMMs, the
    second adding into the first's output (beta = 1, cuBLAS reads it in its epilogue; one more bf16 rounding,
    as HF's separate gate and up layers have when autograd sums their input gradients)."""
    g2 = torch.randn(TOK, 2 * INTER, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    wg, wu = (torch.randn(INTER, HID, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05 for _ in range(2))
    out = torch.empty(TOK, HID, device="cuda", dtype=torch.bfloat16)

    def cat_one():
        return torch.mm(g2, torch.cat((wg, wu)), out=out)

    def two():
        torch.mm(g2[:, :INTER], wg, out=out)
        return out.addmm_(g2[:, INTER:], wu)

    ref = g2.double() @ torch.cat((wg, wu)).double()
    fns = {"cat + one GEMM": cat_one, "two GEMMs": two}
    errs = {n: ((fn().double() - ref).norm() / ref.norm()).item() for n, fn in fns.items()}
    med, _ = abba_ms(fns, bench, rounds)
    print("gate|up dX (16384 x 2048 from K = 16384), ms / relative error against fp64:")
    for n in fns:
        print(f"  {n:16} {med[n]:.4f}  {errs[n]:.2e}  ({LAYERS * (med['cat + one GEMM'] - med[n]):+.2f} ms a step)")


if __name__ == "__main__":
    main()
