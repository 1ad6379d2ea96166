import math

import numpy as np
import pytest
import torch

from tilewise.ops.pointwise import fusion as fu, layout as lay
from tilewise.ops.pointwise.elementwise import cos, exp, gelu, maximum, relu, sigmoid, sin, tanh
from tilewise.runtime import cuda as rt

from conftest import poison

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
    src = f.source(1).src
    assert _expr_body(src, 0).count("ew::Sin()") == 1


def test_generated_source_shape():
    f = fu.fuse(lambda x, b: relu(x + b))
    fs = f.source(2, torch.bfloat16)
    src = fs.src
    assert "using T = __nv_bfloat16;" in src
    assert f"__global__ void __launch_bounds__(256) {fs.strided}(" in src
    assert f"__global__ void __launch_bounds__(NT, MINB) {fs.blocked}(" in src
    assert f"__global__ void __launch_bounds__(NT) {fs.rows}(" in src
    assert "tw::StridedLayout<2>" in src and "tw::broadcast_offsets" in src
    assert "ew::Relu()(" in src and "ew::Add()(" in src
    # The source depends on (expression, dtype): another dtype, another kernel name.
    assert f.source(2, torch.float32).strided != fs.strided
    # x ** 2 is a multiply (exact, as torch.pow(x, 2)), a general power calls powf.
    sq = fu.fuse(lambda x: x ** 2).source(1).src
    assert "= v0 * v0;" in sq and "ew::Pow()" not in sq
    assert "ew::Pow()" in fu.fuse(lambda x, y: x ** y).source(2).src


def _kernel_body(src, name):
    i = src.index(f" {name}(")
    j = src.find("\ntemplate", i)
    return src[i:j if j >= 0 else len(src)]


def test_blocked_kernel_uses_16_byte_vectors_and_rows_kernel_reads_rows():
    fs = fu.fuse(lambda x, b: relu(x + b)).source(2)
    blocked = _kernel_body(fs.src, fs.blocked)
    # Every input and the output through 16-byte vectors, NT x UNROLL vectors per block.
    assert "reinterpret_cast<const uint4*>(in0)[j]" in blocked and "reinterpret_cast<const uint4*>(in1)[j]" in blocked
    assert "o4[j] = r.raw;" in blocked and "blockIdx.x) * NT * UNROLL" in blocked
    assert "broadcast_offsets" not in blocked
    rows = _kernel_body(fs.src, fs.rows)
    assert "fused_load_rows<ROWS>(x[0], in0" in rows and "fused_load_rows<ROWS>(x[1], in1" in rows
    assert "o4[r * CV + cv] = o.raw;" in rows and "broadcast_offsets" not in rows
    helper = fs.src[fs.src.index("void fused_load_rows"):]
    assert "reinterpret_cast<const uint4*>(p + r * sr)[cv]" in helper  # stride-1 rows: 16-byte loads
    cfg = fu.FuseConfig(trig="libm", unroll=4, threads=128, minb=2, rows=2, rows_threads=512)
    assert fu.kernel_name(fs, "blocked", cfg) == f"{fs.blocked}<0,4,128,2>"
    assert fu.kernel_name(fs, "rows", cfg) == f"{fs.rows}<0,2,512>"
    assert fu.kernel_name(fs, "strided", fu.FuseConfig()) == f"{fs.strided}<1>"


def _expr_body(src, mode):
    i = src.index(f"float fused_expr<{mode}>(")
    return src[i:src.index("}", i)]


def test_trig_modes_share_one_argument_reduction():
    src = fu.fuse(lambda x: sin(x) ** 2 + cos(x) ** 2).source(1).src
    libm, both, fast = (_expr_body(src, m) for m in (0, 1, 2))
    assert "ew::Sin()(v0)" in libm and "ew::Cos()(v0)" in libm and "sincosf" not in libm
    assert both.count("sincosf(v0, &") == 1 and "ew::Sin" not in both and "ew::Cos" not in both
    assert "__sincosf(v0, &" in fast
    # A lone sin (no cos of the same value) keeps sinf in the accurate modes.
    lone = fu.fuse(lambda x: sin(x) + cos(x * 2.0)).source(1).src
    assert "sincosf" not in _expr_body(lone, 1) and "ew::Sin()(v0)" in _expr_body(lone, 1)
    assert "__sinf(v0)" in _expr_body(lone, 2) and "__cosf(" in _expr_body(lone, 2)


def _aligned(*shape):
    t = torch.empty(math.prod(shape) + 16)
    skip = (-t.data_ptr() % 16) // 4
    return t[skip:skip + math.prod(shape)].view(shape)


def test_plan_picks_blocked_for_contiguous_and_rows_for_a_bias():
    f = fu.fuse(lambda x, b: relu(x + b))
    x, out = _aligned(64, 32), _aligned(64, 32)
    assert f.plan(x, _aligned(64, 32), out=out) == ("blocked", None)
    kind, layout = f.plan(x, _aligned(32), out=out)
    assert kind == "rows" and layout == (64, 32, ((32, 1), (0, 1)))
    assert f.plan(x, _aligned(64, 1), out=out)[0] == "rows"  # bias column: one scalar per row
    assert f.plan(x, torch.ones(()), out=out)[0] == "rows"  # scalar
    sq = _aligned(32, 32)
    assert f.plan(sq.t(), sq, out=_aligned(32, 32))[0] == "strided"  # transposed
    assert f.plan(_aligned(64, 9), _aligned(9), out=_aligned(64, 9))[0] == "strided"  # rows not whole vectors
    g = fu.fuse(lambda x: sin(x) ** 2 + cos(x) ** 2)
    flat = _aligned(4097)
    assert g.plan(flat, out=_aligned(4097)) == ("blocked", None)
    assert g.plan(flat[1:], out=_aligned(4096))[0] != "blocked"  # misaligned start


def test_fuse_config_validation():
    fu.FUSE_DEFAULT.check()
    for bad in (dict(trig="approx"), dict(unroll=3), dict(threads=100), dict(minb=0), dict(minb=9),
                dict(rows=16), dict(rows_threads=2048)):
        with pytest.raises(ValueError, match="config"):
            fu.FuseConfig(**bad).check()
    with pytest.raises(ValueError, match="'config' must be a FuseConfig"):
        fu.fuse(lambda x: x, config="fast")
    with pytest.raises(ValueError, match="unknown variant"):
        fu.fuse(lambda x: x)(torch.randn(3), variant="vector")


def test_rows_grid_covers_every_row_vector_once():
    """The rows kernel's host grid and index split, emulated: each (row, 16-byte column vector)
    written exactly once, for several configs and shapes."""
    for cfg in (fu.FuseConfig(), fu.FuseConfig(rows=1, rows_threads=128), fu.FuseConfig(rows=4, rows_threads=512)):
        for R, C in ((1, 4), (7, 8), (1000, 4), (33, 4096 + 4), (65, 1028)):
            blocks, (tx, ty) = lay.rows_grid(R, C, 4, cfg.rows_threads, cfg.rows)
            CV = C // 4
            seen = np.zeros((R, CV), dtype=np.int64)
            gx = -(-CV // tx)
            for blk in range(blocks):
                bx, by = blk % gx, blk // gx
                cv = bx * tx + np.arange(tx)[None, :]
                r0 = by * ty * cfg.rows + np.arange(ty)[:, None]
                for u in range(cfg.rows):
                    r = np.broadcast_to(r0 + u * ty, (ty, tx))
                    c = np.broadcast_to(cv, (ty, tx))
                    ok = (r < R) & (c < CV)
                    np.add.at(seen, (r[ok], c[ok]), 1)
            assert (seen == 1).all(), (cfg, R, C)


@pytest.mark.parametrize("name", ["sin2_cos2", "three_inputs", "bias_relu"])
def test_generated_source_compiles_for_sm90(name, fresh_cache):
    fn, arity = EXPRESSIONS[name]
    f = fu.fuse(fn)
    dtype = torch.float16 if name == "three_inputs" else torch.float32
    fs = f.source(arity, dtype)
    cfgs = [fu.FUSE_DEFAULT] + [fu.FuseConfig(trig=m) for m in fu.TRIG_MODES]
    names = list(dict.fromkeys(fu.kernel_name(fs, k, c) for c in cfgs for k in fu.KINDS))
    m = rt.compile_source(fs.src, name=f"fused_{name}.cu", name_expressions=names, arch="sm_90")
    assert {r.name for r in m.resources} == set(names)
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
@pytest.mark.parametrize("variant", [None, "blocked", "contiguous", "strided"])
@pytest.mark.quick(rotate="n")
def test_fused_matches_pytorch_same_shape(variant, name, n, dtype):
    fn, arity = EXPRESSIONS[name]
    g = torch.Generator(device="cuda").manual_seed(n)
    xs = [torch.rand(n, device="cuda", dtype=dtype, generator=g) * 2 for _ in range(arity)]
    f = fu.fuse(fn)
    out = poison(torch.empty(n, device="cuda", dtype=dtype))
    assert f(*xs, out=out, variant=variant) is out
    # The reference: the unfused PyTorch ops in float64.
    _check(out, _torch_version(name)(*[x.double() for x in xs]))


# Each config is one more NVRTC run per (expression, dtype): two besides the default.
CONFIGS = [fu.FuseConfig(trig="libm", unroll=1, threads=128, rows=1, rows_threads=128),
           fu.FuseConfig(unroll=16, threads=64, minb=8, rows=4, rows_threads=512)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("name", ["sin2_cos2", "bias_relu"])  # three_inputs: default config above
def test_fused_blocked_configs_at_odd_sizes(name, cfg, dtype):
    fn, arity = EXPRESSIONS[name]
    f = fu.fuse(fn, config=cfg)
    for n in (1, 33, 4097, 8 * 16 * 256 + 5, (1 << 20) + 3):
        g = torch.Generator(device="cuda").manual_seed(n)
        xs = [torch.rand(n, device="cuda", dtype=dtype, generator=g) * 2 for _ in range(arity)]
        out = poison(torch.empty(n, device="cuda", dtype=dtype))
        assert f(*xs, out=out, variant="blocked") is out
        _check(out, _torch_version(name)(*[x.double() for x in xs]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", [fu.FUSE_DEFAULT, *CONFIGS], ids=str)
def test_fused_rows_bias_layouts(cfg, dtype):
    """The rows kernel on every layout it takes (bias row / column / scalar, either side, padded
    rows, one long row) at odd row counts, outputs poisoned; and plan() picks it for them."""
    g = torch.Generator(device="cuda").manual_seed(5)
    f = fu.fuse(lambda x, b: relu(x + b), config=cfg)
    vec = 16 // torch.empty((), dtype=dtype).element_size()

    def r(*shape):
        return torch.randn(shape, device="cuda", dtype=dtype, generator=g)

    wide = r(1001, 3 * vec * 40)
    cases = [(r(1001, vec * 37), r(vec * 37)), (r(vec * 5), r(33, vec * 5)), (r(33, vec), r(33, 1)),
             (r(1, 1), r(257, vec * 3)), (r(vec * 4097), r()), (wide[:, vec:vec * 41], r(vec * 40)),
             (r(7, 5, vec * 9), r(vec * 9))]
    for a, b in cases:
        shape = torch.broadcast_shapes(a.shape, b.shape)
        out = poison(torch.empty(shape, device="cuda", dtype=dtype))
        assert f.plan(a, b, out=out)[0] == "rows", (a.shape, b.shape)
        assert f(a, b, out=out) is out
        _check(out, torch.relu(a.double() + b.double()))
        out2 = poison(torch.empty(shape, device="cuda", dtype=dtype))
        f(a, b, out=out2, variant="rows")
        torch.testing.assert_close(out2, out, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("trig", list(fu.TRIG_MODES))
def test_trig_modes_accuracy(trig):
    """sin^2 + cos^2 and sin * cos against float64 for |x| up to 6 (fast intrinsics included,
    with their looser bound) and, for the accurate modes, up to 1e4 (full range reduction)."""
    f = fu.fuse(lambda x: sin(x) ** 2 + cos(x) ** 2 + sin(x) * cos(x), config=fu.FuseConfig(trig=trig))
    ref = lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2 + torch.sin(x) * torch.cos(x)  # noqa: E731
    g = torch.Generator(device="cuda").manual_seed(9)
    for scale, tol in ((2.0, 4e-6 if trig != "fast" else 1e-4), (1e4, 4e-6)):
        if trig == "fast" and scale > 10:
            continue  # __sinf / __cosf are not accurate there (documented)
        x = torch.randn((1 << 16) + 3, device="cuda", generator=g) * scale
        for variant in ("blocked", "strided", "contiguous"):
            out = poison(torch.empty_like(x))
            f(x, out=out, variant=variant)
            assert not torch.isnan(out).any()
            err = (out.double() - ref(x.double())).abs().max().item()
            assert err < tol, (variant, scale, err)


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
    with pytest.raises(ValueError, match="blocked kernel needs"):
        f(a, a[:1], variant="blocked")
    with pytest.raises(ValueError, match="rows kernel needs"):
        f(torch.randn(4, 9, device="cuda"), torch.randn(9, device="cuda"), variant="rows")
