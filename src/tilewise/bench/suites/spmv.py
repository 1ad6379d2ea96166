"""spmv over a matrix suite generated from seeds (no downloads), beside PyTorch's CSR ``A @ x``
(cuSPARSE) in the same run: every kernel at every applicable width, the format conversions' cost
(op ``spmv_convert``, csr_merge's partition plan included), and the kernel ``spmv()`` picks
(variant ``auto=<kernel>``). csr_merge runs at its default (nt, ipt) here; every (nt, ipt) is timed
by research/spmv_variants.py.

Matrices (``make_matrix(kind, small)``; ``small`` is the test-sized version):
    uniform:   2M x 2M, 32 random columns per row
    powerlaw:  2M x 2M, lengths 2 * u^(-1/1.6) clipped to [2, 100000] (most 2 to 10) + 8 rows of 100k
    banded5:   5-point stencil on a 2048 x 2048 grid
    banded27:  27-point stencil on a 128^3 grid
    short:     8M x 8M, 1 to 3 per row
    wide:      256 x 4M, 32k to 96k per row
"""

from __future__ import annotations

import torch

from ...ops.spmv import api as op
from ..harness import check, time_ms

KINDS = ("uniform", "powerlaw", "banded5", "banded27", "short", "wide")


def _random_rows(lengths: torch.Tensor, N: int, g: torch.Generator) -> op.CSR:
    """Random columns in [0, N) for rows of the given lengths, sorted within each row."""
    dev = lengths.device
    M = lengths.numel()
    nnz = int(lengths.sum())
    rows = torch.repeat_interleave(torch.arange(M, device=dev), lengths, output_size=nnz)
    cols = torch.randint(0, N, (nnz,), device=dev, generator=g)
    key, _ = torch.sort(rows * N + cols)  # row-major order: rows stay in place, columns sorted
    col = key - rows * N
    row_ptr = torch.zeros(M + 1, dtype=torch.int64, device=dev)
    row_ptr[1:] = torch.cumsum(lengths, 0)
    val = torch.randn(nnz, device=dev, generator=g)
    return op.CSR.from_arrays(row_ptr, col, val, (M, N))


def _stencil(dims: tuple[int, ...], offsets: list[tuple[int, ...]], g: torch.Generator, dev) -> op.CSR:
    """A stencil matrix on a grid (row-major points); offsets sorted by linear distance so that
    columns come out sorted."""
    M = 1
    for d in dims:
        M *= d
    coords = torch.stack(torch.meshgrid(*[torch.arange(d, device=dev) for d in dims], indexing="ij"), -1).view(M, -1)
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    offsets = sorted(offsets, key=lambda o: sum(a * s for a, s in zip(o, strides)))
    off = torch.tensor(offsets, device=dev)
    nb = coords[:, None, :] + off[None, :, :]  # (M, S, D)
    ok = ((nb >= 0) & (nb < torch.tensor(dims, device=dev))).all(-1)
    lin = (nb * torch.tensor(strides, device=dev)).sum(-1)
    col = lin[ok]
    row_ptr = torch.zeros(M + 1, dtype=torch.int64, device=dev)
    row_ptr[1:] = torch.cumsum(ok.sum(1), 0)
    val = torch.randn(col.numel(), device=dev, generator=g)
    return op.CSR.from_arrays(row_ptr, col, val, (M, M))


def make_matrix(kind: str, small: bool = False, seed: int = 0, device="cuda") -> op.CSR:
    g = torch.Generator(device=device).manual_seed(seed)
    dev = torch.device(device)
    if kind == "uniform":
        M = 2000 if small else 2_000_000
        return _random_rows(torch.full((M,), 32, device=dev), M, g)
    if kind == "powerlaw":
        M = 3000 if small else 2_000_000
        n_long, long_len = (2, 5000) if small else (8, 100_000)
        u = torch.rand(M, device=dev, generator=g).clamp_min(1e-12)
        lengths = (2 * u.pow(-1 / 1.6)).floor().clamp(2, 100_000).long()
        lengths[torch.randperm(M, device=dev, generator=g)[:n_long]] = long_len
        return _random_rows(lengths, M, g)
    if kind == "banded5":
        n = 37 if small else 2048
        offs = [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)]
        return _stencil((n, n), offs, g, dev)
    if kind == "banded27":
        n = 9 if small else 128
        offs = [(a, b, c) for a in (-1, 0, 1) for b in (-1, 0, 1) for c in (-1, 0, 1)]
        return _stencil((n, n, n), offs, g, dev)
    if kind == "short":
        M = 1001 if small else 8_000_000
        return _random_rows(torch.randint(1, 4, (M,), device=dev, generator=g), M, g)
    if kind == "wide":
        M, N = (7, 20000) if small else (256, 4_000_000)
        lo, hi = (4100, 9000) if small else (32_000, 96_000)
        return _random_rows(torch.randint(lo, hi, (M,), device=dev, generator=g), N, g)
    raise ValueError(f"unknown matrix kind {kind!r}; choose from {KINDS}")


def kernels_for(A: op.CSR):
    """(variant name, format builder, call) for every kernel that applies to A."""
    out = [("csr_scalar", None, op.csr_scalar)]
    for s in (2, 4, 8, 16, 32):
        out.append((f"csr_vector/sub={s}", None, lambda A_, x, y, s=s: op.csr_vector(A_, x, y, sub=s)))
    out.append(("csr_split", None, op.csr_split))
    out.append(("csr_merge", None, op.csr_merge))
    out.append(("csr_stream", None, op.csr_stream))
    out.append(("ell", op.ELL.from_csr, op.ell))
    out.append(("jds", op.JDS.from_csr, op.jds))
    out.append(("panels", op.Panels.from_csr, op.panels))
    return out


def run(r) -> None:
    for kind in KINDS:
        r.status(f"spmv {kind}: building")
        A = make_matrix(kind, seed=0)
        M, N = A.shape
        st = A.stats
        # The row-length statistics that choose() reads travel with every row of the table.
        shape = f"{kind} {M}x{N} nnz={A.nnz} mean={st.mean:.1f} max={st.max}"
        r.log(f"spmv {shape}: row lengths mean {st.mean:.1f}, max {st.max}, std {st.std:.1f}")
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(N, device="cuda", generator=g)
        y = torch.empty(M, device="cuda")
        ref = op.reference(A.row_ptr, A.col, A.val, x)
        c = op.cost(M, N, A.nnz)
        r.add("spmv_convert", "arrays->csr(validate)", shape, torch.float32, A.build_ms)

        At = A.to_torch()
        check("spmv.torch.sparse", At @ x, ref, tol=1e-4)
        base_ms = time_ms(lambda: At @ x)
        r.add("spmv", "torch.sparse", shape, torch.float32, base_ms, c)

        P = op.merge_plan(A)  # built here so that its cost has a row, not hidden in the first call
        r.add("spmv_convert", f"csr->merge_plan(tile={P.tile})", shape, torch.float32, P.build_ms)

        times = {}
        for name, build, fn in kernels_for(A):
            r.status(f"spmv {kind}: {name}")
            F = A
            if build is not None:
                try:
                    F = build(A)
                except ValueError as e:  # ELL refused: the padding would dominate
                    r.log(f"spmv {shape}: {name} skipped: {e}")
                    continue
                r.add("spmv_convert", f"csr->{name}", shape, torch.float32, F.build_ms)
            y.fill_(float("nan"))
            fn(F, x, y)
            check(f"spmv.{name}", y, ref, tol=1e-4)
            times[name] = ms = time_ms(lambda: fn(F, x, y))
            r.add("spmv", name, shape, torch.float32, ms, c, baseline="torch.sparse", baseline_ms=base_ms)
            del F

        choice = op.choose(st)
        y.fill_(float("nan"))
        op.spmv(A, x, y)  # builds (and keeps with A) the ELL / JDS copy when choice needs one
        check("spmv.auto", y, ref, tol=1e-4)
        if op.FORMAT_OF[choice] is not op.CSR:
            F = op.converted(A, op.FORMAT_OF[choice])
            if F is None:  # refused: spmv fell back to a CSR kernel
                choice = op.choose(st, convert=False)
            else:
                r.add("spmv_convert", f"auto:csr->{choice}", shape, torch.float32, F.build_ms)
        auto_ms = time_ms(lambda: op.spmv(A, x, y))
        r.add("spmv", f"auto={choice}", shape, torch.float32, auto_ms, c, baseline="torch.sparse",
              baseline_ms=base_ms)
        best = min(times, key=times.get)
        r.log(f"spmv {shape}: auto={choice} {base_ms / auto_ms:.2f}x cuSPARSE; best {best} "
              f"{base_ms / times[best]:.2f}x")
        del A, At, x, y, ref
        torch.cuda.empty_cache()
