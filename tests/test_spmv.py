import math

import pytest
import torch

from tilewise.bench.suites import spmv as suite
from tilewise.ops import spmv as sp

from conftest import poison


def _random_dense(M, N, density, seed, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(M, N, generator=g) * (torch.rand(M, N, generator=g) < density)
    for r in empty_rows:
        D[r] = 0
    return D


def _ell_model(E: sp.ELL, x):
    """y from the ELL arrays as the kernel reads them (column-major, -1 padding ends a row)."""
    valid = E.col >= 0
    prod = torch.where(valid, E.val.double() * x.double()[E.col.clamp_min(0).long()], torch.zeros((), dtype=torch.float64))
    return prod.sum(0)


def _jds_model(J: sp.JDS, x):
    M = J.shape[0]
    y = torch.zeros(M, dtype=torch.float64)
    for s in range(M):
        for k in range(int(J.len_sorted[s])):
            i = int(J.jd_ptr[k]) + s
            y[int(J.perm[s])] += float(J.val[i]) * float(x[int(J.col[i])])
    return y


# --------------------------------------------------------------------------- CPU


def test_reference_matches_dense_and_beta():
    D = _random_dense(37, 23, 0.2, 0, empty_rows=(0, 5, 36))
    A = sp.CSR.from_dense(D)
    x, y = torch.randn(23), torch.randn(37)
    ref = sp.reference(A.row_ptr, A.col, A.val, x, y, alpha=2.0, beta=-0.5)
    torch.testing.assert_close(ref, 2.0 * (D.double() @ x.double()) - 0.5 * y.double())
    assert A.stats.empty_rows >= 3 and A.nnz == int((D != 0).sum())


def test_cost():
    c = sp.cost(10, 20, 100)
    assert c.flops == 200 and c.bytes == 8 * 100 + 4 * 11 + 4 * 20 + 4 * 10
    assert sp.cost(10, 20, 100, beta=1.0).bytes == c.bytes + 40


def test_csr_from_torch_and_dense_agree():
    D = _random_dense(50, 40, 0.1, 1)
    a, b = sp.CSR.from_dense(D), sp.CSR.from_torch(D.to_sparse_csr())
    assert torch.equal(a.row_ptr, b.row_ptr) and torch.equal(a.col, b.col) and torch.equal(a.val, b.val)
    assert a.row_ptr.dtype == torch.int32 and a.col.dtype == torch.int32 and a.val.dtype == torch.float32
    assert a.build_ms >= 0 and b.build_ms >= 0
    torch.testing.assert_close(b.to_dense(), D)


def test_csr_from_scipy_if_available():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    D = _random_dense(30, 20, 0.2, 2)
    S = scipy_sparse.csr_matrix(D.numpy())
    A = sp.CSR.from_scipy(S, device="cpu")
    torch.testing.assert_close(A.to_dense(), D)


def test_from_scipy_without_scipy_says_so(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name.startswith("scipy"):
            raise ImportError("no scipy")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match="needs SciPy"):
        sp.CSR.from_scipy(object(), device="cpu")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ell_and_jds_layouts(seed):
    D = _random_dense(33, 31, 0.15, seed, empty_rows=(3, 32))
    A = sp.CSR.from_dense(D)
    x = torch.randn(31)
    want = D.double() @ x.double()
    E = sp.ELL.from_csr(A, max_fill=100)
    assert E.col.shape == (A.stats.max, 33) and E.nnz == A.nnz
    assert int((E.col >= 0).sum()) == A.nnz
    torch.testing.assert_close(_ell_model(E, x), want)
    J = sp.JDS.from_csr(A)
    assert J.jd_ptr.numel() == A.stats.max + 1 and int(J.jd_ptr[-1]) == A.nnz
    assert bool((J.len_sorted[:-1] >= J.len_sorted[1:]).all())
    torch.testing.assert_close(_jds_model(J, x), want)


def test_ell_refuses_heavy_padding():
    D = torch.zeros(2000, 100)
    D[0] = 1.0
    D[1:, 0] = 1.0
    with pytest.raises(ValueError, match="max_fill"):
        sp.ELL.from_csr(sp.CSR.from_dense(D))


def test_split_plan_covers_long_rows():
    lengths = torch.tensor([3, 5000, 0, 4097, 1])
    rp = torch.zeros(6, dtype=torch.long)
    rp[1:] = torch.cumsum(lengths, 0)
    n = int(rp[-1])
    col = torch.cat([torch.arange(int(k)) for k in lengths])
    A = sp.CSR.from_arrays(rp, col, torch.ones(n), (5, 5000))
    rows, starts = A.split_plan(4096)
    assert rows.tolist() == [1] * math.ceil(5000 / sp.CHUNK) + [3] * math.ceil(4097 / sp.CHUNK)
    cover = torch.zeros(n, dtype=torch.long)
    for r, s in zip(rows.tolist(), starts.tolist()):
        e = min(s + sp.CHUNK, int(rp[r + 1]))
        cover[s:e] += 1
    long_mask = torch.zeros(n, dtype=torch.bool)
    long_mask[int(rp[1]):int(rp[2])] = True
    long_mask[int(rp[3]):int(rp[4])] = True
    assert torch.equal(cover, long_mask.long())  # every nonzero of a long row once, nothing else


@pytest.mark.parametrize("kind", ["banded5", "short", "uniform", "powerlaw"])
def test_stream_plan_partitions_rows(kind):
    A = suite.make_matrix(kind, small=True, device="cpu")
    plan = sp.stream_plan(A).long()
    M = A.shape[0]
    assert int(plan[0]) == 0 and int(plan[-1]) == M and bool((plan[1:] > plan[:-1]).all())
    rp = A.row_ptr.long()
    nnz = rp[plan[1:]] - rp[plan[:-1]]
    rows = plan[1:] - plan[:-1]
    if kind != "powerlaw":  # short rows: every block fits the shared buffer (2048) and 256 threads
        assert int(nnz.max()) <= 2048 and int(rows.max()) <= sp.STREAM_ROWS
    else:  # the long rows' blocks overflow and take the kernel's global-memory path
        assert int(nnz.max()) > 2048
    assert sp.stream_plan(A) is sp.stream_plan(A)  # cached


@pytest.mark.parametrize("rp,col,N,match", [
    ([0, 3, 2, 3], [0, 1, 2], 3, "row_ptr decreases at row 1"),
    ([1, 2, 3], [0, 1], 3, "must start at 0"),
    ([0, 1, 3], [0, 1], 3, "end at nnz = 2"),
    ([0, 2, 3], [0, 5, 1], 3, r"column index 5 at position 1 is outside \[0, 3\)"),
    ([0, 2, 3], [0, -1, 1], 3, "is outside"),
    ([0, 2, 3], [2, 1, 0], 3, "not sorted within a row"),
    ([0, 2, 2, 4], [0, 2, 2, 1], 3, "not sorted within a row"),
    ([0, 2], [0, 1], 3, "M \\+ 1"),
])
def test_csr_validation_errors(rp, col, N, match):
    n = len(col)
    shape = (len(rp) - 1, N) if match != "M \\+ 1" else (3, N)
    with pytest.raises(ValueError, match=match):
        sp.CSR.from_arrays(torch.tensor(rp), torch.tensor(col), torch.ones(n), shape)


def test_csr_accepts_row_starting_below_previous_row_and_trailing_empty_rows():
    A = sp.CSR.from_arrays(torch.tensor([0, 2, 3, 3, 3]), torch.tensor([1, 2, 0]), torch.ones(3), (4, 3))
    assert A.stats.empty_rows == 2
    with pytest.raises(ValueError, match="not sorted"):  # unsorted last entry before empty rows
        sp.CSR.from_arrays(torch.tensor([0, 3, 3, 3]), torch.tensor([1, 2, 0]), torch.ones(3), (3, 3))


def test_choose_and_sub_width():
    """The suite's six matrices (stats as measured on the H200) get the kernel that was fastest for
    them in the table of docs/notes-spmv.md; the thresholds between them hold."""
    S = sp.RowStats
    suite_stats = {  # rows, nnz, mean, max, std, empty rows
        "uniform": (S(2_000_000, 64_000_000, 32.0, 32, 0.0, 0), "jds"),
        "powerlaw": (S(2_000_000, 10_599_269, 5.3, 100_000, 203.3, 0), "csr_split"),
        "banded5": (S(4_194_304, 20_963_328, 5.0, 5, 0.0, 0), "jds"),
        "banded27": (S(2_097_152, 55_742_968, 26.6, 27, 1.9, 0), "jds"),
        "short": (S(8_000_000, 15_998_964, 2.0, 3, 0.8, 0), "ell"),
        "wide": (S(256, 16_293_276, 63645.6, 95807, 20202.7, 0), "csr_split"),
    }
    for kind, (st, want) in suite_stats.items():
        assert sp.choose(st) == want, kind
    no_convert = {k: sp.choose(st, convert=False) for k, (st, _) in suite_stats.items()}
    assert no_convert == {"uniform": "csr_vector", "powerlaw": "csr_split", "banded5": "csr_stream",
                          "banded27": "csr_vector", "short": "csr_stream", "wide": "csr_split"}
    # thresholds: split past 128 x SUB; jds from mean >= 0.9 max; ell up to 16 and 2x padding
    assert sp.split_len(5.0) == 256 and sp.split_len(32.0) == 1024 and sp.split_len(1e5) == sp.LONG_LEN
    assert sp.choose(S(10, 50, 5.0, 257, 80.0, 0)) == "csr_split"
    assert sp.choose(S(10, 50, 5.0, 256, 80.0, 0)) == "csr_stream"
    assert sp.choose(S(10, 95, 9.5, 10, 0.5, 0)) == "jds"
    assert sp.choose(S(10, 85, 8.5, 10, 1.0, 0)) == "ell"
    assert sp.choose(S(10, 85, 8.5, 18, 3.0, 0)) == "csr_stream"
    assert sp.choose(S(10, 120, 12.0, 25, 3.0, 0)) == "csr_stream"
    assert sp.choose(S(10, 200, 20.0, 40, 5.0, 0)) == "csr_vector"
    assert sp.choose(S(0, 0, 0.0, 0, 0.0, 0)) == "csr_vector"
    assert [sp.sub_width(m) for m in (1, 2, 3, 5, 7, 12, 27, 32, 500)] == [2, 2, 2, 2, 2, 4, 8, 8, 32]


def test_spmv_input_errors_on_cpu():
    A = sp.CSR.from_dense(torch.eye(4))
    with pytest.raises(ValueError, match="tilewise kernels need it on CUDA"):
        sp.spmv(A, torch.ones(4))
    with pytest.raises(ValueError, match="unknown variant"):
        sp.spmv(A, torch.ones(4), variant="nope")
    with pytest.raises(ValueError, match="must be a ELL"):
        sp.ell(A, torch.ones(4))


@pytest.mark.parametrize("kind", suite.KINDS)
def test_suite_matrices_small_are_valid(kind):
    A = suite.make_matrix(kind, small=True, device="cpu")
    sp._validate_csr(A.row_ptr, A.col, A.val, A.shape)  # sorted, in range
    assert A.nnz > 0
    if kind in ("powerlaw", "wide"):
        assert A.stats.max > sp.LONG_LEN  # exercises csr_split's chunks
        assert sp.choose(A.stats) == "csr_split"
    if kind == "banded5":
        assert A.stats.max == 5


# --------------------------------------------------------------------------- GPU

CSR_VARIANTS = [("csr_scalar", {}), ("csr_split", {}), ("csr_stream", {})] + [("csr_vector", {"sub": s}) for s in (2, 4, 8, 16, 32)]


def _run(name, F, x, y, alpha=1.0, beta=0.0, **kw):
    if name == "csr_vector":
        return sp.csr_vector(F, x, y, alpha, beta, **kw)
    return sp.VARIANTS[name](F, x, y, alpha, beta)


def _all_formats(A):
    out = [(n, kw, A) for n, kw in CSR_VARIANTS]
    out.append(("jds", {}, sp.JDS.from_csr(A)))
    try:
        out.append(("ell", {}, sp.ELL.from_csr(A)))
    except ValueError:
        pass
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", [(1, 1), (31, 33), (33, 31), (1000, 4097), (4097, 1000)])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.3])
def test_every_kernel_on_odd_sizes(M, N, density):
    D = _random_dense(M, N, density, M + N, empty_rows=(0,)).cuda()
    A = sp.CSR.from_dense(D)
    x = torch.randn(N, device="cuda")
    y0 = torch.randn(M, device="cuda")
    want = 1.5 * (D.double() @ x.double()) - 0.25 * y0.double()
    for name, kw, F in _all_formats(A):
        y = y0.clone()
        _run(name, F, x, y, 1.5, -0.25, **kw)
        torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4, msg=f"{name} {kw}")
        y = poison(torch.empty(M, device="cuda"))  # beta = 0 must not read y
        _run(name, F, x, y, **kw)
        torch.testing.assert_close(y.double(), D.double() @ x.double(), rtol=1e-4, atol=1e-4, msg=f"{name} {kw}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", suite.KINDS)
def test_suite_matrices_small_every_kernel_and_auto(kind):
    A = suite.make_matrix(kind, small=True, device="cuda")
    x = torch.randn(A.shape[1], device="cuda")
    ref = sp.reference(A.row_ptr, A.col, A.val, x)
    for name, kw, F in _all_formats(A):
        y = poison(torch.empty(A.shape[0], device="cuda"))
        _run(name, F, x, y, **kw)
        err = (y.double() - ref).norm() / ref.norm()
        assert err < 1e-5, (name, kw, float(err))
    y = sp.spmv(A, x)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-5
    torch.testing.assert_close(sp.spmv(A.to_torch(), x), y, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_empty_matrices():
    for M, N in [(0, 5), (5, 0), (0, 0)]:
        A = sp.CSR.from_dense(torch.zeros(M, N, device="cuda"))
        y = sp.spmv(A, torch.randn(N, device="cuda"))
        assert y.shape == (M,) and bool((y == 0).all())
        assert sp.jds(sp.JDS.from_csr(A), torch.randn(N, device="cuda")).shape == (M,)


@pytest.mark.gpu
def test_gpu_input_errors():
    A = sp.CSR.from_dense(torch.eye(4, device="cuda"))
    with pytest.raises(ValueError, match=r"x must be \(4,\)"):
        sp.spmv(A, torch.ones(5, device="cuda"))
    with pytest.raises(ValueError, match="expected float32"):
        sp.spmv(A, torch.ones(4, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="'x' is on cpu"):
        sp.spmv(A, torch.ones(4))
    with pytest.raises(ValueError, match="beta != 0 needs"):
        sp.spmv(A, torch.ones(4, device="cuda"), beta=1.0)
    with pytest.raises(ValueError, match=r"'y' must be float32 of shape \(4,\)"):
        sp.spmv(A, torch.ones(4, device="cuda"), torch.ones(3, device="cuda"))
    with pytest.raises(ValueError, match="not sorted"):
        sp.CSR.from_arrays(torch.tensor([0, 2], device="cuda"), torch.tensor([1, 0], device="cuda"),
                           torch.ones(2, device="cuda"), (1, 2))


@pytest.mark.gpu
def test_sanitizer_small():
    """Every kernel and format on small odd matrices with empty rows, for
    ``compute-sanitizer --tool memcheck|racecheck python -m pytest -m gpu -k sanitizer tests/test_spmv.py``."""
    mats = [sp.CSR.from_dense(_random_dense(33, 31, 0.2, 7, empty_rows=(0, 32)).cuda()),
            suite.make_matrix("powerlaw", small=True), suite.make_matrix("wide", small=True)]
    for A in mats:
        x = torch.randn(A.shape[1], device="cuda")
        ref = sp.reference(A.row_ptr, A.col, A.val, x)
        for name, kw, F in _all_formats(A):
            y = poison(torch.empty(A.shape[0], device="cuda"))
            _run(name, F, x, y, **kw)
            assert float((y.double() - ref).norm() / ref.norm()) < 1e-5, (name, kw)


@pytest.mark.gpu
def test_auto_converts_once_and_keeps_the_copy():
    """A banded CSR: auto picks jds, builds the JDS on the first call and reuses it; convert=False
    runs a CSR kernel; both agree with the reference."""
    A = suite.make_matrix("banded5", small=True, device="cuda")
    assert sp.choose(A.stats) == "jds"
    x = torch.randn(A.shape[1], device="cuda")
    ref = sp.reference(A.row_ptr, A.col, A.val, x)
    y1 = sp.spmv(A, x)
    F = sp.converted(A, sp.JDS)
    assert isinstance(F, sp.JDS) and sp.converted(A, sp.JDS) is F
    y2 = sp.spmv(A, x)
    assert sp.converted(A, sp.JDS) is F
    y3 = sp.spmv(A, x, convert=False)
    for y in (y1, y2, y3):
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-5
    S = suite.make_matrix("short", small=True, device="cuda")
    if sp.choose(S.stats) == "ell":
        xs = torch.randn(S.shape[1], device="cuda")
        ys = sp.spmv(S, xs)
        assert isinstance(sp.converted(S, sp.ELL), sp.ELL)
        refs = sp.reference(S.row_ptr, S.col, S.val, xs)
        assert float((ys.double() - refs).norm() / refs.norm()) < 1e-5
