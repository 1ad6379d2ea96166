"""Which change buys issue 31's 1.05x over Liger in the Llama-3.2-1B step? Ceilings, one run.

Why: `tilewise bench llama` at 768d022 (H200, 4 x 4096 tokens a step) has hf_tilewise at 260.2 ms
against hf_liger's 262.2 (1.008x); 1.05x is ~249.7 ms, so ~10 ms must go. The c0709cc profile
(bench/results/logs/llama-step-profile-c0709cc.log) names the candidates: attention (now ~1.7 ms a
step behind cuDNN by research/attention_seqmajor.py), the residual adds (5.5 ms of bf16 add kernels
in the elementwise group, fusable into RMSNorm), the lm head's chunk (43.9 -> 40.8 ms at 4,096 rows
in research/lce_chunk_sweep.py). Each variant here times the step with one of them removed or
changed, in the same run as the baseline, so the next kernel work goes where the milliseconds are:

    tilewise                   apply_tilewise(model), as the bench (from 64d8770 its default fuses q / k / v)
    tilewise, no fuse_qkv      apply_tilewise(model, fuse_qkv=False): the default before 64d8770
    tilewise, SDPA attention   apply_tilewise(model, attention=False): transformers' SDPA (cuDNN)
    decoder re-written         the decoder layer's forward as transformers writes it, through this
                               script's copy (the control for the next row)
    decoder without adds       the same without its two residual adds: the ceiling of fusing them
                               into RMSNorm (forward adds and backward's gradient sums; the model's
                               loss changes, so its check is skipped)
    lm head chunk 4096 rows    linear_cross_entropy with CHUNK_BYTES = 1 GiB (4,096 rows at V 128,256);
                               and 3,072 rows, the most under issue 31's 1.5 GiB by lce_chunk_sweep's slope
    fused add_norm ... all     research/llama_fusions.py's patches on top of "tilewise, no fuse_qkv",
                               one at a time and all together (predictions in that file's docstring)
    tilewise + residual_norm   apply_tilewise(residual_norm=True): the library's "fused add_norm" and
                               "fused add_norm_next" (opt-in since 09eb806)
    liger                      apply_liger_kernel_to_llama, for reference

Prediction: SDPA attention -1.5 to -2 ms, no adds -3 to -5 ms, chunk 4096 -2 to -3 ms; together ~8
ms, short of the 10 ms: SwiGLU's epilogue fusion (7.9 ms of SwiGLU kernels at ~the copy roofline)
would be needed too. The fusions (written after this prediction): add_norm -1.0 to -1.5 ms,
add_norm_next another -1.0 to -1.5, qkv -1.5 to -3, gate_up -0.5 to +0.5; all ~-4 to -6 ms.

Run on the GPU (~5 minutes; Liger's row needs its wheel):
    . scripts/_wheels.sh
    PYTHONPATH=src:$PYTHONPATH python3 research/llama_step_ceilings.py [--shape 1x16384] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys

import torch

from tilewise.bench.suites import llama as L

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llama_fusions as F  # noqa: E402


def _decoder_forward(adds: bool):
    """A LlamaDecoderLayer.forward as transformers writes it (norm, attention, residual add, norm, MLP,
    residual add), with or without the two adds. Keyword arguments go to the attention as the original
    passes them."""

    def forward(self, hidden_states, **kwargs):
        h = self.input_layernorm(hidden_states)
        h, _ = self.self_attn(hidden_states=h, **kwargs)
        if adds:
            h = hidden_states + h
        r = h
        h = self.mlp(self.post_attention_layernorm(h))
        return r + h if adds else h

    return forward


@contextlib.contextmanager
def _chunk_bytes(n):
    from tilewise.ops.rowwise import linear_cross_entropy as lce

    old = lce.chunk_rows_for
    lce.chunk_rows_for = lambda N, H, V, dtype, need=None: min(N, n // (V * dtype.itemsize))
    try:
        yield
    finally:
        lce.chunk_rows_for = old


def variant(name, config, state, batches, groups=None):
    """(ms a step, peak GiB, first loss) of one variant, built as the bench builds hf_tilewise; with
    ``groups`` (a dict), its device time a step by kernel group goes to groups[name] (two profiled steps
    after the timed ones)."""
    from transformers.models.llama import modeling_llama as ml

    from tilewise.integrations.transformers import apply_tilewise

    snap = L._snapshot()
    try:
        base = "hf_liger" if name == "liger" else "hf_sdpa"
        model, step_model, opt = L._build(base, config, state)  # a fresh config copy, weights loaded
        if name.startswith("tilewise +"):
            apply_tilewise(model, **{k: True for k in name.split("+")[1].split()})
        elif name == "tilewise, no fuse_qkv" or name.startswith("fused "):  # the research qkv patch: not twice
            apply_tilewise(model, fuse_qkv=False)
        elif name != "liger":
            apply_tilewise(model, attention=name != "tilewise, SDPA attention")
        if name.startswith("decoder"):
            ml.LlamaDecoderLayer.forward = _decoder_forward(adds=name == "decoder re-written")
        if name.startswith("fused "):
            F.apply_fusions(model, **F.VARIANTS[name[len("fused "):]])
        # CHUNK_BYTES of bf16 logits for that many rows of the vocabulary
        chunk = int(name.split()[3]) * config.vocab_size * 2 if name.startswith("lm head chunk") else None
        with _chunk_bytes(chunk) if chunk else contextlib.nullcontext():
            ms, peak, loss0 = L._time_steps(step_model, opt, batches)
            if groups is not None:
                groups[name] = L.group_times(L.profile_steps(step_model, opt, batches))
        del model, step_model, opt
        return ms, peak / 2 ** 30, loss0
    finally:
        L._restore(snap)
        torch.cuda.empty_cache()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4x4096", help="BxS (default 4x4096; the bench's other is 1x16384)")
    p.add_argument("--profile", action="store_true",
                   help="also device time by kernel group (tilewise, fused all, liger)")
    a = p.parse_args(argv)
    B, S = (int(x) for x in a.shape.lower().split("x"))
    config, state, batches = L.inputs(B, S)
    names = ["tilewise", "tilewise, no fuse_qkv", "tilewise, SDPA attention", "decoder re-written",
             "decoder without adds", "lm head chunk 3072 rows", "lm head chunk 4096 rows"]
    names += [f"fused {v}" for v in F.VARIANTS] + ["tilewise + residual_norm", "liger"]
    rows, first, groups = {}, None, {}
    for name in names:
        try:
            rows[name] = variant(name, config, state, batches,
                                 groups if a.profile and name in ("tilewise", "fused all", "liger") else None)
        except ImportError as e:  # Liger's wheel not installed
            print(f"{name}: not run ({type(e).__name__}: {e})", flush=True)
            continue
        ms, peak, loss0 = rows[name]
        first = loss0 if first is None else first
        note = "" if name == "decoder without adds" or abs(loss0 - first) <= 2e-2 * abs(first) else " LOSS DIFFERS"
        print(f"{name:<26} {ms:8.1f} ms a step  peak {peak:5.1f} GiB  first loss {loss0:.4f}{note}", flush=True)
    if "tilewise" in rows:
        t0 = rows["tilewise"][0]
        print("\nagainst tilewise (ms a step):")
        for name, (ms, _, _) in rows.items():
            print(f"  {name:<26} {ms - t0:+7.1f}")
        if "decoder re-written" in rows and "decoder without adds" in rows:
            print(f"  the residual adds cost {rows['decoder re-written'][0] - rows['decoder without adds'][0]:.1f} ms")
        if "liger" in rows:
            print(f"  1.05x liger is {rows['liger'][0] / 1.05:.1f} ms a step")
    if groups:
        print("\n" + "\n".join(L.group_table(groups)))


if __name__ == "__main__":
    main()
