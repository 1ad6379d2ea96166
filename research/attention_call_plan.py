"""Question: how much host time does a call plan (ops/attention/plans.py) save an eager flash_attention
forward + backward, and how far is it from the floor (an autograd.Function that only allocates)?

Runs on a CPU host without a GPU: tests/attention_fakes.py sends CPU bf16 tensors down the H200's routes
through the real launch path (runtime.triton_launch's cache, Bound) to a stand-in for the compiled
kernel's run. What it leaves out: Triton's own launcher (its Python wrapper and the driver call), the
same for both rows. Shapes: the bench's host row (B 1, H 16, S 256, D 128, causal: v5 forward, v3's two
backward kernels) and a Llama one (B 1, H 32 / 8, S 4096, D 128, causal, sequence-major q, k, v as
transformers passes them: v5 and v6).

    PYTHONPATH=src python research/attention_call_plan.py [-p]

Medians of 7 x 300 calls.

RESULT (2026-12-05, CPU host, 2 cores, four runs): host row ordinary 195-199 us, planned 65-66 us,
floor 47-80 us; Llama row ordinary 389-395 us, planned 116-134 us, floor 138-159 us (there the CPU's
allocation of 32 MB buffers dominates the floor: no floor). A replay is 3x less host time at the host
row, within ~20 us of an autograd.Function that only allocates. (Before the launch log was emptied each
call, every allocation was a fresh one and all columns read 50-60 us higher.)
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from attention_fakes import fake_launches  # noqa: E402

from tilewise.ops.attention import api as A, plans  # noqa: E402


def timed(step, n=300, reps=7):
    step(), step()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        ts.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(ts)


class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        q.new_empty(q.shape[:3], dtype=torch.float32)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def inputs(B, H, Hkv, S, D, seq_major):
    g = torch.Generator().manual_seed(0)

    def make(h):
        t = torch.randn(B, S, h, D, generator=g, dtype=torch.bfloat16)
        return (t.transpose(1, 2) if seq_major else t.transpose(1, 2).contiguous()).requires_grad_(True)

    q, k, v = make(H), make(Hkv), make(Hkv)
    return [q, k, v], torch.randn(B, H, S, D, generator=g, dtype=torch.bfloat16)


def main():
    cases = [("bench host row B1 H16 S256 D128 causal", (1, 16, 16, 256, 128, False)),
             ("llama B1 H32/8 S4096 D128 causal seq-major", (1, 32, 8, 4096, 128, True))]
    for name, shape in cases:
        ins, go = inputs(*shape)
        with fake_launches() as log:
            off = A.default_policy(ins[0], ins[1], causal=True).replace(plans=False)

            # The log is emptied each call: tensors it held would make every allocation a fresh one.
            def ordinary():
                log.clear()
                return torch.autograd.grad(A.flash_attention(*ins, causal=True, policy=off), ins, go)

            def planned():
                log.clear()
                return torch.autograd.grad(A.flash_attention(*ins, causal=True), ins, go)

            t_off = timed(ordinary)
            t_on = timed(planned)
            log.clear()
            planned()
            kernels = [k for k, _ in log]
            st = plans.stats()
            if "-p" in sys.argv:
                import cProfile
                import pstats
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(300):
                    planned()
                pr.disable()
                pstats.Stats(pr).sort_stats("tottime").print_stats(20)
        t_floor = timed(lambda: torch.autograd.grad(Floor.apply(*ins)[0], ins, go))
        print(f"{name}: ordinary {t_off:.1f} us, planned {t_on:.1f} us, floor {t_floor:.1f} us a fwd+bwd; "
              f"launches {kernels}; plans {st}")


if __name__ == "__main__":
    main()
