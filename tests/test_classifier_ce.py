"""The classifier's sync-free cross-entropy (tilewise.ops.rowwise.cross_entropy.cross_entropy_capturable):
against F.cross_entropy under the Triton interpreter on the CPU, and captured in a CUDA graph on
the GPU; and how tilewise.nn.functional chooses it."""

import pytest
import torch
import torch.nn.functional as F

from tilewise.nn import functional as twf
from tilewise.ops.rowwise import cross_entropy as ce

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(N, C, dtype=torch.float32, seed=0, device=DEV):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(N, C, generator=g)).to(dtype).to(device).requires_grad_(True)
    t = torch.randint(0, C, (N,), generator=g).to(device)
    return x, t


def _ref(x, t, **kw):
    xr = x.detach().double().requires_grad_(True)
    loss = F.cross_entropy(xr, t, **kw)
    loss.backward()
    return loss.detach(), xr.grad


@pytest.mark.parametrize("N,C", [(1, 2), (33, 2), (64, 2), (31, 7), (5, 33)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_capturable_matches_torch(N, C, reduction):
    x, t = _inputs(N, C)
    ref_loss, ref_grad = _ref(x, t, reduction=reduction)
    loss = ce.cross_entropy_capturable(x, t, reduction=reduction)
    (0.5 * loss).backward()  # an upstream gradient other than 1 reaches the scale
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), 0.5 * ref_grad, rtol=1e-5, atol=1e-7)


def test_capturable_ignore_index_smoothing_and_no_grad():
    x, t = _inputs(40, 5, seed=1)
    t[::3] = -100
    ref_loss, ref_grad = _ref(x, t, label_smoothing=0.1)
    loss = ce.cross_entropy_capturable(x, t, label_smoothing=0.1)
    loss.backward()
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), ref_grad, rtol=1e-5, atol=1e-7)
    assert not x.grad[::3].any()
    with torch.no_grad():
        torch.testing.assert_close(ce.cross_entropy_capturable(x, t, label_smoothing=0.1).double(), ref_loss,
                                   rtol=1e-5, atol=1e-6)
    all_ignored = torch.full_like(t, -100)
    assert torch.isnan(ce.cross_entropy_capturable(x.detach(), all_ignored))  # 0 / 0, as PyTorch


def test_capturable_bad_targets_are_counted_not_read():
    dev = torch.device(DEV)
    ce.check_targets(dev)  # start from zero
    x, t = _inputs(10, 3, seed=2)
    good = t.clone()
    t[2], t[7] = 3, -5  # out of range, not ignore_index
    loss = ce.cross_entropy_capturable(x, t)
    loss.backward()
    keep = torch.ones(10, dtype=torch.bool)
    keep[[2, 7]] = False
    ref_loss, ref_grad = _ref(x[keep], good[keep])
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-6)  # mean over the 8 good rows
    assert not x.grad[2].any() and not x.grad[7].any()
    torch.testing.assert_close(x.grad[keep].double(), ref_grad, rtol=1e-5, atol=1e-7)
    assert ce.bad_target_count(dev) == 2
    with pytest.raises(ValueError, match="2 target"):
        ce.check_targets(dev)
    assert ce.bad_target_count(dev) == 0
    ce.check_targets(dev)  # reset: no error now


@pytest.mark.parametrize("add", [True, False])
def test_targets_kernel_counts_into_or_writes_the_bad_counter(add):
    """_ce_targets_kernel: ADD=True adds this call's bad targets to a running counter (the
    capturable path's), ADD=False writes the count (the v5/v6 path's per-call counter, left
    unzeroed); bad targets become ignore_index, 1/n counts the others."""
    t = torch.tensor([0, 5, 1, -100, -7, 2, 9], device=DEV)
    t_safe = torch.full_like(t, 123)
    inv_n = torch.full((1,), float("nan"), device=DEV)
    bad = torch.full((1,), 40, dtype=torch.int64, device=DEV)  # a stale value
    ce._ce_targets_kernel[(1,)](t, t_safe, bad, inv_n, t.numel(), 3, -100, MEAN=True, BLOCK=4, ADD=add)
    assert int(bad) == (40 + 3 if add else 3)
    assert t_safe.tolist() == [0, -100, 1, -100, -100, 2, -100]
    assert float(inv_n) == pytest.approx(1 / 3)


def test_capturable_input_errors():
    x, t = _inputs(4, 3)
    with pytest.raises(ValueError, match="reduction"):
        ce.cross_entropy_capturable(x, t, reduction="none")
    with pytest.raises(ValueError, match="target"):
        ce.cross_entropy_capturable(x, t[:3])
    with pytest.raises(ValueError, match="at most"):
        ce.cross_entropy_capturable(torch.zeros(1, ce.MAX_FUSED + 1, device=DEV), torch.zeros(1, dtype=torch.long,
                                                                                                device=DEV))


def test_functional_prefers_the_capturable_cross_entropy():
    twf.reset()
    rep = twf.report()
    assert "cross_entropy_capturable" in rep["cross_entropy"]
    assert "cross_entropy" not in twf.NOT_CAPTURABLE or not twf._capture_fallback("cross_entropy")


def test_functional_falls_back_inside_graphs_for_a_sync_op(monkeypatch):
    """Were the op found the synchronizing one, capture would use PyTorch's (NOT_CAPTURABLE)."""
    monkeypatch.setitem(twf.CANDIDATES, "cross_entropy", [("tilewise.ops.rowwise.cross_entropy", "cross_entropy", ())])
    twf.reset()
    try:
        assert twf.resolve("cross_entropy") is ce.cross_entropy
        assert twf._capture_fallback("cross_entropy")
    finally:
        twf.reset()


@pytest.mark.gpu
def test_capturable_in_cuda_graph_gpu():
    """Captured once, replayed on new logits and targets: loss and gradient as F.cross_entropy's;
    a bad target in a replay is counted, not read."""
    N, C = 64, 2
    x = torch.zeros(N, C, device="cuda", requires_grad=True)
    t = torch.zeros(N, dtype=torch.long, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            x.grad = None
            ce.cross_entropy_capturable(x, t).backward()
    torch.cuda.current_stream().wait_stream(s)
    x.grad.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.grad.zero_()
        loss = ce.cross_entropy_capturable(x, t)
        loss.backward()
    ce.check_targets()
    for seed in range(3):
        xi, ti = _inputs(N, C, seed=seed, device="cuda")
        with torch.no_grad():
            x.copy_(xi)
        t.copy_(ti)
        g.replay()
        ref_loss, ref_grad = _ref(xi, ti)
        torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x.grad.double(), ref_grad, rtol=1e-5, atol=1e-7)
    t[0] = 7
    g.replay()
    assert ce.bad_target_count() == 1
    with pytest.raises(ValueError):
        ce.check_targets()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_capturable_half_gpu(dtype):
    x, t = _inputs(1000, 33, dtype=dtype, device="cuda")
    ref_loss, ref_grad = _ref(x, t)
    loss = ce.cross_entropy_capturable(x, t)
    loss.backward()
    assert loss.dtype == dtype and x.grad.dtype == dtype
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(x.grad.double(), ref_grad, rtol=1e-2, atol=1e-4)
