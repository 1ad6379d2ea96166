import math

import pytest
import torch

from tilewise.bench.suites import spmv as suite
from tilewise.ops.spmv import api as sp
from tilewise.ops.spmv import configs as cf
from tilewise.ops.spmv import formats as fm

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
    prod = torch.where(valid, E.val.double() * x.double()[E.col.clamp_min(0).long()],
                       torch.zeros((), dtype=torch.float64))
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


def test_jds_refuses_unbuilt_config():
    J = sp.JDS.from_csr(sp.CSR.from_dense(torch.eye(3)))
    with pytest.raises(ValueError, match="not built"):
        sp.jds(J, torch.randn(3), config=(64, 3))


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
    assert rows.tolist() == [1] * math.ceil(5000 / cf.CHUNK) + [3] * math.ceil(4097 / cf.CHUNK)
    cover = torch.zeros(n, dtype=torch.long)
    for r, s in zip(rows.tolist(), starts.tolist()):
        e = min(s + cf.CHUNK, int(rp[r + 1]))
        cover[s:e] += 1
    long_mask = torch.zeros(n, dtype=torch.bool)
    long_mask[int(rp[1]):int(rp[2])] = True
    long_mask[int(rp[3]):int(rp[4])] = True
    assert torch.equal(cover, long_mask.long())  # every nonzero of a long row once, nothing else


@pytest.mark.parametrize("kind", ["banded5", "short", "uniform", "powerlaw"])
def test_stream_plan_partitions_rows(kind):
    A = suite.make_matrix(kind, small=True, device="cpu")
    plan = fm.stream_plan(A).long()
    M = A.shape[0]
    assert int(plan[0]) == 0 and int(plan[-1]) == M and bool((plan[1:] > plan[:-1]).all())
    rp = A.row_ptr.long()
    nnz = rp[plan[1:]] - rp[plan[:-1]]
    rows = plan[1:] - plan[:-1]
    if kind != "powerlaw":  # short rows: every block fits the shared buffer (2048) and 256 threads
        assert int(nnz.max()) <= 2048 and int(rows.max()) <= cf.STREAM_ROWS
    else:  # the long rows' blocks overflow and take the kernel's global-memory path
        assert int(nnz.max()) > 2048
    assert fm.stream_plan(A) is fm.stream_plan(A)  # cached


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
    them in the table of research/notes/spmv.md; the thresholds between them hold."""
    S = sp.RowStats
    suite_stats = {  # rows, nnz, mean, max, std, empty rows
        "uniform": (S(2_000_000, 64_000_000, 32.0, 32, 0.0, 0, 2_000_000, 0.94), "panels"),
        "powerlaw": (S(2_000_000, 10_599_269, 5.3, 100_000, 203.3, 0), "csr_merge"),
        "banded5": (S(4_194_304, 20_963_328, 5.0, 5, 0.0, 0, 4_194_304, 0.001), "jds"),
        "banded27": (S(2_097_152, 55_742_968, 26.6, 27, 1.9, 0, 2_097_152, 0.016), "jds"),
        "short": (S(8_000_000, 15_998_964, 2.0, 3, 0.8, 0, 8_000_000, 0.28), "ell"),
        "wide": (S(256, 16_293_276, 63645.6, 95807, 20202.7, 0), "csr_merge"),
    }
    for kind, (st, want) in suite_stats.items():
        assert cf.choose(st) == want, kind
    no_convert = {k: cf.choose(st, convert=False) for k, (st, _) in suite_stats.items()}
    assert no_convert == {"uniform": "csr_vector", "powerlaw": "csr_merge", "banded5": "csr_stream",
                          "banded27": "csr_vector", "short": "csr_stream", "wide": "csr_merge"}
    # thresholds: merge past 128 x SUB or std > mean; jds from mean >= 0.9 max; ell up to 16 and 2x padding
    assert cf.split_len(5.0) == 256 and cf.split_len(32.0) == 1024 and cf.split_len(1e5) == cf.LONG_LEN
    assert cf.choose(S(10, 50, 5.0, 257, 4.0, 0)) == "csr_merge"
    assert cf.choose(S(10, 50, 5.0, 256, 4.0, 0)) == "csr_stream"
    assert cf.choose(S(10, 50, 5.0, 256, 5.1, 0)) == "csr_merge"
    assert cf.choose(S(10, 50, 5.0, 256, 5.1, 0), convert=False) == "csr_merge"
    assert cf.choose(S(10, 95, 9.5, 10, 0.5, 0)) == "jds"
    assert cf.choose(S(10, 85, 8.5, 10, 1.0, 0)) == "ell"
    assert cf.choose(S(10, 85, 8.5, 18, 3.0, 0)) == "csr_stream"
    assert cf.choose(S(10, 120, 12.0, 25, 3.0, 0)) == "csr_stream"
    assert cf.choose(S(10, 200, 20.0, 40, 5.0, 0)) == "csr_vector"
    assert cf.choose(S(0, 0, 0.0, 0, 0.0, 0)) == "csr_vector"
    # panels: spread columns over a wide x, panels in one wave; not without conversion
    assert cf.choose(S(2_000_000, 8_000_000, 4.0, 4, 0.0, 0, 2_000_000, 0.6)) == "panels"
    assert cf.choose(S(2_000_000, 8_000_000, 4.0, 4, 0.0, 0, 2_000_000, 0.6), convert=False) == "csr_stream"
    assert cf.choose(S(2_000_000, 8_000_000, 4.0, 4, 0.0, 0, 2_000_000, 0.2)) == "jds"
    assert cf.choose(S(2_000_000, 8_000_000, 4.0, 4, 0.0, 0, 100_000, 0.6)) == "jds"
    assert cf.choose(S(8_000_000, 32_000_000, 4.0, 4, 0.0, 0, 8_000_000, 0.6)) == "jds"
    assert [cf.sub_width(m) for m in (1, 2, 3, 5, 7, 12, 27, 32, 500)] == [2, 2, 2, 2, 2, 4, 8, 8, 32]


def test_spmv_input_errors_on_cpu():
    A = sp.CSR.from_dense(torch.eye(4))
    torch.testing.assert_close(sp.spmv(A, torch.arange(4.0), alpha=2.0), 2 * torch.arange(4.0))  # the CPU rule
    with pytest.raises(ValueError, match="tilewise kernels need it on CUDA"):  # a version is a kernel
        sp.VARIANTS["csr_scalar"](A, torch.ones(4), None, 1.0, 0.0)
    with pytest.raises(ValueError, match="unknown variant"):
        sp.spmv(A, torch.ones(4), variant="nope")
    with pytest.raises(ValueError, match="must be a ELL"):
        sp.ell(A, torch.ones(4))


def test_a_csr_built_directly_is_checked_and_converted_like_from_arrays():
    # Issue 29: CSR(...) skipped the checks and failed later ("'NoneType' object has no attribute
    # 'rows'"); a val of two dims crashed the process in torch's sparse code.
    rp, col, val = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1]), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    A = sp.CSR(rp, col, val, (2, 3))
    B = sp.CSR.from_arrays(rp, col, val, (2, 3))
    assert A.row_ptr.dtype == A.col.dtype == torch.int32 and A.val.dtype == torch.float32
    assert A.stats == B.stats and torch.equal(A.to_dense(), B.to_dense())
    with pytest.raises(ValueError, match=r"column index 2 at position 1 is outside \[0, 2\)"):
        sp.CSR(rp, col, val, (2, 2))
    with pytest.raises(ValueError, match="'row_ptr' has 3 entries; 'shape' \\(3, 3\\) needs M \\+ 1 = 4"):
        sp.CSR(rp, col, val, (3, 3))
    with pytest.raises(TypeError, match="'shape' must be \\(M, N\\), two ints, got None"):
        sp.CSR(rp, col, val, None)
    with pytest.raises(ValueError, match="'col' must be a torch.Tensor, got list"):
        sp.CSR(rp, [0, 2, 1], val, (2, 3))
    for build in (sp.CSR, sp.CSR.from_arrays):
        with pytest.raises(ValueError, match=r"'val' must be 1-D, got shape \(1, 3\)"):
            build(rp, col, val[None], (2, 3))
        with pytest.raises(ValueError, match="'row_ptr' is on meta"):
            build(rp.to("meta"), col, val, (2, 3))


def test_complex_values_are_a_type_error_not_a_lost_imaginary_part():
    rp, col = torch.tensor([0, 1]), torch.tensor([0])
    with pytest.raises(TypeError, match="'val' is torch.complex64"):
        sp.CSR.from_arrays(rp, col, torch.tensor([1 + 2j], dtype=torch.complex64), (1, 1))
    with pytest.raises(TypeError, match="'D' is torch.complex64"):
        sp.CSR.from_dense(torch.ones(2, 2, dtype=torch.complex64))
    with pytest.raises(TypeError, match="spmv: 'A' is torch.complex64"):
        sp.spmv(torch.ones(2, 2, dtype=torch.complex64), torch.ones(2))


def test_formats_are_built_from_a_csr_only():
    for fmt in (sp.ELL, sp.JDS, sp.Panels):
        with pytest.raises(ValueError, match=f"{fmt.__name__}.from_csr: 'A' must be a CSR"):
            fmt.from_csr(torch.eye(3))
    with pytest.raises(ValueError, match="'A' is on cpu; give rows and cluster"):
        sp.Panels.from_csr(sp.CSR.from_dense(torch.eye(3)))
    with pytest.raises(ValueError, match="cannot make a CSR matrix of 'A', a list"):
        sp.spmv([[1.0]], torch.ones(1))


@pytest.mark.parametrize("kind", suite.KINDS)
def test_suite_matrices_small_are_valid(kind):
    A = suite.make_matrix(kind, small=True, device="cpu")
    fm._validate_csr(A.row_ptr, A.col, A.val, A.shape)  # sorted, in range
    assert A.nnz > 0
    if kind in ("powerlaw", "wide"):
        assert A.stats.max > cf.LONG_LEN  # exercises csr_split's chunks
        assert cf.choose(A.stats) == "csr_merge"
    if kind == "banded5":
        assert A.stats.max == 5


# --------------------------------------------------------------------------- Panels (CPU)


def _panels_model(Pn: sp.Panels, x, alpha=1.0, beta=0.0, y0=None):
    """y from the Panels arrays as the kernel reads them: each CTA's share of the panel's rounds
    (whole rounds of PANEL_ROUND chunks) and of its tail (chunks), keys decoded, padding (row 0xFFFF)
    skipped without reading x, rows summed over the cluster's ranks. Checks that no row repeats
    within a round (the kernel adds rounds without atomics)."""
    M = Pn.shape[0]
    y = torch.zeros(M, dtype=torch.float64)
    pc, pt = Pn.panel_chunk.long(), Pn.panel_tail.long()
    key = Pn.key.long() & 0xFFFFFFFF
    NW, CL = Pn.round_chunks, Pn.cluster

    def add(p, chunks):
        k = key.view(-1, 32)[chunks].reshape(-1)
        row, col = k & 0xFFFF, (k >> 16) + Pn.chunk_col0.long()[chunks].repeat_interleave(32)
        live = row != 0xFFFF
        prod = Pn.val.view(-1, 32)[chunks].reshape(-1).double()[live] * x.double()[col[live]]
        y.index_add_(0, p * Pn.rows + row[live], prod)
        return row[live]

    for p in range(Pn.panels):
        c0, t0, c1 = int(pc[p]), int(pt[p]), int(pc[p + 1])
        assert (t0 - c0) % NW == 0 and (Pn.rounds or t0 == c0)
        nr = (t0 - c0) // NW
        for rank in range(CL):
            for q in range(nr * rank // CL, nr * (rank + 1) // CL):
                rows_q = add(p, torch.arange(c0 + q * NW, c0 + (q + 1) * NW))
                assert rows_q.unique().numel() == rows_q.numel(), f"row repeated in round {q} of panel {p}"
            n = c1 - t0
            add(p, torch.arange(t0 + n * rank // CL, t0 + n * (rank + 1) // CL))
    out = alpha * y
    return out + beta * y0.double() if beta != 0.0 else out


def _panels_cases():
    wide = sp.CSR.from_dense(_random_dense(5, 140_000, 0.0005, 3))   # three column blocks
    return {"odd": sp.CSR.from_dense(_random_dense(37, 29, 0.2, 1, empty_rows=(0, 36))),
            "empty_panel": sp.CSR.from_dense(_random_dense(40, 9, 0.3, 2, empty_rows=range(8, 24))),
            "wide": wide, "powerlaw": suite.make_matrix("powerlaw", small=True, device="cpu")}


@pytest.mark.parametrize("name", ["odd", "empty_panel", "wide", "powerlaw"])
@pytest.mark.parametrize("rows,cluster", [(1, 1), (7, 2), (8, 3), (1000, 4), (57344, 1)])
@pytest.mark.parametrize("rounds", [False, True, 128])
def test_panels_layout_and_model(name, rows, cluster, rounds):
    A = _panels_cases()[name]
    M, N = A.shape
    rc = rounds if rounds is not True and rounds else cf.PANEL_ROUND
    Pn = sp.Panels.from_csr(A, rows=rows, cluster=cluster, rounds=bool(rounds), round_chunks=rc)
    assert Pn.panels == -(-M // rows) and Pn.nnz == A.nnz and Pn.key.numel() % 32 == 0
    key = Pn.key.long() & 0xFFFFFFFF
    live = (key & 0xFFFF) != 0xFFFF
    assert int(live.sum()) == A.nnz and bool((Pn.val[~live] == 0).all())
    # every nonzero once: (row, col, val) triples equal CSR's
    chunk = torch.arange(Pn.key.numel()) // 32
    panel = torch.searchsorted(Pn.panel_chunk.long(), chunk, right=True) - 1
    rows_g = (panel * rows + (key & 0xFFFF))[live]
    cols_g = ((key >> 16) + Pn.chunk_col0.long()[chunk])[live]
    got = sorted(zip(rows_g.tolist(), cols_g.tolist(), Pn.val[live].tolist()))
    r = torch.repeat_interleave(torch.arange(M), A.row_lengths().long())
    assert got == sorted(zip(r.tolist(), A.col.long().tolist(), A.val.tolist()))
    # column order within a panel's rounds and within its tail; one column block per chunk
    part = (panel * 2 + (chunk >= Pn.panel_tail.long()[panel]).long())[live]
    assert bool((cols_g[1:] >= cols_g[:-1])[part[1:] == part[:-1]].all())
    if not rounds:
        assert bool((Pn.panel_tail == Pn.panel_chunk[:-1]).all())
    assert bool((Pn.chunk_col0 % cf.PANEL_COLS == 0).all())
    x = torch.randn(N)
    want = sp.reference(A.row_ptr, A.col, A.val, x)  # float64; duplicates summed like the kernel does
    torch.testing.assert_close(_panels_model(Pn, x), want)
    y0 = torch.randn(M)
    torch.testing.assert_close(_panels_model(Pn, x, 1.5, -0.25, y0), 1.5 * want - 0.25 * y0.double())


def test_panels_padding_reads_no_x():
    """A chunk's padding keys decode to column chunk_col0 + 0: the model (as the kernel) must skip
    them, or an Inf there turns a row into NaN."""
    D = torch.zeros(3, 70_000)
    D[0, 5], D[1, 66_000], D[2, 69_999] = 1.0, 2.0, 3.0
    Pn = sp.Panels.from_csr(sp.CSR.from_dense(D), rows=2, cluster=1)
    assert int(((Pn.key.long() & 0xFFFF) == 0xFFFF).sum()) > 0
    x = torch.ones(70_000)
    x[0] = x[65_536] = float("inf")
    torch.testing.assert_close(_panels_model(Pn, x), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))


def test_panels_errors_and_shape_rule():
    A = sp.CSR.from_dense(torch.eye(3))
    with pytest.raises(ValueError, match="rows must be in"):
        sp.Panels.from_csr(A, rows=0, cluster=1)
    with pytest.raises(ValueError, match="rows must be in"):
        sp.Panels.from_csr(A, rows=cf.PANEL_MAX_ROWS + 1, cluster=1)
    with pytest.raises(ValueError, match="cluster must be one of"):
        sp.Panels.from_csr(A, rows=2, cluster=5)
    Pn = sp.Panels.from_csr(A, rows=2, cluster=2)
    with pytest.raises(ValueError, match="not built for clusters of 2"):
        sp.panels(Pn, torch.ones(3), config=(1024, 3, 4))
    with pytest.raises(ValueError, match="must be a Panels"):
        sp.panels(A, torch.ones(3))
    # H200: 30 clusters of 4, 39 of 3, 66 of 2, 132 of 1 resident at once (measured)
    fit = {4: 30, 3: 39, 2: 66, 1: 132}.get
    assert cf.panel_shape(2_000_000, clusters_fit=fit, sms=132) == (30304, 2)   # every SM busy, fewest panels
    assert cf.panel_shape(5_000_000, clusters_fit=fit, sms=132) == (37879, 1)   # 2 CTAs a panel would need 75758 rows
    assert cf.panel_shape(10**8, clusters_fit=fit, sms=132) == (cf.PANEL_MAX_ROWS, 1)
    assert cf.panel_shape(10, clusters_fit=fit, sms=132) == (1, 2)
    fit = {4: 33, 3: 44, 2: 66, 1: 132}.get   # GPCs that hold whole clusters of every size
    assert cf.panel_shape(2_000_000, clusters_fit=fit, sms=132) == (45455, 3)
    for cfg in cf.PANEL_DEFAULT.values():
        assert cfg in cf.PANEL_CONFIGS
    # every config is built for every round size; rounds are whole chunks a warp
    from pathlib import Path
    cu = (Path(sp.__file__).parent / "spmv.cu").read_text()
    for nt, cl, u in cf.PANEL_CONFIGS:
        for rc in cf.PANEL_ROUNDS:
            assert f"spmv_panels<{nt},{cl},{u},{rc}>" in cu and rc % (nt // 32) == 0
    assert cf.PANEL_ROUND in cf.PANEL_ROUNDS
    with pytest.raises(ValueError, match="round_chunks must be one of"):
        sp.Panels.from_csr(A, rows=2, cluster=2, round_chunks=96)


# --------------------------------------------------------------------------- csr_merge's partition (CPU)


def _csr_from_lengths(lengths, N=None, seed=0):
    """A CSR with the given row lengths, random sorted columns (distinct within a row), random values."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    N = N or max(1, int(lengths.max()) if lengths.numel() else 1)
    cols = [torch.randperm(N, generator=g)[:int(k)].sort().values for k in lengths]
    rp = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    rp[1:] = torch.cumsum(lengths, 0)
    col = torch.cat(cols) if cols else torch.zeros(0, dtype=torch.long)
    return sp.CSR.from_arrays(rp, col, torch.randn(col.numel(), generator=g), (lengths.numel(), N))


def _walk_path(row_ptr):
    """Every state (rows closed, nonzeros taken) of the merge path, one step at a time."""
    rp = row_ptr.tolist()
    M, nnz = len(rp) - 1, rp[-1]
    i = j = 0
    states = [(0, 0)]
    while i < M or j < nnz:
        if i < M and rp[i + 1] <= j:
            i += 1
        else:
            j += 1
        states.append((i, j))
    return states


MERGE_MATRICES = {
    "empty_rows": [0, 3, 0, 0, 7, 1, 0, 2, 0],
    "one_huge_row": [2, 3, 0, 1, 500, 4, 0, 2, 5, 1],
    "only_a_huge_row": [777],
    "all_empty": [0] * 9,
    "one_row_one_nz": [1],
    "trailing_empty": [4, 4, 4, 0, 0, 0, 0],
    "ragged": [int(v) for v in torch.randint(0, 40, (61,), generator=torch.Generator().manual_seed(3))],
}


@pytest.mark.parametrize("name", sorted(MERGE_MATRICES))
@pytest.mark.parametrize("tile", [1, 5, 12, 64, 1792])
def test_merge_coords_match_a_step_by_step_walk(name, tile):
    A = _csr_from_lengths(MERGE_MATRICES[name])
    states = _walk_path(A.row_ptr)
    rows, nzs = fm.merge_coords(A.row_ptr, tile)
    total = len(states) - 1
    want = [states[min(t * tile, total)] for t in range(-(-total // tile) + 1)]
    assert list(zip(rows.tolist(), nzs.tolist())) == want
    # segments: exactly the tiles whose end leaves part of an existing row open
    rp = A.row_ptr.tolist()
    M = A.shape[0]
    carry_rows = [(b, r) for b, (r, z) in enumerate(want[1:]) if r < M and z > rp[r]]
    seg_row, b0, b1 = fm.merge_segments(A.row_ptr, rows, nzs)
    got = [(b, r) for r, s, e in zip(seg_row.tolist(), b0.tolist(), b1.tolist()) for b in range(s, e)]
    assert got == carry_rows
    assert len(set(seg_row.tolist())) == seg_row.numel()  # one segment per straddling row


def test_merge_coords_rejects_bad_tile():
    with pytest.raises(ValueError, match="tile must be positive"):
        fm.merge_coords(torch.tensor([0, 1]), 0)


def _kernel_scan(elems):
    """spmv_csr_merge's block scan step by step: Hillis-Steele segmented inclusive scan per warp
    (``__shfl_up_sync`` reads the values from before each step), the warps' totals folded in order,
    each thread's exclusive prefix from its lane - 1 neighbour. Returns (exclusive prefixes, block total)."""
    n = len(elems)
    f = [int(e[0]) for e in elems]
    v = [float(e[1]) for e in elems]
    for w0 in range(0, n, 32):
        off = 1
        while off < 32:
            fu, vu = f[:], v[:]  # the shuffle sees the pre-step values
            for t in range(w0 + off, w0 + 32):
                if not f[t]:
                    v[t] += vu[t - off]
                f[t] |= fu[t - off]
            off *= 2
    ex = []
    for t in range(n):
        w, lane = t // 32, t % 32
        before = 0.0
        for k in range(w):
            last = 32 * k + 31
            before = v[last] if f[last] else before + v[last]
        ev, ef = (0.0, 0) if lane == 0 else (v[t - 1], f[t - 1])
        ex.append(ev if ef else before + ev)
    w = (n - 1) // 32
    before = 0.0
    for k in range(w):
        last = 32 * k + 31
        before = v[last] if f[last] else before + v[last]
    return ex, (v[n - 1] if f[n - 1] else before + v[n - 1])


def _merge_model(A, x, nt, ipt, alpha=1.0, beta=0.0, y0=None):
    """y computed the way spmv_csr_merge + spmv_csr_merge_fixup compute it, from merge_plan: each
    tile staged, each thread's start searched in the tile's row ends, IPT steps walked, a segmented
    scan over the threads, then each straddling row's carries added. float64."""
    P = fm.merge_plan(A, nt * ipt)
    rp = A.row_ptr.tolist()
    prod_all = (A.val.double() * x.double()[A.col.long()]).tolist()
    M = A.shape[0]
    y = [math.nan] * M if y0 is None else y0.double().tolist()
    pr, pz = P.plan_row.tolist(), P.plan_nz.tolist()
    carry, closed = [], []
    for b in range(P.n_tiles):
        r0, z0 = pr[b], pz[b]
        nr, nz = pr[b + 1] - r0, pz[b + 1] - z0
        ends = [rp[r0 + 1 + k] - z0 for k in range(nr)]
        prod = prod_all[z0:z0 + nz]
        L = nr + nz
        assert 0 < L <= nt * ipt
        out = [None] * nr
        elems, heads = [], []
        for t in range(nt):
            d = min(t * ipt, L)
            lo, hi = max(0, d - nz), min(d, nr)
            while lo < hi:
                mid = (lo + hi) // 2
                if mid + ends[mid] < d:
                    lo = mid + 1
                else:
                    hi = mid
            i, j, s, head, head_sum = lo, d - lo, 0.0, -1, 0.0
            for _ in range(d, min(d + ipt, L)):
                if i < nr and ends[i] <= j:
                    if head < 0:
                        head, head_sum = i, s
                    else:
                        out[i] = s
                    s, i = 0.0, i + 1
                else:
                    s, j = s + prod[j], j + 1
            heads.append((head, head_sum))
            elems.append((head >= 0, s))
        run = 0.0  # the exclusive segmented prefix
        for t, ((head, head_sum), (f, s)) in enumerate(zip(heads, elems)):
            if head >= 0:
                out[head] = head_sum + run
            run = s if f else run + s
        carry.append(run)
        if nt % 32 == 0:  # the kernel's shuffle + warp-fold scan gives the same prefixes
            ex, total = _kernel_scan(elems)
            serial, r = [], 0.0
            for f, s in elems:
                serial.append(r)
                r = s if f else r + s
            assert ex == pytest.approx(serial) and total == pytest.approx(run)
        assert None not in out  # every row of the tile closed by exactly one thread
        closed.extend(range(r0, r0 + nr))
        for k in range(nr):
            y[r0 + k] = alpha * out[k] + (beta * y[r0 + k] if beta != 0.0 else 0.0)
    assert closed == list(range(M))  # the tiles close every row once, in order
    for r, s, e in zip(P.seg_row.tolist(), P.seg_b0.tolist(), P.seg_b1.tolist()):
        y[r] += alpha * sum(carry[s:e])
    return torch.tensor(y, dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(MERGE_MATRICES))
@pytest.mark.parametrize("nt,ipt", [(4, 3), (2, 1), (8, 7), (32, 5), (64, 3)])
def test_merge_model_matches_reference(name, nt, ipt):
    A = _csr_from_lengths(MERGE_MATRICES[name], seed=len(name))
    g = torch.Generator().manual_seed(5)
    x, y0 = torch.randn(A.shape[1], generator=g), torch.randn(A.shape[0], generator=g)
    want = sp.reference(A.row_ptr, A.col, A.val, x, y0, alpha=1.5, beta=-0.25)
    torch.testing.assert_close(_merge_model(A, x, nt, ipt, 1.5, -0.25, y0), want)
    # beta = 0 never reads y (the model starts from NaN)
    torch.testing.assert_close(_merge_model(A, x, nt, ipt), sp.reference(A.row_ptr, A.col, A.val, x))


def test_merge_model_on_small_powerlaw_with_default_tile():
    A = suite.make_matrix("powerlaw", small=True, device="cpu")
    x = torch.randn(A.shape[1], generator=torch.Generator().manual_seed(0))
    nt, ipt = cf.MERGE_DEFAULT
    P = fm.merge_plan(A, nt * ipt)
    assert P.n_seg > 0 and int((P.seg_b1 - P.seg_b0).max()) > 1  # the 5000 rows span several tiles
    got = _merge_model(A, x, nt, ipt)
    ref = sp.reference(A.row_ptr, A.col, A.val, x)
    torch.testing.assert_close(got, ref)


def test_merge_plan_cached_and_costed():
    A = _csr_from_lengths(MERGE_MATRICES["one_huge_row"])
    P = fm.merge_plan(A, 12)
    assert fm.merge_plan(A, 12) is P and fm.merge_plan(A, 13) is not P
    assert P.build_ms >= 0 and P.n_tiles == -(-(A.shape[0] + A.nnz) // 12)
    for t in (P.plan_row, P.plan_nz, P.seg_row, P.seg_b0, P.seg_b1):
        assert t.dtype == torch.int32 and t.is_contiguous()
    E = _csr_from_lengths(MERGE_MATRICES["all_empty"])
    assert fm.merge_plan(E, 4).n_seg == 0


def test_csr_merge_rejects_unknown_config():
    A = sp.CSR.from_dense(torch.eye(4))
    with pytest.raises(ValueError, match=r"\(nt, ipt\) must be one of"):
        sp.csr_merge(A, torch.ones(4), nt=64, ipt=7)
    assert set(cf.MERGE_CONFIGS) >= {cf.MERGE_DEFAULT}


# --------------------------------------------------------------------------- GPU

CSR_VARIANTS = ([("csr_scalar", {}), ("csr_split", {}), ("csr_stream", {}), ("csr_merge", {}),
                 ("csr_merge", {"nt": 128, "ipt": 5})] + [("csr_vector", {"sub": s}) for s in (2, 4, 8, 16, 32)])


def _run(name, F, x, y, alpha=1.0, beta=0.0, **kw):
    return sp.VARIANTS[name](F, x, y, alpha, beta, **kw)


def _all_formats(A):
    out = [(n, kw, A) for n, kw in CSR_VARIANTS]
    J = sp.JDS.from_csr(A)
    out += [("jds", {"config": c}, J) for c in cf.JDS_CONFIGS]
    try:
        out.append(("ell", {}, sp.ELL.from_csr(A)))
    except ValueError:
        pass
    out.append(("panels", {}, sp.Panels.from_csr(A)))
    out.append(("panels", {}, sp.Panels.from_csr(A, rounds=True)))
    out.append(("panels", {}, sp.Panels.from_csr(A, rounds=True, round_chunks=128)))
    out += [("panels", {"config": c}, sp.Panels.from_csr(A, rows=max(1, A.shape[0] // 5), cluster=c[1]))
            for c in cf.PANEL_CONFIGS]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", [(1, 1), (31, 33), (33, 31), (1000, 4097), (4097, 1000)])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.3])
@pytest.mark.quick(rotate=("M", "N"), per=2)
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
def test_panels_many_blocks_and_panels():
    """Past one panel (57344 rows) and one column block (65536 columns): 70001 x 200003, an Inf at
    every column-block start no nonzero uses (a padding entry that read x would make NaN), beta
    != 0 and a NaN-poisoned y with beta == 0, every built config at the default panel shape."""
    M, N, per_row = 70_001, 200_003, 9
    g = torch.Generator(device="cuda").manual_seed(5)
    col = torch.randint(1, N, (M, per_row), device="cuda", generator=g)
    col = col + (col % cf.PANEL_COLS == 0).long()   # keep block starts out of the pattern
    col = col.clamp_max(N - 1).sort(1).values
    row_ptr = torch.arange(0, M * per_row + 1, per_row, device="cuda")
    A = sp.CSR.from_arrays(row_ptr, col.view(-1), torch.randn(M * per_row, device="cuda", generator=g), (M, N))
    x = torch.randn(N, device="cuda", generator=g)
    x[torch.arange(0, N, cf.PANEL_COLS, device="cuda")] = float("inf")
    ref = sp.reference(A.row_ptr, A.col, A.val, x)
    assert bool(torch.isfinite(ref).all())
    for cl, rounds in [(cl, r) for cl in sorted(cf.PANEL_DEFAULT) for r in (False, 64, 128)]:
        Pn = sp.Panels.from_csr(A, cluster=cl, rows=-(-M // 3), rounds=bool(rounds), round_chunks=rounds or 64)
        for cfg in [c for c in cf.PANEL_CONFIGS if c[1] == cl]:
            y = poison(torch.empty(M, device="cuda"))
            sp.panels(Pn, x, y, config=cfg)
            torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4, msg=str(cfg))
            y0 = torch.randn(M, device="cuda", generator=g)
            y = y0.clone()
            sp.panels(Pn, x, y, 0.5, 2.0, config=cfg)
            torch.testing.assert_close(y.double(), 0.5 * ref + 2.0 * y0.double(), rtol=1e-4, atol=1e-4)
    Pd = sp.Panels.from_csr(A)
    rows, cl = fm.device_panel_shape(M)
    assert ((Pd.rows, Pd.cluster) == (rows, cl)
            and Pd.panels * cl <= torch.cuda.get_device_properties(0).multi_processor_count)
    torch.testing.assert_close(sp.spmv(Pd, x).double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["odd", "empty_panel", "wide", "powerlaw"])
@pytest.mark.parametrize("rows,cluster,rc", [(7, 2, 64), (1000, 1, 128), (57344, 1, 64)])
@pytest.mark.quick(rotate="rows")
def test_gpu_panels_packed_rounds_match_the_host_walk(name, rows, cluster, rc):
    """spmv_panels_rounds (a block a panel on the GPU) gives the very layout of the host's walk
    (_packed_rounds_host): every key, value, column base and panel boundary."""
    A = _panels_cases()[name]
    host = sp.Panels.from_csr(A, rows=rows, cluster=cluster, round_chunks=rc)
    Ag = sp.CSR.from_arrays(A.row_ptr.cuda(), A.col.cuda(), A.val.cuda(), A.shape)
    dev = sp.Panels.from_csr(Ag, rows=rows, cluster=cluster, round_chunks=rc)
    for f in ("key", "val", "chunk_col0", "panel_chunk", "panel_tail"):
        assert torch.equal(getattr(dev, f).cpu(), getattr(host, f)), f


def _rounds_input(seed, P, rows, per_panel, blocks):
    """Entries sorted by (panel, column) as Panels.from_csr hands them to _packed_rounds: few rows
    (so rows repeat within a round), columns over several column blocks (so chunks re-align)."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(0, per_panel + 1, (P,), generator=g)
    panel = torch.repeat_interleave(torch.arange(P), n)
    c = torch.randint(0, blocks * cf.PANEL_COLS, (panel.numel(),), generator=g)
    c = c // cf.PANEL_COLS * cf.PANEL_COLS + c % 5   # few distinct columns: runs of one block
    order = torch.argsort(panel * (blocks * cf.PANEL_COLS) + c, stable=True)
    panel, c = panel[order], c[order]
    rl = torch.randint(0, rows, (panel.numel(),), generator=g)
    return panel, c, rl, torch.randn(panel.numel(), generator=g)


@pytest.mark.gpu
@pytest.mark.parametrize("seed,P,rows,per_panel,blocks,rc", [(0, 3, 5, 3000, 40, 1), (1, 5, 40, 9000, 3, 2),
                                                             (2, 1, 1, 700, 7, 1), (3, 4, 300, 20000, 1, 3),
                                                             (4, 6, 64, 33, 2, 1)])
def test_gpu_packed_rounds_walk_equals_the_serial_one(seed, P, rows, per_panel, blocks, rc):
    """The warp walk of spmv_panels_rounds against _packed_rounds_host on input made to stress it:
    rows repeated within 32 entries, column-block changes inside a step, rounds of one to three
    chunks so that a step often crosses into the next round."""
    panel, c, rl, v = _rounds_input(seed, P, rows, per_panel, blocks)
    host, host_moved = fm._packed_rounds(panel, c, rl, v, P, rows, rc)
    dev, dev_moved = fm._packed_rounds(panel.cuda(), c.cuda(), rl.cuda(), v.cuda(), P, rows, rc)
    assert torch.equal(dev_moved.cpu(), host_moved)
    for a, b in zip(dev, host):
        assert torch.equal(a.cpu(), b)
    assert 0 < int(host_moved.sum()) < panel.numel() or rows == 1


@pytest.mark.gpu
def test_gpu_panels_uniform_rounds_are_full():
    """On the bench's uniform matrix (2M x 2M, 32 a row) the packed rounds leave under 1 % of
    padding, where fixed rounds left a hole for every repeat (~3 %)."""
    A = suite.make_matrix("uniform", small=False)
    Pn = sp.Panels.from_csr(A)
    assert Pn.key.numel() / A.nnz - 1 < 0.01
    x = torch.randn(A.shape[1], device="cuda")
    torch.testing.assert_close(sp.spmv(Pn, x).double(), sp.reference(A.row_ptr, A.col, A.val, x), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.gpu
def test_empty_matrices():
    for M, N in [(0, 5), (5, 0), (0, 0)]:
        A = sp.CSR.from_dense(torch.zeros(M, N, device="cuda"))
        y = sp.spmv(A, torch.randn(N, device="cuda"))
        assert y.shape == (M,) and bool((y == 0).all())
        assert sp.jds(sp.JDS.from_csr(A), torch.randn(N, device="cuda")).shape == (M,)
        ym = sp.csr_merge(A, torch.randn(N, device="cuda"), poison(torch.empty(M, device="cuda")))
        assert ym.shape == (M,) and bool((ym == 0).all())
        yp = sp.panels(sp.Panels.from_csr(A), torch.randn(N, device="cuda"), poison(torch.empty(M, device="cuda")))
        assert yp.shape == (M,) and bool((yp == 0).all())


@pytest.mark.gpu
def test_gpu_input_errors():
    A = sp.CSR.from_dense(torch.eye(4, device="cuda"))
    with pytest.raises(ValueError, match=r"x must be \(4,\)"):
        sp.spmv(A, torch.ones(5, device="cuda"))
    with pytest.raises(ValueError, match="expected float32"):
        sp.spmv(A, torch.ones(4, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="'x' is on cpu"):
        sp.spmv(A, torch.ones(4))
    with pytest.raises(ValueError, match="'beta' = 1.0 needs a 'y'"):
        sp.spmv(A, torch.ones(4, device="cuda"), beta=1.0)
    with pytest.raises(ValueError, match=r"'y' must be float32 of shape \(4,\)"):
        sp.spmv(A, torch.ones(4, device="cuda"), torch.ones(3, device="cuda"))
    with pytest.raises(ValueError, match="not sorted"):
        sp.CSR.from_arrays(torch.tensor([0, 2], device="cuda"), torch.tensor([1, 0], device="cuda"),
                           torch.ones(2, device="cuda"), (1, 2))


@pytest.mark.gpu
@pytest.mark.sanitize
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
    assert cf.choose(A.stats) == "jds"
    x = torch.randn(A.shape[1], device="cuda")
    ref = sp.reference(A.row_ptr, A.col, A.val, x)
    y1 = sp.spmv(A, x)
    F = fm.converted(A, sp.JDS)
    assert isinstance(F, sp.JDS) and fm.converted(A, sp.JDS) is F
    y2 = sp.spmv(A, x)
    assert fm.converted(A, sp.JDS) is F
    y3 = sp.spmv(A, x, convert=False)
    for y in (y1, y2, y3):
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-5
    S = suite.make_matrix("short", small=True, device="cuda")
    if cf.choose(S.stats) == "ell":
        xs = torch.randn(S.shape[1], device="cuda")
        ys = sp.spmv(S, xs)
        assert isinstance(fm.converted(S, sp.ELL), sp.ELL)
        refs = sp.reference(S.row_ptr, S.col, S.val, xs)
        assert float((ys.double() - refs).norm() / refs.norm()) < 1e-5


def _bound(A, x, alpha=1.0, beta=0.0, y0=None):
    """Elementwise fp32 error allowance: a few ulps of alpha |A| |x| + beta |y0| (a long row's
    rounding grows with its terms' magnitudes, not with its sum)."""
    absA = sp.CSR.from_arrays(A.row_ptr, A.col, A.val.abs(), A.shape, validate=False)
    b = abs(alpha) * sp.reference(absA.row_ptr, absA.col, absA.val, x.abs())
    if y0 is not None and beta != 0.0:
        b = b + abs(beta) * y0.double().abs()
    return 2e-6 * b + 1e-6


def _merge_cases():
    g = torch.Generator().manual_seed(11)
    huge = torch.randint(0, 6, (4097,), generator=g)
    huge[:7] = 0
    huge[17] = 100_000  # one huge row among short ones and leading empty rows
    odd = torch.randint(0, 9, (1000,), generator=g) * (torch.rand(1000, generator=g) < 0.7)  # 30 % empty
    return {
        "odd_empty_rows": (odd, 4097),
        "one_huge_row": (huge, 100_003),
        "only_one_huge_row": (torch.tensor([300_001]), 300_007),
        "all_empty": (torch.zeros(33, dtype=torch.long), 31),
        "one_by_one": (torch.tensor([1]), 1),
        "ends_on_empty_rows": (torch.cat([torch.full((1791,), 1), torch.zeros(5, dtype=torch.long)]), 33),
    }


def _lengths_csr_cuda(lengths, N, seed):
    """Random sorted columns for the given row lengths, built on the GPU (suite helper)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return suite._random_rows(lengths.cuda(), N, g)


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(_merge_cases()))
def test_csr_merge_against_float64(case):
    """Every (nt, ipt) instantiation against a float64 reference: odd sizes, empty rows, one huge
    row, an all-empty matrix; alpha/beta with y read, and beta = 0 on a NaN-poisoned y; the same
    bits on a second run (the fix-up has no atomics)."""
    lengths, N = _merge_cases()[case]
    A = _lengths_csr_cuda(lengths, N, seed=len(case))
    M = A.shape[0]
    x = torch.randn(N, device="cuda")
    y0 = torch.randn(M, device="cuda")
    want = sp.reference(A.row_ptr, A.col, A.val, x, y0, alpha=1.5, beta=-0.25)
    want0 = sp.reference(A.row_ptr, A.col, A.val, x)
    tol, tol0 = _bound(A, x, 1.5, -0.25, y0), _bound(A, x)
    for nt, ipt in cf.MERGE_CONFIGS:
        y = y0.clone()
        sp.csr_merge(A, x, y, 1.5, -0.25, nt=nt, ipt=ipt)
        err = (y.double() - want).abs()
        assert bool((err <= tol).all()), (case, nt, ipt, float((err / tol).max()))
        y = poison(torch.empty(M, device="cuda"))
        sp.csr_merge(A, x, y, nt=nt, ipt=ipt)
        err = (y.double() - want0).abs()
        assert bool((err <= tol0).all()), (case, nt, ipt, "beta=0", float((err / tol0).max()))
        y2 = poison(torch.empty(M, device="cuda"))
        sp.csr_merge(A, x, y2, nt=nt, ipt=ipt)
        assert torch.equal(y, y2), (case, nt, ipt, "not deterministic")


@pytest.mark.gpu
def test_csr_merge_is_the_auto_pick_for_powerlaw():
    A = suite.make_matrix("powerlaw", small=True)
    assert cf.choose(A.stats) == "csr_merge"
    x = torch.randn(A.shape[1], device="cuda")
    ref = sp.reference(A.row_ptr, A.col, A.val, x)
    y = sp.spmv(A, x)
    assert bool(((y.double() - ref).abs() <= _bound(A, x)).all())
    assert fm.merge_plan(A) is fm.merge_plan(A)


@pytest.mark.gpu
@pytest.mark.sanitize
def test_sanitizer_csr_merge_small():
    """csr_merge at every (nt, ipt) on small matrices with empty rows, a row spanning many tiles,
    an all-empty matrix and beta != 0, for
    ``compute-sanitizer --tool memcheck|racecheck|initcheck python -m pytest -m gpu -k sanitizer
    tests/test_spmv.py``."""
    cases = [(torch.tensor([0, 3, 0, 0, 7, 1, 0, 2, 0] * 5), 31), (torch.tensor([2, 0, 5000, 1, 0, 3]), 5003),
             (torch.zeros(7, dtype=torch.long), 5)]
    for k, (lengths, N) in enumerate(cases):
        A = _lengths_csr_cuda(lengths, N, seed=k)
        x = torch.randn(N, device="cuda")
        y0 = torch.randn(A.shape[0], device="cuda")
        want = sp.reference(A.row_ptr, A.col, A.val, x, y0, alpha=2.0, beta=0.5)
        for nt, ipt in cf.MERGE_CONFIGS:
            y = y0.clone()
            sp.csr_merge(A, x, y, 2.0, 0.5, nt=nt, ipt=ipt)
            assert bool(((y.double() - want).abs() <= _bound(A, x, 2.0, 0.5, y0)).all()), (k, nt, ipt)
