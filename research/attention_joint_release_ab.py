"""v5's forward with each stage's K and V released together (``attn_fwd_ws_kernel``'s JOINT: one arrive on
k_empty after P V, the loader waits on it for both) against the release of K after S and of V after P V; and
v6's dQ kernel the same way (``attn_bwd_dq_ws_kernel``'s JOINT: V no longer released after dP's product, K and V
after dQ's); same run, same inputs, outputs compared bit for bit.

Why: Triton 3.6 puts a warpgroup ``bar.sync`` before every mbarrier wait and arrive of a partition (its
shared-memory barrier analysis takes them for conflicting accesses; the arrive is one elected thread's), so a
consumer meets its four warps four times a key tile. Nsight Compute put "barrier" at 51 % (D 128) and 34 %
(D 64, three consumers) of v5's stall cycles (`bench/results/logs/attention-ncu-fwd-8d1d3f3.log`). JOINT leaves
two a tile (sm_90 SASS, Triton 3.6: BAR.SYNC 44 -> 32 at D 64 with three consumers, 33 -> 25 at D 128; v6's dQ
kernel 35 -> 27; the default builds byte-identical). The price: a stage comes back to the loader later.
Prediction (2026-12-05, before any GPU run): 0-3 % faster at D 64 (three consumers, the Llama shapes), 0-2 % at
D 128 on v5's grid; if the barriers only absorbed warp skew that the wgmma issue would absorb anyway, within
noise. v6's dQ kernel (three stages): 0-3 %; an earlier try that kept two arrives at the end read 0.85-0.99x
in a run biased against the later variant (A B A B; docs/tuning/attention.md, "v6 dK / dV: LSE and Delta
staged by the loader").

v5's grid kernel is timed (ws_overlap and ws_persistent off, call plans off); JOINT is passed by wrapping
``gluon_fwd.run`` for the B side. Rounds in the order A B B A, the median of the rounds' middle two.
Run on the GPU: PYTHONPATH=src python3 research/attention_joint_release_ab.py
"""
import torch
from triton.testing import do_bench

from _timing import abba_ms, warm_clocks
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import gluon_fwd as ag

# (B, H, Hkv, S, D, causal): D 64 with three consumers (the default from S 4096) and the llama bench's GQA
# shapes; D 128 on v5's grid (the overlapped kernel is the default there from S 4096).
SHAPES = [(4, 16, 16, 4096, 64, False), (4, 16, 16, 4096, 64, True), (1, 16, 16, 16384, 64, True),
          (4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True),
          (8, 16, 16, 2048, 128, False), (8, 16, 16, 2048, 128, True), (4, 16, 16, 4096, 128, True)]
# v6's dQ kernel: (B, H, Hkv, S, D, causal), the Llama shapes first.
DQ_SHAPES = [(4, 32, 8, 4096, 64, True), (1, 32, 8, 16384, 64, True), (4, 16, 16, 4096, 64, False),
             (4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True)]
REAL_RUN = ag.run


def joint_run(kernel, grid, args, meta, launch=None):
    from tilewise.ops.attention import gluon_bwd as gb

    if kernel is ag.attn_fwd_ws_kernel or kernel is gb.attn_bwd_dq_ws_kernel:
        meta = {**meta, "JOINT": True}
    return REAL_RUN(kernel, grid, args, meta, launch)


def bench(fn):
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def joint(fn):
    """fn run with JOINT passed to the kernels above."""
    def wrapped():
        ag.run = joint_run
        try:
            return fn()
        finally:
            ag.run = REAL_RUN
    return wrapped


def dq_kernel():
    from _timing import v6_backward_inputs
    from tilewise.ops.attention import gluon_bwd as gb

    for B, H, Hkv, S, D, causal in DQ_SHAPES:
        q, k, v, do, scale, lse, delta = v6_backward_inputs(B, H, Hkv, S, D, causal, seed=S + D + causal)
        outs = {n: torch.full_like(q, float("nan")) for n in ("separate", "joint")}

        def sep():
            return gb.dq(q, k, v, do, lse, delta, causal, scale, outs["separate"])
        fns = {"separate": sep, "joint": joint(lambda: gb.dq(q, k, v, do, lse, delta, causal, scale, outs["joint"]))}
        same = torch.equal(fns["separate"](), fns["joint"]())
        med, _ = abba_ms(fns, bench)
        print(f"dQ kernel B{B} H{H}/{Hkv} S{S} D{D} causal={causal}: separate {med['separate']:.3f} ms, "
              f"joint {med['joint']:.3f} ms ({med['separate'] / med['joint']:.3f}x) | bitwise equal {same}", flush=True)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    warm_clocks()
    g = torch.Generator(device="cuda").manual_seed(9)
    for B, H, Hkv, S, D, causal in SHAPES:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        policy = A.default_policy(q, k, causal=causal).replace(
            forward="ws", ws_overlap=False, ws_persistent=False, plans=False,
            ws_config=C.WS_THREE if D == 64 else None)

        def base(q=q, k=k, v=v, causal=causal, policy=policy):
            return A.flash_attention(q, k, v, causal=causal, policy=policy)
        fns = {"separate": base, "joint": joint(base)}
        same = torch.equal(fns["separate"](), fns["joint"]())
        med, _ = abba_ms(fns, bench)
        print(f"forward B{B} H{H}/{Hkv} S{S} D{D} causal={causal}: separate {med['separate']:.3f} ms, "
              f"joint {med['joint']:.3f} ms ({med['separate'] / med['joint']:.3f}x) | bitwise equal {same}", flush=True)


if __name__ == "__main__":
    main()
    dq_kernel()
