"""A forward work item's fixed cost, measured instead of inferred (issue 30: D 128 forward at S 2048 0.825x
cuDNN on the H100, ~0.98x at S 16384): the number of query rows held (B 8, H 16, Sq 2048: the same items
every run) and the keys swept, Sk in 256 .. 8192, plain (no causal), bf16. Each forward's time is
items' rounds x (key tiles x t + c), so a straight line in Sk: its slope is the per-key-tile time t, its
intercept the per-item cost c every round pays (Q's load, the first tile's bubble, the epilogue, the
launch). The same fit for cuDNN (SDPA's cuDNN backend takes Sq != Sk) says what its items cost.

Variants: the library's default (v5 on the persistent grid at D 128), v5 on its own grid, the persistent
overlap (``ws_overlap="persistent"``), and cuDNN; D 128 and 64 (D 64: v5's three consumers, 192 rows).
Outputs compared with cuDNN's (relative error < 2e-2) before timing; rounds A B B A.
Prediction (2026-12-05, before any run; from fa956a6's rows by arithmetic, research/notes/attention.md,
"Twenty-fourth session"): at D 128 our intercept 3-5 key-tile times (~5-8 us) a round, cuDNN's under 1, the
slopes within 3 % of each other.
Prediction (2026-12-06, thirty-first session, with the items chained: the default and the persistent overlap at
D 128 are then one kernel): c 3.80 -> 2.3-2.8 us a round (the next item's S_0 and the epilogue now run beside the
last P V), t unchanged (~1.70); D 64 unchanged (v5's three consumers do not chain).
Run on the GPU: PYTHONPATH=src python3 research/attention_item_cost.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A

B, H, SQ = 8, 16, 2048
SKS = (256, 512, 1024, 2048, 4096, 8192)


def bench(fn):
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def fit(xs, ys):
    """Least squares y = a + b x: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main():
    warm_clocks()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, {sms} SMs; B {B} H {H} Sq {SQ}, plain, bf16", flush=True)
    for D in (128, 64):
        rows = 192 if D == 64 else 128
        items = B * H * -(-SQ // rows)
        rounds = -(-items // sms)
        times = {}
        for Sk in SKS:
            g = torch.Generator(device="cuda").manual_seed(Sk + D)
            q = torch.randn(B, H, SQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(B, H, Sk, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            base = A.default_policy(q, k)
            fns = {
                "default": lambda: A.flash_attention(q, k, v),
                "v5 grid": lambda p=base.replace(forward="ws", ws_persistent=False, ws_overlap=False):
                    A.flash_attention(q, k, v, policy=p),
                "persistent overlap": lambda p=base.replace(forward="ws", ws_persistent=True, ws_overlap="persistent"):
                    A.flash_attention(q, k, v, policy=p),
            }
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ref = F.scaled_dot_product_attention(q, k, v)

            def cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v)
            fns["cudnn"] = cudnn
            ok = {}
            for n, fn in fns.items():
                try:
                    err = ((fn().float() - ref.float()).norm() / ref.float().norm()).item()
                except Exception as e:  # noqa: BLE001 - a variant that does not apply here
                    print(f"  D {D} Sk {Sk}: {n} failed: {type(e).__name__}: {str(e)[:100]}")
                    continue
                if err < 2e-2:
                    ok[n] = fn
                else:
                    print(f"  D {D} Sk {Sk}: {n} off by {err:.2e}, dropped")
            mid, _ = abba_ms(ok, bench)
            for n, ms in mid.items():
                times.setdefault(n, {})[Sk] = ms
            flops = 4 * B * H * SQ * Sk * D
            print(f"D {D} Sk {Sk:5d}: " + "  ".join(f"{n} {ms * 1e3:8.1f} us ({flops / ms / 1e9:4.0f} TF)"
                                                   for n, ms in mid.items()), flush=True)
        print(f"D {D}: {items} items of {rows} rows, {rounds} rounds on {sms} SMs; fit per round "
              f"(us = c + t x key tiles of 128):")
        for n, by_sk in times.items():
            xs = [sk / 128 for sk in by_sk]
            ys = [ms * 1e3 / rounds for ms in by_sk.values()]
            c, t = fit(xs, ys)
            worst = max(abs(y - (c + t * x)) / y for x, y in zip(xs, ys))
            print(f"  {n:20s} t {t:6.3f} us a key tile, c {c:6.2f} us a round ({c / t:5.2f} tiles); "
                  f"worst residual {100 * worst:.1f} %")


if __name__ == "__main__":
    main()
