"""The forward's online softmax with the scale folded into the exponent (row max on q.k, one FFMA a
score instead of a multiply and an add) and, as first measured, LAZY rescaling (acc and l rescaled
only when a row max grows by more than 2^8; since removed), against the previous kernels (the package at OLD_SRC, e.g. an
older checkout's src/, imported as a second copy) and SDPA cuDNN / flash, same run. bf16, B=4 H=16
S=4096 and B=2 H=16 S=8192, D 64 and 128, plain and causal, and a (1, H, S, S) bias.

Why (sm_90 SASS, Triton 3.6, compiled without a GPU): the TMA forward's main loop at D = 64 (64 x
64 x 4 warps) had 329 instructions a key tile without a bias, 450 with; the fold takes it to 299 /
420 (the per-score FMUL goes). The FA2 forward without warp specialization is issue-bound beside
its wgmma at D = 64 (~1,800 warp-instructions a tile against ~512 cycles of MMA an SM), so fewer
instructions should show. LAZY removes the 32 acc * alpha multiplies a tile (and alpha's exp2)
when no rescale is due, at the price of a CTA-wide reduction and branch.

Prediction: plain D = 64 ~0.63 -> ~0.59 ms (-7 %), D = 128 -3 %; bias D = 64 0.85 -> ~0.80 ms;
LAZY a further -5 % at D = 64 if the branch costs little.

Measured (H200, 767ce4a, logs/attention-softmax-fold.log; ms, before -> fold, x cuDNN after):
plain D 64 0.639 -> 0.641 (S 4096), 1.279 -> 1.274 (S 8192); causal 0.381 -> 0.371, 0.708 -> 0.703;
bias 0.913 -> 0.834 (1.25x), 1.976 -> 1.911 (1.21x). D 128: plain 1.144 -> 1.143, 2.265 -> 2.243;
causal 0.654 -> 0.635, 1.230 -> 1.185; bias 1.404 -> 1.395 (1.29x), 2.853 -> 2.819 (1.31x). The bias
forward at D = 64 gained most (-9 %, the add and the multiply a score became one FFMA); the plain
forward did not move: its wgmma waits, not its issue slots, bound it. LAZY was 8-20 % slower
everywhere (the CTA-wide any-row reduction and branch a tile cost more than the multiplies saved).

Run on the GPU (~2 minutes): OLD_SRC=<dir> PYTHONPATH=src python3 research/attention_softmax_fold.py
"""
import contextlib
import importlib.util
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tilewise.ops.attention import api as A


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


@contextlib.contextmanager
def old_kernels():
    """The attention kernels of OLD_SRC (an older checkout's src/) under the current launchers: the
    kernel module is swapped for the call (the launchers import it at call time)."""
    import tilewise.ops.attention as pkg
    from tilewise.ops.attention import triton_kernels as new

    # Checkouts from before the family packages have ops/attention_kernels.py, later ones
    # ops/attention/triton_kernels.py.
    path = os.path.join(os.environ["OLD_SRC"], "tilewise", "ops", "attention", "triton_kernels.py")
    if not os.path.exists(path):
        path = os.path.join(os.environ["OLD_SRC"], "tilewise", "ops", "attention_kernels.py")
    spec = importlib.util.spec_from_file_location("tw_old_attention_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pkg.triton_kernels = mod
    try:
        yield
    finally:
        pkg.triton_kernels = new


def main():
    old = bool(os.environ.get("OLD_SRC"))
    g = torch.Generator(device="cuda").manual_seed(0)
    for D in (64, 128):
        for B, S in ((4, 4096), (2, 8192)):
            H = 16
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            bias = torch.randn(1, H, S, S, device="cuda", dtype=torch.bfloat16, generator=g)
            for kind in ("plain", "causal", "bias"):
                kw = {"causal": kind == "causal", "bias": bias if kind == "bias" else None}
                flops = 4 * B * H * S * S * D / (2 if kind == "causal" else 1)
                backend = SDPBackend.CUDNN_ATTENTION
                with sdpa_kernel(backend):
                    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=kw["bias"], is_causal=kw["causal"])
                    t_cudnn = bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=kw["bias"],
                                                                           is_causal=kw["causal"]))
                line = f"D={D} B={B} S={S} {kind:6s}: cuDNN {t_cudnn:.4f}"
                if old:
                    with old_kernels():
                        t_old = bench(lambda: A.flash_attention(q, k, v, **kw))
                    line += f" | before {t_old:.4f} ({t_cudnn / t_old:.3f}x)"
                out = A.flash_attention(q, k, v, **kw)
                err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
                t = bench(lambda: A.flash_attention(q, k, v, **kw))
                line += f" | fold {t:.4f} ({t_cudnn / t:.3f}x, {flops / t / 1e9:.0f} TF/s, err {err:.1e})"
                print(line, flush=True)


if __name__ == "__main__":
    main()
