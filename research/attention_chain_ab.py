"""The overlapped persistent forward with its work items chained (``gluon_overlap.fwd(chain=True)``) against
the same kernel unchained with two Q buffers, and the library's route, cuDNN beside them; one run, same inputs,
outputs compared bit for bit.

Why: an item's fixed cost (docs/tuning/attention.md, "A forward item's fixed cost": 3.8 us a round for the
persistent overlap at D 128 against cuDNN's 1.0) holds the item's last P V, its epilogue (normalize, store O and
the log-sum-exp) and the next item's first S = Q K^T with its softmax, one after the other, while the tensor
cores wait. Chained, the next item's S_0 is issued with the last P V and runs during the epilogue (its Q is
already in the second buffer). A 64 x 128 x 128 product is ~0.4 us of a ~1.7 us key tile.
Prediction (2026-12-06, before a run): chained 1.01-1.03x the unchained kernel at S 1024-2048, 1.00-1.01x from
S 8192 (fewer items, each longer); bitwise equal everywhere.
Measured (H100, d5e4eae): bitwise equal; 1.020x (S 1024), 1.038x (2048), 1.033x (GQA 2048), 1.028x (4096), 1.025x
(GQA 4096), 1.008x (8192), 1.014x (16384): docs/tuning/attention.md, "Chained work items".
--v5: the same for v5's persistent kernel (``gluon_fwd.fwd(chain=...)``), D 64's three consumers (the route without
causal from S 1024) and D 128's two. v5 waits for each product before its softmax, so chained its key tile's P V and
the next S run back to back (v5 issued them a softmax apart) besides the epilogue beside the next item's S_0.
Prediction (2026-12-06, before a run): 1.02-1.05x at D 64 S 1024-2048 (short items: the fixed cost is a larger
share), 1.01-1.02x from 4096; D 128 1.02-1.04x at S 1024; bitwise equal.
Measured (H100, 55ff61e): the overlap 1.019-1.041x; --v5 at D 64 (three consumers) 0.933x (S 1024), 0.962x (GQA 1024),
0.974x (2048), 0.991x (GQA 2048), 1.003x (4096), 1.016x (8192): a miss, so v5 chains with two consumers only
(configs.WS_CHAIN_CONSUMERS); D 128 1.025x at S 1024 (docs/tuning/attention.md, "Chained work items", "Landed").
--tma-out: the chained overlap with O stored by TMA through the finished item's Q buffer
(``gluon_overlap.fwd(tma_out=True)``) against the chained kernel. Under Nsight Compute (cf5885b, H100,
research/attention_item_ncu.sh ... sass) the second consumer spent ~5.2 us an item past its last key tile against
~2.9 us for the first; 2.4 % of all samples were its 32 4-byte stores a thread stalling (the LSU queue, "lg") and
the next item's softmax waiting for the stores' registers (long scoreboard). Through shared memory O is 8 stmatrix a
thread and one TMA store. Prediction (2026-12-06, thirty-fifth session, before a run): 1.02-1.05x the chained kernel
at S 1024-2048, 1.00-1.02x from S 8192; bitwise equal, also at Sq 1031 / Sk 129 and Sq 777 (a partial last tile).
Measured (H100, 433ecb3): bitwise equal; 1.101x (S 1024), 1.044x (2048), 1.067x (GQA 2048), 1.034x (4096), 1.015x
(GQA 4096), 0.986x (8192), 0.987x (16384): the route takes it up to Sk 4096 (configs.WS_TMA_OUT_MAX_SK;
since bbb6334 TMA out is the default on every persistent kernel with two Q buffers and the limit is gone).
The same comparison with S_1 issued before softmax(S_0) (research/patches/chain-early-s1.patch, which adds its
own --early-s1) lost: 0.969-1.002x (H100, d5c7f06, attention-chain-early-s1-d5c7f06*.log).
--tma-out-apart: the same epilogue on the unchained persistent overlap (two Q buffers; the buffer goes back at the
next item's start, after ``tma.store_wait``), causal (the D 128 route from Sq 2048; D 64's from 1024) and plain.
Prediction (2026-12-06, thirty-fifth session, before a run): 1.02-1.05x at S 1024-2048 (causal items are short on
average), 1.00-1.02x from S 8192; bitwise equal.
--tma-out-v5: the same on v5's persistent kernel (``gluon_fwd.fwd(tma_out=True)``, two Q buffers, unchained): the
D 128 causal route below Sq 2048 (two consumers; S 1024 is 0.87x cuDNN, the grid's weakest causal point) and D 64's
three consumers without causal. Prediction (2026-12-06, thirty-sixth session, before a run): D 128 causal 1.02-1.06x
at S 512-1024 (items of 1-8 key tiles: an item end every ~4.5 tiles), 1.01-1.03x at 2048; D 64 (16 4-byte stores a
thread) 1.01-1.03x at S 1024-2048, ~1.00x from 4096; bitwise equal.
With research/patches/tma-out-lse-last.patch (the log-sum-exp stored after O's TMA store is issued: the fence before
it no longer waits for those two 4-byte stores; the loops' SASS is the same, research/sass_loops.py), --tma-out again:
prediction (2026-12-06, thirty-sixth session, before a run) 0.986x at S 8192-16384 -> ~1.00x, S 1024-4096 as before
or up to 1 % more; bitwise equal.
Measured (H100, a7ff350, all three modes; docs/tuning/attention.md, "O by TMA on every persistent kernel"): bitwise
equal everywhere; --tma-out 1.044-1.103x at S 1024-4096 (GQA 4096 1.000x), 1.002x (8192), 0.996x (16384): the long
items' loss is gone, so the limit went; --tma-out-apart causal D 128 1.034-1.108x, D 64 1.011-1.032x; --tma-out-v5
D 128 causal 1.093-1.153x (S 512-2048), D 64 three consumers 1.012-1.066x. The default on all of them since
bbb6334 (its quick tier green at 624bec5).
Run on the GPU: PYTHONPATH=src python3 research/attention_chain_ab.py [--v5|--tma-out|--tma-out-apart|--tma-out-v5]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_fwd as ag
from tilewise.ops.attention import gluon_overlap as ao

# (B, H, Hkv, S, D), without causal, B x S = 16384
SHAPES = [(16, 16, 16, 1024, 128), (8, 16, 16, 2048, 128), (8, 32, 8, 2048, 128), (4, 16, 16, 4096, 128),
          (4, 32, 8, 4096, 128), (2, 16, 16, 8192, 128), (1, 16, 16, 16384, 128)]
CAUSAL_SHAPES = [(8, 16, 16, 2048, 128), (8, 32, 8, 2048, 128), (4, 16, 16, 4096, 128), (2, 16, 16, 8192, 128),
                 (16, 16, 16, 1024, 64), (8, 16, 16, 2048, 64), (4, 32, 8, 4096, 64)]
V5_CAUSAL_SHAPES = [(32, 16, 16, 512, 128), (16, 16, 16, 1024, 128), (16, 32, 8, 1024, 128), (8, 16, 16, 2048, 128)]
V5_SHAPES = [(16, 16, 16, 1024, 64), (16, 32, 8, 1024, 64), (8, 16, 16, 2048, 64), (8, 32, 8, 2048, 64),
             (4, 16, 16, 4096, 64), (4, 32, 8, 4096, 64), (2, 16, 16, 8192, 64), (16, 16, 16, 1024, 128)]


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def variant(name: str, chain=True, causal=False, shapes=SHAPES, fwd=None, config=None, **kw):
    """The persistent overlap (or ``fwd``: gluon_fwd.fwd, v5's; chained or not, two Q buffers, ``config(D)``'s tile)
    against itself with ``kw`` (``fwd``'s), bit for bit at odd sizes, then timed beside the route and cuDNN."""
    fwd = fwd or ao.fwd
    config = config or (lambda D: C.ws_fwd_config(D, False, None))
    print(torch.cuda.get_device_name(), f"({fwd.__module__}, chain={chain}, causal={causal}: against {name})",
          flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(17)

    def call(q, k, v, out, lse, on):
        return fwd(q, k, v, causal, q.shape[-1] ** -0.5, out, lse, config=config(q.shape[-1]), persistent=True,
                   q_buffers=2, chain=chain, **(kw if on else {n: False for n in kw}))[0]

    for B, H, Hkv, Sq, Sk in [(2, 16, 16, 2048, 1000), (3, 4, 2, 1031, 129), (1, 8, 8, 777, 4099)]:
        D = shapes[0][-1]
        q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        res = [(torch.full_like(q, float("nan")), torch.full((B, H, Sq), float("nan"), device="cuda"))
               for _ in range(2)]
        for on in (False, True):
            call(q, k, v, *res[on], on)
        ref = A.reference(q.float(), k.float(), v.float(), causal=causal)
        err = ((res[1][0].float() - ref).norm() / ref.norm()).item()
        same = torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
        print(f"check B{B} H{H}/{Hkv} Sq{Sq} Sk{Sk} D{D}: bitwise equal {same}, vs fp32 {err:.1e}", flush=True)
    for B, H, Hkv, S, D in shapes:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        outs = [(torch.full_like(q, float("nan")), torch.full((B, H, S), float("nan"), device="cuda"))
                for _ in range(2)]

        def cudnn(q=q, k=k, v=v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hkv, is_causal=causal)

        fns = {"chained": lambda q=q, k=k, v=v: call(q, k, v, *outs[0], False),
               name: lambda q=q, k=k, v=v: call(q, k, v, *outs[1], True),
               "route": lambda q=q, k=k, v=v: A.flash_attention(q, k, v, causal=causal), "cudnn": cudnn}
        a, b = fns["chained"]().clone(), fns[name]().clone()
        same = torch.equal(a, b) and torch.equal(outs[0][1], outs[1][1])
        med, _ = abba_ms(fns, bench)
        flops = 4 * B * H * S * S * D
        print(f"B{B} H{H}/{Hkv} S{S} D{D}: " + ", ".join(
            f"{n} {ms:.4f} ms ({flops / ms / 1e9:.0f} TF, x cuDNN {med['cudnn'] / ms:.3f})" for n, ms in med.items())
            + f" | {name} / chained {med['chained'] / med[name]:.3f}x, bitwise equal {same}", flush=True)


def main():
    if "--tma-out" in sys.argv[1:]:
        return variant("TMA out", tma_out=True)
    if "--tma-out-v5" in sys.argv[1:]:  # v5's persistent kernel, unchained: D 128 causal (2), D 64 (3)
        variant("TMA out", chain=False, causal=True, shapes=V5_CAUSAL_SHAPES, fwd=ag.fwd, tma_out=True)
        return variant("TMA out", chain=False, shapes=V5_SHAPES[:7], fwd=ag.fwd, config=lambda D: C.WS_THREE,
                       tma_out=True)
    if "--tma-out-apart" in sys.argv[1:]:
        variant("TMA out", chain=False, causal=True, shapes=CAUSAL_SHAPES, tma_out=True)
        return variant("TMA out", chain=False, shapes=SHAPES[:3], tma_out=True)
    v5 = "--v5" in sys.argv[1:]
    print(torch.cuda.get_device_name(), "(v5's persistent kernel)" if v5 else "(the overlapped consumers)", flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(13)
    fwd = ag.fwd if v5 else ao.fwd
    for B, H, Hkv, S, D in V5_SHAPES if v5 else SHAPES:
        cfg = C.WS_THREE if D == 64 else C.ws_fwd_config(D, False, None)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        outs = {c: (torch.full_like(q, float("nan")), torch.full((B, H, S), float("nan"), device="cuda"))
                for c in (False, True)}

        def direct(chain, q=q, k=k, v=v):
            out, lse = outs[chain]
            return fwd(q, k, v, False, D ** -0.5, out, lse, config=cfg, persistent=True, q_buffers=2, chain=chain)[0]

        def cudnn(q=q, k=k, v=v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hkv)

        fns = {"unchained QB2": lambda: direct(False), "chained": lambda: direct(True),
               "route": lambda q=q, k=k, v=v: A.flash_attention(q, k, v), "cudnn": cudnn}
        a, b, c = fns["unchained QB2"]().clone(), fns["chained"]().clone(), fns["cudnn"]()
        same = torch.equal(a, b) and torch.equal(outs[False][1], outs[True][1])
        err = ((b.float() - c.float()).norm() / c.float().norm()).item()
        med, _ = abba_ms(fns, bench)
        flops = 4 * B * H * S * S * D
        print(f"B{B} H{H}/{Hkv} S{S} D{D}: " + ", ".join(
            f"{n} {ms:.4f} ms ({flops / ms / 1e9:.0f} TF, x cuDNN {med['cudnn'] / ms:.3f})" for n, ms in med.items())
            + f" | chained / unchained {med['unchained QB2'] / med['chained']:.3f}x, chained / route "
              f"{med['route'] / med['chained']:.3f}x, bitwise equal {same}, vs cuDNN {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
