"""llama: whole training steps of a Hugging Face LlamaForCausalLM built from a config (random weights),
bf16, AdamW: tokens / s and peak memory for

    hf_sdpa          transformers' default (SDPA attention, eager layers, logits + fp32 loss)
    hf_compile       the same model under torch.compile (full runs)
    hf_liger         Liger-Kernel's apply_liger_kernel_to_llama (when its wheel is carried)
    hf_tilewise      tilewise.integrations.transformers.apply_tilewise with its defaults (RMSNorm, RoPE,
                     SwiGLU, the fused lm head + loss, and attention="auto": each call on flash_attention
                     or SDPA, whichever measured faster); its row's baseline: the fastest of the others
    hf_tilewise_own_attn  apply_tilewise(attention=True): the same with flash_attention at every call,
                     what our attention costs or saves in the step (full runs); its baseline as
                     hf_tilewise's
    hf_tilewise_keep_act  apply_tilewise(recompute_swiglu=False): the MLPs keep their SwiGLU activation
                     for the backward instead of recomputing it, the time and memory that trade moves
                     (full runs); its baseline as hf_tilewise's
    hf_tilewise_adamw  hf_tilewise with ``tilewise.AdamW`` (one fused pass a parameter) where the others
                     run torch's fused AdamW: the optimizer's share of the step (full runs, or by name in
                     TILEWISE_BENCH_LLAMA_CANDIDATES); its baseline as hf_tilewise's

Full runs: Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 / 8 heads, intermediate 8192, vocabulary
128,256) at batch x sequence 4 x 4096 and 1 x 16384; quick runs: 2 layers at 2 x 2048, no compile.
Check first: every candidate's first loss against the baseline's, from the same weights and batch
(bf16 noise: relative 2e-2). Timing: device events around each of ``STEPS`` steps after ``WARMUP``,
median ms a step, in ``TILEWISE_BENCH_LLAMA_PASSES`` passes over the candidates (default 2 in full runs),
the order reversed every other pass, the mean of the passes' medians (``pass_orders``); the CSV row's
TFLOP/s counts 6 x parameters x tokens plus attention's 12 x layers x B x S^2 x hidden / 2 (causal),
tokens / s and peak memory (the passes' largest) go to the log, and with an ``out_dir`` a bar chart
``<device>-llama.png``.

Liger's and tilewise's patches change transformers' modeling_llama module (its classes' forward, its
apply_rotary_pos_emb); every candidate's patches are undone before the next one builds its model.
Each candidate is built from its own copy of the config (docs/tuning/bench.md, "llama: a config per
candidate").

Packed documents: with ``TILEWISE_BENCH_LLAMA_PACKED=N`` each row holds documents of N tokens back to back
(``position_ids`` restarting every N tokens, no ``attention_mask``, as ``DataCollatorWithFlattening``
gives): transformers then masks attention to each document, and the shapes read ``docs=N``. The
TFLOP/s count attention within the documents only.

Token ids: uniform over the vocabulary by default; ``TILEWISE_BENCH_LLAMA_TOKENS=zipf`` draws them by a Zipf
law (``ZIPF_EXPONENT``, frequency rank r with weight 1 / r, ranks shuffled over the vocabulary), as text has:
a few ids repeat thousands of times a row, which is what the embedding's and the loss's gradients see in
training (docs/tuning/bench.md, "llama: Zipf token ids"); the shapes read ``tokens=zipf``.

Why one is faster: with ``TILEWISE_BENCH_LLAMA_PROFILE=1``, after its timed steps each candidate runs
``PROFILED`` more under torch.profiler, and the log gets a table of device ms a step by kernel group
(``KERNEL_GROUPS``: attention, GEMM, RMSNorm, ...) for every candidate of a shape side by side. It is
off by default until a run shows that profiling one candidate leaves the next one's timing alone.
"""

from __future__ import annotations

import gc
import re
import statistics
from pathlib import Path

import torch

from ... import settings
from ...cost import Cost
from ..harness import check, device_slug

WARMUP, STEPS, PROFILED = 3, 10, 2
# The exponent of the Zipf law for TILEWISE_BENCH_LLAMA_TOKENS=zipf: ~1 for word and subword frequencies.
ZIPF_EXPONENT = 1.0
# Ours, by apply_tilewise's keywords: the rows that name a baseline (the fastest of the others)
TILEWISE_OPTIONS = {"hf_tilewise": {}, "hf_tilewise_own_attn": {"attention": True},
                    "hf_tilewise_keep_act": {"recompute_swiglu": False}, "hf_tilewise_adamw": {}}
TILEWISE_ADAMW = ("hf_tilewise_adamw",)  # apply_tilewise's defaults and tilewise.AdamW for torch's fused AdamW
OURS = tuple(TILEWISE_OPTIONS)

# First match wins: a kernel's name (lower case) -> its group in the step's device-time table.
KERNEL_GROUPS = (
    ("attention", r"attn|flash|fmha|sdpa|cudnn"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|matmul|splitkreduce"),
    ("cross_entropy", r"cross_entropy|linear_cross|_lce|_ce_kernel|logsumexp|log_softmax|nll"),
    ("rms_norm", r"rms_norm|rmsnorm"),
    ("rope", r"rope|rotary"),
    ("swiglu", r"swiglu|silu|geglu"),
    ("optimizer", r"adam|multi_tensor"),
    ("embedding", r"embedding|index_put|indexing_backward|scatter|sort"),
    ("copy/fill", r"copy|fill|memset|memcpy|cat|transpose"),
    ("elementwise/reduce", r"elementwise|vectorized|reduce|unrolled"),
)


def kernel_group(name: str) -> str:
    """The ``KERNEL_GROUPS`` group of a CUDA kernel's name, "other" if none matches."""
    low = name.lower()
    for group, pattern in KERNEL_GROUPS:
        if re.search(pattern, low):
            return group
    return "other"


def group_times(kernels: dict) -> dict:
    """{kernel name: ms a step} -> {group: ms a step} with a "total"."""
    out: dict = {}
    for name, ms in kernels.items():
        g = kernel_group(name)
        out[g] = out.get(g, 0.0) + ms
    out["total"] = sum(kernels.values())
    return out


def group_table(by_name: dict) -> list:
    """Log lines: one row a group, one column a candidate ({candidate: group_times(...)})."""
    names = list(by_name)
    groups = sorted({g for t in by_name.values() for g in t if g != "total"}) + ["total"]
    lines = [f"  {'device ms a step':<20}" + "".join(f"{n:>13}" for n in names)]
    for g in groups:
        lines.append(f"  {g:<20}" + "".join(f"{by_name[n].get(g, 0.0):13.2f}" for n in names))
    return lines


CANDIDATES = ("hf_sdpa", "hf_compile", "hf_tilewise", "hf_liger", "hf_tilewise_own_attn", "hf_tilewise_keep_act",
              "hf_tilewise_adamw")
FULL_ONLY = ("hf_compile", "hf_tilewise_own_attn", "hf_tilewise_keep_act", "hf_tilewise_adamw")  # not in quick runs


def candidates(quick: bool) -> list:
    """The candidates to time, in order: ``TILEWISE_BENCH_LLAMA_CANDIDATES`` (comma-separated; a device
    session short of time can leave out hf_compile's minutes of compiling), default all of
    ``CANDIDATES``, less ``FULL_ONLY`` in quick runs. The first one's loss is every other's check."""
    env = settings.bench_llama_candidates()
    if not env:
        return [n for n in CANDIDATES if not (quick and n in FULL_ONLY)]
    chosen = [n.strip() for n in env.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(CANDIDATES))
    if unknown or not chosen:
        raise ValueError(f"{settings.BENCH_LLAMA_CANDIDATES}={env!r}: unknown candidates {unknown}; "
                         f"known: {', '.join(CANDIDATES)}")
    return [n for n in CANDIDATES if n in chosen]


def _config(quick: bool):
    import transformers

    kw = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=16384, rope_theta=500000.0,
              tie_word_embeddings=True, attention_dropout=0.0)
    if quick:
        kw["num_hidden_layers"] = 2
    return transformers.LlamaConfig(**kw)


def _snapshot():
    """What the patches touch: modeling_llama's globals and the classes' forward methods."""
    from transformers.models.llama import modeling_llama as ml

    classes = {n: v for n, v in vars(ml).items() if isinstance(v, type)}
    return ml, dict(vars(ml)), {n: c.__dict__.get("forward") for n, c in classes.items()}


def _restore(snap) -> None:
    ml, globals_, forwards = snap
    for n, v in globals_.items():
        setattr(ml, n, v)
    for n, f in forwards.items():
        if f is not None:
            setattr(getattr(ml, n), "forward", f)


def _build(name, config, state, device="cuda"):
    import copy

    import transformers

    # A copy per candidate: apply_tilewise sets the attention implementation on the model's config,
    # the object given here, so every model built after it would run tilewise's attention.
    config = copy.deepcopy(config)

    with torch.device(device):  # initialised on the GPU (a CPU init of 1B parameters takes seconds)
        model = transformers.LlamaForCausalLM(config).to(dtype=torch.bfloat16)
    model.load_state_dict(state)
    model.config.use_cache = False
    if name == "hf_liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(model=model)
    elif name in OURS:
        from ...integrations.transformers import apply_tilewise

        apply_tilewise(model, **TILEWISE_OPTIONS[name])
    model.train()
    step_model = torch.compile(model) if name == "hf_compile" else model
    if name in TILEWISE_ADAMW:
        from ...ops.optim.api import AdamW

        opt = AdamW(model.parameters(), lr=1e-5)  # torch's defaults otherwise, as the line below
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=torch.device(device).type == "cuda")
    return model, step_model, opt


def _cost(config, B, S, doc=None) -> Cost:
    """6 x parameters x tokens, plus attention's causal FLOPs: over each row, or (``doc``) over each
    document of ``doc`` tokens (the row's last one shorter)."""
    n_params = sum(int(torch.Size(s).numel()) for s in _param_shapes(config))
    square = S * S if doc is None else (S // doc) * doc * doc + (S % doc) ** 2
    attn = 12.0 * config.num_hidden_layers * B * square * config.hidden_size / 2
    return Cost(6.0 * n_params * B * S + attn, 0)


def _param_shapes(config):
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    d = getattr(config, "head_dim", None) or h // config.num_attention_heads
    qh, kvh = config.num_attention_heads * d, config.num_key_value_heads * d
    per_layer = [(qh, h), (kvh, h), (kvh, h), (h, qh), (i, h), (i, h), (h, i), (h,), (h,)]
    return [(v, h), (h,)] + per_layer * config.num_hidden_layers  # tied head: the embedding once


def run(r) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        r.log("  llama: transformers is not installed: no rows")
        return
    config = _config(r.quick)
    cases = [(2, 2048)] if r.quick else [(4, 4096), (1, 16384)]
    names = candidates(r.quick)
    doc = settings.bench_llama_packed()
    tokens = settings.bench_llama_tokens()
    torch.manual_seed(0)
    with torch.device("cuda"):
        state = transformers_state(config)
    results = {}
    passes = settings.bench_llama_passes(r.quick)
    for B, S in cases:
        shape = (f"layers={config.num_hidden_layers},B={B},S={S}" + (f",docs={doc}" if doc else "")
                 + (f",tokens={tokens}" if tokens != "uniform" else ""))
        batches = _batches(config, B, S, doc, tokens=tokens)
        first_loss, runs, peaks, groups = None, {}, {}, {}
        for k, order in enumerate(pass_orders(names, passes)):
            profile = k == 0 and settings.bench_llama_profile()
            for name in order:
                got = _candidate(r, name, shape, config, state, batches, profile=profile)
                if got is None:
                    continue
                ms, peak, loss0, group = got
                if first_loss is None:
                    first_loss = loss0
                check(f"llama {shape} {name} first loss", torch.tensor([loss0]), torch.tensor([first_loss]),
                      tol=2e-2)
                runs.setdefault(name, []).append(ms)
                peaks[name] = max(peaks.get(name, 0), peak)
                if group is not None:
                    groups[name] = group
                r.log(f"  llama {shape} {name}{f' (pass {k + 1} of {passes})' if passes > 1 else ''}: {ms:.1f} ms "
                      f"a step, {B * S / (ms / 1e3):,.0f} tokens/s, peak memory {peak / 2 ** 30:.1f} GiB")
        times = {n: statistics.mean(ms) for n, ms in runs.items()}
        for name, ms in times.items():
            results[(shape, name)] = (B * S / (ms / 1e3), peaks[name])
            if passes > 1:
                r.log(f"  llama {shape} {name}: {ms:.1f} ms a step over {passes} passes "
                      f"({' / '.join(f'{x:.1f}' for x in runs[name])})")
        if groups:
            r.log(f"  llama {shape}: where the device time goes ({PROFILED} profiled steps after the timed ones)")
            for line in group_table(groups):
                r.log(line)
        # Only ours names a baseline: the fastest of what a user would otherwise run, in the same run.
        others = {n: ms for n, ms in times.items() if n not in OURS}
        best = min(others, key=others.get) if others else ""
        for name, ms in times.items():
            base = best if name in OURS else ""
            r.add("llama_train_step", name, shape, torch.bfloat16, ms, _cost(config, B, S, doc), baseline=base,
                  baseline_ms=others.get(base) if base else None)
    out_dir = getattr(r, "out_dir", None)
    if out_dir is not None and results:
        png = _plot(results, Path(out_dir) / f"{device_slug(r.device)}-llama.png")
        if png is not None:
            r.log(f"llama chart written to {png}")


def pass_orders(names: list, passes: int) -> list:
    """The candidates' order in each pass: as given, then reversed, by turns, so that no candidate always
    runs first or after the same one (in two one-pass 4 x 4096 runs on an H100 the third candidate's GEMMs
    took 4 % more device time than the first's, the same GEMMs: docs/tuning/bench.md, "llama: passes")."""
    return [list(names) if k % 2 == 0 else list(names)[::-1] for k in range(passes)]


def _candidate(r, name, shape, config, state, batches, profile: bool):
    """(ms a step, peak bytes, first loss, device time by kernel group or None) of one candidate built afresh,
    or None where it cannot be built here (logged); its patches undone and its model freed after."""
    snap = _snapshot()
    before = torch.cuda.memory_allocated()
    try:
        r.status(f"llama {shape} {name}")
        try:
            model, step_model, opt = _build(name, config, state)
        except ImportError as e:
            r.log(f"  llama {name}: {e}: no row")
            return None
        ms, peak, loss0 = _time_steps(step_model, opt, batches)
        group = None
        if profile:
            try:
                group = group_times(profile_steps(step_model, opt, batches))
            except Exception as e:  # noqa: BLE001 - the table explains; the row stands without it
                r.log(f"  llama {shape} {name}: no profile ({type(e).__name__}: {str(e)[:120]})")
        del model, step_model, opt
        return ms, peak, loss0, group
    finally:
        _restore(snap)
        # A model whose patched modules hold it in a reference cycle outlives `del` until the cycle
        # collector runs, and was counted in the next candidates' peak memory (2.3 GiB, a model's
        # weights, in some runs and not others): what `del` left is logged, then collected.
        left = torch.cuda.memory_allocated() - before
        gc.collect()
        torch.cuda.empty_cache()
        still = torch.cuda.memory_allocated() - before
        if max(left, still) > 64 << 20:
            r.log(f"  llama {shape} {name}: {left / 2 ** 30:.2f} GiB still allocated after it, "
                  f"{still / 2 ** 30:.2f} GiB after a collection")


def zipf_ids(V: int, shape: tuple, generator: torch.Generator, device="cuda") -> torch.Tensor:
    """Token ids in [0, V) of ``shape`` drawn by a Zipf law: the id of frequency rank r (1-based) with
    weight r ** -ZIPF_EXPONENT, the ranks a seeded shuffle of the vocabulary (frequent ids spread over the
    embedding's rows, as a tokenizer's are)."""
    weights = torch.arange(1, V + 1, device=device, dtype=torch.float32) ** -ZIPF_EXPONENT
    ranked = torch.multinomial(weights, shape[0] * shape[1], replacement=True, generator=generator)
    return torch.randperm(V, device=device, generator=generator)[ranked].view(shape)


def _batches(config, B, S, doc=None, device="cuda", tokens="uniform") -> list:
    """The two batches a shape's candidates step on (the model's keywords: (B, S) tokens, their labels
    and, with ``doc``, ``position_ids`` restarting every ``doc`` tokens), seeded by the shape; ``tokens``
    ``uniform`` or ``zipf`` (``zipf_ids``)."""
    g = torch.Generator(device=device).manual_seed(B * S)
    out = []
    for _ in range(2):
        if tokens == "zipf":
            ids = zipf_ids(config.vocab_size, (B, S), g, device)
        else:
            ids = torch.randint(0, config.vocab_size, (B, S), device=device, generator=g)
        batch = {"input_ids": ids, "labels": ids}
        if doc:
            batch["position_ids"] = (torch.arange(S, device=device) % doc).expand(B, S)
        out.append(batch)
    return out


def inputs(B: int, S: int, quick: bool = False, doc: int | None = None, tokens: str = "uniform") -> tuple:
    """(config, shared weights, batches) as ``run`` makes them for a B x S shape (``doc``: packed
    documents of that length; ``tokens``: ``uniform`` or ``zipf``): what research scripts that step the
    bench's model start from."""
    config = _config(quick)
    torch.manual_seed(0)
    with torch.device("cuda"):
        state = transformers_state(config)
    return config, state, _batches(config, B, S, doc, tokens=tokens)


def transformers_state(config) -> dict:
    """One set of random bf16 weights every candidate loads (the same model each time)."""
    import transformers

    model = transformers.LlamaForCausalLM(config).to(dtype=torch.bfloat16)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _step(model, opt, batch):
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def profile_steps(model, opt, batches, steps=PROFILED, launches: dict | None = None) -> dict:
    """{CUDA kernel name: device ms a step} over ``steps`` steps of an already warm model; ``launches``,
    when given, gets each kernel's launches a step."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            _step(model, opt, batches[i % 2])
        torch.cuda.synchronize()
    kernels: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] = kernels.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / steps
            if launches is not None:
                launches[e.name] = launches.get(e.name, 0) + 1 / steps
    return kernels


def _time_steps(model, opt, batches):
    loss0 = float(_step(model, opt, batches[0]))  # the check's loss: the first step, from the shared weights
    for i in range(WARMUP):
        _step(model, opt, batches[i % 2])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(STEPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        _step(model, opt, batches[i % 2])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), torch.cuda.max_memory_allocated(), loss0


def _plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    shapes = sorted({s for s, _ in results})
    names = [n for n in ("hf_sdpa", "hf_compile", "hf_liger", *OURS) if any(k[1] == n for k in results)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(names))
    for j, (ax, what, scale, label) in enumerate(((axes[0], 0, 1e3, "tokens / s (thousands)"),
                                                  (axes[1], 1, 2 ** 30, "peak memory (GiB)"))):
        for k, n in enumerate(names):
            vals = [results.get((s, n), (0, 0))[what] / scale for s in shapes]
            ax.bar([i + k * width for i in range(len(shapes))], vals, width, label=n)
        ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(shapes))], shapes, fontsize=7)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle("Llama training step (bf16, AdamW), higher tokens/s and lower memory are better")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
