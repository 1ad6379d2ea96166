"""v5's forward at D 64 with part of the softmax's exp2 on the FMA pipe (a polynomial) instead of MUFU, against
v5 as it is; same run, same inputs, cuDNN beside.

Why (arithmetic, sm_90): MUFU.EX2 runs 16 lanes a clock an SM, the tensor pipe 4096 bf16 FLOP a clock. A
consumer's key tile of 64 rows x 128 keys costs 8192 exp2 (512 MUFU clocks) and 2 x 64 x 128 x D x 2 FLOP of
products: 512 tensor clocks at D 64, 1024 at D 128. So at D 64 the exp2 alone keeps the MUFU pipe as busy as
the tensor pipe (at D 128 half as busy): both must overlap perfectly for the products to run at the tensor
pipe's rate, and any two consumers doing their softmax at the same time queue on MUFU while the tensor pipe
idles. v5 at D 64 ran its tensor pipe 48.7-53.6 % busy under Nsight Compute (attention-ncu-fwd-8d1d3f3.log).
FlashAttention-4 computes part of its exponentials with a polynomial on the FMA pipe for the same reason.

What: 2^x as round(x) by the 1.5 x 2^23 magic-number add (no F2I / FRND, which are not FMA-pipe
instructions), 2^f on f in [-0.5, 0.5] by a degree-3 polynomial fitted for relative error (7.5e-5 at most in
fp32, below P's bf16 rounding of 2^-9), round(x) added into the exponent bits; x clamped at -126 first. It
runs on every EVERY-th unmasked key tile of a row (``j % EVERY == EVERY - 1``), MUFU on the rest and on every
masked tile (the -inf of masked keys must give 0, and 2^-126 is not 0: a fully masked row's l must stay 0).
Issue-slot arithmetic (D 64, three consumers a SM sub-partition, ~5 issue slots an element besides exp2): the
polynomial's ~8 instructions an element keep the issue rate under the tensor pipe's time up to 1 tile in ~3;
so EVERY 4 and 3 are measured, 2 as the point past it.

The variant is gluon_fwd.py's source with the one exp2 line of ``online_softmax`` replaced, loaded as a module
of the attention package (tilewise.ops.attention.gluon_fwd_poly<EVERY>), so nothing in src/ changes. Outputs
are compared with v5's (not bitwise: the polynomial is not MUFU's rounding) and with the fp32 reference.

Prediction (before the GPU run): at D 64, EVERY 4: 3-8 % faster where the forward is furthest from the tensor
pipe's rate (S 4096-16384, plain and causal, H 16 and GQA 32 / 8); EVERY 2 slower than EVERY 4 (issue-bound);
at D 128 (MUFU half as busy) within +-2 % or slower. If MUFU is not what the D 64 consumers wait on, every
variant is within noise or slower, and that settles it.

Backward (``--backward``): v6's dK / dV and dQ kernels recompute P = exp2(S - LSE) a tile, against three (dQ: S,
dP, dS K) or four products (dK / dV): at D 64 MUFU 2/3 and 1/2 as busy as the tensor pipe. The same polynomial
on every 4th / 2nd tile (all tiles: masked entries are zeroed after exp2 there), D 64 shapes and one D 128
control. Prediction: dQ 2-6 % faster at D 64, dK / dV 0-3 %; D 128 within noise.

Run on the GPU: PYTHONPATH=src python3 research/attention_exp2_poly.py [--backward]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_fwd as ag
from tilewise.ops.attention import reference as R

from _timing import load_attention_module, warm_clocks

EVERY = (4, 3, 2)
# (B, H, Hkv, S, D, causal): the Llama-3.2-1B shapes first (D 64, GQA 32 / 8), then issue 30's grid at D 64,
# and two D 128 points (MUFU half as busy there: the control).
SHAPES = [(4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True), (4, 16, 16, 4096, 64, False),
          (4, 16, 16, 4096, 64, True), (2, 16, 16, 8192, 64, False), (1, 16, 16, 16384, 64, False),
          (1, 16, 16, 16384, 64, True), (4, 16, 16, 4096, 128, False), (1, 16, 16, 16384, 128, True)]
LINE = "        p = gl.exp2(t * qk_scale - m_safe[:, None])\n"
# 2^f, f in [-0.5, 0.5]: c0 + c1 f + c2 f^2 + c3 f^3, least relative error (fitted in fp64, evaluated in fp32)
POLY = (0.9999281167984009, 0.6932609677314758, 0.24261054396629333, 0.05517132207751274)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _poly_block(x: str, pad: str, p: str, cond: str) -> str:
    """Source lines computing ``p`` = 2^``x`` by the polynomial when ``cond`` holds, else by MUFU (exp2)."""
    return (f"{pad}x_ = {x}\n"
            f"{pad}if {cond}:  # research/attention_exp2_poly.py: this tile's exp2 on the FMA pipe\n"
            f"{pad}    x_ = gl.maximum(x_, -126.0)\n"
            f"{pad}    r_ = x_ + 12582912.0  # 1.5 * 2**23: r_'s low mantissa bits hold round(x_)\n"
            f"{pad}    f_ = x_ - (r_ - 12582912.0)\n"
            f"{pad}    c_ = (({POLY[3]!r} * f_ + {POLY[2]!r}) * f_ + {POLY[1]!r}) * f_ + {POLY[0]!r}\n"
            f"{pad}    {p} = (c_.to(gl.int32, bitcast=True) + (r_.to(gl.int32, bitcast=True) << 23)).to(gl.float32, "
            f"bitcast=True)\n"
            f"{pad}else:\n"
            f"{pad}    {p} = gl.exp2(x_)\n")


# The forward's masked tiles keep MUFU: their -inf keys must give 0, and a fully masked row's l must stay 0.
NEW = ("        if MASKED:\n            p = gl.exp2(t * qk_scale - m_safe[:, None])\n        else:\n"
       + _poly_block("t * qk_scale - m_safe[:, None]", " " * 12, "p", "j % _EVERY == _EVERY - 1"))


def load_variant(every: int, module=None, edits=None):
    """``module``'s source (default gluon_fwd.py) with each ``edits`` line (old line -> new source) replaced and
    ``_EVERY`` defined, loaded as a module of the attention package (``<name>_poly<EVERY>``)."""
    module = module or ag
    edits = edits if edits is not None else {LINE: NEW}
    src = open(module.__file__).read()
    for old, new in edits.items():
        assert src.count(old) == 1, f"{module.__name__}: the exp2 line moved: {old.strip()}"
        src = src.replace(old, new)
    src = src.replace("\nif _GLUON:\n", f"\nif _GLUON:\n    _EVERY = gl.constexpr({every})\n", 1)
    short = module.__name__.rsplit(".", 1)[1]
    path = os.path.join(tempfile.mkdtemp(prefix="exp2poly"), f"{short}_poly{every}.py")
    with open(path, "w") as fh:
        fh.write(src)
    return load_attention_module(path, f"{short}_poly{every}")


# v6's two exp2 lines: dK / dV's P^T (tile t of the key block's query walk) and dQ's P (ring fill j); masked
# entries are zeroed by a gl.where after either, so every tile may take the polynomial.
BWD_EDITS = {
    "        pt = gl.exp2(st * qk_scale - lse[None, :])\n":
        _poly_block("st * qk_scale - lse[None, :]", "        ", "pt", "t % _EVERY == _EVERY - 1"),
    "        p = gl.exp2(st * qk_scale - lse[:, None])\n":
        _poly_block("st * qk_scale - lse[:, None]", "        ", "p", "j % _EVERY == _EVERY - 1"),
}
BWD_SHAPES = [(4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True), (4, 16, 16, 4096, 64, False),
              (4, 16, 16, 4096, 128, True)]


def backward():
    """v6's dK / dV and dQ kernels with the polynomial on every EVERY-th tile (4 and 2) against v6, cuDNN's
    backward beside; gradients against v6's (not bitwise)."""
    from tilewise.ops.attention import gluon_bwd as gb

    from _timing import cudnn_backward_ms, v6_backward_inputs, v6_grads

    mods = {"v6": gb, **{f"poly{e}": load_variant(e, gb, BWD_EDITS) for e in (4, 2)}}
    warm_clocks()
    print(f"{torch.cuda.get_device_name()} (backward): B H/Hkv S D causal | dK/dV ms: " + " ".join(mods) +
          " | dQ ms: " + " ".join(mods) + " | cuDNN backward | max err vs v6", flush=True)
    for B, H, Hkv, S, D, causal in BWD_SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D + causal)
        grads = v6_grads(mods, q, k, v, do, lse, delta, causal, scale)
        err = {n: max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                      for a, b in zip(g, grads["v6"])) for n, g in grads.items()}
        assert all(e < 2e-2 for e in err.values()) and all(torch.isfinite(t).all() for g in grads.values()
                                                              for t in g), (B, H, S, D, causal, err)
        times = {n: ([], []) for n in mods}
        for r in range(2):
            for n in (list(mods) if r == 0 else list(mods)[::-1]):
                m, (dk, dv, dq) = mods[n], grads[n]
                times[n][0].append(bench(lambda m=m, dk=dk, dv=dv: m.dkdv(q, k, v, do, lse, delta, causal, scale,
                                                                          dk, dv)))
                times[n][1].append(bench(lambda m=m, dq=dq: m.dq(q, k, v, do, lse, delta, causal, scale, dq)))
        t_c = cudnn_backward_ms(q, k, v, do, causal, bench)
        med = {n: [statistics.median(x) for x in t] for n, t in times.items()}
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | " + " ".join(f"{med[n][0]:.3f}" for n in mods) +
              " | " + " ".join(f"{med[n][1]:.3f}" for n in mods) + f" | {t_c:.3f} | " +
              " ".join(f"{n} {e:.1e}" for n, e in err.items() if n != "v6"), flush=True)


def main():
    mods = {"v5": ag, **{f"poly{e}": load_variant(e) for e in EVERY}}
    warm_clocks()
    print(f"{torch.cuda.get_device_name()}: B H/Hkv S D causal | ms: " + " ".join(mods) +
          " | x v5 | cuDNN ms (x v5) | max err vs v5, vs fp32", flush=True)
    for B, H, Hkv, S, D, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(S + D + causal)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        scale = D ** -0.5
        config = C.WS_THREE if D == 64 else None  # v5's own choice at each head dim (configs.WS_FWD_RULES)
        outs = {}
        for n, m in mods.items():
            out = torch.full_like(q, float("nan"))
            lse = torch.full((B, H, S), float("nan"), device="cuda", dtype=torch.float32)
            m.fwd(q, k, v, causal, scale, out, lse, config=config)
            outs[n] = (out, lse)
        kv = 2 if H == Hkv else 1  # query heads 0 and 1 read K / V heads 0 and 1, or (GQA) both head 0
        ref = R.reference(q[:1, :2].float(), k[:1, :kv].float(), v[:1, :kv].float(), causal=causal, scale=scale)
        errs = {}
        for n, (out, lse) in outs.items():
            assert torch.isfinite(out).all() and not torch.isnan(lse).any(), (n, B, H, S, D, causal)
            to_v5 = ((out.float() - outs["v5"][0].float()).abs().max() / outs["v5"][0].float().abs().max()).item()
            to_ref = ((out[:1, :2].float() - ref).norm() / ref.norm()).item()
            assert to_ref < 2e-2, (n, to_ref)
            errs[n] = (to_v5, to_ref)
        times = {n: [] for n in mods}
        for r in range(2):  # A B C D, D C B A: a drift within a round falls on all
            for n in (list(mods) if r == 0 else list(mods)[::-1]):
                out, lse = outs[n]
                times[n].append(bench(lambda m=mods[n], out=out, lse=lse: m.fwd(q, k, v, causal, scale, out, lse,
                                                                               config=config)))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_c = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                               enable_gqa=H != Hkv))
        med = {n: statistics.median(t) for n, t in times.items()}
        print(f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} | " + " ".join(f"{med[n]:.3f}" for n in mods) + " | " +
              " ".join(f"{med['v5'] / med[n]:.3f}" for n in mods if n != "v5") +
              f" | {t_c:.3f} ({t_c / med['v5']:.3f}) | " +
              " ".join(f"{n} {a:.1e}, {b:.1e}" for n, (a, b) in errs.items() if n != "v5"), flush=True)


if __name__ == "__main__":
    backward() if "--backward" in sys.argv[1:] else main()
