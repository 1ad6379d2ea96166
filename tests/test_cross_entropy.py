import pytest
import torch
import torch.nn.functional as F

from tilewise.bench.harness import peak_extra_bytes
from tilewise.ops.rowwise import cross_entropy as ce

from conftest import HAS_CUDA

@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # the inputs made with the default generator repeat from run to run


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
KERNELS = ["v2_fused", "v3_online", "v4_cluster"]


def _rel(out, ref):
    o, r = out.double(), ref.double()
    assert not torch.isnan(o).any(), "NaN in output"
    return ((o - r).norm() / r.norm().clamp_min(1e-2)).item()  # C = 1: loss and grad are 0


def _case(N, C, dtype, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(N, C, generator=g, device=device) * 2).to(dtype)
    t = torch.randint(0, C, (N,), generator=g, device=device)
    if N > 3:
        t[3] = -100
    return x, t


def _ours_and_torch(x, t, variant, **kw):
    a = x.clone().requires_grad_()
    b = x.double().requires_grad_()
    la = ce.cross_entropy(a, t, variant=variant, **kw)
    lb = F.cross_entropy(b, t, **kw)
    w = torch.randn(la.shape, dtype=torch.float64, device=x.device)
    (la.double() * w).sum().backward()
    (lb * w).sum().backward()
    return la, lb, a.grad, b.grad


# ---------------------------------------------------------------- CPU

def test_reference_is_torch():
    x, t = _case(9, 5, torch.float32)
    torch.testing.assert_close(ce.reference(x, t), F.cross_entropy(x, t))
    torch.testing.assert_close(ce.reference(x, t, "none", label_smoothing=0.2),
                               F.cross_entropy(x, t, reduction="none", label_smoothing=0.2))


def test_cost():
    c = ce.cost(8192, 131072, torch.bfloat16)
    assert c.bytes == 2 * 2 * 8192 * 131072 + 8 * 8192
    assert ce.cost(4, 3, torch.float32, grad=False).bytes == 4 * 12 + 32


@pytest.mark.skipif(HAS_CUDA, reason="CPU-only checks")
def test_input_errors():
    x, t = _case(4, 5, torch.float32)
    with pytest.raises(ValueError, match=r"out of range \[0, 5\).*e.g. 5"):
        ce.cross_entropy(x, torch.tensor([0, 5, 1, 2]))
    with pytest.raises(ValueError, match="out of range"):
        ce.cross_entropy(x, torch.tensor([0, -1, 1, 2]))
    with pytest.raises(ValueError, match="integer class indices"):
        ce.cross_entropy(x, t.float())
    with pytest.raises(ValueError, match="'logits' has dtype torch.int64"):
        ce.cross_entropy(x.long(), t)
    with pytest.raises(ValueError, match="must be 2-D"):
        ce.cross_entropy(x[0], t)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        ce.cross_entropy(x, t[:3])
    with pytest.raises(ValueError, match="reduction"):
        ce.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        ce.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="unknown variant"):
        ce.cross_entropy(x, t, variant="v1_torch")
    with pytest.raises(ValueError, match="exceeds 131072"):
        ce.cross_entropy(torch.zeros(1, ce.MAX_CLUSTER + 1), torch.zeros(1, dtype=torch.long),
                         variant="v4_cluster")
    with pytest.raises(ValueError, match="does not fit"):
        ce.cross_entropy(torch.zeros(1, ce.MAX_FUSED + 1), torch.zeros(1, dtype=torch.long),
                         variant="v2_fused")
    # ignore_index is allowed whatever its value
    ce.cross_entropy(x, torch.tensor([0, 7, 1, 2]), ignore_index=7)


def test_cpu_without_interpreter_runs_the_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, t = torch.randn(4, 3), torch.tensor([0, 2, 1, -100])
    torch.testing.assert_close(ce.cross_entropy(x, t, label_smoothing=0.2), ce.reference(x, t, label_smoothing=0.2))


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs on CPU tensors")
@pytest.mark.parametrize("C", [1, 2, 3, 1000])
@pytest.mark.parametrize("variant", KERNELS)
def test_interpreter_against_torch(variant, C):
    N = 3 if C == 1000 else 7  # the interpreter is slow: keep the big-C case small
    x, t = _case(N, C, torch.float32, seed=C)
    for red in ("mean", "sum", "none"):
        for ls in ((0.0, 0.1) if C != 1000 else (0.1,)):
            la, lb, ga, gb = _ours_and_torch(x, t, variant, reduction=red, label_smoothing=ls)
            assert _rel(la, lb) < 1e-5, (red, ls)
            assert _rel(ga, gb) < 1e-5, (red, ls)


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs on CPU tensors")
def test_interpreter_bf16_ignore_index_and_masked_rows():
    x, t = _case(6, 37, torch.bfloat16, seed=3)
    t[0], t[3] = 5, 7
    x[1, :] = float("-inf")                 # all masked, its target ignored: loss 0, grad 0
    t[1] = 7
    x[2, ::2] = float("-inf")               # partly masked, target on a live class
    t[2] = 1
    for v in KERNELS:
        a = x.clone().requires_grad_()
        la = ce.cross_entropy(a, t, reduction="none", ignore_index=7, variant=v)
        la.sum().backward()
        lb = F.cross_entropy(x.double(), t, reduction="none", ignore_index=7)
        assert la[1] == 0 and torch.equal(a.grad[1], torch.zeros(37, dtype=torch.bfloat16))
        assert _rel(la, lb) < 1e-2
        assert not torch.isnan(a.grad).any()


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs on CPU tensors")
def test_interpreter_empty_and_all_ignored_and_no_grad():
    x = torch.zeros(0, 5, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long)
    assert torch.isnan(ce.cross_entropy(x, t)) and torch.isnan(F.cross_entropy(x, t))
    assert ce.cross_entropy(x, t, reduction="sum") == 0
    assert ce.cross_entropy(x, t, reduction="none").shape == (0,)
    x, _ = _case(4, 5, torch.float32)
    t = torch.full((4,), -100)
    assert torch.isnan(ce.cross_entropy(x, t)) and torch.isnan(F.cross_entropy(x, t))
    x.requires_grad_()
    ce.cross_entropy(x, t, reduction="sum").backward()
    assert torch.equal(x.grad, torch.zeros(4, 5))
    with torch.no_grad():
        x2, t2 = _case(4, 5, torch.float32)
        torch.testing.assert_close(ce.cross_entropy(x2, t2), F.cross_entropy(x2, t2))


def test_fake_impl_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(4, 8, dtype=torch.bfloat16)
        t = torch.empty(4, dtype=torch.long)
        loss, g = torch.ops.tilewise.cross_entropy_fwd(x, t, "none", -100, 0.0, True, "v2_fused", [])
        assert loss.shape == (4,) and g.shape == (4, 8) and g.dtype == torch.bfloat16
        loss, g = torch.ops.tilewise.cross_entropy_fwd(x, t, "mean", -100, 0.0, False, "v3_online", [])
        assert loss.shape == () and g.numel() == 0


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (31, 2), (33, 3), (1000, 33), (17, 4097), (5, 16384),
                                   (7, 16385), (5, 100003), (3, 131075)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", KERNELS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.quick(rotate="shape")
def test_gpu_variants_against_torch(variant, dtype, shape, reduction):
    N, C = shape
    if variant == "v2_fused" and C > ce.MAX_FUSED or variant == "v4_cluster" and C > ce.MAX_CLUSTER:
        pytest.skip("C larger than this version holds")
    if variant == "v4_cluster" and C > ce.CLUSTER_SLICE and ce.cluster_unsupported_reason():
        pytest.skip(ce.cluster_unsupported_reason())  # test_gpu_cluster_fails_cleanly checks the error
    x, t = _case(N, C, dtype, "cuda", seed=N + C)
    for ls in (0.0, 0.1):
        la, lb, ga, gb = _ours_and_torch(x, t, variant, reduction=reduction, label_smoothing=ls)
        assert _rel(la, lb) <= TOL[dtype]
        assert _rel(ga, gb) <= 2 * TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", list(ce.VARIANTS))
def test_gpu_every_table_entry(variant, dtype):
    """Each VARIANTS entry called through the table, loss and gradient, at 37 x 1000 (a row every
    version holds: whole 16-byte vectors, not a multiple of any block), smoothing and an ignored row."""
    if variant == "v7_cluster_tma" and dtype == torch.float32:
        pytest.skip("v7 is built for 2-byte types (tests/test_rowwise_cluster.py checks the error)")
    x, t = _case(37, 1000, dtype, "cuda", seed=3)
    t[4] = -100
    a = x.clone().requires_grad_()
    b = x.double().requires_grad_()
    la = ce.VARIANTS[variant](a, t, reduction="none", label_smoothing=0.1)
    lb = F.cross_entropy(b, t, reduction="none", label_smoothing=0.1)
    w = torch.randn(la.shape, dtype=torch.float64, device="cuda")
    (la.double() * w).sum().backward()
    (lb * w).sum().backward()
    assert _rel(la.detach(), lb.detach()) <= TOL[dtype]
    assert _rel(a.grad, b.grad) <= 2 * TOL[dtype]


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs on CPU tensors")
def test_interpreter_grad_is_adopted_not_copied(monkeypatch):
    """backward hands out the forward's gradient with no other reference left, so AccumulateGrad
    adopts it as .grad (no copy: peak extra memory = the gradient, not twice it)."""
    made = []
    launch = ce._launch

    def spy(*a, **k):
        loss, grad = launch(*a, **k)
        made.append(grad.data_ptr())
        return loss, grad

    monkeypatch.setattr(ce, "_launch", spy)
    x, t = _case(6, 37, torch.float32)
    x.requires_grad_()
    ce.cross_entropy(x, t).backward()
    assert x.grad.data_ptr() == made[-1]
    ref = x.detach().clone().requires_grad_()
    F.cross_entropy(ref, t).backward()
    assert _rel(x.grad, ref.grad) < 1e-5
    # an upstream gradient other than 1 scales in place; a second backward is a clear error
    y = x.detach().clone().requires_grad_()
    loss = ce.cross_entropy(y, t, reduction="sum")
    (2.5 * loss).backward(retain_graph=True)
    assert y.grad.data_ptr() == made[-1]
    ref2 = x.detach().clone().requires_grad_()
    (2.5 * F.cross_entropy(ref2, t, reduction="sum")).backward()
    assert _rel(y.grad, ref2.grad) < 1e-5
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_peak_memory_is_the_gradient():
    N, C = 1024, 131072
    x = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, C, (N,), device="cuda")
    extra = peak_extra_bytes(lambda: ce.cross_entropy(x, t).backward())
    grad_bytes = N * C * 2
    assert extra <= grad_bytes + (1 << 20), f"peak extra {extra} B vs gradient {grad_bytes} B"
    xr = x.detach().float().requires_grad_()
    F.cross_entropy(xr, t).backward()
    assert _rel(x.grad, xr.grad) < 1e-2


@pytest.mark.gpu
def test_gpu_bad_target_and_upstream_scale():
    x, t = _case(8, 10, torch.float32, "cuda")
    with pytest.raises(ValueError, match="out of range"):
        ce.cross_entropy(x, t.clamp_min(0) + 10)
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    (3.0 * ce.cross_entropy(a, t)).backward()
    (3.0 * F.cross_entropy(b, t)).backward()
    assert _rel(a.grad, b.grad) < 1e-5


# The sm_90 compile and spill check of _ce_kernel is in test_softmax.py (one child process for all).


@pytest.mark.gpu
@pytest.mark.parametrize("C", [2, 32000, 131072])
def test_gpu_real_sizes_fp32_against_torch(C):
    N = 65536 if C == 2 else 512
    x, t = _case(N, C, torch.float32, "cuda", seed=C)
    for kw in ({}, {"label_smoothing": 0.1}, {"reduction": "sum", "ignore_index": 0}):
        cluster = C > ce.MAX_FUSED and not ce.cluster_unsupported_reason()
        for v in [None] + (["v4_cluster"] if cluster else []):
            la, lb, ga, gb = _ours_and_torch(x, t.clamp_min(0), v, **kw)
            assert _rel(la, lb) < 1e-5, (kw, v)
            assert _rel(ga, gb) < 1e-5, (kw, v)


@pytest.mark.gpu
def test_gpu_cluster_fails_cleanly():
    """v4_cluster past 16384 classes: NotImplementedError naming the Triton version where the
    multi-CTA kernel does not build, the right answer where it does; never silently wrong."""
    import triton

    x, t = _case(4, 2 * ce.CLUSTER_SLICE + 3, torch.bfloat16, "cuda")
    why = ce.cluster_unsupported_reason()
    if why:
        with pytest.raises(NotImplementedError, match=f"Triton {triton.__version__}"):
            ce.cross_entropy(x, t, variant="v4_cluster")
    else:
        la, lb, ga, gb = _ours_and_torch(x, t, "v4_cluster")
        assert _rel(la, lb) <= TOL[torch.bfloat16] and _rel(ga, gb) <= 2 * TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_compile_traces_through():
    x, t = _case(33, 1000, torch.float32, "cuda")
    x.requires_grad_()
    f = torch.compile(lambda a, b: ce.cross_entropy(a, b, label_smoothing=0.1) * 2.0)
    f(x, t).backward()
    g = x.grad.clone()
    x.grad = None
    (F.cross_entropy(x, t, label_smoothing=0.1) * 2.0).backward()
    assert _rel(g, x.grad) < 1e-5
