"""Host cost of one kernel launch, through each path a user could take.

Back-to-back launches of a tiny kernel with no synchronization between them: the GPU runs each in
about 2 us, so the host sets the pace and the time per call is the launch overhead.
    tilewise (public op): ops.vector_add.v1_naive: input checks, output given, launch;
    tilewise Kernel:      runtime Kernel.__call__: argument checks + launch on the current stream;
    cuda.core launch:     cuda.core.launch with arguments prepared once (the floor we build on);
    torch.add:            one PyTorch eager op into a given output;
    triton:               a one-line Triton add kernel.
"""

from __future__ import annotations

import numpy as np
import torch

from ...ops.pointwise import vector_add as op
from ...runtime import cuda as rt
from ..harness import host_us_per_call


def _triton_add():
    import triton
    import triton.language as tl

    @triton.jit
    def _add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=m) + tl.load(b_ptr + offs, mask=m), mask=m)

    return _add_kernel


def run(r) -> None:
    n = 1024
    shape = f"n={n}"
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    out = torch.empty_like(a)
    r.status("launch overhead")

    k = op._kernel("v1_naive", torch.float32, a.get_device())
    blocks = n // 256
    cc = rt._cuda_core()
    stream = rt._stream_for(torch.cuda.current_stream().cuda_stream)
    cfg = cc.LaunchConfig(grid=blocks, block=256)
    raw_args = (a.data_ptr(), b.data_ptr(), out.data_ptr(), np.int64(n))
    handle = k.handle

    results = {}
    results["cuda.core launch"] = host_us_per_call(lambda: cc.launch(stream, cfg, handle, *raw_args))
    results["tilewise Kernel"] = host_us_per_call(lambda: k(blocks, 256, a, b, out, n))
    results["tilewise vector_add.v1_naive"] = host_us_per_call(lambda: op.v1_naive(a, b, out))
    results["torch.add"] = host_us_per_call(lambda: torch.add(a, b, out=out))
    tk = _triton_add()
    results["triton"] = host_us_per_call(lambda: tk[(blocks,)](a, b, out, n, BLOCK=256))
    torch.cuda.synchronize()
    assert torch.equal(out, a + b)

    base = results["cuda.core launch"] / 1e3
    for name, us in results.items():
        ours = name.startswith("tilewise")
        r.add("launch_overhead", name, shape, torch.float32, us / 1e3,
              baseline="cuda.core launch" if ours else "", baseline_ms=base if ours else None)
