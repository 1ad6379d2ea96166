"""v6 (the Gluon warp-specialized backward kernels, ops/attention/gluon_bwd.py) against v3's Triton
dK / dV and dQ kernels (the deterministic backward), and cuDNN's backward: the backward alone (one
forward, its graph kept; do_bench, L2 flushed), bf16, H = 16, B * S = 16384 tokens as the bench,
D 64 / 128, causal or not, S 1024 / 4096 / 8192. Columns: triton (both kernels v3's), v6 dkdv (the
Gluon dK / dV kernel, v3's dQ), v6 (both Gluon), cudnn. Each v6 run is checked against the Triton
result (dQ, dK, dV) first. With --tiles: v6's dK / dV (BLOCK_M, STAGES, registers) candidates at
S = 4096 (with v3's dQ).
Prediction (before the first run, from the ninth session's Nsight Compute profile: the Triton dK /
dV kernel keeps the tensor pipe 38% busy at D = 128 (3.02 ms), its dQ kernel 54% (1.57 ms), cuDNN's
backward 63% (2.29 ms)): v6's kernels at ~55-60% busy, so the D = 128 backward 4.65 -> ~3.2 ms at
S = 4096 (fwd + bwd ~1.5x SDPA flash, from 1.13x); D = 64 2.0 -> ~1.6 ms.
Run on the GPU: PYTHONPATH=src python3 research/attention_ws_bwd.py [--tiles [D ...] | --short-causal]
"""

import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import api as A
from tilewise.ops.attention import gluon_bwd as gb


def warm_up():
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):
        x @ x


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")


def case(S, D, causal, g, runs=None):
    """One shape: v3's kernels, cuDNN, and ``runs``: (name, dK / dV config or None, dQ config or None,
    Gluon dQ?) (a config: (BLOCK, STAGES, consumer registers))."""
    H, TOKENS = 16, 16384
    B = TOKENS // S
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
               for _ in range(3))
    go = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    # The backward runs the forward's policy: each column's forward is made with the policy it times.
    base = A.default_policy(q, k, causal=causal)
    out = A.flash_attention(q, k, v, causal=causal, policy=base.replace(backward="two_kernel"))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out_cudnn = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def bwd(o=out):
        return torch.autograd.grad(o, (q, k, v), go, retain_graph=True)

    ref = bwd()
    res = {"triton": bench(bwd), "cudnn": bench(lambda: bwd(out_cudnn))}
    runs = runs or [("v6 dkdv", None, None, False), ("v6", None, None, True)]
    for name, cfg, dq_cfg, ws_dq in runs:
        policy = base.replace(backward="ws", ws_bwd_dq=ws_dq, ws_bwd_config=cfg, ws_bwd_dq_config=dq_cfg)
        try:
            out_ws = A.flash_attention(q, k, v, causal=causal, policy=policy)
            got = bwd(out_ws)
            for n, a, r in zip(("dq", "dk", "dv"), got, ref):
                err = ((a.float() - r.float()).norm() / r.float().norm()).item()
                assert err < 1e-2, f"{name} D={D} S={S} causal={causal} {n}: {err:.3g} from the Triton kernel"
            res[name] = bench(lambda: bwd(out_ws))
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a tile out of shared memory: logged
            print(f"  {name}: {type(e).__name__}: {str(e)[:160]}", flush=True)
    flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
    line = " | ".join(f"{n} {ms * 1e3:7.1f} us {flops / ms / 1e9:5.1f} TF" for n, ms in res.items())
    print(f"backward D={D:3d} S={S:5d} {'causal' if causal else 'plain ':6s}: {line}", flush=True)


# --tiles: v6 (both Gluon kernels) with these dK / dV configs (v6's dQ config), then v6's dQ configs
# (v6's dK / dV config); (BLOCK, STAGES, consumer registers). Shared memory at D = 128: dK / dV 64 KB
# + STAGES x BLOCK_M x 512 B, dQ 64 KB + STAGES x BLOCK_N x 512 B.
DKDV_TILES = {128: [(32, 3, 240), (64, 2, 240), (64, 3, 240), (64, 4, 240)],
              64: [(32, 3, 240), (64, 2, 240), (64, 3, 240), (64, 4, 240), (128, 2, 240)]}
DQ_TILES = {128: [(64, 2, 240), (64, 4, 240), (128, 2, 240)],
            64: [(64, 2, 240), (64, 4, 240), (128, 2, 240), (128, 3, 240)]}


def short_causal(g):
    """The grid (e79d096) timed v6's causal backward at S = 1024 / 2048 no faster than non-causal
    (D = 128 S = 1024: fwd + bwd 1.23 ms causal, 1.25 plain), where the --tiles run had 0.65 ms for
    the backward alone (and 0.92 ms in another run of the same config): each kernel alone, five
    timings each, plain and causal, to see which kernel and whether the time is bimodal."""
    H, TOKENS = 16, 16384
    for D, S in ((128, 1024), (64, 2048), (128, 4096)):
        B = TOKENS // S
        q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        for causal in (False, True):
            out, lse = A.flash_attention(q, k, v, causal=causal, return_lse=True)
            delta = (out.float() * do.float()).sum(-1)
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            scale = D ** -0.5
            t_kv = [bench(lambda: gb.dkdv(q, k, v, do, lse, delta, causal, scale, dk, dv)) for _ in range(5)]
            t_q = [bench(lambda: gb.dq(q, k, v, do, lse, delta, causal, scale, dq)) for _ in range(5)]
            print(f"D={D:3d} S={S:5d} {'causal' if causal else 'plain ':6s}: dkdv "
                  + " ".join(f"{t * 1e3:6.0f}" for t in t_kv) + " us | dq " + " ".join(f"{t * 1e3:6.0f}" for t in t_q)
                  + " us", flush=True)


def main():
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    warm_up()
    g = torch.Generator(device="cuda").manual_seed(0)
    if "--short-causal" in sys.argv:
        short_causal(g)
        return
    if "--tiles" in sys.argv:
        dims = [int(a) for a in sys.argv[sys.argv.index("--tiles") + 1:] if a.isdigit()] or [128, 64]
        for D in dims:
            for S in (1024, 4096, 16384):
                for causal in (False, True):
                    runs = [(f"dkdv {c}", c, None, True) for c in DKDV_TILES[D]]
                    runs += [(f"dq {c}", None, c, True) for c in DQ_TILES[D]]
                    case(S, D, causal, g, runs)
        return
    for D in (128, 64):
        for S in (4096, 1024, 8192):
            for causal in (False, True):
                case(S, D, causal, g)


if __name__ == "__main__":
    main()
