"""Q in registers on the overlapped persistent grid (``ws_q_regs``, opt-in): does a consumer's Q load race the
loader's next TMA write into the same buffer?

The quick tier at 0ce3b4a (H100) failed once in ``test_gpu_overlap_persistent_two_q_buffers`` (causal, Q in
registers, B 2 H 16 Sq 2048 Sk 777: one and two Q buffers not bitwise equal), a case that had passed in every
earlier tier, with kernel sources whose SASS was unchanged: an intermittent fault. ``gluon_overlap._rows``
reads Q from shared memory into registers (generic proxy) and hands the buffer back at once (``q_empty``);
the loader's next TMA write (async proxy) had no proxy fence to follow those reads, where the bias path has
one (``gluon_fwd._tile``'s ``fence_async_shared``). Prediction: without the fence some runs differ from Q in
shared memory; with it none.

Each case runs N times with Q in registers (one and two buffers) and is compared bit for bit with Q in shared
memory (two buffers; its wgmma reads Q through the async proxy, no hazard), which is itself checked against the
fp32 reference first. Inputs are random (never zeros); each output's memory is poisoned (NaN) first.
Run on the GPU (~1 minute): PYTHONPATH=src python3 research/attention_q_regs_race.py [N]
"""
import sys

import torch

from tilewise.ops.attention import api as A

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
CASES = [((2, 16, 16, 2048, 777, 128), True), ((2, 16, 16, 4096, 4096, 128), True),
         ((2, 16, 16, 4096, 4096, 128), False), ((3, 4, 2, 1031, 1031, 128), True)]

for (B, H, Hkv, Sq, Sk, D), causal in CASES:
    g = torch.Generator(device="cuda").manual_seed(Sq + Sk + 23)
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    base = A.default_policy(q, k, causal=causal).replace(forward="ws", ws_persistent=True, ws_overlap="persistent",
                                                         ws_config=None, ws_q_regs=False, ws_q_buffers=2)

    def run(policy):
        torch.full_like(q, float("nan"))  # freed at once: the output's block from the caching allocator, poisoned
        return A.flash_attention(q, k, v, causal=causal, policy=policy)

    ref = run(base)
    exact = A.reference(q.float(), k.float(), v.float(), causal=causal)
    err = (ref.float() - exact).abs().max().item()
    line = f"B{B} H{H}/{Hkv} Sq{Sq} Sk{Sk} D{D}{' causal' if causal else ''}: Q in shared memory, max err {err:.2e};"
    for bufs in (1, 2):
        policy = base.replace(ws_q_regs=True, ws_q_buffers=bufs)
        bad = 0
        worst = 0.0
        for _ in range(N):
            o = run(policy)
            if not torch.equal(o, ref):
                bad += 1
                worst = max(worst, (o.float() - ref.float()).abs().nan_to_num(float("inf")).max().item())
        line += f" Q in registers, {bufs} buffer(s): {bad} / {N} runs differ (worst {worst:.2e});"
    print(line, flush=True)
