"""tilewise: GPU kernels for LLM workloads, from naive to the roofline.

The public functional API. Each function lives in ``tilewise.ops.<op>`` (with its versions in
``VARIANTS``, its ``reference`` and its ``cost``); names are imported on first use, so
``import tilewise`` stays light and one op's dependencies never break another's import.
"""

from __future__ import annotations

import importlib

from .cost import Cost

__version__ = "0.1.0"

_LAZY = {
    # name: module under tilewise.ops (or tilewise.<x> when it has a dot)
    "vector_add": "ops.vector_add",
    "fuse": "ops.fusion",
    "reduce": "ops.reduce",
    "masked_mean": "ops.reduce",
    "relu": "ops.elementwise", "gelu": "ops.elementwise", "sigmoid": "ops.elementwise",
    "tanh": "ops.elementwise", "exp": "ops.elementwise", "log": "ops.elementwise",
    "sin": "ops.elementwise", "cos": "ops.elementwise", "neg": "ops.elementwise",
    "add": "ops.elementwise", "sub": "ops.elementwise", "mul": "ops.elementwise",
    "div": "ops.elementwise", "maximum": "ops.elementwise", "pow": "ops.elementwise",
    "transpose": "ops.transpose",
    "spmv": "ops.spmv", "CSR": "ops.spmv", "ELL": "ops.spmv", "JDS": "ops.spmv", "Panels": "ops.spmv",
    "matmul": "ops.matmul",
    "gemm": "ops.gemm_triton", "linear": "ops.gemm_triton",
    "softmax": "ops.softmax", "log_softmax": "ops.softmax", "softmax_backward": "ops.softmax",
    "cross_entropy": "ops.cross_entropy",
    "sigmoid3": "ops.recompute",
    "flash_attention": "ops.attention",
    "embedding": "ops.embedding",
    "SentimentClassifier": "nn.classifier",
}

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
