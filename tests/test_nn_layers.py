"""tilewise.nn's transformer layers against their PyTorch / transformers counterparts, in Triton's
interpreter on the CPU (fp32, odd sizes); the GPU tests run them in bf16 on the real kernels."""

import pytest
import torch
import torch.nn.functional as F

import tilewise
import tilewise.nn as tnn


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_linear_matches_torch(activation):
    torch.manual_seed(0)
    ours = tnn.Linear(12, 9, activation=activation)
    ref = torch.nn.Linear(12, 9)
    ref.load_state_dict(ours.state_dict())  # the same parameters, by name
    x = torch.randn(5, 7, 12)
    xo, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    act = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu}[activation]
    yo, yr = ours(xo), act(ref(xr))
    torch.testing.assert_close(yo, yr, rtol=1e-4, atol=1e-5)
    g = torch.randn_like(yr)
    yo.backward(g)
    yr.backward(g)
    torch.testing.assert_close(xo.grad, xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="'activation'"):
        tnn.Linear(2, 2, activation="tanh")


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16])
def test_linear_under_autocast_as_torch(x_dtype):
    """fp32 parameters under autocast (float16 here: Triton's interpreter computes bfloat16 dots wrongly
    on the CPU host): like torch's Linear, the output and the GEMM in autocast's dtype, for fp32 or
    16-bit inputs (a 16-bit x beside the fp32 weight raised before)."""
    torch.manual_seed(1)
    ours = tnn.Linear(12, 9, activation="relu")
    ref = torch.nn.Linear(12, 9)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(5, 12).to(x_dtype)
    with torch.autocast("cpu", dtype=torch.float16):
        yo, yr = ours(x), F.relu(ref(x))
    assert yo.dtype == yr.dtype == torch.float16
    torch.testing.assert_close(yo.float(), yr.float(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("scaling", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_rotary_embedding_matches_transformers(scaling):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    kw = dict(hidden_size=64, num_attention_heads=2, max_position_embeddings=256, rope_theta=500000.0)
    if scaling is not None:
        kw["rope_scaling"] = dict(scaling)
    config = transformers.LlamaConfig(**kw)
    theirs = LlamaRotaryEmbedding(config)
    ours = tnn.RotaryEmbedding(32, base=500000.0, scaling=scaling)
    x = torch.randn(2, 3, 5)
    pos = torch.tensor([[0, 5, 17, 100, 255], [3, 4, 5, 6, 7]])
    for a, b in zip(ours(x, pos), theirs(x, pos)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if scaling is not None:  # the scaling changed the long wavelengths
        plain = tnn.RotaryEmbedding(32, base=500000.0)
        assert not torch.allclose(plain.inv_freq, ours.inv_freq)
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        tnn.RotaryEmbedding(32, scaling={"rope_type": "yarn"})
    with pytest.raises(ValueError, match="'head_dim'"):
        tnn.RotaryEmbedding(31)


def test_attention_matches_transformers_llama_attention():
    """Same weights as transformers' LlamaAttention (GQA 4 / 2, head dim 16, 19 positions, causal):
    the same output and input gradient, in Triton's interpreter."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(1)
    theirs = LlamaAttention(config, layer_idx=0)
    ours = tnn.Attention(64, 4, 2)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 19, 64)
    pos = torch.arange(19)[None].expand(2, -1)
    cos, sin = LlamaRotaryEmbedding(config)(x, pos)
    xo, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yo = ours(xo, cos, sin)
    yr = theirs(xr, position_embeddings=(cos, sin), attention_mask=None)[0]
    torch.testing.assert_close(yo, yr, rtol=1e-4, atol=1e-5)
    g = torch.randn_like(yr)
    yo.backward(g)
    yr.backward(g)
    torch.testing.assert_close(xo.grad, xr.grad, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of 'num_kv_heads'"):
        tnn.Attention(64, 4, 3)


@pytest.mark.gpu
@pytest.mark.quick
def test_gpu_layers_bf16():
    """The three layers in bf16 on the GPU against their fp32 counterparts (relative error)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    torch.manual_seed(2)
    lin = tnn.Linear(1000, 777, activation="gelu", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(3, 301, 1000, device="cuda", dtype=torch.bfloat16)
    want = F.gelu(F.linear(x.float(), lin.weight.float(), lin.bias.float()))
    assert ((lin(x).float() - want).norm() / want.norm()).item() < 2e-2
    config = transformers.LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                                      max_position_embeddings=1024, attn_implementation="sdpa")
    theirs = LlamaAttention(config, layer_idx=0).cuda()
    ours = tnn.Attention(512, 8, 2, device="cuda", dtype=torch.bfloat16)
    ours.load_state_dict({k: v.to(torch.bfloat16) for k, v in theirs.state_dict().items()})
    h = torch.randn(2, 333, 512, device="cuda")
    pos = torch.arange(333, device="cuda")[None].expand(2, -1)
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]  # moved in newer transformers
    cos, sin = tnn.RotaryEmbedding(64, base=theta).cuda()(h, pos)
    rc, rs = LlamaRotaryEmbedding(config).cuda()(h, pos)
    torch.testing.assert_close(cos, rc, rtol=1e-5, atol=1e-6)
    want = theirs(h, position_embeddings=(rc, rs), attention_mask=None)[0]
    got = ours(h.to(torch.bfloat16), cos.to(torch.bfloat16), sin.to(torch.bfloat16)).float()
    assert ((got - want).norm() / want.norm()).item() < 3e-2


def test_fused_linear_cross_entropy_loss_under_autocast_as_torch():
    """The loss module under autocast (float16 on the CPU host) over fp32 parameters: its GEMMs in
    autocast's dtype, as torch's lm head would run (it raised on a 16-bit x beside the fp32 weight, and
    ran fp32 GEMMs for an fp32 x); the loss against F.linear + F.cross_entropy under the same autocast."""
    torch.manual_seed(2)
    w = torch.randn(37, 16, requires_grad=True)
    t = torch.randint(0, 37, (11,))
    for x in (torch.randn(11, 16), torch.randn(11, 16).half()):
        with torch.autocast("cpu", dtype=torch.float16):
            got = tnn.FusedLinearCrossEntropyLoss()(w, x, t)
            want = F.cross_entropy(F.linear(x, w).float(), t)
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


def _packed_case(bias, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(3, 7, 33, generator=g, device=device, dtype=dtype, requires_grad=True)
    ws = [torch.randn(o, 33, generator=g, device=device, dtype=dtype, requires_grad=True) for o in (19, 19, 5)]
    bs = [torch.randn(o, generator=g, device=device, dtype=dtype, requires_grad=True) for o in (19, 19, 5)]
    return x, ws, bs if bias else None


@pytest.mark.parametrize("bias", [False, True])
def test_linear_packed_is_the_concatenated_linear_without_keeping_the_concatenation(bias):
    """``linear_packed``: the output and every gradient of F.linear(x, cat(weights), cat(biases)) (float64,
    odd sizes, three weights); autograd keeps x and the weights themselves, never a new weight-sized tensor."""
    from tilewise.nn.packed import linear_packed

    x, ws, bs = _packed_case(bias)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = linear_packed(x, ws, bs)
    ref = F.linear(x, torch.cat(ws), torch.cat(bs) if bias else None)
    assert y.shape == (3, 7, 43) and torch.allclose(y, ref, rtol=1e-12, atol=1e-12)
    assert saved and all(any(t.data_ptr() == p.data_ptr() for p in (x, *ws)) for t in saved), \
        [tuple(t.shape) for t in saved]
    go = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, *ws, *(bs or ())), go)
    want = torch.autograd.grad(ref, (x, *ws, *(bs or ())), go)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_linear_packed_frozen_weights_fallbacks_and_errors():
    """The gradients asked for, with frozen weights or a frozen input; under autocast, or with mixed dtypes,
    it is the concatenated linear itself; a bias count that does not match the weights is an error naming
    the function."""
    from tilewise.nn.packed import linear_packed

    x, ws, _ = _packed_case(False)
    frozen = [w.detach() for w in ws]
    (gx,) = torch.autograd.grad(linear_packed(x, frozen).sum(), (x,))
    assert torch.allclose(gx, torch.cat(frozen).sum(0).expand_as(x))
    y = linear_packed(x.detach(), ws)
    gw = torch.autograd.grad(y.sum(), ws)
    assert all(torch.allclose(g, x.detach().reshape(-1, 33).sum(0).expand_as(g)) for g in gw)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = linear_packed(x.float(), [w.float() for w in ws])
        b = F.linear(x.float(), torch.cat([w.float() for w in ws]))
    assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b)
    with pytest.raises(RuntimeError):  # mixed dtypes: torch's own error, as the expression gives it
        F.linear(x.float(), torch.cat(ws))
    with pytest.raises(RuntimeError):
        linear_packed(x.float(), ws)
    with pytest.raises(ValueError, match="linear_packed"):
        linear_packed(x, ws, [torch.zeros(19)])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.quick
def test_gpu_linear_packed(dtype):
    """On the GPU (cuBLAS writing each weight's columns of a strided output): output and gradients against
    the float64 concatenated linear, within the dtype's rounding, and poisoned memory never read."""
    from tilewise.nn.packed import linear_packed

    x, ws, bs = _packed_case(True, dtype=torch.float64, device="cuda", seed=1)
    low = [t.detach().to(dtype).requires_grad_(True) for t in (x, *ws, *bs)]
    y = linear_packed(low[0], low[1:4], low[4:])
    ref = F.linear(x, torch.cat(ws), torch.cat(bs))
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2
    go = torch.randn_like(ref)
    got = torch.autograd.grad(y, low, go.to(dtype))
    want = torch.autograd.grad(ref, (x, *ws, *bs), go)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and ((a.double() - b).norm() / b.norm()).item() < 1e-2


def _mlp_case(bias, dtype=torch.float32, device="cpu", seed=3, inter=45):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(3, 7, 33, generator=g, device=device, dtype=dtype, requires_grad=True)
    ws = [torch.randn(s, generator=g, device=device, dtype=dtype) / 5
          for s in ((inter, 33), (inter, 33), (33, inter))]
    bs = [torch.randn(o, generator=g, device=device, dtype=dtype) for o in (inter, inter, 33)] if bias else [None] * 3
    return x, [w.requires_grad_(True) for w in ws], [b.requires_grad_(True) if bias else b for b in bs]


def _mlp_reference(x, ws, bs):
    gate = F.linear(x, ws[0], bs[0])
    return F.linear(F.silu(gate) * F.linear(x, ws[1], bs[1]), ws[2], bs[2])


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_mlp_recomputes_the_activation(bias):
    """``swiglu_mlp`` (Triton's interpreter, fp32, odd sizes): output and every gradient against float64
    autograd through the three linears; autograd keeps x, the (.., 2 I) gate / up output and the weights,
    never the (.., I) activation; the module's ``recompute`` takes it and keeps the state-dict keys."""
    from tilewise.nn.mlp import swiglu_mlp

    x, ws, bs = _mlp_case(bias)
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = swiglu_mlp(x, *ws, *bs)
    assert (3, 7, 45) not in shapes and (21, 45) not in shapes and (21, 90) in shapes, shapes
    params = [x, *ws, *(bs if bias else ())]
    ref = _mlp_reference(*[[t.double() if t is not None else None for t in v] if isinstance(v, list)
                           else v.double() for v in (x, ws, bs)])
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)
    go = torch.randn(y.shape, dtype=torch.float64)
    got = torch.autograd.grad(y, params, go.float())
    want = torch.autograd.grad(ref, params, go)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-4)
    m = tnn.SwiGLU(33, 45, bias=bias, fuse_gate_up=True, recompute=True)
    assert "recompute=True" in repr(m) and set(m.state_dict()) == set(tnn.SwiGLU(33, 45, bias=bias).state_dict())
    with torch.no_grad():
        for lin, w, b in zip((m.gate_proj, m.up_proj, m.down_proj), ws, bs):
            lin.weight.copy_(w)
            if bias:
                lin.bias.copy_(b)
    torch.testing.assert_close(m(x).double(), ref, rtol=1e-4, atol=1e-4)


def test_swiglu_mlp_frozen_fallbacks_and_errors():
    """Frozen weights (only x's gradient) and a frozen input (only the weights'); under autocast it is the
    unfused expression; mismatched shapes or one gate / up bias are errors naming the argument."""
    from tilewise.nn.mlp import swiglu_mlp

    x, ws, _ = _mlp_case(False, seed=4)
    frozen = [w.detach() for w in ws]
    (gx,) = torch.autograd.grad(swiglu_mlp(x, *frozen).sum(), (x,))
    (gr,) = torch.autograd.grad(_mlp_reference(x, frozen, [None] * 3).sum(), (x,))
    torch.testing.assert_close(gx, gr, rtol=1e-4, atol=1e-4)
    gw = torch.autograd.grad(swiglu_mlp(x.detach(), *ws).sum(), ws)
    gwr = torch.autograd.grad(_mlp_reference(x.detach(), ws, [None] * 3).sum(), ws)
    for a, b in zip(gw, gwr):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = swiglu_mlp(x, *ws)
    assert a.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="'b_gate' and 'b_up'"):
        swiglu_mlp(x, *ws, torch.zeros(45))
    with pytest.raises(ValueError, match="swiglu_mlp: shapes"):
        swiglu_mlp(x, ws[0], ws[1], ws[2].t())


@pytest.mark.gpu
@pytest.mark.parametrize("inter", [45, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.quick
def test_gpu_swiglu_mlp_equals_the_kept_activation(dtype, inter):
    """On the GPU: ``swiglu_mlp``'s output and gradients equal, bit for bit, those of the same layers with
    the activation kept (``linear_packed`` + ``swiglu_packed`` + F.linear: the recomputed activation is
    the forward's), and are within the dtype's rounding of float64 autograd; odd sizes, and an intermediate
    size on swiglu_packed's 4096-column block."""
    from tilewise.nn.mlp import swiglu_mlp
    from tilewise.nn.packed import linear_packed

    x, ws, bs = _mlp_case(True, dtype=torch.float64, device="cuda", seed=5, inter=inter)
    low = [t.detach().to(dtype).requires_grad_(True) for t in (x, *ws, *bs)]
    y = swiglu_mlp(*low)
    kept = F.linear(tilewise.swiglu_packed(linear_packed(low[0], low[1:3], low[4:6])), low[3], low[6])
    ref = _mlp_reference(x, ws, bs)
    go = torch.randn_like(ref)
    got = torch.autograd.grad(y, low, go.to(dtype))
    same = torch.autograd.grad(kept, low, go.to(dtype))
    assert torch.equal(y, kept) and all(torch.equal(a, b) for a, b in zip(got, same))
    want = torch.autograd.grad(ref, (x, *ws, *bs), go)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and ((a.double() - b).norm() / b.norm()).item() < 2e-2

