"""The policy backward "cudnn": our forward's O and LSE into PyTorch's cuDNN attention backward."""

from types import SimpleNamespace

import pytest
import torch

from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import cudnn_bwd, plans

from conftest import HAS_CUDA

CUDNN = C.AttentionPolicy(forward="ws", backward="cudnn")


def test_cudnn_backward_needs_deterministic_false():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="cudnn backward is not deterministic; pass deterministic=False"):
        A.flash_attention(q, q, q, policy=CUDNN)


def test_cudnn_backward_calls_are_not_planned():
    """A plan replays recorded launches; cuDNN's backward is none, so such calls are never planned."""
    q = torch.randn(1, 2, 8, 16)
    assert plans.key(q, q, q, True, None, False, CUDNN, "top_left") is None
    assert plans.key(q, q, q, True, None, False, CUDNN.replace(backward="atomic"), "top_left") is not None


def _t(*shape, dtype=torch.bfloat16, cuda=True):
    """What applies() reads of a tensor: a stand-in, so the rule is checked without a GPU."""
    return SimpleNamespace(shape=shape, dtype=dtype, is_cuda=cuda)


def test_cudnn_backward_applies_to_plain_16_bit_self_attention_only():
    q, k = _t(1, 4, 64, 64), _t(1, 2, 64, 64)
    assert cudnn_bwd.applies(q, k, k, None, None, None, True) == (cudnn_bwd._OP is not None)
    if cudnn_bwd._OP is None:
        pytest.skip("this PyTorch has no cuDNN attention backward op")
    mask = torch.ones(1, 1, 64, 64, dtype=torch.bool)
    assert not cudnn_bwd.applies(q, k, k, None, None, None, False)  # a window, score mod or bottom-right
    assert not cudnn_bwd.applies(q, k, k, None, mask, None, True)
    assert not cudnn_bwd.applies(q, k, k, None, None, mask.float(), True)
    assert not cudnn_bwd.applies(q, k, k, torch.zeros(1), None, None, True)  # an LSE gradient
    f32 = _t(1, 2, 64, 64, dtype=torch.float32)
    assert not cudnn_bwd.applies(_t(1, 4, 64, 64, dtype=torch.float32), f32, f32, None, None, None, True)
    assert not cudnn_bwd.applies(q, _t(1, 2, 80, 64), _t(1, 2, 80, 64), None, None, None, True)  # Sq != Sk
    wide = _t(1, 2, 64, 256)
    assert not cudnn_bwd.applies(_t(1, 4, 64, 256), wide, wide, None, None, None, True)
    cpu = _t(1, 2, 64, 64, cuda=False)
    assert not cudnn_bwd.applies(_t(1, 4, 64, 64, cuda=False), cpu, cpu, None, None, None, True)


def test_cudnn_backward_pays_where_our_forward_wins_only():
    """Derived from SDPA_RULES: the backward on SDPA, the forward alone on us (sm_90: D 64 from 8192, but causal
    from 4096 to 16384, where our whole call is the faster)."""
    assert C.cudnn_backward_pays((9, 0), 64, 8192, False)
    assert not C.cudnn_backward_pays((9, 0), 64, 8192, True)
    assert C.cudnn_backward_pays((9, 0), 64, 16384, True)
    assert C.cudnn_backward_pays((9, 0), 64, 16384, False)
    assert not C.cudnn_backward_pays((9, 0), 64, 4096, True)
    assert not C.cudnn_backward_pays((9, 0), 128, 16384, True)
    assert not C.cudnn_backward_pays((8, 0), 64, 16384, True)  # not measured


def test_cudnn_backward_lays_o_and_do_out_as_its_graph_cache_assumes(monkeypatch):
    """PyTorch keys its cached cuDNN backward graphs by q's, k's and v's strides only, with O's and dO's built in:
    O reaches it with empty_like(q)'s strides (copied where ours differ, e.g. a compiled call's dense O beside
    sequence-major q), dO with O's, the values unchanged. Fails without the copy (the 354c853 tier's garbage dQ)."""
    seen = []

    def fake_op(do, q, k, v, out, lse, *rest, scale):
        seen.append((do.stride(), out.stride(), out.data_ptr(), out.clone(), do.clone()))
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    monkeypatch.setattr(cudnn_bwd, "_OP", fake_op)
    B, H, S, D = 2, 4, 9, 16
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, S, H, D, generator=g).transpose(1, 2) for _ in range(3))  # sequence-major
    lse = torch.randn(B, H, S, generator=g)
    for out, do in ((torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, D, generator=g)),  # dense O, dO
                    (torch.randn(B, S, H, D, generator=g).transpose(1, 2), torch.randn(B, H, S, D, generator=g))):
        cudnn_bwd.backward(do, q, k, v, out, lse, True, 0.25)
        do_stride, out_stride, ptr, out_seen, do_seen = seen.pop()
        assert out_stride == q.stride() == do_stride
        assert torch.equal(out_seen, out) and torch.equal(do_seen, do)
        assert (ptr == out.data_ptr()) == (out.stride() == q.stride())  # copied only where the layouts differ
    f = torch.randn(B, S, H + 2, D, generator=g)[:, :, :H].transpose(1, 2)  # a fused projection's slice: not dense
    cudnn_bwd.backward(do, f, k, v, torch.randn(B, H, S, D, generator=g), lse, True, 0.25)
    assert seen.pop()[1] == torch.empty_like(f).stride() == torch.empty(B, S, H, D).transpose(1, 2).stride()


def _fwd_bwd(q, k, v, causal, policy, deterministic):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = A.flash_attention(q, k, v, causal=causal, policy=policy, deterministic=deterministic)
    g = torch.Generator(device=q.device).manual_seed(3)
    go = torch.randn(out.shape, generator=g, device=q.device).to(out.dtype)
    (out.float() * go.float()).sum().backward()
    return out, [q.grad, k.grad, v.grad]


def _reference(q, k, v, causal):
    """The fp32 reference's output and gradients for ``_fwd_bwd``'s dO (the same draws, rounded to q's dtype)."""
    low = q.dtype
    q, k, v = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    out = A.reference(q, k, v, causal=causal)
    g = torch.Generator(device=q.device).manual_seed(3)
    go = torch.randn(out.shape, generator=g, device=q.device).to(low).float()
    (out * go).sum().backward()
    return out, [q.grad, k.grad, v.grad]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["head_major", "seq_major"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.quick(rotate="layout")
def test_gpu_cudnn_backward_matches_reference(dtype, causal, layout, D):
    """Odd length, GQA 4 / 2: the gradients within 1e-2 of the fp32 reference's and of our own two-kernel
    backward's; every gradient written (they start as NaN-free fresh tensors from cuDNN: checked finite)."""
    B, H, Hkv, S = 2, 4, 2, 1000
    g = torch.Generator(device="cuda").manual_seed(D + S)

    def make(h):
        if layout == "seq_major":  # transformers' (B, S, H, D) storage seen as (B, H, S, D)
            return torch.randn(B, S, h, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        return torch.randn(B, h, S, D, device="cuda", dtype=dtype, generator=g)
    q, k, v = make(H), make(Hkv), make(Hkv)
    policy = A.default_policy(q, k, causal=causal, deterministic=False).replace(backward="cudnn")
    out, grads = _fwd_bwd(q, k, v, causal, policy, False)
    _, ours = _fwd_bwd(q, k, v, causal, A.default_policy(q, k, causal=causal), True)
    ref_out, ref = _reference(q, k, v, causal)
    assert _rel(out, ref_out) < 1e-2
    for name, a, b, r in zip(("dq", "dk", "dv"), grads, ours, ref):
        assert a.dtype == dtype and a.shape == b.shape and torch.isfinite(a).all(), name
        assert _rel(a, r) < 1e-2, (name, _rel(a, r))
        assert _rel(a, b) < 1e-2, (name, _rel(a, b))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.quick
def test_gpu_cudnn_backward_with_lse_gradient_falls_back():
    """A loss that uses the LSE needs its gradient, which cuDNN's backward does not take: v3's two kernels
    run instead (as for any policy path that does not apply), and the gradients stay right."""
    q, k, v = (torch.randn(1, 2, 333, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    policy = A.default_policy(q, k, causal=True, deterministic=False).replace(backward="cudnn")
    out, lse = A.flash_attention(q, k, v, causal=True, policy=policy, deterministic=False, return_lse=True)
    (out.float().sum() + lse.sum()).backward()
    qr, kr, vr = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    o, l_ = A.reference(qr, kr, vr, causal=True, return_lse=True)
    (o.sum() + l_.sum()).backward()
    for a, r in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert _rel(a, r) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.quick
def test_gpu_cudnn_backward_under_torch_compile():
    """The policy's cuDNN backward inside torch.compile (the custom ops carry the policy's key, their fake
    gradients are dense as the real ones given there): sequence-major GQA inputs as transformers passes them,
    gradients of the shapes and dtypes of q, k, v, within 1e-2 of the fp32 reference's and of the eager call's
    (cuDNN's backward is not bitwise reproducible)."""
    B, H, Hkv, S, D = 1, 4, 2, 1000, 64
    g = torch.Generator(device="cuda").manual_seed(17)
    q, k, v = (torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
               for h in (H, Hkv, Hkv))
    policy = A.default_policy(q, k, causal=True, deterministic=False).replace(backward="cudnn")
    eager_out, eager = _fwd_bwd(q, k, v, True, policy, False)
    f = torch.compile(lambda a, b, c: A.flash_attention(a, b, c, causal=True, policy=policy, deterministic=False),
                      backend="aot_eager", fullgraph=True)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = f(*leaves)
    go = torch.randn(out.shape, generator=torch.Generator(device="cuda").manual_seed(3), device="cuda").to(out.dtype)
    (out.float() * go.float()).sum().backward()
    ref_out, ref = _reference(q, k, v, True)
    assert _rel(out, ref_out) < 1e-2 and _rel(out, eager_out) < 1e-3  # the same forward kernels, any layout
    for name, leaf, e, r in zip(("dq", "dk", "dv"), leaves, eager, ref):
        a = leaf.grad
        assert a.shape == leaf.shape and a.dtype == leaf.dtype and torch.isfinite(a).all(), name
        assert _rel(a, r) < 1e-2 and _rel(a, e) < 1e-2, (name, _rel(a, r), _rel(a, e))
