"""Which tiles for the attention backward? Times tilewise's backward alone (forward done once, the
autograd graph kept) at B=4, H=16, S=4096, bf16, D in {128, 64}, causal and not:
    - SDPA flash and cuDNN backwards (what a user gets),
    - the deterministic two-kernel backward (default tiles),
    - the atomic backward (deterministic=False) over a handful of (BLOCK_M, BLOCK_N, warps, stages),
      with dQ added by pointer atomics ("ptr") or by TMA reduce-add ("tma", D = 128 only),
    - the deterministic backward with one of its two kernels' tiles overridden ("det ...").
Every candidate's dQ, dK, dV are first checked against SDPA math in fp32 on batch 0, heads 0-1, and
against SDPA flash's full-size gradients; a failing config is reported and not timed.
TFLOP/s = 2.5 x 4 B H S^2 D / time (halved when causal), the backward's share of the usual count.
Run on the GPU (< 2 min): PYTHONPATH=src python3 research/attention_bwd_configs.py [D ...]
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tilewise.ops.attention import api as A

B, H, S = 4, 16, 4096
ATOMIC = {  # D: [(dQ path, (BLOCK_M, BLOCK_N, num_warps, num_stages)), ...]; the default is starred
    # First run (logs/attention-bwd-configs.log): 64 x 128 x 8 warps x 2 stages best (330.8 TFLOP/s
    # non-causal), spilling; the next candidates trade the key tile for registers or add stages.
    128: [("ptr", (64, 128, 8, 3)), ("ptr", (64, 128, 8, 2)), ("ptr", (64, 64, 4, 2)), ("ptr", (64, 64, 8, 3)),
          ("ptr", (128, 64, 8, 2)), ("ptr", (128, 128, 8, 2)), ("ptr", (32, 128, 8, 2))],
    64: [("ptr", (64, 64, 8, 2)), ("ptr", (64, 128, 8, 2)), ("ptr", (32, 128, 8, 2)), ("ptr", (64, 128, 8, 1)),
         ("ptr", (128, 64, 8, 2))],
}


# Deterministic backward (two kernels: dK/dV with a key tile kept, dQ with a query tile kept): tile
# overrides to time beside its defaults (configs.DKDV, configs.DQ). At D = 64 the bench had
# fwd+bwd at 1.17x flash with the defaults (logs/bench-attention-d64-s16k.log); these are the next
# candidates, one kind changed at a time.
DETERMINISTIC = {
    # Run 3 (logs/attention-bwd-configs-d64-det-tiles.log): dkdv 32 x 64 x 4 warps x 4 stages won (now
    # the 2-byte default); its neighbours, and the dQ kernel's, next.
    64: [{"dkdv": (32, 128, 8, 3)}, {"dkdv": (32, 64, 4, 3)}, {"dkdv": (32, 64, 4, 5)}, {"dkdv": (64, 64, 4, 4)},
         {"dkdv": (16, 64, 4, 4)}, {"dq": (64, 64, 4, 4)}, {"dq": (64, 128, 4, 3)}, {"dq": (128, 64, 8, 4)}],
    128: [{"dkdv": (64, 128, 8, 2)}, {"dkdv": (32, 64, 4, 3)}, {"dq": (128, 128, 8, 2)}, {"dq": (64, 64, 4, 3)}],
}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main():
    dims = [int(a) for a in sys.argv[1:]] or [128, 64]
    t_start = time.time()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for D in dims:
        q, k, v, go = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        for causal in (False, True):
            flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
            sl = (slice(0, 1), slice(0, 2))
            qs, ks, vs = (t[sl].float().requires_grad_(True) for t in (q, k, v))
            with sdpa_kernel(SDPBackend.MATH):
                ref = torch.autograd.grad(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal),
                                          (qs, ks, vs), go[sl].float())

            def setup(fwd):
                qi, ki, vi = (t.detach().requires_grad_(True) for t in (q, k, v))
                out = fwd(qi, ki, vi)
                return lambda: torch.autograd.grad(out, (qi, ki, vi), go, retain_graph=True)

            def sdpa(backend):
                def fwd(a, b, c):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(a, b, c, is_causal=causal)
                return fwd

            flash_bwd = setup(sdpa(SDPBackend.FLASH_ATTENTION))
            flash_grads = flash_bwd()
            cands = [("sdpa_flash", flash_bwd, None), ("sdpa_cudnn", None, sdpa(SDPBackend.CUDNN_ATTENTION)),
                     ("tilewise deterministic", None, lambda a, b, c: A.flash_attention(a, b, c, causal=causal))]
            # The tiles below are v3's two backward kernels' (not v6's): their candidates run that backward.
            det_policy = A.default_policy(q, k, causal=causal).replace(backward="two_kernel")
            atomic_policy = A.default_policy(q, k, causal=causal, deterministic=False)
            default_tma = atomic_policy.dq_tma and A._dq_tma_applies(q, D)
            default = atomic_policy.tile("atomic_tma" if default_tma else "atomic", D, q.dtype.itemsize)
            for path, cfg in ATOMIC.get(D, []):
                star = "*" if cfg == default and (path == "tma") == default_tma else ""
                cands.append((f"atomic {path} {cfg}{star}", (path, cfg), None))
            for over in DETERMINISTIC.get(D, []):
                cands.append(("det " + " ".join(f"{k}={v}" for k, v in over.items()), ("det", over), None))
            for name, spec, fwd in cands:
                try:
                    if isinstance(spec, tuple) and spec[0] == "det":
                        policy = det_policy.replace(tiles=spec[1])
                        bwd = setup(lambda a, b, c: A.flash_attention(a, b, c, causal=causal, policy=policy))
                        grads = bwd()
                        errs = ([rel(x[sl], r) for x, r in zip(grads, ref)]
                                + [rel(x, f) for x, f in zip(grads, flash_grads)])
                        ms = do_bench(bwd, warmup=25, rep=100, return_mode="median") if max(errs) < 2e-2 else None
                    elif isinstance(spec, tuple):
                        path, cfg = spec
                        kind = "atomic_tma" if path == "tma" else "atomic"
                        policy = atomic_policy.replace(tiles={kind: cfg}, dq_tma=path == "tma")
                        bwd = setup(lambda a, b, c: A.flash_attention(a, b, c, causal=causal, deterministic=False,
                                                                      policy=policy))
                        grads = bwd()
                        ms = None
                        if path == "tma" and A._DQ_TMA_BUILDS["ok"] is not True:
                            print(f"D={D} causal={causal} {name}: TMA reduce-add unavailable (fell back)")
                            continue
                        errs = ([rel(x[sl], r) for x, r in zip(grads, ref)]
                                + [rel(x, f) for x, f in zip(grads, flash_grads)])
                        if max(errs) < 2e-2:
                            ms = do_bench(bwd, warmup=25, rep=100, return_mode="median")
                    else:
                        bwd = spec if spec is not None else setup(fwd)
                        grads = bwd()
                        errs = ([rel(x[sl], r) for x, r in zip(grads, ref)]
                                + [rel(x, f) for x, f in zip(grads, flash_grads)])
                        ms = do_bench(bwd, warmup=25, rep=100, return_mode="median") if max(errs) < 2e-2 else None
                except Exception as e:  # a config that does not build (shared memory, registers) is reported
                    print(f"D={D} causal={causal} {name}: FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                if ms is None:
                    print(f"D={D} causal={causal} {name}: WRONG, max rel err {max(errs):.3g} (not timed)", flush=True)
                    continue
                rows.append((D, causal, name, ms, flops / ms / 1e9, max(errs)))
                print(f"D={D:3d} causal={causal!s:5} {name:34s} {ms:7.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s "
                      f"(max rel err {max(errs):.2g})", flush=True)
            del flash_bwd, flash_grads
            torch.cuda.empty_cache()
    print("\nbest atomic per case (bwd TFLOP/s; vs sdpa_flash and the deterministic backward):")
    for D in dims:
        for causal in (False, True):
            case = [r for r in rows if r[0] == D and r[1] == causal]
            at = [r for r in case if r[2].startswith("atomic")]
            ref = {r[2]: r[3] for r in case}
            for label, group in (("atomic", at), ("deterministic tiles", [r for r in case if r[2].startswith("det ")])):
                if group:
                    best = min(group, key=lambda r: r[3])
                    print(f"  D={D} causal={causal} {label}: {best[2]} {best[4]:.1f} TFLOP/s, "
                          f"{ref.get('sdpa_flash', float('nan')) / best[3]:.2f}x flash, "
                          f"{ref.get('tilewise deterministic', float('nan')) / best[3]:.2f}x deterministic defaults")
    print(f"elapsed {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
