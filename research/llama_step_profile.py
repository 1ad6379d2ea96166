"""Where does a Llama training step's device time go, with tilewise and with Liger-Kernel?

`tilewise bench llama` at 016a510 (H200, Llama-3.2-1B shape, bf16, AdamW): 4 x 4096 tokens a step
hf_tilewise 268.9 ms, hf_liger 275.6 ms, hf_sdpa 333.2 ms; 1 x 16384: 411.8 / 417.3 / 488.4 ms.
Issue 31 asks for >= 1.05x Liger (262.5 ms at 4 x 4096): which kernels differ, and by how much?
Arithmetic before the run: 6 x 1.24e9 parameters x 16384 tokens = 1.22e14 FLOP of GEMM (187 ms at
650 TFLOP/s) + causal attention at head dim 64 (1.5e13 FLOP, ~38 ms at 400 TFLOP/s) + AdamW and
the row-wise ops (~10 ms): ~235 ms, so ~35 ms of either step is not near a roofline.

Per candidate (hf_tilewise, hf_liger; hf_sdpa with --all): the bench's model and batches, WARMUP
steps, then STEPS steps under torch.profiler; prints device time a step by kernel group and the
top kernels, and writes llama-step-profile.json under --out. Run on the GPU (~2 minutes; the
Liger rows need its wheel: `. scripts/_wheels.sh`):

    PYTHONPATH=src:$PYTHONPATH python3 research/llama_step_profile.py --out /tmp/prof [--shape 1x16384]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tilewise.bench.suites import llama as L

# The kernel groups are the llama bench's (tilewise.bench.suites.llama.KERNEL_GROUPS).
group = L.kernel_group


WARMUP, STEPS = 3, 5


def profile_one(name, config, state, batches, warmup=WARMUP, steps=STEPS):
    """{kernel name: (launches a step, ms a step)} of one candidate, built and stepped as the bench does."""
    snap = L._snapshot()
    try:
        model, step_model, opt = L._build(name, config, state)
        for i in range(warmup):
            L._step(step_model, opt, batches[i % 2])
        launches: dict = {}
        ms = L.profile_steps(step_model, opt, batches, steps, launches=launches)
        return {k: (launches[k], t) for k, t in ms.items()}
    finally:
        L._restore(snap)
        torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--shape", default="4x4096", help="B x S (4x4096 or 1x16384 in the bench)")
    p.add_argument("--all", action="store_true", help="profile hf_sdpa too")
    p.add_argument("--names", default="hf_tilewise,hf_liger", help="candidates, comma-separated")
    a = p.parse_args()
    B, S = (int(x) for x in a.shape.lower().split("x"))
    config, state, batches = L.inputs(B, S)
    names = (["hf_sdpa"] if a.all else []) + a.names.split(",")
    result = {}
    for name in names:
        try:
            result[name] = profile_one(name, config, state, batches)
        except ImportError as e:
            print(f"{name}: {e}: skipped")
    print(f"\ndevice ms a step by kernel group, B={B} S={S}")
    for line in L.group_table({n: L.group_times({k: t for k, (_, t) in ks.items()}) for n, ks in result.items()}):
        print(line)
    for name, ks in result.items():
        print(f"\n{name}: top kernels (ms a step, launches a step)")
        for k, (n, t) in sorted(ks.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"  {t:8.2f} {round(n):5d}  [{group(k)}] {k[:110]}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "llama-step-profile.json").write_text(json.dumps(
        {"shape": [B, S], "ms_a_step": {n: {k: round(t, 4) for k, (_, t) in ks.items()} for n, ks in result.items()}},
        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
