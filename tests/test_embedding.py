"""embedding: references and input checks on the CPU; every variant on the GPU (`pytest -m gpu`)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import poison
from tilewise.ops import embedding as em


def test_reference_matches_torch():
    w = torch.randn(11, 7)
    ids = torch.randint(0, 11, (3, 5))
    torch.testing.assert_close(em.reference(ids, w), w[ids])


@pytest.mark.parametrize("padding_idx", [None, 0, 4])
def test_reference_backward_matches_autograd(padding_idx):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(9, 6, generator=g, requires_grad=True)
    ids = torch.randint(0, 9, (4, 13), generator=g)
    gout = torch.randn(4, 13, 6, generator=g)
    (ref,) = torch.autograd.grad(F.embedding(ids, w, padding_idx=padding_idx), w, gout)
    ours = em.reference_backward(ids, gout, 9, padding_idx)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours.float(), ref, rtol=1e-5, atol=1e-5)


def test_reference_backward_ignores_out_of_range():
    gout = torch.ones(3, 2)
    out = em.reference_backward(torch.tensor([0, 5, -1]), gout, 2)
    assert out.tolist() == [[1.0, 1.0], [0.0, 0.0]]


def _bitonic_like_kernel(keys):
    """The kernel's compare-exchange schedule, step for step, in Python."""
    n = 1 << max(0, (len(keys) - 1).bit_length())
    a = list(keys) + [float("inf")] * (n - len(keys))
    size = 2
    while size <= n:
        stride = size >> 1
        while stride > 0:
            for t in range(n >> 1):
                i = 2 * t - (t & (stride - 1))
                j = i + stride
                up = (i & size) == 0
                if (a[i] > a[j]) == up:
                    a[i], a[j] = a[j], a[i]
            stride >>= 1
        size <<= 1
    return a[:len(keys)]


@pytest.mark.parametrize("n", [1, 2, 3, 31, 33, 100])
def test_bitonic_schedule_sorts(n):
    g = torch.Generator().manual_seed(n)
    keys = (torch.randint(0, 7, (n,), generator=g) * 1000 + torch.arange(n)).tolist()
    assert _bitonic_like_kernel(keys) == sorted(keys)


def _sort_like_v2(ids, V):
    """The v2 sort kernel in Python: keys (id << 32 | position; bad ids -> 0xFFFFFFFF, written out
    as V), the bitonic schedule, then row_start[v] = first sorted key >= v << 32 for v in [0, V]."""
    keys = [((i if 0 <= i < V else 0xFFFFFFFF) << 32) | p for p, i in enumerate(ids)]
    keys = _bitonic_like_kernel(keys)
    starts = []
    for v in range(V + 1):
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi) >> 1
            lo, hi = (mid + 1, hi) if keys[mid] < (v << 32) else (lo, mid)
        starts.append(lo)
    return starts, [k & 0xFFFFFFFF for k in keys]


def _segment_sum_like_kernel(row_start, sorted_pos, gout, V, pad, blocks, threads=256, U=8):
    """embedding_bwd_segment_sum's indexing in Python: warp w handles rows w, w + warps, ...;
    row v's segment is [row_start[v], row_start[v+1]); U partial sums per lane; output starts NaN."""
    n, E = gout.shape
    out = torch.full((V, E), float("nan"), dtype=torch.float64)
    warps = blocks * threads // 32
    for w in range(warps):
        for v in range(w, V, warps):
            begin, end = row_start[v], row_start[v + 1]
            if begin >= end or v == pad:
                out[v] = 0
                continue
            acc = torch.zeros(U, E, dtype=torch.float64)
            k = begin
            while k + U <= end:
                for u in range(U):
                    acc[u] += gout[sorted_pos[k + u]]
                k += U
            for u in range(U):
                if k + u < end:
                    acc[u] += gout[sorted_pos[k + u]]
            out[v] = acc.sum(0)
    return out


@pytest.mark.parametrize("fused_sort", [False, True])
@pytest.mark.parametrize("n,V,E,pad,blocks", [(1, 1, 1, None, 1), (37, 5, 3, None, 1), (37, 50, 3, 4, 1),
                                               (100, 23, 2, 0, 2), (9, 300, 4, None, 3), (0, 4, 2, None, 1)])
def test_backward_indexing_emulated(fused_sort, n, V, E, pad, blocks):
    """The backward's sort, segment starts and segment sum, step for step on the CPU: every row
    written (zeros for rows no id names), out-of-range ids ignored, more rows than warps."""
    if fused_sort and n == 0:
        pytest.skip("the launcher sends n = 0 down v1's path")
    g = torch.Generator().manual_seed(n * 100 + V)
    ids = torch.randint(-2, V + 2, (n,), generator=g)
    gout = torch.randn(n, E, generator=g, dtype=torch.float64)
    if fused_sort:
        starts, spos = _sort_like_v2(ids.tolist(), V)
    else:  # the launcher's torch path, run for real
        keyed = torch.where((ids >= 0) & (ids < V), ids, torch.full_like(ids, V))
        sids, spos = torch.sort(keyed, stable=True)
        starts = torch.searchsorted(sids, torch.arange(V + 1), out_int32=True).tolist()
        spos = spos.tolist()
    # the launcher's grid: min(resident wave, ceil(V * 32 / 256)); here a small "wave" of `blocks`
    grid = max(1, min(blocks, -(-V * 32 // 256)))
    got = _segment_sum_like_kernel(starts, spos, gout, V, -1 if pad is None else pad, grid)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, em.reference_backward(ids, gout, V, pad))


def test_cost():
    c = em.cost(64 * 64, 20000, 50)
    assert c.flops == 0 and c.bytes == 64 * 64 * 8 + 2 * 64 * 64 * 50 * 4
    cb = em.cost(64 * 64, 20000, 50, backward=True)
    assert cb.bytes == c.bytes + 64 * 64 * 8 + 64 * 64 * 50 * 4 + 20000 * 50 * 4
    assert cb.flops == 64 * 64 * 50


def test_input_checks_on_cpu():
    w = torch.randn(5, 3)
    with pytest.raises(ValueError, match="CUDA"):
        em.embedding(torch.tensor([[1]]), w)
    with pytest.raises(ValueError, match="unknown variant"):
        em.embedding(torch.tensor([[1]]), w, variant="v9")
    with pytest.raises(ValueError, match="'ids' must be a torch.Tensor"):
        em.embedding([1, 2], w)


# --------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
DTYPE_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


@gpu
@pytest.mark.parametrize("variant", list(em.VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,V,E", [((1, 1), 1, 1), ((31, 33), 1000, 50), ((64, 64), 20000, 50),
                                       ((4097,), 33, 31), ((3, 3000), 7, 129), ((1, 9000), 4097, 33),
                                       ((7, 9), 70001, 3)])  # the last: past v2's one-block row starts
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_forward_backward_gpu(variant, dtype, shape, V, E, id_dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(V, E, device="cuda", generator=g).to(dtype).requires_grad_()
    ids = torch.randint(0, V, shape, device="cuda", generator=g).to(id_dtype)
    out = em.VARIANTS[variant](ids, w)
    assert out.shape == (*shape, E) and out.dtype == dtype
    assert torch.equal(out, w.detach()[ids.long()])  # a gather: exact
    gout = torch.randn(*shape, E, device="cuda", generator=g).to(dtype)
    ref = em.reference_backward(ids, gout.float(), V)
    # Through autograd. (Not via a NaN-filled w.grad: autograd ADDS into an existing .grad, so a
    # poisoned .grad stays NaN whatever the kernel writes; that was this test's own bug.)
    (gw,) = torch.autograd.grad(out, w, gout)
    assert gw.dtype == dtype and not torch.isnan(gw).any()
    assert _rel(gw, ref) <= DTYPE_TOL[dtype] * 4
    # The kernel itself, writing into a NaN-filled buffer: every element must be written.
    buf = poison(torch.empty(V, E, device="cuda", dtype=dtype))
    em._backward(ids.contiguous(), gout, V, None, variant == "v2_fused_sort", out=buf)
    assert not torch.isnan(buf).any()
    assert torch.equal(buf, gw)  # same order of adds: the same bits


@gpu
def test_backward_adds_into_existing_grad_gpu():
    w = torch.randn(40, 8, device="cuda", requires_grad=True)
    ids = torch.randint(0, 40, (5, 7), device="cuda")
    gout = torch.randn(5, 7, 8, device="cuda")
    w.grad = torch.ones_like(w)
    em.embedding(ids, w).backward(gout)
    ref = em.reference_backward(ids, gout, 40) + 1
    torch.testing.assert_close(w.grad.double(), ref, rtol=1e-5, atol=1e-5)


@gpu
@pytest.mark.parametrize("variant", list(em.VARIANTS))
def test_backward_is_deterministic_and_padding_idx(variant):
    V, E = 50, 50
    ids = torch.randint(0, V, (64, 64), device="cuda")
    ids[:, 40:] = 3  # a long segment, as padding makes
    w = torch.randn(V, E, device="cuda", requires_grad=True)
    gout = torch.randn(64, 64, E, device="cuda")
    grads = []
    for _ in range(3):
        w.grad = None
        em.VARIANTS[variant](ids, w, padding_idx=3).backward(gout)
        grads.append(w.grad.clone())
    assert all(torch.equal(grads[0], x) for x in grads[1:])
    assert not grads[0][3].any()
    ref = em.reference_backward(ids, gout, V, padding_idx=3)
    assert _rel(grads[0], ref) < 1e-5


@gpu
def test_out_of_range_ids_gpu():
    w = torch.randn(5, 4, device="cuda", requires_grad=True)
    ids = torch.tensor([[0, 5, -1, 4]], device="cuda")
    out = em.embedding(ids, w)
    assert torch.isnan(out[0, 1]).all() and torch.isnan(out[0, 2]).all()
    assert torch.equal(out[0, 0], w[0]) and torch.equal(out[0, 3], w[4])
    for variant in em.VARIANTS:
        w.grad = None
        em.VARIANTS[variant](ids, w).backward(torch.ones(1, 4, 4, device="cuda"))
        assert w.grad.sum(1).tolist() == [4.0, 0.0, 0.0, 0.0, 4.0]


@gpu
def test_input_checks_gpu():
    w = torch.randn(5, 3, device="cuda")
    with pytest.raises(ValueError, match="'ids' has dtype"):
        em.embedding(torch.tensor([[1.0]], device="cuda"), w)
    with pytest.raises(ValueError, match="2-D"):
        em.embedding(torch.tensor([[1]], device="cuda"), w[None])
    with pytest.raises(ValueError, match="not contiguous"):
        em.embedding(torch.tensor([[1]], device="cuda"), torch.randn(3, 5, device="cuda").t())
    with pytest.raises(ValueError, match="padding_idx"):
        em.embedding(torch.tensor([[1]], device="cuda"), w, padding_idx=5)
    empty = em.embedding(torch.empty(0, 4, dtype=torch.int64, device="cuda"), w)
    assert empty.shape == (0, 4, 3)


@gpu
def test_cuda_graph_capture_gpu():
    w = torch.randn(100, 50, device="cuda", requires_grad=True)
    ids = torch.randint(0, 100, (64, 64), device="cuda")
    gout = torch.randn(64, 64, 50, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            w.grad = None
            em.embedding(ids, w).backward(gout)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    w.grad = None
    with torch.cuda.graph(graph):
        out = em.embedding(ids, w)
        out.backward(gout)
    ids.copy_(torch.randint(0, 100, (64, 64), device="cuda"))
    graph.replay()
    torch.testing.assert_close(out, w.detach()[ids])
    # fp32 sums against a float64 reference: fp32 tolerances, not float64's default 1e-7.
    torch.testing.assert_close(w.grad, em.reference_backward(ids, gout, 100).float(), rtol=1e-5, atol=1e-5)


@gpu
def test_torch_compile_traces_the_custom_op_gpu():
    w = torch.randn(300, 50, device="cuda", requires_grad=True)
    ids = torch.randint(0, 300, (31, 33), device="cuda")
    f = torch.compile(lambda i, ww: (em.embedding(i, ww) * 2.0).sum(), fullgraph=True)
    f(ids, w).backward()
    ref = em.reference_backward(ids, torch.full((31, 33, 50), 2.0, device="cuda"), 300)
    torch.testing.assert_close(w.grad, ref.float(), rtol=1e-5, atol=1e-5)
