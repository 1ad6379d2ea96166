import pytest
import torch

from tilewise.ops import fusion as fu
from tilewise.ops.elementwise import cos, exp, gelu, maximum, relu, sigmoid, sin, tanh
from tilewise.runtime import cuda as rt

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

EXPRESSIONS = {
    "sin2_cos2": (lambda x: sin(x) ** 2 + cos(x) ** 2, 1),
    "bias_relu": (lambda x, b: relu(x + b), 2),
    "swish_scaled": (lambda x: 0.5 * x * sigmoid(x) - 1.0 / (1 + exp(-x)), 1),
    "three_inputs": (lambda x, y, z: maximum(gelu(x) * y, tanh(z) / 2.0), 3),
    "pow_general": (lambda x, y: (x * x + 1.0) ** y, 2),
}


# --------------------------------------------------------------------------- tracing and codegen (CPU)


def test_tracer_builds_the_expression():
    f = fu.fuse(lambda x: sin(x) ** 2 + cos(x) ** 2)
    assert f.expression() == "add(pow(sin(x0), 2.0), pow(cos(x0), 2.0))"
    g = fu.fuse(lambda x, b: relu(x + b))
    assert g.expression(2) == "relu(add(x0, x1))"
    h = fu.fuse(lambda x: 2 - x / 3 + (-x))
    assert h.expression() == "add(sub(2.0, div(x0, 3.0)), neg(x0))"


def test_common_subexpressions_are_shared():
    f = fu.fuse(lambda x: sin(x) * sin(x) + sin(x))
    graph, out = f.traced(1)
    ops = [n.op for n in fu._live(graph, out)]
    assert ops.count("sin") == 1 and ops.count("input") == 1
    src, _, _ = f.source(1)
    assert src.count("ew::Sin()") == 1


def test_generated_source_shape():
    f = fu.fuse(lambda x, b: relu(x + b))
    src, strided, contig = f.source(2, torch.bfloat16)
    assert "using T = __nv_bfloat16;" in src
    assert f'extern "C" __global__ void __launch_bounds__(256) {strided}(' in src
    assert "tw::StridedLayout<2>" in src and "tw::broadcast_offsets" in src
    assert "ew::Relu()(" in src and "ew::Add()(" in src
    # The source depends on (expression, dtype): another dtype, another kernel name.
    assert f.source(2, torch.float32)[1] != strided
    # x ** 2 is a multiply (exact, as torch.pow(x, 2)), a general power calls powf.
    sq = fu.fuse(lambda x: x ** 2).source(1)[0]
    assert "= v0 * v0;" in sq and "ew::Pow()" not in sq
    assert "ew::Pow()" in fu.fuse(lambda x, y: x ** y).source(2)[0]


@pytest.mark.parametrize("name", ["sin2_cos2", "three_inputs"])
def test_generated_source_compiles_for_sm90(name, fresh_cache):
    fn, arity = EXPRESSIONS[name]
    f = fu.fuse(fn)
    dtype = torch.float32 if name == "sin2_cos2" else torch.float16
    src, strided, contig = f.source(arity, dtype)
    m = rt.compile_source(src, name=f"fused_{name}.cu", name_expressions=[strided, contig], arch="sm_90")
    assert {r.name for r in m.resources} == {strided, contig}
    for r in m.resources:
        assert r.registers > 0 and not r.spills, r


@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_cpu_reference_path_matches_pytorch(name):
    fn, arity = EXPRESSIONS[name]
    g = torch.Generator().manual_seed(0)
    shapes = [(5, 7), (7,), (5, 1)][:arity]
    xs = [torch.rand(s, generator=g) + 0.1 for s in shapes]
    got = fu.fuse(fn)(*xs)
    want = {
        "sin2_cos2": lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2,
        "bias_relu": lambda x, b: torch.relu(x + b),
        "swish_scaled": lambda x: 0.5 * x * torch.sigmoid(x) - 1.0 / (1 + torch.exp(-x)),
        "three_inputs": lambda x, y, z: torch.maximum(torch.nn.functional.gelu(x) * y, torch.tanh(z) / 2.0),
        "pow_general": lambda x, y: (x * x + 1.0) ** y,
    }[name](*xs)
    torch.testing.assert_close(got, want.expand(got.shape))
    assert got.is_contiguous()


def test_cost_counts_op_nodes_and_one_pass():
    f = fu.fuse(lambda x: sin(x) ** 2 + cos(x) ** 2)
    c = f.cost(1 << 28, (1 << 28,))
    assert c.bytes == 8 * (1 << 28) and c.flops == 5 * (1 << 28)


def test_tracing_errors():
    with pytest.raises(ValueError, match="PyTorch function"):
        fu.fuse(lambda x: torch.sin(x))(torch.randn(3))
    with pytest.raises(ValueError, match="comparisons cannot be fused"):
        fu.fuse(lambda x: x if x > 0 else -x)(torch.randn(3))
    with pytest.raises(ValueError, match="must return one traced tensor"):
        fu.fuse(lambda x: 3.0)(torch.randn(3))
    with pytest.raises(ValueError, match="must be callable"):
        fu.fuse(3)
    with pytest.raises(ValueError, match="cannot use a str"):
        fu.fuse(lambda x: x + "a")(torch.randn(3))
    f = fu.fuse(lambda x, b: x + b)
    with pytest.raises(ValueError, match="cannot broadcast"):
        f(torch.randn(3, 4), torch.randn(5))
    with pytest.raises(ValueError, match="'x1' has dtype torch.int64"):
        f(torch.randn(3), torch.arange(3))
    with pytest.raises(ValueError, match="at least one tensor"):
        f()


# --------------------------------------------------------------------------- GPU


def _torch_version(name):
    return {
        "sin2_cos2": lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2,
        "bias_relu": lambda x, b: torch.relu(x + b),
        "swish_scaled": lambda x: 0.5 * x * torch.sigmoid(x) - 1.0 / (1 + torch.exp(-x)),
        "three_inputs": lambda x, y, z: torch.maximum(torch.nn.functional.gelu(x) * y, torch.tanh(z) / 2.0),
        "pow_general": lambda x, y: (x * x + 1.0) ** y,
    }[name]


_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
        torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


def _check(out, ref):
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref.to(out.dtype).float(), **_TOL[out.dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 31, 33, 1000, 4097, (1 << 20) + 3])
@pytest.mark.parametrize("name", list(EXPRESSIONS))
@pytest.mark.parametrize("variant", ["contiguous", "strided"])
def test_fused_matches_pytorch_same_shape(variant, name, n, dtype):
    fn, arity = EXPRESSIONS[name]
    g = torch.Generator(device="cuda").manual_seed(n)
    xs = [torch.rand(n, device="cuda", dtype=dtype, generator=g) * 2 for _ in range(arity)]
    f = fu.fuse(fn)
    out = torch.empty(n, device="cuda", dtype=dtype).fill_(float("nan"))
    assert f(*xs, out=out, variant=variant) is out
    # The reference: the unfused PyTorch ops in float64.
    _check(out, _torch_version(name)(*[x.double() for x in xs]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_broadcast_and_strided(dtype):
    g = torch.Generator(device="cuda").manual_seed(3)
    f = fu.fuse(lambda x, b: relu(x + b))
    x = torch.randn(1000, 4097, device="cuda", dtype=dtype, generator=g)
    cases = [
        (x, torch.randn(4097, device="cuda", dtype=dtype, generator=g)),            # bias row
        (x, torch.randn(1000, 1, device="cuda", dtype=dtype, generator=g)),         # bias column
        (x[:, ::3], torch.randn(1, 1366, device="cuda", dtype=dtype, generator=g)),  # strided + row
        (x.t(), torch.randn((), device="cuda", dtype=dtype, generator=g)),          # transposed + scalar
        (torch.randn(31, 1, 7, device="cuda", dtype=dtype, generator=g),
         torch.randn(33, 1, device="cuda", dtype=dtype, generator=g)),              # outer broadcast
    ]
    for a, b in cases:
        out = f(a, b)
        assert out.shape == torch.broadcast_shapes(a.shape, b.shape) and out.is_contiguous()
        _check(out, torch.relu(a.double() + b.double()))
    assert f.compiles == 1  # one module per (expression, dtype), whatever the broadcast pattern


@pytest.mark.gpu
def test_sin2_cos2_is_one_and_compiles_once():
    f = fu.fuse(lambda x: sin(x) ** 2 + cos(x) ** 2)
    for n in (4097, 1 << 20):
        x = torch.randn(n, device="cuda")
        out = f(x)
        torch.testing.assert_close(out, torch.sin(x) ** 2 + torch.cos(x) ** 2, rtol=1e-6, atol=1e-6)
    assert f.compiles == 1
    f(torch.randn(100, device="cuda", dtype=torch.bfloat16))
    assert f.compiles == 2
    assert f(torch.empty(0, 3, device="cuda")).shape == (0, 3)


@pytest.mark.gpu
def test_fused_gpu_errors():
    f = fu.fuse(lambda x, b: x + b)
    a = torch.randn(8, device="cuda")
    with pytest.raises(ValueError, match="'x1' is on cpu"):
        f(a, a.cpu())
    with pytest.raises(ValueError, match="'x1' has dtype torch.float16 but 'x0' has torch.float32"):
        f(a, a.half())
    with pytest.raises(ValueError, match="contiguous kernel needs"):
        f(a, a[:1], variant="contiguous")
