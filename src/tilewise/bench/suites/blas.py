"""blas (cuBLAS through nvmath-python) beside the PyTorch call that reaches the same library.

The two should match: the rows show what the binding costs (argument checks, handle and stream
set-up per call) on top of cuBLAS itself. Skipped, with a message, when nvmath-python is missing.
"""

from __future__ import annotations

import torch

from ...ops.gemm import blas as op
from ..harness import check, time_ms


def run(r) -> None:
    try:
        import nvmath.bindings.cublas  # noqa: F401
    except ImportError:
        r.log("blas: nvmath-python is not installed; suite skipped")
        return
    g = torch.Generator(device="cuda").manual_seed(0)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        dtypes = [torch.float32, torch.bfloat16] if r.quick else [torch.float32, torch.float64, torch.float16,
                                                                  torch.bfloat16]
        n = 4096
        for dtype in dtypes:
            a = torch.randn(n, n, device="cuda", generator=g).to(dtype)
            b = torch.randn(n, n, device="cuda", generator=g).to(dtype)
            out = torch.empty(n, n, device="cuda", dtype=dtype)
            shape, cost = f"{n}x{n}x{n}", op.cost("gemm", n, n, n, dtype=dtype)
            base_ms = time_ms(lambda: torch.matmul(a, b, out=out))
            r.add("blas_gemm", "torch.matmul", shape, dtype, base_ms, cost)
            out.fill_(float("nan"))
            op.gemm(a, b, out=out)
            check("blas.gemm", out, torch.matmul(a.double(), b.double()), dtype=dtype)
            ms = time_ms(lambda: op.gemm(a, b, out=out))
            r.add("blas_gemm", "cublas(nvmath)", shape, dtype, ms, cost, baseline="torch.matmul", baseline_ms=base_ms)
            del a, b, out

        # cuBLASLt (planned once, cached) with and without a fused ReLU + bias epilogue: an MLP
        # up-projection w (4096 x 1024) @ x^T (1024 x 8192), bias per row of the result.
        w = torch.randn(4096, 1024, device="cuda", generator=g).to(torch.bfloat16)
        xt = torch.randn(8192, 1024, device="cuda", generator=g).to(torch.bfloat16).t()
        bias = torch.randn(4096, device="cuda", generator=g).to(torch.bfloat16)
        shape, cost = "4096x8192x1024", op.cost("gemm", 4096, 8192, 1024, dtype=torch.bfloat16)
        base_ms = time_ms(lambda: torch.matmul(w, xt))
        r.add("blas_lt", "torch.matmul", shape, torch.bfloat16, base_ms, cost)
        check("blas.lt_matmul", op.lt_matmul(w, xt), torch.matmul(w.float(), xt.float()), dtype=torch.bfloat16)
        ms = time_ms(lambda: op.lt_matmul(w, xt))
        r.add("blas_lt", "cublasLt(nvmath)", shape, torch.bfloat16, ms, cost, baseline="torch.matmul",
              baseline_ms=base_ms)
        unfused_ms = time_ms(lambda: torch.relu(torch.matmul(w, xt) + bias[:, None]))
        r.add("blas_lt_relu_bias", "torch_unfused", shape, torch.bfloat16, unfused_ms, cost)
        ref = torch.relu(torch.matmul(w.float(), xt.float()) + bias.float()[:, None])
        check("blas.lt_matmul relu_bias", op.lt_matmul(w, xt, bias=bias, epilogue="relu_bias"), ref,
              dtype=torch.bfloat16)
        ms = time_ms(lambda: op.lt_matmul(w, xt, bias=bias, epilogue="relu_bias"))
        r.add("blas_lt_relu_bias", "cublasLt(nvmath)", shape, torch.bfloat16, ms, cost, baseline="torch_unfused",
              baseline_ms=unfused_ms)
        del w, xt, bias, ref

        M = N = 16384  # 1 GiB of fp32: far past L2
        A = torch.randn(M, N, device="cuda", generator=g)
        x = torch.randn(N, device="cuda", generator=g)
        y = torch.empty(M, device="cuda")
        shape, cost = f"{M}x{N}", op.cost("gemv", M, N)
        base_ms = time_ms(lambda: torch.mv(A, x, out=y))
        r.add("blas_gemv", "torch.mv", shape, torch.float32, base_ms, cost)
        y.fill_(float("nan"))
        op.gemv(A, x, out=y)
        check("blas.gemv", y, A.double() @ x.double(), dtype=torch.float32)
        ms = time_ms(lambda: op.gemv(A, x, out=y))
        r.add("blas_gemv", "cublas(nvmath)", shape, torch.float32, ms, cost, baseline="torch.mv", baseline_ms=base_ms)
        del A

        n = 1 << 27
        u = torch.randn(n, device="cuda", generator=g)
        v = torch.randn(n, device="cuda", generator=g)
        shape, cost = f"n={n}", op.cost("dot", n)
        base_ms = time_ms(lambda: torch.dot(u, v))
        r.add("blas_dot", "torch.dot", shape, torch.float32, base_ms, cost)
        check("blas.dot", op.dot(u, v), torch.dot(u.double(), v.double()), dtype=torch.float32, tol=1e-4)
        ms = time_ms(lambda: op.dot(u, v))
        r.add("blas_dot", "cublas(nvmath)", shape, torch.float32, ms, cost, baseline="torch.dot", baseline_ms=base_ms)
        del u, v
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
        torch.cuda.empty_cache()
