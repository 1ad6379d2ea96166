"""What is alive at the llama bench's peak memory, by the code that allocated it: hf_tilewise against hf_liger.

Why: at 699a416 / 2373afd the bench read hf_tilewise 30.9 GiB against hf_liger 29.1 GiB at 4 x 4096 (issue 31
asks for <= Liger's). By arithmetic the fused gate / up keeps a concatenated weight for the backward, 1 GiB
(research/patches/linear-packed.patch removes it); the rest, ~0.8 GiB, is not explained (docs/tuning/bench.md,
"Peak memory").

For each candidate: the bench's model, weights and batches (``bench.suites.llama``), three warm steps, then one
step under ``torch.cuda.memory._record_memory_history`` (Python stacks). From the allocator's trace (what the
step allocated: the weights and optimizer state before it are one number), the blocks alive when its total was
highest, grouped by the first stack frame in transformers, tilewise or liger_kernel (else the
first frame), largest groups first, in MiB; then the groups side by side.

Run on the GPU (~2 minutes at 4 x 4096): PYTHONPATH=src python3 research/llama_memory_peak.py [--shape 4x4096]
[--candidates hf_tilewise,hf_liger] [--top 25]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

OWNERS = ("transformers/", "tilewise/", "liger_kernel/")


def owner(frames: list) -> str:
    """The allocating code: the first frame (innermost first, as the trace lists them) in one of OWNERS'
    packages, else the first frame; ``file:line function``."""
    for f in frames:
        name = f.get("filename", "")
        if any(o in name for o in OWNERS):
            short = name[name.rfind("/", 0, name.rfind("/")) + 1:]
            return f"{short}:{f.get('line')} {f.get('name')}"
    if frames:
        f = frames[0]
        return f"{f.get('filename', '?').rsplit('/', 1)[-1]}:{f.get('line')} {f.get('name')}"
    return "(no frames)"


def live_at_peak(trace: list) -> tuple[int, dict]:
    """(the highest allocated total, {owner: bytes alive then}) from one device's allocator trace: a block
    is alive from its ``alloc`` to its ``free_completed``."""
    live: dict = {}
    total = peak = 0
    at_peak: dict = {}
    for e in trace:
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            live[addr] = (e["size"], owner(e.get("frames", [])))
            total += e["size"]
            if total > peak:
                peak = total
                at_peak = dict(live)
        elif action == "free_completed" and addr in live:
            total -= live.pop(addr)[0]
    groups: dict = defaultdict(int)
    for size, who in at_peak.values():
        groups[who] += size
    return peak, dict(groups)


def measure(name: str, config, state, batches) -> tuple[int, int, dict]:
    import torch

    from tilewise.bench.suites import llama

    snap = llama._snapshot()
    try:
        model, step_model, opt = llama._build(name, config, state)
        for i in range(3):
            llama._step(step_model, opt, batches[i % 2])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")  # C++ stacks: slow
        llama._step(step_model, opt, batches[0])
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        max_alloc = torch.cuda.max_memory_allocated()
        trace = snapshot["device_traces"][torch.cuda.current_device()]
        _, groups = live_at_peak(trace)
        del model, step_model, opt
        return base, max_alloc, groups
    finally:
        llama._restore(snap)
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4x4096", help="BxS (default %(default)s)")
    p.add_argument("--candidates", default="hf_tilewise,hf_liger")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    from tilewise.bench.suites import llama

    B, S = (int(x) for x in a.shape.split("x"))
    config, state, batches = llama.inputs(B, S)
    names = a.candidates.split(",")
    found = {}
    for name in names:
        base, max_alloc, groups = measure(name, config, state, batches)
        found[name] = groups
        print(f"{name} {a.shape}: peak allocated {max_alloc / 2 ** 30:.2f} GiB (before the step "
              f"{base / 2 ** 30:.2f} GiB: weights, gradients' buffers, optimizer state); alive at the trace's peak "
              f"by allocating code, MiB:", flush=True)
        for who, size in sorted(groups.items(), key=lambda kv: -kv[1])[:a.top]:
            print(f"  {size / 2 ** 20:10.1f}  {who}", flush=True)
    if len(names) == 2:
        x, y = names
        keys = sorted(set(found[x]) | set(found[y]), key=lambda k: -abs(found[x].get(k, 0) - found[y].get(k, 0)))
        print(f"largest differences, MiB ({x} - {y}):")
        for k in keys[:a.top]:
            print(f"  {(found[x].get(k, 0) - found[y].get(k, 0)) / 2 ** 20:+10.1f}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
