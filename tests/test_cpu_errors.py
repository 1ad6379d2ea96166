"""A public op given CPU tensors outside Triton's interpreter either runs or says what to use instead;
the reference it names must exist (a module renamed in the redesign left `gemm_triton.reference`)."""

import importlib
import re

import pytest
import torch

import tilewise as tw

X, Y = torch.randn(4, 8), torch.randn(4, 8)
CALLS = {
    "vector_add": lambda: tw.vector_add(X, Y), "reduce": lambda: tw.reduce(X, 1), "sigmoid3": lambda: tw.sigmoid3(X),
    "swiglu": lambda: tw.swiglu(X, Y), "transpose": lambda: tw.transpose(X), "matmul": lambda: tw.matmul(X, Y.t()),
    "gemm": lambda: tw.gemm(X, Y.t()), "softmax": lambda: tw.softmax(X),
    "cross_entropy": lambda: tw.cross_entropy(X, torch.tensor([1, 2, 3, 4])),
    "linear_cross_entropy": lambda: tw.linear_cross_entropy(X, Y, torch.tensor([1, 2, 3, 0])),
    "flash_attention": lambda: tw.flash_attention(*(torch.randn(1, 2, 8, 16) for _ in range(3))),
    "embedding": lambda: tw.embedding(torch.tensor([1, 2]), X), "rms_norm": lambda: tw.rms_norm(X, torch.ones(8)),
    "apply_rotary": lambda: tw.apply_rotary(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 3, 4),
                                            torch.randn(1, 3, 4)),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_cpu_error_names_a_reference_that_exists(name, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    try:
        CALLS[name]()
    except ValueError as e:
        m = re.search(r"use (tilewise\.[\w.]+) for CPU", str(e))
        if m is None:  # no reference named: the message points to public functions instead
            assert "tilewise.sum" in str(e), str(e)
            return
        module, attr = m.group(1).rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), attr)), m.group(1)
