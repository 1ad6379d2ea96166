"""mkdocs hooks (mkdocs.yml): one page per op family, generated at build time from the family modules'
docstrings (what each version is, its bound) and the newest rows of bench/results/<device>.csv, so the
site never disagrees with the code or the measurements."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# family page -> (title, modules whose docstrings describe the versions, bench ops (CSV "op") of its rows)
FAMILIES = {
    "pointwise": ("Pointwise: vector add, elementwise, reductions, fusion, recomputation, SwiGLU",
                  ["ops.pointwise.vector_add", "ops.pointwise.elementwise", "ops.pointwise.reduce",
                   "ops.pointwise.fusion", "ops.pointwise.recompute", "ops.pointwise.swiglu"],
                  ["vector_add", "copy", "map_relu", "map_gelu", "zip_add", "reduce_sum", "reduce_max",
                   "masked_mean", "fused_bias_relu", "fused_sin2_cos2", "sigmoid3", "sigmoid3_fwd", "sigmoid3_bwd",
                   "swiglu_fwd", "swiglu_fwd_bwd", "launch_overhead", "divergence"]),
    "transpose": ("Transpose", ["ops.transpose.api"], ["transpose", "transpose_bank_conflict"]),
    "spmv": ("Sparse matrix-vector product", ["ops.spmv.api", "ops.spmv.formats"], ["spmv", "spmv_convert"]),
    "gemm": ("Matrix multiplication: SGEMM levels, Triton and Hopper GEMM, cuBLAS",
             ["ops.gemm.sgemm", "ops.gemm.api", "ops.gemm.sm90", "ops.gemm.blas"],
             ["matmul", "gemm", "gemm_sweep", "gemm_long_k", "linear_relu", "wave", "blas_gemm", "blas_gemv",
              "blas_dot", "blas_lt", "blas_lt_relu_bias"]),
    "rowwise": ("Row-wise: softmax, cross-entropy and the fused LM-head loss",
                ["ops.rowwise.softmax", "ops.rowwise.cross_entropy", "ops.rowwise.linear_cross_entropy"],
                ["softmax", "softmax_bwd", "log_softmax", "cross_entropy", "cross_entropy_fwd",
                 "cross_entropy_kernel", "linear_cross_entropy_fwd_bwd"]),
    "attention": ("Attention: FlashAttention-2 on Hopper", ["ops.attention.api", "ops.attention.varlen",
                                                           "ops.attention.gluon_fwd", "ops.attention.plans"],
                  ["attention_fwd", "attention_fwd_bwd", "attention_bias_fwd", "attention_bias_fwd_bwd",
                   "attention_window_fwd", "attention_window_fwd_bwd", "attention_varlen_fwd",
                   "attention_varlen_fwd_bwd", "attention_host_fwd_bwd"]),
    "embedding": ("Embedding", ["ops.embedding.api"], ["embedding_fwd", "embedding_fwd_bwd"]),
    "norm": ("RMSNorm", ["ops.norm.api"], ["rmsnorm_fwd", "rmsnorm_fwd_bwd", "add_rmsnorm_fwd", "add_rmsnorm_fwd_bwd"]),
    "rope": ("Rotary embeddings", ["ops.rope.api"], ["rope_fwd", "rope_fwd_bwd", "rope_qkv_fwd", "rope_qkv_fwd_bwd"]),
    "optim": ("Optimizers: AdamW", ["ops.optim.api"], ["adamw"]),
}


def _module_doc(name: str) -> str:
    mod = importlib.import_module(f"tilewise.{name}")
    doc = inspect.getdoc(mod) or ""
    return f"### `tilewise.{name}`\n\n```text\n{doc}\n```\n" if doc else ""


def _rows(ops: list[str]) -> str:
    from tilewise.bench import harness, report

    csvs = sorted(p for p in (ROOT / "bench" / "results").glob("*.csv") if "-" not in p.stem)
    if not csvs:
        return "No measurements in bench/results yet.\n"
    every = harness.read_csv(csvs[-1])
    rows = [r for r in report.with_readme_baselines(report.best_of_ours(report.latest_run(every)), every)
            if r["op"] in ops]
    if not rows:
        return "No rows of these ops in the newest results yet.\n"
    return report.markdown_table(sorted(rows, key=lambda r: (r["op"], r["shape"], r["dtype"]))) + "\n"


def family_page(family: str) -> str:
    title, modules, ops = FAMILIES[family]
    tuning = ROOT / "docs" / "tuning" / f"{family}.md"
    parts = [f"# {title}\n",
             "What each version is and what bounds it, from the modules' own documentation, then the newest "
             "measurements (the fastest of our versions per case, against its baseline in the same run; "
             f"`bench/results/`).{' Tuning decisions: [tuning/' + family + '](../tuning/' + family + '.md).' if tuning.is_file() else ''}\n",
             "## Versions\n", *(_module_doc(m) for m in modules), "## Measured\n", _rows(ops)]
    return "\n".join(parts)


def _readme_sections(*titles: str) -> str:
    """The README's ``## <title>`` sections, as they are (the README stays the one place they are written)."""
    text = (ROOT / "README.md").read_text()
    out = []
    for title in titles:
        start = text.index(f"\n## {title}\n")
        end = text.find("\n## ", start + 1)
        out.append(text[start + 1:end if end != -1 else None].rstrip() + "\n")
    return "\n".join(out)


def index_page() -> str:
    head = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    return head + "\n" + _readme_sections("Two commands", "Use")


def api_page() -> str:
    """Every public name of ``tilewise`` (its ``_PUBLIC`` table), grouped by the module that holds it."""
    from tilewise import _PUBLIC

    parts = ["# API reference\n", "Every name `import tilewise` exports, by the module that defines it. "
             "Shapes, dtypes and what each argument means are in each docstring.\n"]
    for module, names in _PUBLIC.items():
        parts.append(f"## `tilewise.{module}`\n")
        parts += [f"::: tilewise.{module}.{name}\n" for name in names]
    return "\n".join(parts)


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "index.md", content=index_page()))
    files.append(File.generated(config, "api.md", content=api_page()))
    for family in FAMILIES:
        files.append(File.generated(config, f"ops/{family}.md", content=family_page(family)))
    return files
