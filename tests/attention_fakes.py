"""Attention's eager launch path on the CPU, without a GPU: every kernel's launch recorded, none run.

``fake_launches()`` makes CPU bf16 / fp16 tensors take the H200's routes (v5 forward; v6 or v3's two
kernels backward, as the policy says) through the real launch path: ``runtime.triton_launch``'s
cache and ``Bound`` objects (with Triton's per-call dispatch on a signature's first call), down to
the compiled kernel's ``run``, which here records the call's values in place of launching. For host
time (``research/attention_call_plan.py``) and for checking that a replayed call launches what the
ordinary path launches (``tests/test_attention_plans.py``).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch


class _Kernel:
    """A compiled kernel's stand-in: ``run`` records (kernel name, the kernel's argument values)."""

    def __init__(self, name, log):
        self.name, self.log = name, log
        self.function = self.packed_metadata = None

    def run(self, *a):
        self.log.append((self.name, a[9:]))  # (grid x 3, stream, function, metadata, 3 hooks, values)


def _kernels():
    from tilewise.ops.attention import gluon_bwd, gluon_fwd, gluon_overlap, triton_kernels as K

    return (gluon_fwd.attn_fwd_ws_kernel, gluon_fwd.attn_fwd_ws_persistent_kernel,
            gluon_overlap.attn_fwd_overlap_persistent_kernel, gluon_bwd.attn_bwd_dkdv_ws_kernel,
            gluon_bwd.attn_bwd_dq_ws_kernel, K._attn_fwd_kernel, K._attn_fwd_tma_kernel, K._attn_bwd_preprocess_kernel,
            K._attn_bwd_dkdv_kernel, K._attn_bwd_dq_kernel, K._attn_bwd_atomic_kernel)


class _Param:
    def __init__(self, p):
        self.name, self.is_constexpr = p.name, "constexpr" in str(p.annotation)
        self.has_default, self.default = p.default is not p.empty, p.default


def _params(fn):
    import inspect

    return [_Param(p) for p in inspect.signature(fn).parameters.values()]


@contextlib.contextmanager
def fake_launches(sm_count: int = 132):
    """Yields the launch log: (kernel name, values) per launch, the first launch of a signature with
    its positional arguments only (Triton's dispatch), later ones with every parameter's value."""
    from tilewise import settings
    from tilewise.ops.attention import api, gluon_bwd, gluon_fwd, gluon_overlap, plans, routes, varlen
    from tilewise.runtime import triton_launch as TL

    log: list = []
    with contextlib.ExitStack() as st:
        patch = st.enter_context
        patch(mock.patch.object(torch.cuda, "current_device", lambda: 0))
        patch(mock.patch.object(TL, "_INTERPRET", False))
        patch(mock.patch.object(TL, "_ENABLED", True))
        patch(mock.patch.object(TL, "_raw_stream", lambda device: 0))
        patch(mock.patch.object(TL, "_CACHES", {}))
        patch(mock.patch.object(settings, "triton_interpret", lambda: True))  # CPU tensors pass the checks
        for mod in (api, routes, varlen):  # varlen imports the route checks by name
            for name in ("_ws_applies", "ws_applies", "_ws_bwd_applies", "ws_bwd_applies"):
                if hasattr(mod, name):
                    patch(mock.patch.object(mod, name, lambda *a, **k: True))
        fake_rt = type("rt", (), {"sm_count": staticmethod(lambda *a: sm_count)})
        patch(mock.patch.object(gluon_fwd, "rt", fake_rt))
        patch(mock.patch.object(gluon_overlap, "rt", fake_rt))
        patch(mock.patch.object(gluon_bwd, "sm_count", lambda *a: sm_count))
        patch(mock.patch.object(plans, "PLANS", {}))
        for fn in _kernels():
            kernel = _Kernel(fn.__name__, log)
            if not hasattr(fn, "device_caches"):  # Triton's interpreter (CPU tests): what the cache reads
                patch(mock.patch.object(fn, "device_caches", {}, create=True))
                patch(mock.patch.object(fn, "params", _params(fn.fn), create=True))

            def first(*args, grid=None, warmup=False, kernel=kernel, **kwargs):
                kernel.log.append((kernel.name, args))
                return kernel

            patch(mock.patch.object(fn, "run", first, create=True))
        yield log
