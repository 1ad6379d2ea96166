"""Three small items of the Llama step where hf_tilewise spends more device time than hf_liger (1 x 16384,
H100, `llama_step_profile.py` at d66fbda): the packed linear's input gradient concatenating its weights
(CatArrayBatchedCopy 0.87 ms a step), SwiGLU's packed kernel's launch shape (keep_act 11.51 ms a step against
Liger's 11.14 for the same bytes), and RMSNorm's dW partial sums reduced by torch (0.43 ms a step for 33
launches against Liger's 0.22).

1. grad x of ``grads_packed``: ``g2 @ torch.cat(weights)`` against one GEMM a weight accumulated into one
   output (``mm`` then ``addmm_(beta=1)``, what transformers' separate projections plus autograd's add round
   like). Same bytes on paper (the cat's 2 x |W| against the accumulate's 2 x |grad x|); the second GEMM's C
   read sits in its epilogue. Prediction: gate / up (two 8192 x 2048 weights) -20 to -30 us a layer; q / k / v
   (2048 + 512 + 512 rows) no gain (three GEMMs, two with K = 512).
2. ``_swiglu_packed_kernel`` at (16384, 2 x 8192) by BLOCK and warps, forward, backward and backward with y
   kept, beside Liger's forward / backward kernels. Prediction: a 2048 or 4096 block within 3 % of Liger's.
3. RMSNorm's dW: ``part[:, :N].sum(0).to(bf16)`` of the (4 x 132, 2048) fp32 partials against a Triton column
   sum in a fixed row order that writes bf16 (deterministic as now). Prediction: 13 -> 5 us a call.

Run on the GPU (~40 s): PYTHONPATH=src:/tmp/site python3 research/llama_small_kernels.py (Liger from the
carried wheel: `. scripts/_wheels.sh` first; its rows are skipped without it).

RESULT (H100, d66fbda, `llama-small-kernels-d66fbda.log`): 1. no gain (1607 against 1614 us; q / k / v 380
against 302); 2. 4096 columns 2 % faster backward (`configs.swiglu_packed_block`, 4b9e86b), ours ~10 % ahead of
Liger's kernels; 3. both launch-bound in this timing, no answer (`research/patches/rms-norm-dw-sum.patch` since).

4. (``--embed``, added 2026-12-07 after the run) the tied embedding's rows into the head's dense gradient
   (`_EmbeddingRows.backward`): ``index_add_`` (0.32 ms a step in the 1 x 16384 profile: bf16 atomics, each
   repeat rounded) against ``index_put_(accumulate=True)`` (sorts the ids, sums a row's repeats in fp32, adds
   once: deterministic). 16384 ids into (128256, 2048) bf16, uniform and Zipf-like ids. Prediction: index_put_
   60-120 us against ~320, and closer to the float64 sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilewise.ops.pointwise import swiglu as SW

from _timing import abba_ms, median_event_ms, warm_clocks

T, HID, INTER = 16384, 2048, 8192


def bench(fn):
    return median_event_ms(fn, reps=60, warmup=5)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def grad_x():
    g = torch.Generator(device="cuda").manual_seed(1)
    for label, outs in (("gate/up", (INTER, INTER)), ("q/k/v", (2048, 512, 512))):
        ws = [torch.randn(o, HID, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for o in outs]
        g2 = torch.randn(T, sum(outs), device="cuda", dtype=torch.bfloat16, generator=g)
        gx = torch.empty(T, HID, device="cuda", dtype=torch.bfloat16)

        def cat():
            return g2 @ torch.cat(ws)

        def accumulate():
            col = 0
            for i, w in enumerate(ws):
                a = g2[:, col:col + w.shape[0]]
                if i == 0:
                    torch.mm(a, w, out=gx)
                else:
                    gx.addmm_(a, w)
                col += w.shape[0]
            return gx

        ref = g2.double() @ torch.cat(ws).double()
        print(f"grad x {label}: rel err cat {rel(cat(), ref):.2e}, accumulate {rel(accumulate(), ref):.2e}",
              flush=True)
        mid, rounds = abba_ms({"cat": cat, "accumulate": accumulate}, bench, rounds=6)
        print(f"  cat {mid['cat'] * 1e3:8.1f} us  accumulate {mid['accumulate'] * 1e3:8.1f} us  "
              f"rounds {rounds}", flush=True)


def swiglu():
    g = torch.Generator(device="cuda").manual_seed(2)
    gu = torch.randn(T, 2 * INTER, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = torch.randn(T, INTER, device="cuda", dtype=torch.bfloat16, generator=g)
    y = torch.empty(T, INTER, device="cuda", dtype=torch.bfloat16)
    dgu = torch.empty_like(gu)
    ld = gu.stride(0)
    gate, up = gu[:, :INTER], gu[:, INTER:]
    y_ref = torch.nn.functional.silu(gate.float()) * up.float()
    fwd_bytes, bwd_bytes = 3 * T * INTER * 2, 5 * T * INTER * 2
    for block in (1024, 2048, 4096):
        for warps in (4, 8):
            grid = (T, triton.cdiv(INTER, block))

            def fwd():
                SW._launch(SW._swiglu_packed_kernel, grid, gu, gu, y, gu, INTER, ld, BLOCK=block, BACKWARD=False,
                           STORE_Y=False, num_warps=warps)

            def bwd(keep):
                SW._launch(SW._swiglu_packed_kernel, grid, gu, dy, y, dgu, INTER, ld, BLOCK=block, BACKWARD=True,
                           STORE_Y=keep, num_warps=warps)

            y.fill_(float("nan"))
            fwd()
            err = rel(y, y_ref)
            tf, tb, tk = bench(fwd), bench(lambda: bwd(False)), bench(lambda: bwd(True))
            print(f"swiglu packed BLOCK {block:4d} warps {warps}: fwd {tf * 1e3:6.1f} us ({fwd_bytes / tf / 1e9:5.2f} "
                  f"TB/s)  bwd {tb * 1e3:6.1f} us ({bwd_bytes / tb / 1e9:5.2f} TB/s)  bwd+y {tk * 1e3:6.1f} us  "
                  f"(y err {err:.1e})", flush=True)
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError as e:
        print(f"liger: {e}: skipped")
        return
    a, b = gate.contiguous().requires_grad_(True), up.contiguous().requires_grad_(True)
    out = LigerSiLUMulFunction.apply(a, b)
    tf = bench(lambda: LigerSiLUMulFunction.apply(a, b))
    tb = bench(lambda: torch.autograd.grad(out, (a, b), dy, retain_graph=True))
    print(f"liger swiglu: fwd {tf * 1e3:6.1f} us ({fwd_bytes / tf / 1e9:5.2f} TB/s)  bwd {tb * 1e3:6.1f} us "
          f"({bwd_bytes / tb / 1e9:5.2f} TB/s)", flush=True)


@triton.jit
def _column_sum_kernel(P, OUT, rows, n, stride, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    for r0 in range(0, rows, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        m = (r[:, None] < rows) & (cols[None, :] < n)
        acc += tl.load(P + r[:, None] * stride + cols[None, :], mask=m, other=0.0)
    tl.store(OUT + cols, tl.sum(acc, 0).to(OUT.dtype.element_ty), mask=cols < n)


def rms_dw():
    rows = 4 * torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(3)
    part = torch.randn(rows, HID, device="cuda", dtype=torch.float32, generator=g)
    out = torch.empty(HID, device="cuda", dtype=torch.bfloat16)
    ref = part.double().sum(0)

    def torch_sum():
        return part[:, :HID].sum(0).to(torch.bfloat16)

    for block_r, block_n in ((32, 64), (16, 128), (64, 32)):
        def triton_sum(br=block_r, bn=block_n):
            _column_sum_kernel[(triton.cdiv(HID, bn),)](part, out, rows, HID, part.stride(0), BLOCK_R=br,
                                                        BLOCK_N=bn, num_warps=4)
            return out
        print(f"rms dW ({rows}, {HID}) rows {block_r} cols {block_n}: err torch {rel(torch_sum(), ref):.1e} "
              f"triton {rel(triton_sum(), ref):.1e}; torch {bench(torch_sum) * 1e3:5.1f} us, triton "
              f"{bench(triton_sum) * 1e3:5.1f} us", flush=True)


def embed_rows():
    V, n = 128256, T
    g = torch.Generator(device="cuda").manual_seed(4)
    base = torch.randn(V, HID, device="cuda", dtype=torch.bfloat16, generator=g) * 1e-3
    rows = torch.randn(n, HID, device="cuda", dtype=torch.bfloat16, generator=g) * 1e-3
    zipf = (torch.rand(n, device="cuda", generator=g) ** 4 * 2000).long()  # a few ids repeated many times
    for label, ids in (("uniform", torch.randint(0, V, (n,), device="cuda", generator=g)), ("zipf", zipf)):
        ref = base.double().index_add(0, ids, rows.double())
        dense = base.clone()
        u = ids.unique()

        def add():
            dense.copy_(base)
            dense.index_add_(0, ids, rows)

        def put():
            dense.copy_(base)
            dense.index_put_((ids,), rows, accumulate=True)

        def copy_only():
            dense.copy_(base)

        errs = {}
        for name, fn in (("index_add_", add), ("index_put_", put)):
            fn()
            errs[name] = rel(dense[u].double() - base[u].double(), ref[u] - base[u].double())  # the added part
        c = bench(copy_only)
        print(f"embedding rows into the dense gradient, {label} ids ({ids.unique().numel()} distinct): "
              + "  ".join(f"{name} {(bench(fn) - c) * 1e3:6.1f} us (err {errs[name]:.1e})"
                          for name, fn in (("index_add_", add), ("index_put_", put)))
              + f"  (each less a {c * 1e3:.1f} us copy of the base)", flush=True)


def main():
    import sys

    print(torch.cuda.get_device_name(), flush=True)
    warm_clocks()
    if "--embed" in sys.argv:
        return embed_rows()
    grad_x()
    swiglu()
    rms_dw()


if __name__ == "__main__":
    main()
