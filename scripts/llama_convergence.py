#!/usr/bin/env python3
"""Does a Llama train the same on tilewise? Three runs from the same weights on the same batches:

    hf_fp32       transformers' default (SDPA), float32: the reference
    hf_bf16       transformers' default, bfloat16: what bf16 noise looks like
    tilewise_bf16 apply_tilewise (attention, RMSNorm, RoPE, SwiGLU, fused lm head + loss), bfloat16

A small LlamaForCausalLM built from a config trains ``--steps`` AdamW steps on a fixed text corpus: the
sentences of a GLUE-style TSV (SST-2's train.tsv; first column), as bytes (vocabulary 256 + BOS/EOS/PAD),
joined into one stream cut into (batch, seq) windows in a fixed order. Then the three models' logits on
held-out windows are compared.

Pass: at every step the tilewise run's loss is as close to the fp32 run's as the bf16 HF run's is,
within a factor ``--tolerance`` (both smoothed over 10 steps, plus 0.01 absolute), and the final
logits' relative error against fp32 is within the same factor of the bf16 HF run's. Writes
``llama-convergence.json`` (every loss, the verdict) and ``llama-convergence.png`` (the curves and
their differences) under ``--out``. Exit status 1 if it does not pass.

    python scripts/llama_convergence.py --data ../shared/data/sst2/train.tsv --out bench/results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

BOS, EOS, PAD = 256, 257, 258
VOCAB = 259


def read_corpus(path: Path, limit_bytes: int = 8 << 20) -> torch.Tensor:
    """The first column of every row after the header, as one byte stream with BOS/EOS around each."""
    ids = []
    total = 0
    with open(path, encoding="utf-8", errors="strict") as f:
        next(f, None)  # header
        for line_no, line in enumerate(f, start=2):
            text = line.rstrip("\n").split("\t", 1)[0]
            if not text:
                continue
            b = text.encode("utf-8")
            ids.extend([BOS, *b, EOS])
            total += len(b) + 2
            if total >= limit_bytes:
                break
    if len(ids) < 2:
        raise SystemExit(f"llama_convergence: {path} holds no text rows")
    return torch.tensor(ids, dtype=torch.long)


def windows(stream: torch.Tensor, batch: int, seq: int, steps: int, seed: int) -> list[torch.Tensor]:
    """``steps`` batches of (batch, seq) windows at fixed random offsets (the same for every run)."""
    if stream.numel() <= seq + 1:
        raise SystemExit(f"llama_convergence: the corpus ({stream.numel()} tokens) is shorter than --seq {seq}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - seq, (steps, batch), generator=g)
    return [torch.stack([stream[s:s + seq] for s in row.tolist()]) for row in starts]


def build(config, state, dtype, device, tilewise_parts):
    import transformers

    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(state)
    model = model.to(dtype=dtype)
    if tilewise_parts is not None:
        from tilewise.integrations.transformers import apply_tilewise

        apply_tilewise(model, **{p: p in tilewise_parts for p in ("attention", "rms_norm", "rope", "swiglu", "loss")})
    return model.train()


def train(model, batches, lr, device, label):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.startswith("cuda"))
    warm = max(1, len(batches) // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / len(batches)))))
    losses = []
    t0 = time.time()
    for i, ids in enumerate(batches):
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        if (i + 1) % max(1, len(batches) // 12) == 0 or i + 1 == len(batches):
            print(f"  {label}: step {i + 1}/{len(batches)} loss {losses[-1]:.4f} ({time.time() - t0:.0f} s)",
                  flush=True)
    return losses


def smooth(xs, k=10):
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def plot(result, path: Path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    L = result["losses"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in L:
        a.plot(L[name], label=name, lw=1)
    a.set_xlabel("step")
    a.set_ylabel("loss")
    a.legend()
    ref = smooth(L["hf_fp32"])
    for name in ("hf_bf16", "tilewise_bf16"):
        b.plot([abs(x - y) for x, y in zip(smooth(L[name]), ref)], label=f"|{name} - hf_fp32| (10-step mean)", lw=1)
    b.set_xlabel("step")
    b.set_yscale("log")
    b.legend(fontsize=8)
    fig.suptitle(f"Llama convergence ({result['config']}): pass={result['pass']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, type=Path, help="a TSV whose first column is text (SST-2's train.tsv)")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tolerance", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--parts", default="attention,rms_norm,rope,swiglu,loss",
                   help="what apply_tilewise swaps (comma list)")
    a = p.parse_args(argv)
    import transformers

    if not a.data.is_file():
        raise SystemExit(f"llama_convergence: --data {a.data} is not a file")
    parts = set(filter(None, a.parts.split(",")))
    stream = read_corpus(a.data)
    batches = windows(stream, a.batch, a.seq, a.steps, a.seed)
    held_out = windows(stream, 4, a.seq, 1, a.seed + 1)[0]
    inter = max(64, a.hidden * 8 // 3 // 64 * 64)  # Llama's ratio, whole 64s
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=a.hidden, intermediate_size=inter,
                                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                                      bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True)
    torch.manual_seed(a.seed)
    state = transformers.LlamaForCausalLM(config).state_dict()
    runs = {"hf_fp32": (torch.float32, None), "hf_bf16": (torch.bfloat16, None),
            "tilewise_bf16": (torch.bfloat16, parts)}
    losses, logits = {}, {}
    for name, (dtype, tw) in runs.items():
        print(f"{name}: {a.steps} steps", flush=True)
        model = build(config, state, dtype, a.device, tw)
        losses[name] = train(model, batches, a.lr, a.device, name)
        model.eval()
        with torch.no_grad():
            logits[name] = model(input_ids=held_out.to(a.device)).logits.float().cpu()
        del model
    ref = smooth(losses["hf_fp32"])
    d_hf = [abs(x - y) for x, y in zip(smooth(losses["hf_bf16"]), ref)]
    d_tw = [abs(x - y) for x, y in zip(smooth(losses["tilewise_bf16"]), ref)]
    worst = max(range(len(d_tw)), key=lambda i: d_tw[i] - (a.tolerance * d_hf[i] + 0.01))
    losses_ok = all(t <= a.tolerance * h + 0.01 for t, h in zip(d_tw, d_hf))

    def rel(x):
        return float((x - logits["hf_fp32"]).norm() / logits["hf_fp32"].norm())

    logit_hf, logit_tw = rel(logits["hf_bf16"]), rel(logits["tilewise_bf16"])
    logits_ok = logit_tw <= a.tolerance * logit_hf + 1e-3
    result = {
        "config": f"{a.layers} layers, hidden {a.hidden}, heads {a.heads}/{a.kv_heads}, vocab {VOCAB} (bytes), "
                  f"batch {a.batch} x {a.seq}, {a.steps} steps, AdamW lr {a.lr}",
        "data": os.path.basename(a.data),
        "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device,
        "tilewise_parts": sorted(parts), "tolerance": a.tolerance,
        "final_loss": {n: l[-1] for n, l in losses.items()},
        "worst_step": {"step": worst, "tilewise_vs_fp32": d_tw[worst], "hf_bf16_vs_fp32": d_hf[worst]},
        "logits_rel_error_vs_fp32": {"hf_bf16": logit_hf, "tilewise_bf16": logit_tw},
        "pass": bool(losses_ok and logits_ok), "losses": losses,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    from tilewise._files import write_atomic

    write_atomic(a.out / "llama-convergence.json", (json.dumps(result, indent=1) + "\n").encode())
    png = plot(result, a.out / "llama-convergence.png")
    print(json.dumps({k: v for k, v in result.items() if k != "losses"}, indent=1))
    print(f"written: {a.out / 'llama-convergence.json'}" + (f", {png}" if png else ""))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
