"""The one CPU rule (issue 32): every public op given CPU tensors, outside Triton's interpreter, runs
its PyTorch reference: the result matches an independent float64 formula written here, gradients
flow (autograd), torch.compile traces it, and an argument on another device is named. A public
function without a case here fails the walk, so a new op cannot skip the rule."""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import tilewise as tw

g = torch.Generator().manual_seed(0)


def rnd(*shape, dtype=torch.float32, gen=g):
    return torch.randn(*shape, generator=gen).to(dtype)


def _rope_half(t):
    h = t.shape[-1] // 2
    return torch.cat([-t[..., h:], t[..., :h]], -1)


def _qkv_rope(t, cos, sin):
    """(B, S, 5 * 8) as 3 q heads, 1 k head, 1 v head of D = 8: q and k rotated, v as it is."""
    q, k, v = (t[..., a:b].unflatten(-1, (-1, 8)).transpose(1, 2) for a, b in ((0, 24), (24, 32), (32, 40)))
    return [x * cos[:, None] + _rope_half(x) * sin[:, None] for x in (q, k)] + [v]


def _attention(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def _cases(dev="cpu"):
    """name -> (inputs, call(*inputs), float64 formula(*inputs in float64), differentiable input indices),
    every tensor on ``dev`` (the same values on any device)."""
    gen = torch.Generator().manual_seed(1)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dev)

    x, y = rnd(5, 7), rnd(5, 7)
    q, k, v = rnd(2, 3, 9, 8), rnd(2, 3, 11, 8), rnd(2, 3, 11, 8)
    qv, kv, vv = rnd(10, 2, 8), rnd(10, 2, 8), rnd(10, 2, 8)
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32, device=dev)
    lengths = torch.tensor([2, 0, 7, 5, 1], device=dev)
    ids = torch.tensor([[1, 4, 0], [2, 2, 5]], device=dev)
    cos, sin = rnd(1, 9, 8), rnd(1, 9, 8)
    target = torch.tensor([1, 0, 6, 3, 2], device=dev)
    D = rnd(6, 7)
    D[D.abs() < 0.7] = 0
    un = {"relu": torch.relu, "gelu": F.gelu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
          "sin": torch.sin, "cos": torch.cos, "neg": torch.neg, "log": lambda t: torch.log(t.abs() + 1)}
    bi = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
          "pow": lambda a, b: torch.pow(a.abs() + 1, b)}
    c = {}
    for n, f in un.items():
        c[n] = ([x], (lambda t, n=n: getattr(tw, n)(t.abs() + 1 if n == "log" else t)), f, [0])
    for n, f in bi.items():
        c[n] = ([x, y], (lambda a, b, n=n: getattr(tw, n)(a.abs() + 1 if n == "pow" else a, b)), f, [0, 1])
    c["vector_add"] = ([x, y], tw.vector_add, torch.add, [])
    c["fuse"] = ([x, y], tw.fuse(lambda a, b: tw.sin(a) * b), lambda a, b: torch.sin(a) * b, [])
    c["reduce"] = ([x], lambda t: tw.reduce(t, 1, "max"), lambda t: t.amax(1), [])
    c["sum"] = ([x], lambda t: tw.sum(t, 0), lambda t: t.sum(0), [0])
    c["amax"] = ([x], lambda t: tw.amax(t, 1), lambda t: t.amax(1), [0])
    c["mean"] = ([x], lambda t: tw.mean(t, 1), lambda t: t.mean(1), [0])
    c["masked_mean"] = ([rnd(5, 7, 3)], lambda t: tw.masked_mean(t, lengths),
                        lambda t: torch.stack([t[b, :n].mean(0) if n else t.new_zeros(3) for b, n in
                                               enumerate(lengths.tolist())]), [0])
    c["sigmoid3"] = ([x], tw.sigmoid3, lambda t: torch.sigmoid(torch.sigmoid(torch.sigmoid(t))), [0])
    c["swiglu"] = ([x, y], tw.swiglu, lambda a, b: F.silu(a) * b, [0, 1])
    c["swiglu_packed"] = ([rnd(5, 8)], tw.swiglu_packed, lambda t: F.silu(t[..., :4]) * t[..., 4:], [0])
    c["transpose"] = ([rnd(3, 5, 7)], tw.transpose, lambda t: t.transpose(-1, -2), [])
    c["spmv"] = ([D, rnd(7)], tw.spmv, lambda A, b: A @ b, [])
    c["matmul"] = ([x, rnd(7, 3)], tw.matmul, torch.matmul, [])
    c["gemm"] = ([x, rnd(7, 3), rnd(3)], lambda a, b, bias: tw.gemm(a, b, bias=bias, activation="gelu"),
                 lambda a, b, bias: F.gelu(a @ b + bias), [])
    c["linear"] = ([x, rnd(3, 7), rnd(3)], lambda a, w, b: tw.linear(a, w, b, "relu"),
                   lambda a, w, b: torch.relu(a @ w.t() + b), [0, 1, 2])
    c["softmax"] = ([x], tw.softmax, lambda t: torch.softmax(t, -1), [0])
    c["log_softmax"] = ([x], tw.log_softmax, lambda t: torch.log_softmax(t, -1), [0])
    c["softmax_backward"] = ([x, y], lambda a, b: tw.softmax_backward(torch.softmax(a, -1), b),
                             lambda a, b: torch.softmax(a, -1) * (b - (torch.softmax(a, -1) * b).sum(-1, keepdim=True)),
                             [])
    c["cross_entropy"] = ([x], lambda t: tw.cross_entropy(t, target, label_smoothing=0.1),
                          lambda t: F.cross_entropy(t, target, label_smoothing=0.1), [0])
    c["linear_cross_entropy"] = ([rnd(5, 4), rnd(7, 4)], lambda h, w: tw.linear_cross_entropy(h, w, target),
                                 lambda h, w: F.cross_entropy(h @ w.t(), target), [0, 1])
    c["flash_attention"] = ([q, k, v], lambda a, b, d: tw.flash_attention(a, b, d, causal=True),
                            lambda a, b, d: _attention(a, b, d, True), [0, 1, 2])
    c["flash_attention_varlen"] = (
        [qv, kv, vv], lambda a, b, d: tw.flash_attention_varlen(a, b, d, cu, cu, 7, 7, causal=True),
        lambda a, b, d: torch.cat([_attention(*(t[s:e].transpose(0, 1) for t in (a, b, d)), True).transpose(0, 1)
                                   for s, e in ((0, 3), (3, 3), (3, 10))]), [0, 1, 2])
    c["embedding"] = ([rnd(6, 4)], lambda w: tw.embedding(ids, w), lambda w: w[ids], [0])
    c["rms_norm"] = ([x, rnd(7)], tw.rms_norm, lambda t, w: w * t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6),
                     [0, 1])
    c["add_rms_norm"] = ([x, y, rnd(7)], lambda a, b, w: torch.cat([t.flatten() for t in tw.add_rms_norm(a, b, w)]),
                         lambda a, b, w: torch.cat([(w * (a + b) * torch.rsqrt((a + b).pow(2).mean(-1, keepdim=True)
                                                                                + 1e-6)).flatten(), (a + b).flatten()]),
                         [0, 1, 2])
    c["apply_rotary_qkv"] = ([rnd(2, 9, 40)], lambda t: torch.cat([o.flatten() for o in tw.apply_rotary_qkv(
        t, cos, sin, 3, 1)]), lambda t: torch.cat([o.flatten() for o in _qkv_rope(t, cos, sin)]), [0])
    c["apply_rotary"] = ([q[:, :, :, :], q[:, :2].clone()], lambda a, b: torch.cat(
        [t.flatten() for t in tw.apply_rotary(a, b, cos, sin)]),
        lambda a, b: torch.cat([(t * cos[:, None] + _rope_half(t) * sin[:, None]).flatten() for t in (a, b)]), [0, 1])
    return c


CASES = _cases()


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a user's CPU run: the rule, not the Triton interpreter


def test_every_public_function_has_a_case():
    public = {n for n in tw.__all__ if n not in ("Cost", "__version__") and not inspect.isclass(getattr(tw, n))}
    assert public <= set(CASES), f"public functions with no CPU case: {sorted(public - set(CASES))}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_result_matches_float64(name):
    inputs, call, formula, _ = CASES[name]
    out = call(*inputs)
    assert out.device.type == "cpu"
    want = formula(*(t.double() for t in inputs))
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n][3]))
def test_cpu_gradients_match_float64(name):
    inputs, call, formula, grads = CASES[name]
    ins = [t.clone().requires_grad_(i in grads) for i, t in enumerate(inputs)]
    ref = [t.double().detach().requires_grad_(i in grads) for i, t in enumerate(inputs)]
    out, want = call(*ins), formula(*ref)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out.double() * w).sum(), [ins[i] for i in grads])
    exp = torch.autograd.grad((want * w).sum(), [ref[i] for i in grads])
    for i, a, b in zip(grads, got, exp):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5, msg=f"{name}: gradient of input {i}")


@pytest.mark.parametrize("name", ["rms_norm", "add_rms_norm", "softmax", "cross_entropy", "flash_attention", "linear",
                                  "swiglu", "swiglu_packed", "apply_rotary", "apply_rotary_qkv",
                                  "linear_cross_entropy"])
def test_cpu_ops_trace_under_torch_compile(name):
    inputs, call, _, _ = CASES[name]
    torch._dynamo.reset()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(*inputs), call(*inputs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_low_precision_keeps_the_dtype(dtype):
    x, w = rnd(4, 16, dtype=dtype), rnd(16, dtype=dtype)
    assert tw.rms_norm(x, w).dtype == dtype
    assert tw.softmax(x).dtype == dtype
    assert tw.swiglu(x, x).dtype == dtype
    q = rnd(1, 2, 5, 16, dtype=dtype)
    assert tw.flash_attention(q, q, q).dtype == dtype


def test_cpu_out_arguments_are_written():
    x, y = rnd(5, 7), rnd(5, 7)
    out = torch.full((5, 7), float("nan"))
    assert tw.vector_add(x, y, out=out) is out and torch.equal(out, x + y)
    out_t = torch.full((7, 5), float("nan"))
    assert tw.transpose(x, out=out_t) is out_t and torch.equal(out_t, x.t())
    with pytest.raises(ValueError, match="out must be"):
        tw.vector_add(x, y, out=torch.empty(3))


def test_cpu_checks_stay_those_of_the_gpu():
    """A CPU call refuses what a CUDA call refuses, naming the argument (no silent broadcast)."""
    x = rnd(4, 8)
    with pytest.raises(ValueError, match="'b' has"):
        tw.vector_add(x, rnd(8))
    with pytest.raises(ValueError, match="'up'"):
        tw.swiglu(x, rnd(8))
    with pytest.raises(ValueError, match="'weight'"):
        tw.rms_norm(x, rnd(5))
    with pytest.raises(ValueError, match="dtype"):
        tw.softmax(x.long())
    with pytest.raises(ValueError, match="unknown variant"):
        tw.vector_add(x, x, variant="v9")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for the mixed-device case")
def test_cpu_and_cuda_arguments_name_the_odd_one():
    x = rnd(4, 8)
    with pytest.raises(ValueError, match="'weight' is on cuda"):
        tw.rms_norm(x, torch.ones(8, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_the_cpu_rule(name):
    """The same call on CUDA tensors (the kernels) and on CPU tensors (the reference) agree."""
    inputs, call, _, _ = CASES[name]
    cuda_inputs, cuda_call, _, _ = _cases("cuda")[name]
    got = cuda_call(*cuda_inputs)
    assert got.is_cuda
    torch.testing.assert_close(got.cpu().double(), call(*inputs).double(), rtol=2e-3, atol=2e-3)


def test_a_patched_llama_trains_on_cpu(monkeypatch):
    """apply_tilewise on a CPU model, nothing faked: attention, RMSNorm, RoPE, SwiGLU and the fused loss
    all take the rule's references; the loss and every gradient equal the untouched model's."""
    import copy

    transformers = pytest.importorskip("transformers")
    import tilewise.integrations.transformers as tw_hf

    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)  # undone after
    config = transformers.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(config).train()
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    ours.set_attn_implementation(tw_hf.NAME)
    ids = torch.randint(0, 61, (2, 13), generator=torch.Generator().manual_seed(3))
    lr, lo = ref(ids, labels=ids).loss, ours(ids, labels=ids).loss
    torch.testing.assert_close(lo, lr, rtol=1e-5, atol=1e-5)
    lr.backward()
    lo.backward()
    for (n, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
