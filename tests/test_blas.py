import pytest
import torch

from tilewise.ops.gemm import blas

from conftest import poison

_OP_N, _OP_T = 0, 1


def _colmajor(t: torch.Tensor, rows: int, cols: int, ld: int) -> torch.Tensor:
    """The (rows x cols) column-major matrix cuBLAS reads at t's first element with leading dim ld."""
    return torch.as_strided(t, (rows, cols), (1, ld), t.storage_offset())


def _emulate_cublas_gemm(p: blas.GemmPlan, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """What cublas<t>gemm writes, computed from raw storage the way cuBLAS reads it; returned as
    the row-major (n x m) matrix that C's storage (ldc = m) holds."""
    A = _colmajor(first, *((p.m, p.k) if p.transa == _OP_N else (p.k, p.m)), p.lda)
    B = _colmajor(second, *((p.k, p.n) if p.transb == _OP_N else (p.n, p.k)), p.ldb)
    A = A if p.transa == _OP_N else A.t()
    B = B if p.transb == _OP_N else B.t()
    Cc = A.double() @ B.double()  # (m x n) column-major result
    store = torch.empty(p.ldc * p.n, dtype=torch.float64)
    _colmajor(store, p.m, p.n, p.ldc).copy_(Cc)
    return store[: p.n * p.m].view(p.n, p.m)


def _layouts(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, cols, generator=g)
    yield "rowmajor", base
    yield "transposed-view", torch.randn(cols, rows, generator=g).t()
    yield "padded-rows", torch.randn(rows, cols + 3, generator=g)[:, 1:cols + 1]
    yield "padded-cols", torch.randn(cols, rows + 5, generator=g)[:, 2:rows + 2].t()


@pytest.mark.parametrize("M,K,N", [(3, 5, 7), (7, 2, 4), (1, 6, 3), (5, 1, 1), (4, 3, 1)])
def test_operand_swap_plan_computes_row_major_product(M, K, N):
    # Non-square, non-symmetric operands in every layout: a swap of A and B, a wrong op or a wrong
    # leading dimension gives a different product or reads outside the operand.
    for la, a in _layouts(M, K, 1):
        for lb, b in _layouts(K, N, 2):
            p = blas.gemm_plan(tuple(a.shape), tuple(a.stride()), tuple(b.shape), tuple(b.stride()))
            assert (p.m, p.n, p.k, p.ldc) == (N, M, K, N)
            got = _emulate_cublas_gemm(p, b, a)
            torch.testing.assert_close(got, a.double() @ b.double(), msg=f"{la} @ {lb}")


def test_swapping_the_operands_back_would_fail():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    p = blas.gemm_plan(tuple(a.shape), tuple(a.stride()), tuple(b.shape), tuple(b.stride()))
    with pytest.raises(RuntimeError):  # passing A first: shapes no longer chain (or wrong values)
        _emulate_cublas_gemm(p, a, b)


@pytest.mark.parametrize("layout", ["rowmajor", "transposed-view", "padded-rows", "padded-cols"])
def test_gemv_plan(layout):
    A = dict(_layouts(6, 4, 3))[layout]
    x = torch.randn(4, dtype=torch.float64)
    p = blas.gemv_plan(tuple(A.shape), tuple(A.stride()))
    S = _colmajor(A, p.m, p.n, p.lda).double()
    y = (S.t() if p.trans == _OP_T else S) @ x
    torch.testing.assert_close(y, A.double() @ x)


def test_stored_rejects_no_unit_stride_and_handles_size_one():
    assert blas.stored((3, 4), (8, 2)) is None
    assert blas.stored((1, 4), (0, 1)) == blas.Stored(True, 4)  # an expanded row
    assert blas.stored((4, 1), (1, 1)).ld >= 1


def test_reference_cost_and_cpu_errors():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(blas.reference("gemm", a, b), a @ b)
    assert blas.cost("gemm", 2, 3, 4).flops == 48
    assert blas.cost("dot", 10, dtype=torch.float64).bytes == 8 * 21
    with pytest.raises(ValueError, match="'A' is on cpu"):
        blas.gemm(a, b)
    with pytest.raises(ValueError, match="dtype torch.int64"):
        blas.dot(torch.arange(3), torch.arange(3))


def test_import_does_not_load_nvmath():
    import subprocess
    import sys

    code = "import sys, tilewise.ops.gemm.blas; print('nvmath.bindings.cublas' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stdout.strip() == "False", p.stderr


# --------------------------------------------------------------------------- GPU


@pytest.fixture
def nvmath():
    return pytest.importorskip("nvmath.bindings.cublas")


def _gpu_layouts(rows, cols, dtype, seed):
    for name, t in _layouts(rows, cols, seed):
        yield name, t.to("cuda", dtype) if name == "rowmajor" else _regpu(t, dtype)


def _regpu(t, dtype):
    # Keep the view's layout on the GPU: copy its base, then take the same view.
    base = t._base if t._base is not None else t
    gb = base.to("cuda", dtype)
    return torch.as_strided(gb, t.shape, t.stride(), t.storage_offset())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (31, 17, 33), (1000, 33, 257), (4097, 64, 31)])
def test_gpu_gemm_every_layout(nvmath, dtype, M, K, N):
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    for la, a in _gpu_layouts(M, K, dtype, 1):
        for lb, b in _gpu_layouts(K, N, dtype, 2):
            out = poison(torch.empty(M, N, device="cuda", dtype=dtype))
            blas.gemm(a, b, out=out)
            ref = a.double() @ b.double()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < tol, (la, lb, err)


@pytest.mark.gpu
def test_gpu_gemm_alpha_beta_and_fp32_is_not_tf32(nvmath):
    a = torch.randn(512, 2048, device="cuda")
    b = torch.randn(2048, 384, device="cuda")
    c = torch.randn(512, 384, device="cuda")
    got = blas.gemm(a, b, out=c.clone(), alpha=2.0, beta=-1.0)
    ref = 2 * (a.double() @ b.double()) - c.double()
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-6  # TF32 would be ~1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_gpu_gemv(nvmath, dtype):
    for _, A in _gpu_layouts(1000, 257, dtype, 4):
        x = torch.randn(257, device="cuda", dtype=dtype)
        out = poison(torch.empty(1000, device="cuda", dtype=dtype))
        blas.gemv(A, x, out=out)
        torch.testing.assert_close(out.double(), A.double() @ x.double(), rtol=1e-5, atol=1e-4)
    xs = torch.randn(514, device="cuda", dtype=dtype)[::2]  # a strided x
    A = torch.randn(7, 257, device="cuda", dtype=dtype)
    torch.testing.assert_close(blas.gemv(A, xs).double(), A.double() @ xs.double(), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_gpu_dot(nvmath, dtype):
    x = torch.randn(4097, device="cuda", dtype=dtype)
    y = torch.randn(8194, device="cuda", dtype=dtype)[::2]
    got = blas.dot(x, y)
    assert got.shape == () and got.dtype == dtype and got.is_cuda
    ref = torch.dot(x.double(), y.double())
    tol = {torch.float32: 1e-4, torch.float64: 1e-10, torch.float16: 5e-2, torch.bfloat16: 5e-1}[dtype]
    assert abs(got.double().item() - ref.item()) <= tol * max(1.0, abs(ref.item()))


@pytest.mark.gpu
def test_gpu_errors_and_stream(nvmath):
    a = torch.randn(4, 5, device="cuda")
    with pytest.raises(ValueError, match="inner dimensions differ"):
        blas.gemm(a, a)
    with pytest.raises(ValueError, match="'B' is torch.float64"):
        blas.gemm(a, a.t().double())
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = blas.gemm(a, a.t())
    s.synchronize()
    torch.testing.assert_close(out, a @ a.t(), rtol=1e-5, atol=1e-5)


def test_lt_matmul_input_errors_on_cpu():
    a = torch.randn(4, 5)
    with pytest.raises(ValueError, match="'A' is on cpu"):
        blas.lt_matmul(a, a.t())


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", [None, "bias", "relu_bias", "gelu_bias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_gpu_lt_matmul_epilogues(nvmath, epilogue, dtype):
    M, K, N = 1000, 257, 333
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    bias = torch.randn(M, device="cuda", dtype=dtype) if epilogue else None
    for _ in range(2):  # the second call reuses the cached plan with fresh operands
        a.normal_()
        got = blas.lt_matmul(a, b, bias=bias, epilogue=epilogue)
        ref = a.double() @ b.double()
        if bias is not None:
            ref = ref + bias.double()[:, None]  # one value per row of the result
        if epilogue == "relu_bias":
            ref = torch.relu(ref)
        elif epilogue == "gelu_bias":
            ref = torch.nn.functional.gelu(ref, approximate="tanh")
        tol = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 2e-3}[dtype]  # fp32 may run as TF32
        assert got.shape == (M, N)
        assert ((got.double() - ref).norm() / ref.norm()).item() < tol


@pytest.mark.gpu
def test_gpu_lt_matmul_autotune_and_errors(nvmath):
    a = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
    got = blas.lt_matmul(a, b, autotune=True)
    assert ((got.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm()).item() < 2e-2
    with pytest.raises(ValueError, match="needs bias"):
        blas.lt_matmul(a, b, epilogue="relu_bias")
    with pytest.raises(ValueError, match=r"bias must be \(512,\)"):
        blas.lt_matmul(a, b, bias=torch.randn(384, device="cuda", dtype=torch.bfloat16), epilogue="bias")
