"""The llama bench's step with each MLP's activation kept or recomputed in the backward (apply_tilewise's
``recompute_swiglu``): time and peak memory, alternating in one process.

Why: issue 31 asks for peak memory <= HF + Liger's; at f6bc84f hf_tilewise was 29.9 GiB against Liger's 29.1
at 4 x 4096 (H100). The SwiGLU activation (tokens x 8192 bf16, 256 MiB a layer at 16384 tokens) is kept by
the down projection for its weight gradient; ``tilewise.nn.mlp.swiglu_mlp`` drops it and has SwiGLU's
backward kernel write it again. Prediction: peak -4.0 GiB (16 x 256 MiB) at both shapes; step time +0.6 to
+1.2 ms (one more 256 MiB write a layer in the backward, ~0.06 ms at ~4 TB/s, x 16).

Each round times both variants (the bench's ``_time_steps``: 1 + 3 warm steps, median of 10), in turn; the
peak is the step's highest allocation less what was allocated before it, plus the variant's own weights,
gradients and optimizer state (both models are alive, so the absolute peak would count the other's).

Run on the GPU (~3 min): PYTHONPATH=src python3 research/llama_swiglu_recompute.py [--shapes 4x4096,1x16384]
[--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics


def build(config, state, recompute: bool):
    import torch

    from tilewise.bench.suites import llama
    from tilewise.integrations.transformers import apply_tilewise

    before = torch.cuda.memory_allocated()
    model, _, opt = llama._build("hf_sdpa", config, state)  # plain HF, then the integration with one change
    apply_tilewise(model, recompute_swiglu=recompute)
    llama._step(model, opt, {"input_ids": state_ids(config), "labels": state_ids(config)})  # optimizer state
    torch.cuda.synchronize()
    return model, opt, torch.cuda.memory_allocated() - before


def state_ids(config):
    import torch

    return torch.arange(64, device="cuda").remainder(config.vocab_size).view(1, 64)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4x4096,1x16384")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    import torch

    from tilewise.bench.suites import llama

    for shape in a.shapes.split(","):
        B, S = (int(x) for x in shape.split("x"))
        config, state, batches = llama.inputs(B, S)
        snap = llama._snapshot()
        try:
            variants = {name: build(config, state, rec) for name, rec in (("kept", False), ("recomputed", True))}
            times = {n: [] for n in variants}
            peaks = {n: [] for n in variants}
            losses = {}
            for r in range(a.rounds):
                for name, (model, opt, own) in variants.items():
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    ms, peak, loss0 = llama._time_steps(model, opt, batches)
                    times[name].append(ms)
                    peaks[name].append(peak - base + own)
                    losses.setdefault(name, loss0)
                    print(f"{shape} round {r} {name}: {ms:.2f} ms a step, peak {(peak - base + own) / 2 ** 30:.2f} "
                          f"GiB (own weights / grads / optimizer {own / 2 ** 30:.2f}), first loss {loss0:.4f}",
                          flush=True)
            k, c = (statistics.median(times[n]) for n in ("kept", "recomputed"))
            pk, pc = (max(peaks[n]) / 2 ** 30 for n in ("kept", "recomputed"))
            print(f"{shape}: kept {k:.2f} ms, recomputed {c:.2f} ms ({c - k:+.2f} ms, {k / c:.4f}x); peak "
                  f"{pk:.2f} -> {pc:.2f} GiB ({pc - pk:+.2f})", flush=True)
            del variants
        finally:
            llama._restore(snap)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
