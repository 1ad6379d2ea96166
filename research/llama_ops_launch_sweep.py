"""Question: which launch settings bring RMSNorm and RoPE to the bytes roofline on the H200?

The tables in ops/norm/configs.py and ops/rope/configs.py were written from register budgets; the
bench (bench/results/logs/bench-llama-ops-540c1b3.log) has RMSNorm's forward at 0.67-0.98x of
torch.compile for rows of 2048-16384 and RoPE's forward at 0.87-0.93x. This times the same kernels
over a grid of launch settings at the bench's shapes, with torch.compile of the reference in the same
run, and prints GB/s and the fraction of the 4.26 TB/s copy ceiling for each.

    PYTHONPATH=src python research/llama_ops_launch_sweep.py [--quick] [--what norm|rope] [--norm-shapes 4096x16384]

RMSNorm: warps x rows a program x persistent programs a SM (forward and backward).
RoPE: warps x heads a step (forward; the backward is the same kernel with the sin negated).
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import astuple

import torch
import triton

from tilewise.bench.harness import time_ms
from tilewise.ops.norm import api as norm
from tilewise.ops.norm import triton_kernels as NK
from tilewise.ops.rope import api as rope
from tilewise.ops.rope import triton_kernels as RK
from tilewise.runtime.cuda import sm_count
from tilewise.runtime.triton_launch import launch

COPY_TBS = 4.26


def _gbs(nbytes, ms):
    return nbytes / ms / 1e6


def sweep_norm(shapes, quick):
    sms = sm_count(0)
    for M, N in shapes:
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = (torch.rand(N, device="cuda") + 0.5).to(torch.bfloat16)
        dy = torch.randn_like(x)
        y = torch.empty_like(x)
        rstd = torch.empty(M, device="cuda", dtype=torch.float32)
        dx = torch.empty_like(x)
        ref = norm.reference(x.float(), w.float()).to(torch.bfloat16)
        comp = torch.compile(norm.reference, dynamic=False)
        t_c = time_ms(lambda: comp(x, w))
        e = x.numel() * 2
        print(f"\nrmsnorm fwd {M}x{N}: torch.compile {t_c * 1e3:.1f} us ({_gbs(2 * e, t_c):.0f} GB/s)")
        cur, fwd = norm.launch_for(N), norm.forward_launch_for(N)
        block = triton.next_power_of_2(N)
        best = []
        for warps, rows, per_sm in itertools.product((4, 8, 16, 32), (1, 2, 4), (1, 2, 4, 8, 0)):
            if block * rows // (warps * 32) > 64 or (quick and per_sm not in (0, 4)):
                continue  # more than 64 fp32 values a thread: spills
            progs = -(-M // rows) if per_sm == 0 else min(-(-M // rows), sms * per_sm)
            try:
                launch(NK._rms_norm_fwd_kernel, (progs,), x, w, y, rstd, M, N, N, N, 1e-6, 0.0,
                       BLOCK=block, ROWS=rows, CAST_FIRST=True, num_warps=warps)
                torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2)
                t = time_ms(lambda: launch(NK._rms_norm_fwd_kernel, (progs,), x, w, y, rstd, M, N, N, N, 1e-6,
                                           0.0, BLOCK=block, ROWS=rows, CAST_FIRST=True, num_warps=warps))
                part = torch.empty(progs, block, device="cuda", dtype=torch.float32)
                tb = time_ms(lambda: launch(NK._rms_norm_bwd_kernel, (progs,), dy, x, w, rstd, dx, part, M, N, N, N,
                                            N, 0.0, BLOCK=block, ROWS=rows, CAST_FIRST=True, num_warps=warps))
            except Exception as exc:  # noqa: BLE001 - a setting that does not build is a row too
                print(f"  warps {warps:2} rows {rows} per_sm {per_sm}: {type(exc).__name__}")
                continue
            tag = " <- bwd table" if (warps, rows) == (cur.warps, cur.ROWS) and per_sm == norm.PROGRAMS_PER_SM else ""
            if (warps, rows, per_sm) == (fwd.warps, fwd.ROWS, norm.PROGRAMS_PER_SM if fwd.persistent else 0):
                tag += " <- fwd table"
            best.append((t, warps, rows, per_sm))
            print(f"  warps {warps:2} rows {rows} per_sm {per_sm or 'grid'}: fwd {t * 1e3:6.1f} us "
                  f"{_gbs(2 * e, t):5.0f} GB/s ({_gbs(2 * e, t) / COPY_TBS / 10:4.1f} %)  bwd {tb * 1e3:6.1f} us "
                  f"{_gbs(3 * e, tb):5.0f} GB/s{tag}")
        best.sort()
        print(f"  best fwd: {best[:3]}")
        torch.cuda.empty_cache()


def sweep_rope(shapes, quick):
    for B, Hq, Hk, S, D in shapes:
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
        inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
        emb = torch.cat([torch.arange(S, device="cuda", dtype=torch.float32)[:, None] * inv[None, :]] * 2, -1)[None]
        cos, sin = emb.cos().to(torch.bfloat16).contiguous(), emb.sin().to(torch.bfloat16).contiguous()
        rq, rk = rope.reference(q.float(), k.float(), cos.float(), sin.float())
        comp = torch.compile(rope.reference, dynamic=False)
        t_c = time_ms(lambda: comp(q, k, cos, sin))
        e = (q.numel() + k.numel()) * 2
        print(f"\nrope fwd B={B} Hq={Hq} Hk={Hk} S={S} D={D}: torch.compile {t_c * 1e3:.1f} us "
              f"({_gbs(2 * e, t_c):.0f} GB/s)")
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        half = D // 2
        db = triton.next_power_of_2(half)
        for warps, hb in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16, 32)):
            if hb > triton.next_power_of_2(max(Hq, Hk)) or (quick and warps not in (2, 4)):
                continue
            args = (q, k, qo, ko, cos, sin, S, Hq, Hk, half, q.stride(0), q.stride(1), q.stride(2), k.stride(0),
                    k.stride(1), k.stride(2), qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1),
                    ko.stride(2), 0, D)
            launch(RK._rope_kernel, (B * S,), *args, HB=hb, DB=db, BACKWARD=False, num_warps=warps)
            torch.testing.assert_close(qo.float(), rq, rtol=2e-2, atol=2e-2)
            t = time_ms(lambda: launch(RK._rope_kernel, (B * S,), *args, HB=hb, DB=db, BACKWARD=False,
                                       num_warps=warps))
            tag = " <- table" if (hb, db, warps) == astuple(rope.launch_for(Hq, Hk, half)) else ""
            print(f"  warps {warps} heads/step {hb:2}: {t * 1e3:6.1f} us {_gbs(2 * e, t):5.0f} GB/s "
                  f"({_gbs(2 * e, t) / COPY_TBS / 10:4.1f} %){tag}")
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer settings (about a minute)")
    p.add_argument("--what", choices=("norm", "rope", "both"), default="both")
    p.add_argument("--norm-shapes", default="16384x4096,32768x2048,8192x8192,4096x16384", help="MxN,...")
    a = p.parse_args()
    if a.what in ("norm", "both"):
        sweep_norm([tuple(int(v) for v in s.split("x")) for s in a.norm_shapes.split(",")], a.quick)
    if a.what in ("rope", "both"):
        sweep_rope([(4, 32, 8, 4096, 128), (1, 32, 8, 16384, 128), (8, 16, 16, 2048, 64)], a.quick)


if __name__ == "__main__":
    main()
