"""tilewise: GPU kernels for LLM workloads, from naive to the roofline.

The public functional API. Each function lives in ``tilewise.ops.<family>.<module>`` (with its versions in
``VARIANTS``, its ``reference`` and its ``cost``); names are imported on first use, so
``import tilewise`` stays light and one op's dependencies never break another's import.
"""

from __future__ import annotations

import importlib

from .cost import Cost

from importlib.metadata import PackageNotFoundError, version as _version

try:  # the installed distribution's version (setuptools-scm: from git tags)
    __version__ = _version("tilewise")
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"

_PUBLIC = {
    # module under tilewise (a family package's module): the public names it holds
    "ops.pointwise.vector_add": ["vector_add"],
    "ops.pointwise.fusion": ["fuse"],
    "ops.pointwise.reduce": ["reduce", "masked_mean", "sum", "amax", "mean"],
    "ops.pointwise.elementwise": ["relu", "gelu", "sigmoid", "tanh", "exp", "log", "sin", "cos", "neg",
                                  "add", "sub", "mul", "div", "maximum", "pow"],
    "ops.pointwise.recompute": ["sigmoid3"],
    "ops.pointwise.swiglu": ["swiglu", "swiglu_packed"],
    "ops.transpose.api": ["transpose"],
    "ops.spmv.api": ["spmv", "CSR", "ELL", "JDS", "Panels"],
    "ops.gemm.sgemm": ["matmul"],
    "ops.gemm.api": ["gemm", "linear"],
    "ops.rowwise.softmax": ["softmax", "log_softmax", "softmax_backward"],
    "ops.rowwise.cross_entropy": ["cross_entropy"],
    "ops.rowwise.linear_cross_entropy": ["linear_cross_entropy"],
    "ops.attention.api": ["flash_attention", "AttentionPolicy"],
    "ops.attention.varlen": ["flash_attention_varlen"],
    "ops.embedding.api": ["embedding"],
    "ops.norm.api": ["rms_norm", "add_rms_norm"],
    "ops.rope.api": ["apply_rotary", "apply_rotary_qkv"],
    "ops.optim.api": ["AdamW"],
    "nn.classifier": ["SentimentClassifier"],
}
_LAZY = {name: mod for mod, names in _PUBLIC.items() for name in names}

__all__ = ["Cost", "__version__", *_LAZY]


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'tilewise' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
