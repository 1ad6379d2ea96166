"""v5 (the warp-specialized Gluon forward, ops/attention/gluon_fwd.py) against the Triton forward the
library runs without it (v3's pointer kernel; v4's TMA kernel with a bias), and SDPA's cuDNN
backend, forward only, bf16, H = 16, B * S = 16384 tokens as the bench: D 64 / 128, S 1024 / 4096 /
8192, plain, causal, and with a (1, H, S, S) bias. Two interleaved rounds (do_bench, L2 flushed);
each version checked against the fp32 reference on heads 0-1 of batch 0 first. The result picks
``attention._WS_RULES``.
Run on the GPU: PYTHONPATH=src python3 research/attention_ws_ab.py [--bias-paths | --d64 |
--pingpong | --persistent | --persistent3] (the bias forward's routes at S = 1024 and 2048; D = 64 with
two and three consumers; v5 with and without ping-pong; v5 on its own grid and on a persistent one; D = 64's
three consumers on both grids) instead.
"""

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import api as A


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")


def race(fns, q, k, v, causal, bias, label):
    """Check each fn against the fp32 reference on heads 0-1 of batch 0, then time them in two
    interleaved rounds; the best of the two per fn (ms)."""
    ref = A.reference(q[:1, :2].float(), k[:1, :2].float(), v[:1, :2].float(), causal=causal,
                      bias=bias[:, :2].float() if bias is not None else None)
    for name, fn in fns.items():
        err = ((fn()[:1, :2].float() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, f"{name} {label}: rel err {err:.3g}"
    times = {name: [] for name in fns}
    for _ in range(2):
        for name, fn in fns.items():
            times[name].append(bench(fn))
    return {name: min(ts) for name, ts in times.items()}


def warm_up():
    """Clocks up before the first timing (an idle H200 sits at 345 MHz)."""
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):
        x @ x


def modes(H, S, g):
    """(mode, causal, bias) for the plain, causal and (1, H, S, S)-bias forwards."""
    for mode in ("plain", "causal", "bias"):
        bias = 0.1 * torch.randn(1, H, S, S, device="cuda", dtype=torch.bfloat16, generator=g) if mode == "bias" else None
        yield mode, mode == "causal", bias


def cudnn_fn(q, k, v, bias, causal):
    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal)
    return fn


def main():
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    H, TOKENS = 16, 16384
    for D in (64, 128):
        for S in (1024, 4096, 8192):
            B = TOKENS // S
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for mode, causal, bias in modes(H, S, g):
                flops = 4 * B * H * S * S * D // (2 if causal else 1)
                cudnn = cudnn_fn(q, k, v, bias, causal)

                base = A.default_policy(q, k, causal=causal, bias=bias)

                def ours(ws):
                    policy = base.replace(forward="ws" if ws else "pointer")

                    def fn():
                        return A.flash_attention(q, k, v, causal=causal, bias=bias, policy=policy)
                    return fn

                fns = {"cudnn": cudnn, "triton (v3/v4)": ours(False), "v5 gluon ws": ours(True)}
                t = race(fns, q, k, v, causal, bias, f"D={D} S={S} {mode}")
                line = " | ".join(f"{name} {t[name] * 1e3:8.1f} us {flops / t[name] / 1e9:6.1f} TF" for name in fns)
                print(f"D={D:3d} S={S:5d} B={B:2d} {mode:6s}: {line} | v5 x triton {t['triton (v3/v4)'] / t['v5 gluon ws']:.3f}"
                      f" | v5 x cudnn {t['cudnn'] / t['v5 gluon ws']:.3f} (triton x cudnn "
                      f"{t['cudnn'] / t['triton (v3/v4)']:.3f})", flush=True)


def bias_paths():
    """The bias forward's routes at S = 1024 / 2048 (B = 16 / 8): v4's TMA bias kernel (the
    default where v5 is not), v3's pointer kernel (policy ``bias_tma`` off), v5, and cuDNN."""
    g = torch.Generator(device="cuda").manual_seed(1)
    H, TOKENS = 16, 16384
    for D in (64, 128):
        for S in (1024, 2048):
            B = TOKENS // S
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            bias = 0.1 * torch.randn(1, H, S, S, device="cuda", dtype=torch.bfloat16, generator=g)
            flops = 4 * B * H * S * S * D
            cudnn = cudnn_fn(q, k, v, bias, False)

            base = A.default_policy(q, k, bias=bias)

            def route(ws, tma):
                policy = base.replace(forward="ws" if ws else "pointer", bias_tma=tma)

                def fn():
                    return A.flash_attention(q, k, v, bias=bias, policy=policy)
                return fn

            fns = {"cudnn": cudnn, "v4 tma bias": route(False, True), "v3 pointer bias": route(False, False),
                   "v5 gluon ws": route(True, True)}
            t = race(fns, q, k, v, False, bias, f"bias D={D} S={S}")
            line = " | ".join(f"{name} {t[name] * 1e3:7.1f} us {flops / t[name] / 1e9:6.1f} TF "
                              f"({t['cudnn'] / t[name]:.3f}x cudnn)" for name in fns)
            print(f"bias D={D:3d} S={S:5d} B={B:2d}: {line}", flush=True)


def d64():
    """D = 64: the Triton forward against v5 with two consumer warpgroups (128 query rows a CTA) and
    with three (192 rows, 160 registers each), plain / causal / bias, S 1024 / 4096 / 8192. (At
    803d45c the rules' config took precedence over attention_gluon.OVERRIDE: all three v5 columns of
    that run are the three-consumer config; the override wins since. Today the policy's ws_config:
    None is two consumers with the table's tile.)"""
    g = torch.Generator(device="cuda").manual_seed(2)
    H, TOKENS, D = 16, 16384, 64
    warm_up()
    for S in (1024, 4096, 8192):
        B = TOKENS // S
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        for mode, causal, bias in modes(H, S, g):
            cudnn = cudnn_fn(q, k, v, bias, causal)

            base = A.default_policy(q, k, causal=causal, bias=bias)

            def ours(ws, cfg=None):
                policy = base.replace(forward="ws" if ws else "pointer", ws_config=cfg)

                def fn():
                    return A.flash_attention(q, k, v, causal=causal, bias=bias, policy=policy)
                return fn

            fns = {"cudnn": cudnn, "triton": ours(False), "v5 2x64": ours(True),
                   "v5 3x64": ours(True, (128, 2, 160, None, 3)), "v5 3x64 bn64": ours(True, (64, 3, 160, None, 3))}
            t = race(fns, q, k, v, causal, bias, f"D=64 S={S} {mode}")
            line = " | ".join(f"{name} {t[name] * 1e3:7.1f} us ({t['cudnn'] / t[name]:.3f}x cudnn)" for name in fns)
            print(f"D=64 S={S:5d} B={B:2d} {mode:6s}: {line}", flush=True)


def pingpong():
    """v5 with and without the consumers taking turns issuing their products
    (policy ``ws_pingpong``), D 64 / 128, S 4096 / 8192, plain / causal / bias, against cuDNN.
    Written after the eighth session's device budget was spent: not yet run."""
    g = torch.Generator(device="cuda").manual_seed(3)
    H, TOKENS = 16, 16384
    warm_up()
    for D in (128, 64):
        for S in (4096, 8192):
            B = TOKENS // S
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for mode, causal, bias in modes(H, S, g):
                cudnn = cudnn_fn(q, k, v, bias, causal)

                base = A.default_policy(q, k, causal=causal, bias=bias)

                def ws(pp):
                    policy = base.replace(forward="ws", ws_pingpong=pp)

                    def fn():
                        return A.flash_attention(q, k, v, causal=causal, bias=bias, policy=policy)
                    return fn

                fns = {"cudnn": cudnn, "v5": ws(False), "v5 ping-pong": ws(True)}
                t = race(fns, q, k, v, causal, bias, f"D={D} S={S} {mode}")
                line = " | ".join(f"{name} {t[name] * 1e3:7.1f} us ({t['cudnn'] / t[name]:.3f}x cudnn)" for name in fns)
                print(f"D={D:3d} S={S:5d} B={B:2d} {mode:6s}: {line}", flush=True)


def persistent():
    """v5 on its grid of 2048-ish CTAs against v5 on a persistent grid (policy ``ws_persistent``:
    one CTA an SM, work items round robin, the K / V ring running on across items), two consumers,
    D 128 / 64, S 1024 / 4096 / 8192, plain / causal, against cuDNN. Written after the ninth
    session's device budget was spent: not yet run. Prediction: D = 128 plain S = 4096 from 0.90x
    cuDNN to ~0.95x (the prologue and epilogue of 15.5 waves hidden), little change at S = 8192
    causal where v5 is already at 0.97x."""
    from tilewise.ops.attention import configs as C

    g = torch.Generator(device="cuda").manual_seed(4)
    H, TOKENS = 16, 16384
    warm_up()
    for D in (128, 64):
        for S in (4096, 1024, 8192):
            B = TOKENS // S
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for causal in (False, True):
                cudnn = cudnn_fn(q, k, v, None, causal)

                base = A.default_policy(q, k, causal=causal)

                def ws(pers):
                    policy = base.replace(forward="ws", ws_persistent=pers,
                                          ws_config=(128, 2, C.WS_FWD_CONSUMER_REGS, None, 2))

                    def fn():
                        return A.flash_attention(q, k, v, causal=causal, policy=policy)
                    return fn

                fns = {"cudnn": cudnn, "v5": ws(False), "v5 persistent": ws(True)}
                t = race(fns, q, k, v, causal, None, f"D={D} S={S} causal={causal}")
                line = " | ".join(f"{name} {t[name] * 1e3:7.1f} us ({t['cudnn'] / t[name]:.3f}x cudnn)" for name in fns)
                print(f"D={D:3d} S={S:5d} B={B:2d} {'causal' if causal else 'plain':6s}: {line}", flush=True)


def persistent3():
    """D = 64's three consumers (``configs.WS_THREE``, the default from Sq = 4096) on v5's grid and on the
    persistent grid (one CTA an SM, 192-row work items; measured before only with two consumers:
    tuning, "v5 persistent grid"), against cuDNN: H 16 at S 4096 / 8192 / 16384 and the llama bench's
    GQA 32 / 8 shapes, plain and causal. Rounds in the order A B B A (a variant timed later in a round
    ran slower at long shapes: tuning, "v6 dK / dV: LSE and Delta staged by the loader"); the median
    of the rounds' middle two. The persistent output is checked against the grid's first.
    Prediction (2026-12-05, before the run): causal 2-5 % faster on the persistent grid from S 4096
    (two consumers gained 4.5 % there), plain within 2 % either way (two consumers: -1 %).
    Measured (H100, a2733c6, `bench/results/logs/attention-ws-persistent3-a2733c6.log`): plain 1.000-1.030x the
    grid, causal 0.948-1.032x (slower at H 16 S 4096 / 8192, faster at the GQA 4 x 4096 shape)."""
    from _timing import abba_ms
    from tilewise.ops.attention import configs as C

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(5)
    warm_up()
    shapes = [(4, 16, 16, 4096), (2, 16, 16, 8192), (1, 16, 16, 16384), (4, 32, 8, 4096), (1, 32, 8, 16384)]
    for B, H, Hkv, S in shapes:
        q = torch.randn(B, H, S, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        for causal in (False, True):
            base = A.default_policy(q, k, causal=causal).replace(forward="ws", ws_config=C.WS_THREE)

            def ours(pers, base=base, causal=causal):
                policy = base.replace(ws_persistent=pers)
                return lambda: A.flash_attention(q, k, v, causal=causal, policy=policy)

            def cudnn(causal=causal):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hkv)
            fns = {"cudnn": cudnn, "grid": ours(False), "persistent": ours(True)}
            a, b = fns["grid"]().float(), fns["persistent"]().float()
            err = ((a - b).norm() / a.norm()).item()
            assert err < 1e-3, f"persistent vs grid {err:.3g}"
            med, _ = abba_ms(fns, bench)
            line = " | ".join(f"{n} {med[n] * 1e3:7.1f} us ({med['cudnn'] / med[n]:.3f}x cudnn)" for n in fns)
            print(f"B={B} H={H}/{Hkv} S={S:5d} {'causal' if causal else 'plain':6s}: {line} | persistent / grid "
                  f"{med['grid'] / med['persistent']:.3f}x | rel diff {err:.1e}", flush=True)


if __name__ == "__main__":
    import sys

    if "--bias-paths" in sys.argv:
        bias_paths()
    elif "--d64" in sys.argv:
        d64()
    elif "--pingpong" in sys.argv:
        pingpong()
    elif "--persistent3" in sys.argv:
        persistent3()
    elif "--persistent" in sys.argv:
        persistent()
    else:
        main()
