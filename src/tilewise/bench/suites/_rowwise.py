"""What the row-wise suites (softmax, cross_entropy) share: their cases, and how they treat the
experimental v4_cluster version. Not a suite: the leading underscore keeps it out of ``SUITES``.
"""

from __future__ import annotations

import torch

from ...ops.rowwise.configs import CLUSTER_SLICE
from ...ops.rowwise.softmax import cluster_unsupported_reason


def cases(r, opname: str, shapes):
    """``(dtype, rows, cols, shape label, generator)`` for each (rows, cols) of ``shapes`` in bf16,
    then fp32 beyond --quick, the runner's status naming the case. One generator for the whole run,
    so every case's inputs are the same from run to run."""
    dtypes = [torch.bfloat16] if r.quick else [torch.bfloat16, torch.float32]
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in dtypes:
        for M, N in shapes:
            shape = f"{M}x{N}"
            r.status(f"{opname} {shape} {dtype}")
            yield dtype, M, N, shape, g


def cluster_skip(name: str, N: int) -> str | None:
    """Why v4_cluster is not run at this row length (its multi-CTA kernel does not build on this
    Triton), else None. Rows of <= 16384 are one CTA: the v2 kernel, always built."""
    if name != "v4_cluster" or N <= CLUSTER_SLICE:
        return None
    return cluster_unsupported_reason()


def checked(r, what: str, name: str, shape: str, dtype, run_checks) -> bool:
    """``run_checks()`` (a version's run and check); False when v4_cluster fails, logged: it is
    experimental, so its failure drops its row and keeps the other versions'. Others' raise."""
    try:
        run_checks()
    except Exception as e:
        if name != "v4_cluster":
            raise
        r.log(f"  {what}.v4_cluster {shape} {dtype} FAILED, not timed: {e}")
        return False
    return True
