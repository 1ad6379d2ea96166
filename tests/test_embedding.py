"""embedding: references and input checks on the CPU; every variant on the GPU (`pytest -m gpu`)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import poison
from tilewise.ops.embedding import api as em
from tilewise.ops.embedding import configs as cf


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
    ids = torch.tensor([[1, 4], [0, 1]])
    torch.testing.assert_close(em.embedding(ids, w, padding_idx=1), w[ids])  # the one CPU rule
    with pytest.raises(ValueError, match="CUDA"):  # a version is a kernel
        em.v4_block_scan(ids, w)
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
@pytest.mark.quick(rotate=("shape", "V", "E"))
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
    kind = {"v1_naive": 0, "v2_fused_sort": 1, "v3_scan": cf.SCAN, "v4_block_scan": cf.BLOCK_SCAN}[variant]
    em._backward(ids.contiguous(), gout, V, None, kind, out=buf)
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


def test_sort_workspace_reuse_rules(monkeypatch):
    """The backward's sort buffers are reused per (device, stream, n, V), fresh while capturing."""
    stream = [7]
    capturing = [False]
    monkeypatch.setattr(em, "_raw_stream", lambda dev: stream[0])
    monkeypatch.setattr(em, "_capturing", lambda: capturing[0])
    monkeypatch.setattr(em, "_workspaces", {})
    dev = torch.device("cpu")
    a = em._workspace(10, 5, dev, 0)
    assert a[0].shape == (10,) and a[0].dtype == torch.int64
    assert a[1].shape == (6,) and a[1].dtype == torch.int32
    b = em._workspace(10, 5, dev, 0)
    assert b[0] is a[0] and b[1] is a[1]
    assert em._workspace(11, 5, dev, 0)[0] is not a[0]  # another size
    stream[0] = 8
    assert em._workspace(10, 5, dev, 0)[0] is not a[0]  # another stream
    stream[0] = 7
    capturing[0] = True
    c = em._workspace(10, 5, dev, 0)
    assert c[0] is not a[0] and len(em._workspaces) == 3  # not cached
    capturing[0] = False
    for n in range(20):
        em._workspace(100 + n, 5, dev, 0)
    assert len(em._workspaces) <= em._MAX_WORKSPACES


@gpu
@pytest.mark.parametrize("variant", ["v1_naive", "v2_fused_sort"])
def test_repeated_calls_reuse_workspace_gpu(variant):
    """Back-to-back steps with different ids (the workspace reused, no sync between them), and a
    step on a second stream: every gradient matches its reference."""
    V, E = 1000, 50
    w = torch.randn(V, E, device="cuda", requires_grad=True)
    grads, refs = [], []
    for i in range(4):
        ids = torch.randint(0, V, (31, 33), device="cuda")
        gout = torch.randn(31, 33, E, device="cuda")
        grads.append(torch.autograd.grad(em.VARIANTS[variant](ids, w), w, gout)[0])
        refs.append(em.reference_backward(ids, gout, V).float())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ids = torch.randint(0, V, (31, 33), device="cuda")
        gout = torch.randn(31, 33, E, device="cuda")
        grads.append(torch.autograd.grad(em.VARIANTS[variant](ids, w), w, gout)[0])
        refs.append(em.reference_backward(ids, gout, V).float())
    torch.cuda.current_stream().wait_stream(s)
    for g, r in zip(grads, refs):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_launch_plumbing_with_recorded_kernels(monkeypatch):
    """forward + backward through the autograd.Function with the kernels replaced by recorders
    (CPU tensors): what each launch gets, and the sort buffers passed on to the segment sum."""
    calls = []

    class Rec:
        def __init__(self, name):
            self.name = name

        def __call__(self, grid, block, *args, shmem=0):
            calls.append((self.name, grid, block, args, shmem))

    plan = (Rec("fwd"), 264, Rec("sort"), Rec("seg"), 528)
    monkeypatch.setattr(em, "_plan", lambda *a: plan)
    monkeypatch.setattr(em, "_check", lambda ids, w, p: ids.contiguous())
    monkeypatch.setattr(em, "runs_reference", lambda *a, **k: False)  # the launches, recorded, on CPU tensors
    V, E = 300, 5
    w = torch.randn(V, E, requires_grad=True)
    ids = torch.randint(0, V, (7, 9))
    out = em.v2_fused_sort(ids, w, padding_idx=3)
    assert out.shape == (7, 9, E)
    name, grid, block, args, _ = calls[0]
    assert name == "fwd" and block == 256 and grid == min(264, -(-63 * E // 256))
    assert args[0] is not None and args[3:] == (63, V, E)
    out.backward(torch.ones_like(out))
    (_, g1, b1, sargs, shmem), (_, g2, b2, gargs, _) = calls[1], calls[2]
    assert (g1, b1, shmem) == (1, 1024, 64 * 8)
    assert sargs[1].shape == (63,) and sargs[1].dtype == torch.int64
    assert sargs[2].shape == (V + 1,) and sargs[2].dtype == torch.int32
    assert sargs[3:] == (63, V, 64)
    assert gargs[0] is sargs[2] and gargs[1] is sargs[1]  # row_start, sorted_pos
    assert gargs[3].shape == (V, E) and w.grad.shape == (V, E) and gargs[4:] == (V, E, 3)
    assert b2 == 256 and g2 == min(528, -(-V * 32 // 256))
    out.backward(torch.ones_like(out))  # retain_graph is not needed for a Function without saved tensors
    assert [c[0] for c in calls] == ["fwd", "sort", "seg", "sort", "seg"]


def test_block_scan_config_travels_to_the_backward(monkeypatch):
    """v4_block_scan's ``config=`` is a per-call choice: the backward of that call launches that
    configuration's kernel, a call without it the default's (kernels replaced by recorders)."""
    launches = []

    class Rec:
        def __init__(self, cfg=None):
            self.cfg = cfg

        def __call__(self, grid, block, *args, shmem=0):
            launches.append((self.cfg, grid, block, shmem))

    monkeypatch.setattr(em, "_plan", lambda *a: (Rec(), 1, Rec(), Rec(), 1))
    monkeypatch.setattr(em, "_check", lambda ids, w, p: ids.contiguous())
    monkeypatch.setattr(em, "runs_reference", lambda *a, **k: False)  # the launches, recorded, on CPU tensors
    monkeypatch.setattr(em, "_block_scan_kernel", lambda dtype, id_dtype, dev, cfg: Rec(cfg))
    V, E = 300, 5
    w = torch.randn(V, E, requires_grad=True)
    ids = torch.randint(0, V, (7, 9))
    em.v4_block_scan(ids, w, config=(8, 8, 64)).sum().backward()
    em.embedding(ids, w).sum().backward()
    scans = [c for c in launches if c[0] is not None]
    assert scans == [((8, 8, 64), 5, 256, (8 * 64 * E + 63) * 4),
                     (cf.BLOCK_SCAN_DEFAULT, 10, 128, (4 * 32 * E + 63) * 4)]


def test_scan_applies_limits():
    assert cf.scan_applies(4096, 14819, 50)
    assert not cf.scan_applies(0, 10, 50)
    assert not cf.scan_applies(cf.SCAN_MAX_IDS + 1, 10, 50)
    assert not cf.scan_applies(4096, (1 << 28) // 4096 + 1, 50)
    assert not cf.scan_applies(64, 10, 257)
    assert [cf.scan_chunks(e) for e in (1, 32, 33, 64, 65, 128, 129, 256)] == [1, 1, 2, 2, 4, 4, 8, 8]


@gpu
@pytest.mark.parametrize("kind,cfg", [("scan", None), ("block_scan", None)]
                         + [("block_scan", c) for c in cf.BLOCK_SCAN_EXTRA])
@pytest.mark.parametrize("E", [1, 50, 100, 256])
def test_scan_backward_frequent_ids_padding_and_bad_ids_gpu(E, kind, cfg):
    """v3_scan: a frequent id (a long position list), padding, out-of-range ids and a table whose
    row count is not a multiple of a block's rows; every row written (NaN-filled buffer)."""
    V = 1000 * 4 + 3
    g = torch.Generator(device="cuda").manual_seed(E)
    ids = torch.randint(0, V, (61, 67), device="cuda", generator=g)
    ids[:, 40:] = 0               # padding, as in padded sentences
    ids[3, :20] = 17              # one frequent word
    ids[5, 1] = V + 5             # out of range: no gradient anywhere
    ids[6, 2] = -3
    gout = torch.randn(61, 67, E, device="cuda", generator=g)
    ref = em.reference_backward(ids.clamp(0, V - 1), gout.float(), V)
    ref_fix = ref.clone()
    # remove the two bad positions' contributions from the clamped reference
    ref_fix[V - 1] -= gout[5, 1].double()
    ref_fix[0] -= gout[6, 2].double()
    ref_fix[0] = 0.0              # padding_idx
    buf = poison(torch.empty(V, E, device="cuda"))
    k = cf.SCAN if kind == "scan" else cf.BLOCK_SCAN
    em._backward(ids, gout, V, 0, k, out=buf, config=cfg)
    assert not torch.isnan(buf).any()
    assert _rel(buf, ref_fix.float()) <= 1e-5
    again = poison(torch.empty(V, E, device="cuda"))
    em._backward(ids, gout, V, 0, k, out=again, config=cfg)
    assert torch.equal(buf, again)  # deterministic


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("E", [31, 50, 100, 200])  # one per chunks-a-row build (_scan_chunks: 1, 2, 4, 8)
def test_scan_backward_every_build_gpu(E, id_dtype, dtype):
    """Each embedding_bwd_scan_v3<T, index, chunks> the module builds, at a row width that is not
    a multiple of its chunk, with repeated ids and padding, against the float64 reference."""
    V = 777
    g = torch.Generator(device="cuda").manual_seed(E)
    ids = torch.randint(0, V, (9, 37), device="cuda", generator=g)
    ids[0, :25] = 5                # a repeated id
    ids[:, 30:] = 3                # padding
    ids = ids.to(id_dtype)
    gout = torch.randn(9, 37, E, device="cuda", generator=g).to(dtype)
    ref = em.reference_backward(ids, gout, V, padding_idx=3)
    buf = poison(torch.empty(V, E, device="cuda", dtype=dtype))
    em._backward(ids, gout, V, 3, cf.SCAN, out=buf)
    assert not torch.isnan(buf).any()
    assert _rel(buf, ref) <= DTYPE_TOL[dtype] * 4


def test_module_names_are_instantiated_in_the_cu():
    """Every kernel name _module asks NVRTC for is instantiated by embedding.cu (a name missing
    there fails only when the module loads, on a GPU)."""
    from pathlib import Path

    from tilewise.runtime import cuda as rtc

    declared = set(rtc.name_expressions_for(Path(em.__file__).with_name("embedding.cu")))
    asked = set(em.module_names()) | set(em.module_names(extra=True))
    assert asked <= declared, sorted(asked - declared)
    assert not set(em.module_names()) & set(em.module_names(extra=True))


def test_block_scan_limits():
    assert cf.block_scan_applies(4096, 14819, 50)
    assert cf.block_scan_shmem(4096, 50) == (4 * 32 * 50 + 4096) * 4
    assert cf.block_scan_shmem(4096, 50, (8, 8, 64)) == (8 * 64 * 50 + 4096) * 4
    with pytest.raises(ValueError, match="not built"):
        cf.block_scan_config((2, 2, 2))
    assert cf.block_scan_config(None) == cf.BLOCK_SCAN_DEFAULT and cf.block_scan_config([4, 8, 64]) == (4, 8, 64)
    with pytest.raises(ValueError, match="not built"):
        em.v4_block_scan(torch.zeros(2, dtype=torch.long), torch.zeros(3, 4), config=(2, 2, 2))
    with pytest.raises(ValueError, match="takes none"):
        em.embedding(torch.zeros(2, dtype=torch.long), torch.zeros(3, 4), variant="v3_scan", config=(4, 8, 64))
    assert not cf.block_scan_applies(60000, 10, 50)   # shared memory
    assert not cf.block_scan_applies(0, 10, 50)
