"""Question: where do the seconds before the classifier's first training step go (cold and warm)?

`tilewise train --epochs 1 --max-steps 100` took 29.0 s with empty kernel caches and 12.1 s with warm
ones on the H200 (issue 32's numbers); the targets are <= 15 s cold in all and <= 3 s warm to the
first step. This runs what the cold_start bench's classifier case runs (model and AdamW as `train`
builds them, one synthetic batch of 64 x 64, eager step), twice, and splits the time into imports,
model build, each step, and inside the steps: NVRTC compiles (tilewise.runtime.cuda.compile_source,
cached or not), Triton compiles (Triton's compilation listener: cache hits apart) and autotune
timing (Autotuner._bench). Run it twice, first with empty caches:

    D=$(mktemp -d); TILEWISE_CACHE_DIR=$D/tw TRITON_CACHE_DIR=$D/triton PYTHONPATH=src \\
        python research/cold_start_profile.py [--mode graph] [--buckets 16,32,64]
    (the same line again: warm)
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import collections  # noqa: E402

import torch  # noqa: E402

T_TORCH = time.perf_counter()

import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

from tilewise.runtime import cuda as rt  # noqa: E402
from tilewise.sst2.step_bench import build_step, step_model, synthetic_batches  # noqa: E402

T_IMPORTS = time.perf_counter()

STATS = collections.defaultdict(lambda: [0, 0.0])  # what -> [count, seconds]
WHERE = {"phase": "setup"}


def _add(what, secs):
    s = STATS[(WHERE["phase"], what)]
    s[0] += 1
    s[1] += secs


def _listener(*, src, metadata, metadata_group, times, cache_hit):
    total = (times.ir_initialization + sum(d for _, d in times.lowering_stages) + times.store_results) / 1e6
    _add("triton compile (cache hit)" if cache_hit else "triton compile", total)
    if not cache_hit:
        for stage, d in times.lowering_stages:
            _add(f"  triton stage {stage}", d / 1e6)


def _wrap_nvrtc():
    real = rt.compile_source

    def timed(*a, **k):
        t = time.perf_counter()
        m = real(*a, **k)
        _add("nvrtc module (cached)" if m.from_cache else "nvrtc compile", time.perf_counter() - t)
        return m

    rt.compile_source = timed


def _wrap_autotune():
    real = Autotuner._bench

    def timed(self, *a, **k):
        t = time.perf_counter()
        out = real(self, *a, **k)
        _add("autotune: one config timed (compile included)", time.perf_counter() - t)
        return out

    Autotuner._bench = timed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="eager", choices=("eager", "graph"))
    p.add_argument("--buckets", default="64", help="sequence lengths, one step each (train pads to 16,32,64)")
    p.add_argument("--backend", default="tilewise", choices=("tilewise", "torch"))
    p.add_argument("--device", default="cuda")
    # train's default; "torch" is torch.optim's, whose constructor imports torch._dynamo (logs up to 098b657
    # timed that one: their "model + AdamW" 3.8-4.9 s warm is mostly that import, which train does not make)
    p.add_argument("--optimizer", default="tilewise", choices=("tilewise", "torch"))
    a = p.parse_args()
    knobs.compilation.listener = _listener
    _wrap_nvrtc()
    _wrap_autotune()
    dev = torch.device(a.device)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    marks = []
    if dev.type == "cuda":  # the driver's context apart from the model, as any PyTorch program pays it
        t = time.perf_counter()
        torch.cuda.init()
        marks.append(("torch.cuda.init", time.perf_counter() - t))
        t = time.perf_counter()
        torch.zeros(1, device=dev)
        sync()
        marks.append(("first tensor", time.perf_counter() - t))
    t = time.perf_counter()
    model, opt = step_model(a.backend, a.mode, dropout=0.0, device=dev, optimizer=a.optimizer)
    sync()
    marks.append(("model + AdamW", time.perf_counter() - t))
    for T in (int(x) for x in a.buckets.split(",")):
        batch = synthetic_batches(1, 64, T, device=dev)[0]
        step = build_step(model, opt, a.mode, batch_size=64, seq_len=T, device=dev)
        for i in range(2):
            WHERE["phase"] = f"T={T} step {i + 1}"
            t = time.perf_counter()
            step(batch)
            sync()
            marks.append((WHERE["phase"], time.perf_counter() - t))
    print(f"triton {triton.__version__}, torch {torch.__version__}, {a.backend} {a.mode}")
    print(f"import torch {T_TORCH - T0:6.2f} s; triton + tilewise {T_IMPORTS - T_TORCH:6.2f} s")
    for name, secs in marks:
        print(f"{name:>16}: {secs:7.2f} s")
        for (phase, what), (n, s) in sorted(STATS.items()):
            if phase == name:
                print(f"{'':>18}{what:<48} {n:4} x, {s:7.2f} s")
    print(f"total to the end of the last step: {time.perf_counter() - T0:.2f} s")


if __name__ == "__main__":
    main()
