#!/usr/bin/env python3
"""A transformers LlamaForCausalLM trained under FSDP2 (``fully_shard``), unpatched, with apply_tilewise or
with Liger: per-step losses, tokens/s and peak memory per device. Run with torchrun:

    torchrun --nproc_per_node 2 scripts/llama_fsdp.py --variant tilewise --out runs/fsdp-2.json
    torchrun --nproc_per_node 1 scripts/llama_fsdp.py --variant tilewise --out runs/fsdp-1.json
    python scripts/llama_fsdp.py --compare runs/fsdp-1.json runs/fsdp-2.json --png fsdp.png

Every rank builds the same model from the same seed, applies the variant, shards each decoder layer
and then the root; the global batch (``--batch`` rows of ``--seq`` random tokens, the same stream for
any world size) is split by rank, so one process and two see the same data and, up to the reduction
order and bf16 rounding, the same losses. On CUDA: NCCL, bf16 parameters with fp32 gradient reduction
(MixedPrecisionPolicy), fused AdamW. On the CPU (``--device cpu``, gloo, fp32): the same program for
tests, with ``--parts`` naming the tilewise pieces that run there (Triton's interpreter).
``--compare`` checks that two runs' losses agree step by step (``--tolerance``, relative) and draws them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

PARTS = ("attention", "rms_norm", "rope", "swiglu", "loss")


def _config(a):
    import transformers

    return transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                                    num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                    num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                                    tie_word_embeddings=True, attention_dropout=0.0)


def build(a, device, mesh):
    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(a.seed)  # the same weights on every rank and at every world size
    model = transformers.LlamaForCausalLM(_config(a)).to(device)
    if a.variant == "tilewise":
        from tilewise.integrations.transformers import apply_tilewise

        parts = set(a.parts.split(","))
        apply_tilewise(model, **{p: p in parts for p in PARTS})
    elif a.variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(model=model)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device.type == "cuda"
          else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model.train()


def batches(a, rank, world):
    """This rank's rows of each step's global batch (a fixed token stream, whatever the world size)."""
    if a.batch % world:
        raise SystemExit(f"llama_fsdp: --batch {a.batch} must be a multiple of the world size {world}")
    g = torch.Generator().manual_seed(a.seed + 1)
    per = a.batch // world
    out = []
    for _ in range(a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        out.append(ids[rank * per:(rank + 1) * per])
    return out


def train(a) -> dict:
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (world,))
    model = build(a, device, mesh)
    if a.optimizer == "tilewise":
        import tilewise

        opt = tilewise.AdamW(model.parameters(), lr=a.lr)  # each rank updates its shards (DTensor local tensors)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, fused=cuda)
    losses, times = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i, ids in enumerate(batches(a, rank, world)):
        ids = ids.to(device)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)  # every rank has as many tokens: the global mean is the mean of the means
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(mean) / world)
        if rank == 0 and ((i + 1) % max(1, a.steps // 10) == 0 or i + 1 == a.steps):
            print(f"step {i + 1}/{a.steps} loss {losses[-1]:.4f}", flush=True)
    steady = sorted(times[min(3, len(times) - 1):])
    step_s = steady[len(steady) // 2]
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) if cuda else 0], dtype=torch.float64,
                        device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    result = {"variant": a.variant, "world": world, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
              "config": {k: getattr(a, k) for k in ("layers", "hidden", "heads", "kv_heads", "vocab", "batch", "seq",
                                                    "steps", "lr", "parts")},
              "losses": losses, "median_step_s": step_s, "tokens_per_s": a.batch * a.seq / step_s,
              "tokens_per_s_per_device": a.batch * a.seq / step_s / world, "peak_bytes_per_device": int(peak.item())}
    # Free the sharded model and its optimizer, and let every rank get here, before the process group
    # goes: a gloo run once aborted in teardown ("terminate called without an active exception") after
    # its last step, with FSDP's objects still alive when the group was destroyed.
    del model, opt, loss
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return result if rank == 0 else {}


def compare(paths, tolerance, png=None) -> int:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    a, b = runs[0]["losses"], runs[1]["losses"]
    if len(a) != len(b):
        raise SystemExit(f"llama_fsdp: {paths[0]} has {len(a)} steps, {paths[1]} {len(b)}")
    worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))
    for r, p in zip(runs, paths):
        print(f"{p}: world {r['world']}, {r['tokens_per_s']:,.0f} tokens/s ({r['tokens_per_s_per_device']:,.0f} a "
              f"device), peak {r['peak_bytes_per_device'] / 2 ** 30:.2f} GiB a device")
    if len(runs) == 2 and runs[0]["world"] != runs[1]["world"]:
        one, two = sorted(runs, key=lambda r: r["world"])
        print(f"scaling efficiency: {two['tokens_per_s'] / (two['world'] / one['world'] * one['tokens_per_s']):.3f}")
    print(f"largest relative loss difference over {len(a)} steps: {worst:.2e} (tolerance {tolerance:g})")
    if png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for r, p in zip(runs, paths):
            ax.plot(r["losses"], label=f"{r['variant']}, world {r['world']}", lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=120)
        print(f"written: {png}")
    return 0 if worst <= tolerance else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=("hf", "tilewise", "liger"), default="tilewise")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--optimizer", choices=("torch", "tilewise"), default="torch",
                   help="torch.optim.AdamW (fused on CUDA) or tilewise.AdamW")
    p.add_argument("--parts", default=",".join(PARTS), help="with --variant tilewise: what apply_tilewise swaps")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batch", type=int, default=8, help="global batch (rows)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="rank 0 writes the run's JSON here")
    p.add_argument("--compare", nargs=2, metavar="RUN.json", help="compare two runs' losses instead of training")
    p.add_argument("--tolerance", type=float, default=2e-2)
    p.add_argument("--png")
    a = p.parse_args(argv)
    if a.compare:
        return compare(a.compare, a.tolerance, a.png)
    result = train(a)
    if result and a.out:
        from tilewise._files import write_atomic

        a.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(a.out, (json.dumps(result, indent=1) + "\n").encode())
        print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
