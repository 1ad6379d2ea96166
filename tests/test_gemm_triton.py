import os

import pytest
import torch

from tilewise.bench.harness import rel_error
from tilewise.ops.gemm import api as gt
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import route as gr
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import triton_kernels as tk

from conftest import HAS_CUDA, poison

DEV = "cuda" if HAS_CUDA else "cpu"  # on CPU the kernels run in Triton's interpreter
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-3, torch.float8_e4m3fn: 1e-2}
VARIANTS = list(gt.VARIANTS)


def _operands(M, N, K, dtype, b_layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(DEV, dtype)
    if b_layout == "kmajor":  # b = w.T of an (N, K) weight, as in a linear layer
        b = torch.randn(N, K, generator=g).to(DEV, dtype).t()
    else:
        b = torch.randn(K, N, generator=g).to(DEV, dtype)
    bias = torch.randn(N, generator=g).to(DEV)
    return a, b, bias


@pytest.fixture(autouse=True)
def _fresh_plans():
    """gemm()'s call plans are per process: a test that patches the routing must not leave (or
    find) plans made under another routing."""
    gr.PLANS.clear()
    yield
    gr.PLANS.clear()


def _run(variant, a, b, **kw):
    if variant in ("v3_tma_persistent", "v3_tma_split") and not tk.tma_applies(a, b, kw.get("out_dtype")):
        pytest.skip("layout not TMA-compatible")
    if variant == "v3_tma_split" and (a.dtype not in (torch.float16, torch.bfloat16)
                                      or (kw.get("out_dtype") or a.dtype).itemsize != 2):
        with pytest.raises(ValueError, match="2-byte"):
            gt.VARIANTS[variant](a, b, **kw)
        pytest.skip("v3_tma_split takes 16-bit inputs and outputs only (the error is checked)")
    return gt.VARIANTS[variant](a, b, **kw)


# --------------------------------------------------------------------------- CPU (interpreter) and GPU


@pytest.mark.parametrize("splits", [1, 3, 7])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_split_k_odd_sizes(splits, dtype, activation):
    """K sliced into partial products summed in a fixed order, then bias + activation + cast;
    b as the transposed view a linear layer's weight gradient passes (g.t())."""
    M, N, K = 21, 13, 101
    a, b, bias = _operands(M, N, K, dtype, "kmajor", seed=splits)
    out = poison(torch.empty(M, N, device=DEV, dtype=dtype))
    res = gt.gemm_splitk(a, b, bias=bias, activation=activation, out=out, splits=splits)
    assert res is out
    assert rel_error(out, gt.reference(a, b, bias, activation).float()) < TOL[dtype]
    again = gt.gemm_splitk(a, b, bias=bias, activation=activation, splits=splits)
    assert torch.equal(again, out)  # deterministic
    with pytest.raises(ValueError, match="splits"):
        gt.gemm_splitk(a, b, splits=0)


def test_split_k_heuristic_and_auto_route(monkeypatch):
    assert gc.split_k_for(256, 50, 4096) > 1      # a linear layer's weight gradient (H x E from tokens)
    assert gc.split_k_for(4096, 4096, 4096) == 1  # big outputs fill the GPU without it
    assert gc.split_k_for(256, 50, 512) == 1      # short K: not worth a second kernel
    calls = []
    real = gt.gemm_splitk
    monkeypatch.setattr(gt, "gemm_splitk", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(gc, "split_k_for", lambda M, N, K: 4)
    a, b, _ = _operands(9, 7, 1030, torch.float32, "rowmajor")
    out = gt.gemm(a, b, policy=gc.GemmPolicy(plans=False))  # routing is what this test watches
    assert calls and rel_error(out, gt.reference(a, b).float()) < TOL[torch.float32]



@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("b_layout", ["rowmajor", "kmajor"])
def test_plain_gemm_odd_sizes(variant, dtype, b_layout):
    # TMA needs 16-byte rows: N = 40 keeps it applicable while M, K stay odd-ish.
    M, N, K = (33, 40, 24) if variant.startswith("v3_tma") else (33, 37, 19)
    a, b, _ = _operands(M, N, K, dtype, b_layout)
    out = poison(torch.empty(M, N, device=DEV, dtype=dtype))
    res = _run(variant, a, b, out=out)
    assert res is out
    assert rel_error(out, gt.reference(a, b).float()) < TOL[dtype]


def test_persistent_with_a_fixed_tile(monkeypatch):
    """run_pointer(fixed=...): the persistent kernel with one given tile and no autotuner (the
    small-problem path of gemm() on the GPU), here with more tiles than programs."""
    monkeypatch.setattr(tk, "num_sms", lambda device_index: 3)
    a, b, bias = _operands(45, 38, 29, torch.float32, "kmajor", seed=11)
    out = poison(torch.empty(45, 38, device=DEV, dtype=torch.float32))
    tk.run_pointer("persistent", a, b, out, bias, "relu", None, None, "ieee", None, fixed=gc.Tile(16, 16, 16, 1, 4))
    assert rel_error(out, gt.reference(a, b, bias, "relu").float()) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("b_layout", ["rowmajor", "kmajor"])
@pytest.mark.parametrize("shape", [(33, 72, 24), (50, 40, 40), (17, 112, 136)], ids=str)
def test_tma_split_tile_both_halves(shape, b_layout, dtype, monkeypatch):
    """v3_tma_split: a (BLOCK_M, BLOCK_N + BLOCK_N2) tile as two products; N = 72 / 112 end inside
    the second half of a tile, N = 40 inside the first (the second half all outside); bias, GELU
    and the pre-activation aux through both halves' descriptors; fewer programs than tiles."""
    monkeypatch.setattr(tk, "num_sms", lambda device_index: 2)
    M, N, K = shape
    a, b, bias = _operands(M, N, K, dtype, b_layout, seed=M + N)
    out = poison(torch.empty(M, N, device=DEV, dtype=dtype))
    aux = poison(torch.empty(M, N, device=DEV, dtype=dtype))
    gt.VARIANTS["v3_tma_split"](a, b, bias=bias, activation="gelu", out=out, aux=aux)
    assert rel_error(out, gt.reference(a, b, bias, "gelu").float()) < TOL[dtype]
    assert rel_error(aux, gt.reference(a, b, bias).float()) < TOL[dtype]


def test_tma_tile_rule_and_auto_route(monkeypatch):
    """tma_tile_for on 132 SMs: 64 x 128 at 768-1000, 128 x 192 at 1536^2 and 3072^2, the
    autotuner's tiles at 1280, 2048, 2304, 4096, 8192; gemm() routes 16-bit outputs to the fixed
    64 x 128 launch and to v3_tma_split (fp32 outputs to the autotuned v3), with right answers."""
    assert [gc.tma_tile_for(n, n, 132) for n in (768, 1000, 1536, 3072)] == ["64x128", "64x128", "128x192", "128x192"]
    assert all(gc.tma_tile_for(n, n, 132) in ("128x128", "128x256") for n in (1280, 2048, 2304, 4096, 8192))
    assert gc.tma_tile_for(0, 8, 132) in gc.TMA_TILES  # no division by zero on empty outputs
    unplanned = gc.GemmPolicy(plans=False)  # routing is what this test watches
    taken = []
    for name in ("v3_tma_persistent", "v3_tma_split"):
        real = gt.VARIANTS[name]
        monkeypatch.setitem(gt.VARIANTS, name, lambda *a, _n=name, _r=real, **k: taken.append(_n) or _r(*a, **k))
    real_fixed = gt._TMA_FIXED_64x128
    monkeypatch.setattr(gt, "_TMA_FIXED_64x128", lambda *a, **k: taken.append("fixed") or real_fixed(*a, **k))
    monkeypatch.setattr(gc, "SMALL_MAX_TILES", 0)  # not the small-problem tile (on a GPU)
    a, b, bias = _operands(40, 48, 32, torch.bfloat16, "rowmajor")
    for tile in ("128x192", "64x128", "128x128"):
        monkeypatch.setattr(gc, "tma_tile_for", lambda M, N, sms, _t=tile: _t)
        out = gt.gemm(a, b, bias=bias, activation="relu", policy=unplanned)
        assert rel_error(out, gt.reference(a, b, bias, "relu").float()) < TOL[torch.bfloat16]
    gt.gemm(a, b, out_dtype=torch.float32, policy=unplanned)
    assert taken == ["v3_tma_split", "fixed", "v3_tma_persistent", "v3_tma_persistent"]


@pytest.mark.parametrize("sms", [3, 4, 7])
@pytest.mark.parametrize("b_layout", ["rowmajor", "kmajor"])
@pytest.mark.parametrize("shape", [(16, 16, 1000), (40, 24, 200), (33, 70, 45), (48, 40, 72)], ids=str)
def test_streamk_splits_tiles_across_programs(shape, b_layout, sms, monkeypatch):
    """v4_streamk with K split over several programs: one tile over 3-7 programs (middle segments),
    several tiles with heads and tails in different programs, odd sizes, TMA loads where rows are
    16-byte aligned (K = 1000, 200, 72 in fp32) and pointer loads where not (K = 45); the same bits
    on a second run (partials added in program order whoever arrives last), counters back at zero."""
    monkeypatch.setattr(tk, "num_sms", lambda device_index: sms)
    M, N, K = shape
    a, b, bias = _operands(M, N, K, torch.float32, b_layout, seed=M + K)
    out = poison(torch.empty(M, N, device=DEV, dtype=torch.float32))
    gt.VARIANTS["v4_streamk"](a, b, bias=bias, activation="relu", out=out)
    assert rel_error(out, gt.reference(a, b, bias, "relu").float()) < TOL[torch.float32]
    again = gt.VARIANTS["v4_streamk"](a, b, bias=bias, activation="relu")
    assert torch.equal(again, out)
    assert all(int(c.count_nonzero()) == 0 for c in tk._STREAMK_COUNTS.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_streamk_16bit_with_aux_and_gelu(dtype, monkeypatch):
    monkeypatch.setattr(tk, "num_sms", lambda device_index: 5)
    a, b, bias = _operands(37, 48, 136, dtype, "kmajor", seed=5)
    out = poison(torch.empty(37, 48, device=DEV, dtype=dtype))
    aux = poison(torch.empty(37, 48, device=DEV, dtype=torch.float32))
    gt.VARIANTS["v4_streamk"](a, b, bias=bias, activation="gelu", out=out, aux=aux)
    assert rel_error(out, gt.reference(a, b, bias, "gelu").float()) < TOL[dtype]
    assert rel_error(aux, gt.reference(a, b, bias, None, out_dtype=torch.float32)) < TOL[dtype]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_fused_epilogue_bias_activation_cast(variant, activation):
    M, N, K = 17, 48, 40
    a, b, bias = _operands(M, N, K, torch.float16, "kmajor", seed=3)
    aux = poison(torch.empty(M, N, device=DEV, dtype=torch.float32))
    out = _run(variant, a, b, bias=bias, activation=activation, out_dtype=torch.float32, aux=aux)
    assert out.dtype == torch.float32
    ref = gt.reference(a, b, bias, activation, out_dtype=torch.float32)
    assert rel_error(out, ref) < 1e-4
    assert rel_error(aux, gt.reference(a, b, bias, out_dtype=torch.float32)) < 1e-4
    if activation == "relu":
        assert (out >= 0).all() and (out == 0).any()


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_with_per_tensor_scales(variant):
    M, N, K = 19, 32, 48
    g = torch.Generator().manual_seed(5)
    a = torch.randn(M, K, generator=g).to(DEV).to(torch.float8_e4m3fn)
    w = torch.randn(N, K, generator=g).to(DEV).to(torch.float8_e4m3fn)
    sa = torch.tensor([0.25], device=DEV)
    sb = torch.tensor([3.0], device=DEV)
    out = _run(variant, a, w.t(), scale_a=sa, scale_b=sb)
    assert out.dtype == torch.bfloat16
    # The reference dequantizes the same fp8 values, so only the bf16 output rounding differs.
    assert rel_error(out, gt.reference(a, w.t(), scale_a=sa, scale_b=sb).float()) < 1e-2
    # Scales enter: doubling one doubles the result.
    out2 = _run(variant, a, w.t(), scale_a=sa * 2, scale_b=sb)
    assert rel_error(out2, 2 * out.float()) < 1e-2


@pytest.mark.parametrize("precision", ["tf32", "ieee"])
def test_fp32_precisions(precision):
    a, b, _ = _operands(21, 23, 35, torch.float32, "rowmajor", seed=7)
    out = gt.gemm(a, b, precision=precision, variant="v1_tiled")
    ref = a.double() @ b.double()
    assert rel_error(out, ref) < (2e-3 if precision == "tf32" else 1e-5)


def test_k_one_and_size_one():
    a, b, bias = _operands(1, 1, 1, torch.float16, "rowmajor", seed=9)
    out = gt.gemm(a, b, bias=bias.half(), variant="v1_tiled")
    torch.testing.assert_close(out.float(), (a.float() @ b.float() + bias.half().float()), rtol=2e-3, atol=2e-3)
    a, b, _ = _operands(37, 29, 1, torch.float16, "rowmajor", seed=10)
    assert rel_error(gt.gemm(a, b, variant="v2_persistent"), gt.reference(a, b).float()) < 2e-3


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_linear_forward_and_backward(activation):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 7, 24, generator=g).to(DEV).requires_grad_()
    w = (0.3 * torch.randn(40, 24, generator=g)).to(DEV).requires_grad_()
    b = torch.randn(40, generator=g).to(DEV).requires_grad_()
    gy = torch.randn(3, 7, 40, generator=g).to(DEV)
    y = gt.linear(x, w, b, activation=activation)
    y.backward(gy)
    grads = [t.grad.clone() for t in (x, w, b)]
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = torch.nn.functional.linear(xr, wr, br)
    yr = {None: lambda t: t, "relu": torch.relu, "gelu": torch.nn.functional.gelu}[activation](yr)
    yr.backward(gy.double())
    assert y.shape == (3, 7, 40)
    assert rel_error(y, yr) < 2e-3  # TF32 forward
    for got, want in zip(grads, (xr.grad, wr.grad, br.grad)):
        assert rel_error(got, want) < 2e-3


def test_linear_named_variant_and_no_grad_match():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(5, 24, generator=g).to(DEV)
    w = torch.randn(16, 24, generator=g).to(DEV)
    b = torch.randn(16, generator=g).to(DEV)
    ref = torch.nn.functional.gelu(x.double() @ w.double().t() + b.double())
    with torch.no_grad():
        assert rel_error(gt.linear(x, w, b, "gelu"), ref) < 2e-3
    assert rel_error(gt.linear(x, w, b, "gelu", variant="v2_persistent"), ref) < 2e-3


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_linear_eager_skips_the_custom_op_and_compile_uses_it(activation, monkeypatch):
    """Eager calls run an autograd.Function (no custom-op dispatcher); torch.compile traces the
    custom ops. Both give the same values and gradients."""
    g = torch.Generator().manual_seed(14)
    x = torch.randn(2, 5, 24, generator=g).to(DEV)
    w = (0.3 * torch.randn(16, 24, generator=g)).to(DEV)
    b = torch.randn(16, generator=g).to(DEV)
    gy = torch.randn(2, 5, 16, generator=g).to(DEV)

    def grads(fn):
        ts = [t.clone().requires_grad_() for t in (x, w, b)]
        y = fn(*ts)
        y.backward(gy)
        return [y.detach()] + [t.grad for t in ts]

    def refuse(*args, **kwargs):
        raise AssertionError("eager linear went through the custom op")

    with monkeypatch.context() as m:
        m.setattr(gt, "_linear_op", refuse)
        m.setattr(gt, "_gemm_op", refuse)
        eager = grads(lambda a, c, d: gt.linear(a, c, d, activation=activation))
    torch._dynamo.reset()
    compiled = grads(torch.compile(lambda a, c, d: gt.linear(a, c, d, activation=activation), backend="aot_eager",
                                   fullgraph=True))
    for e, c in zip(eager, compiled):
        assert torch.allclose(e, c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b_layout", ["rowmajor", "kmajor"])
@pytest.mark.parametrize("shape", [(37, 29, 19), (20, 33, 16), (24, 16, 41)], ids=str)
def test_padded_route_for_unaligned_rows(shape, b_layout):
    """Rows that are not whole 16-byte multiples (odd K or N) go through zero-padded copies and
    the TMA kernel: the padding must not change the sum, and the result lands in a plain (M, N)."""
    M, N, K = shape
    a, b, bias = _operands(M, N, K, torch.float16, b_layout, seed=M * N + K)
    plan = _pad_plan(a, b)
    assert plan is not None and any(plan)
    out = poison(torch.empty(M, N, device=DEV, dtype=torch.float16))
    gt._run_padded(a, b, bias, "relu", None, None, None, "tf32", out)
    ref = torch.relu(a.double() @ b.double() + bias.double())
    assert rel_error(out, ref) < 2e-3
    # A result with no out given is a contiguous (M, N) tensor.
    res = gt._run_padded(a, b, None, None, None, None, None, "tf32", None)
    assert res.shape == (M, N) and res.is_contiguous()
    assert rel_error(res, a.double() @ b.double()) < 2e-3


def _pad_plan(a, b):
    return gc.pad_plan(gc.Operand.of(a), gc.Operand.of(b), None, None)


def test_padded_route_model_and_plan():
    a = torch.empty(64, 2999, dtype=torch.bfloat16)
    assert _pad_plan(a, torch.empty(2999, 3000, dtype=torch.bfloat16)) == (True, True, False)
    assert _pad_plan(torch.empty(64, 3000, dtype=torch.bfloat16), torch.empty(3000, 2999, dtype=torch.bfloat16)) \
        == (False, True, True)
    assert _pad_plan(a, torch.empty(8, 2999, dtype=torch.bfloat16).t()) == (True, True, False)
    assert _pad_plan(a[:, ::2], torch.empty(1500, 64, dtype=torch.bfloat16)) is None
    # Large cubes pay (copies ~ n^2, product ~ n^3), small ones do not (copy launches dominate).
    assert gc.padded_time_ratio(2999, 2999, 2999, 2, 2, (True, True, True)) < 0.5
    assert gc.padded_time_ratio(100, 100, 100, 2, 2, (True, True, True)) > 1.0


def test_output_sharing_memory_with_an_input_is_refused():
    g = torch.Generator().manual_seed(15)
    buf = torch.randn(64, 32, generator=g).to(DEV)
    a, b = buf[:32], torch.randn(32, 32, generator=g).to(DEV)
    for variant in (None, "v1_tiled"):
        with pytest.raises(ValueError, match="shares memory with 'a'"):
            gt.gemm(a, b, out=a, variant=variant)
        with pytest.raises(ValueError, match="shares memory with 'b'"):
            gt.gemm(a, b, out=b.t(), variant=variant)
    with pytest.raises(ValueError, match="'aux' shares memory with 'out'"):
        out = torch.empty(32, 32, device=DEV)
        gt.gemm(a, b, out=out, aux=out, variant="v1_tiled")
    # Disjoint rows of one buffer are fine: the other half of buf receives a @ b.
    gt.gemm(a, b, out=buf[32:], variant="v1_tiled")
    assert rel_error(buf[32:], a.double() @ b.double()) < 2e-3
    # A bias inside the output's range is refused as well.
    bias_in_out = torch.zeros(32, 32, device=DEV)
    with pytest.raises(ValueError, match="shares memory with 'bias'"):
        gt.gemm(a, b, bias=bias_in_out[0], out=bias_in_out)


def test_custom_ops_pass_opcheck():
    g = torch.Generator().manual_seed(13)
    x = torch.randn(9, 16, generator=g).to(DEV).requires_grad_()
    w = torch.randn(8, 16, generator=g).to(DEV).requires_grad_()
    b = torch.randn(8, generator=g).to(DEV).requires_grad_()
    torch.library.opcheck(gt._gemm_op, (x.detach(), w.detach().t(), b.detach(), "relu"))
    torch.library.opcheck(gt._linear_op, (x, w, b, "gelu", True))
    torch.library.opcheck(gt._linear_op, (x, w, None, "", False))


def test_bad_input_is_rejected_with_the_reason():
    a = torch.randn(4, 5, device=DEV)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        gt.gemm(a, torch.randn(6, 3, device=DEV))
    with pytest.raises(ValueError, match="both must have one dtype"):
        gt.gemm(a, torch.randn(5, 3, device=DEV).half())
    with pytest.raises(ValueError, match="dtype torch.int32"):
        gt.gemm(a.int(), a.int().t())
    with pytest.raises(ValueError, match="need scale_a and scale_b"):
        f8 = a.to(torch.float8_e4m3fn)
        gt.gemm(f8, f8.t())
    with pytest.raises(ValueError, match="apply to float8_e4m3fn inputs only"):
        gt.gemm(a, a.t(), scale_a=torch.ones(1, device=DEV), scale_b=torch.ones(1, device=DEV))
    with pytest.raises(ValueError, match="activation 'tanh'"):
        gt.gemm(a, a.t(), activation="tanh")
    with pytest.raises(ValueError, match=r"bias must be a tensor of shape \(4,\)"):
        gt.gemm(a, a.t(), bias=torch.ones(5, device=DEV))
    with pytest.raises(ValueError, match="must be 2-D"):
        gt.gemm(a[None], a.t())
    with pytest.raises(ValueError, match="unknown variant"):
        gt.gemm(a, a.t(), variant="v0")
    with pytest.raises(ValueError, match="'x' has K=5"):
        gt.linear(a, torch.randn(3, 4, device=DEV))
    with pytest.raises(ValueError, match="TMA needs"):
        gt.gemm(a, a.t(), variant="v3_tma_persistent")  # rows of 5 fp32 are not 16-byte multiples


def test_cost_and_reference():
    c = gt.cost(4096, 4096, 4096, torch.bfloat16)
    assert c.flops == 2 * 4096**3 and c.bytes == 2 * 3 * 4096**2
    c8 = gt.cost(64, 32, 128, torch.float8_e4m3fn, bias=True)
    assert c8.bytes == 64 * 128 + 128 * 32 + 2 * 64 * 32 + 4 * 32
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(gt.reference(a, b, activation="relu"), torch.relu(a @ b))


# --------------------------------------------------------------------------- GPU only, larger sizes


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (31, 33, 17), (1000, 4097, 64), (4097, 1000, 1000), (257, 8, 4096)],
                         ids=str)
@pytest.mark.quick(rotate="shape", per=2)
def test_gpu_sizes_against_fp64(variant, dtype, shape):
    M, N, K = shape
    a, b, bias = _operands(M, N, K, dtype, "kmajor", seed=M + N + K)
    out = poison(torch.empty(M, N, device="cuda", dtype=dtype))
    try:
        _run(variant, a, b, bias=bias, activation="gelu", out=out)
    except pytest.skip.Exception:
        if shape[1] % 8 == 0:
            raise
        return
    ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    assert rel_error(out, ref) < {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 2e-3}[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("b_layout", ["rowmajor", "kmajor"])
@pytest.mark.parametrize("shape", [(2999, 2999, 2999), (1001, 1536, 1003), (4096, 1000, 517)], ids=str)
@pytest.mark.quick(rotate="shape")
def test_gpu_auto_pads_unaligned_rows(shape, b_layout, dtype, monkeypatch):
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M + K)
    a = torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(K, N, device="cuda", generator=g) if b_layout == "rowmajor" else \
        torch.randn(N, K, device="cuda", generator=g).t()
    bias = torch.randn(N, device="cuda", generator=g)
    kw = {}
    if dtype == torch.float8_e4m3fn:
        kw = dict(scale_a=torch.tensor([0.5], device="cuda"), scale_b=torch.tensor([0.25], device="cuda"))
    a, b = a.to(dtype), b.to(dtype)
    calls = []
    real = gt._run_padded
    monkeypatch.setattr(gt, "_run_padded", lambda *args: calls.append(1) or real(*args))
    out = gt.gemm(a, b, bias=bias, activation="gelu", **kw)
    # The route follows the time model (for fp32 the copies cost twice the bytes); 2999^3 pays.
    pays = gr.route_of(a, b, bias=bias, activation="gelu", **kw).kind == "padded"
    assert bool(calls) == pays
    assert pays or shape != (2999, 2999, 2999)
    s = 0.125 if kw else 1.0
    ref = torch.nn.functional.gelu(s * (a.double() @ b.double()) + bias.double())
    assert out.shape == (M, N) and out.is_contiguous()
    assert rel_error(out, ref) < {torch.bfloat16: 1e-2, torch.float32: 2e-3, torch.float8_e4m3fn: 1e-2}[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_fp8_matches_scaled_mm(variant):
    M, N, K = 1000, 4096, 1024
    a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.tensor([0.5], device="cuda")
    sb = torch.tensor([0.25], device="cuda")
    if variant == "v3_tma_split":  # 16-bit only: a clear error
        with pytest.raises(ValueError, match="2-byte"):
            gt.VARIANTS[variant](a, w.t(), scale_a=sa, scale_b=sb)
        return
    out = gt.VARIANTS[variant](a, w.t(), scale_a=sa, scale_b=sb)
    ref = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    assert rel_error(out, ref.float()) < 1e-2


@pytest.mark.gpu
def test_gpu_linear_bf16_backward():
    x = torch.randn(4097, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (0.05 * torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16)).requires_grad_()
    b = torch.randn(1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = gt.linear(x, w, b, activation="gelu")
    gy = torch.randn_like(y)
    y.backward(gy)
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = torch.nn.functional.gelu(torch.nn.functional.linear(xr, wr, br))
    yr.backward(gy.double())
    assert rel_error(y, yr) < 1e-2
    for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        assert rel_error(got, want) < 2e-2


@pytest.mark.gpu
def test_gpu_rejects_mixed_devices():
    # CPU tensors alone run the reference (tests/test_cpu_rule.py); one on each device is refused
    with pytest.raises(ValueError, match="'b' is on cuda:0 but 'a' is on cpu"):
        gt.gemm(torch.randn(4, 4), torch.randn(4, 4, device="cuda"))


def test_autotune_config_pruning_and_tma_hook():
    from triton.tools.tensor_descriptor import TensorDescriptor

    def pruned(dtype, M, N, K=4096):
        return tk._prune(tk._CONFIGS, {"a_ptr": torch.empty(1, dtype=dtype), "M": M, "N": N, "K": K})

    for dtype, bk in ((torch.bfloat16, 64), (torch.float16, 64), (torch.float8_e4m3fn, 128), (torch.float32, 32)):
        big = pruned(dtype, 8192, 8192)
        assert len(big) >= 3 and {c.kwargs["BLOCK_K"] for c in big} == {bk}
    small = pruned(torch.bfloat16, 20, 40)
    assert small and all(c.kwargs["BLOCK_M"] <= 64 and c.kwargs["BLOCK_N"] <= 64 for c in small) or \
        len(small) == 1
    # At most TINY_FLOPS: one config (the smallest kept), so the first call times nothing; one more FLOP's
    # worth of K and the list is back.
    for dtype in (torch.bfloat16, torch.float32):
        tiny = pruned(dtype, 512, 512, gc.TINY_FLOPS // (2 * 512 * 512))
        assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in tiny] == [(64, 128)]
        assert len(pruned(dtype, 512, 512, gc.TINY_FLOPS // (2 * 512 * 512) + 1)) > 1
    # Descriptors get the chosen config's block shapes (B transposed when K-major).
    a = torch.empty(64, 64, dtype=torch.bfloat16)
    nargs = {n: TensorDescriptor.from_tensor(a, [16, 16]) for n in ("a_desc", "b_desc", "c_desc", "aux_desc")}
    cfg = tk._tma_configs()[0]
    tk._tma_pre_hook({**nargs, **cfg.kwargs, "B_KMAJOR": True})
    bm, bn, bk = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"]
    assert nargs["a_desc"].block_shape == [bm, bk] and nargs["b_desc"].block_shape == [bn, bk]
    assert nargs["c_desc"].block_shape == [bm, bn]


def test_tma_pruning_drops_configs_past_shared_memory():
    from triton.tools.tensor_descriptor import TensorDescriptor

    def pruned(dtype):
        t = torch.empty(64, 64, dtype=dtype)
        d = TensorDescriptor.from_tensor(t, [16, 16])
        return tk._prune(tk._CONFIGS, {"a_desc": d, "c_desc": d, "M": 8192, "N": 8192, "K": 8192})

    fp32 = pruned(torch.float32)
    assert fp32 and all((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) != (128, 256) for c in fp32)
    assert any(c.kwargs["BLOCK_N"] == 256 for c in pruned(torch.bfloat16))  # 208 KiB: fits


_COMPILE_SM90 = (r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import triton_kernels as tk


def build(fn, sig, constexprs, aligned, num_warps, num_stages):
    # The 16-divisibility that the JIT finds for aligned pointers and sizes, given by hand.
    for k in constexprs:
        sig.setdefault(k, "constexpr")
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), """
                 r"""options={"num_warps": num_warps, "num_stages": num_stages})
    ptx = k.asm["ptx"]
    return {"wgmma": "wgmma.mma_async" in ptx, "cp_async": "cp.async.cg" in ptx or "cp.async.ca" in ptx,
            "tma": "cp.async.bulk.tensor" in ptx, "e4m3": "e4m3" in ptx, "smem": k.metadata.shared}


meta = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "HAS_BIAS": True, "HAS_SCALES": False,
        "STORE_AUX": False, "ACTIVATION": 2, "PRECISION": "tf32", "UPCAST": False}
sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "bias_ptr": "*bf16", "aux_ptr": "*bf16",
       "scale_a_ptr": "*fp32", "scale_b_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32",
       "stride_ak": "constexpr", "stride_bk": "i32", "stride_bn": "constexpr", "stride_cm": "i32",
       "stride_cn": "constexpr"}
ptr = build(tk._gemm_kernel, sig, {**meta, "stride_ak": 1, "stride_bn": 1, "stride_cn": 1},
            ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"], 8, 3)
tsig = {"a_desc": "tensordesc<fp8e4nv[128, 128]>", "b_desc": "tensordesc<fp8e4nv[256, 128]>",
        "c_desc": "tensordesc<bf16[128, 256]>", "aux_desc": "tensordesc<bf16[128, 256]>", "bias_ptr": "*bf16",
        "scale_a_ptr": "*fp32", "scale_b_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "NUM_SMS": "i32",
        "dtype_tag": "i32"}
tma = build(tk._gemm_tma_persistent_kernel, tsig, {**meta, "BLOCK_K": 128, "HAS_SCALES": True, "B_KMAJOR": True},
            ["M", "N", "K"], 8, 3)
ssig = {**{k: v for k, v in sig.items() if k not in meta}, "a_desc": "tensordesc<bf16[128, 64]>",
        "b_desc": "tensordesc<bf16[128, 64]>", "ws_ptr": "*fp32", "count_ptr": "*i32", "ITERS_PER_PROG": "i32"}
ssig = {k: ssig[k] for k in ["a_ptr", "b_ptr", "a_desc", "b_desc", "c_ptr", "bias_ptr", "aux_ptr", "scale_a_ptr",
                             "scale_b_ptr", "ws_ptr", "count_ptr", "M", "N", "K", "stride_am", "stride_ak",
                             "stride_bk", "stride_bn", "stride_cm", "stride_cn", "ITERS_PER_PROG"]}
sk = build(tk._gemm_streamk_kernel, ssig, {**meta, "BLOCK_N": 128, "stride_ak": 1, "stride_bn": 1, "stride_cn": 1,
                                           "USE_TMA": True, "B_KMAJOR": True},
           ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"], 8, 4)
t = gc.SPLIT_TILE
bm, bn, bn2, bk, st, w = t.bm, t.bn, t.bn2, t.bk, t.stages, t.warps
spsig = {"a_desc": f"tensordesc<bf16[{bm}, {bk}]>", "b_desc": f"tensordesc<bf16[{bk}, {bn}]>",
         "b2_desc": f"tensordesc<bf16[{bk}, {bn2}]>", "c_desc": f"tensordesc<bf16[{bm}, {bn}]>",
         "c2_desc": f"tensordesc<bf16[{bm}, {bn2}]>", "aux_desc": f"tensordesc<bf16[{bm}, {bn}]>",
         "aux2_desc": f"tensordesc<bf16[{bm}, {bn2}]>", "bias_ptr": "*bf16", "scale_a_ptr": "*fp32",
         "scale_b_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "NUM_SMS": "i32"}
split = build(tk._gemm_tma_split_kernel, spsig, {**meta, "BLOCK_N": bn, "BLOCK_N2": bn2, "BLOCK_K": bk,
                                                 "B_KMAJOR": False}, ["M", "N", "K"], w, st)
print(json.dumps({"ptr": ptr, "tma": tma, "streamk": sk, "split": split, "limit": gc.SMEM_LIMIT}))
""")


@pytest.mark.skipif(HAS_CUDA, reason="on a GPU the kernels run for real")
def test_kernels_compile_for_sm90_with_wgmma_pipelining_and_tma():
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, don't interpret
    p = subprocess.run([sys.executable, "-c", _COMPILE_SM90], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["ptr"]["wgmma"] and r["ptr"]["cp_async"]  # tensor cores, software-pipelined loads
    assert r["ptr"]["smem"] == 3 * (128 + 256) * 64 * 2  # three stages of A and B tiles
    assert r["tma"]["wgmma"] and r["tma"]["tma"] and r["tma"]["e4m3"]
    assert r["tma"]["smem"] <= r["limit"]
    assert r["streamk"]["wgmma"] and r["streamk"]["tma"] and r["streamk"]["smem"] <= r["limit"]
    assert r["split"]["wgmma"] and r["split"]["tma"] and r["split"]["smem"] <= r["limit"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("b_layout", ["rowmajor", "kmajor"])
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (768, 776, 3000), (1000, 1000, 8)], ids=str)
@pytest.mark.quick(rotate="shape")
def test_gpu_fixed_64x128_tile(shape, b_layout, dtype):
    """gemm()'s fixed 64 x 128 TMA launch (where tma_tile_for picks it): bias + GELU + aux, sizes
    off the tile, long and short K, poisoned outputs."""
    M, N, K = shape
    a, b, bias = _operands(M, N, K, dtype, b_layout, seed=M + N + K)
    out = poison(torch.empty(M, N, device="cuda", dtype=dtype))
    aux = poison(torch.empty(M, N, device="cuda", dtype=dtype))
    gt._TMA_FIXED_64x128(a, b, bias=bias, activation="gelu", out=out, aux=aux)
    pre = a.double() @ b.double() + bias.double()
    assert rel_error(out, torch.nn.functional.gelu(pre)) <= TOL[dtype]
    assert rel_error(aux, pre) <= TOL[dtype]
    if tk.num_sms(a.get_device()) == 132:
        assert gc.tma_tile_for(M, N, 132) == "64x128"
    assert rel_error(gt.gemm(a, b), a.double() @ b.double()) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("b_layout", ["rowmajor", "kmajor"])
@pytest.mark.parametrize("shape", [(1536, 1536, 1536), (3072, 3072, 3072), (1000, 1096, 520), (129, 200, 4104)],
                         ids=str)
@pytest.mark.quick(rotate="shape", per=2)
def test_gpu_tma_split(shape, b_layout, dtype):
    """v3_tma_split on the GPU (its 128 x 192 tile): sizes where gemm() picks it, tiles cut in the
    first and second halves, long K; bias + ReLU + aux; poisoned outputs."""
    M, N, K = shape
    a, b, bias = _operands(M, N, K, dtype, b_layout, seed=M + K)
    out = poison(torch.empty(M, N, device="cuda", dtype=dtype))
    aux = poison(torch.empty(M, N, device="cuda", dtype=dtype))
    gt.VARIANTS["v3_tma_split"](a, b, bias=bias, activation="relu", out=out, aux=aux)
    pre = a.double() @ b.double() + bias.double()
    assert rel_error(out, torch.relu(pre)) <= TOL[dtype]
    assert rel_error(aux, pre) <= TOL[dtype]
    if M == N == K:
        sms = tk.num_sms(a.get_device())
        assert (gc.tma_tile_for(M, N, sms) == "128x192") == (sms == 132)
        assert rel_error(gt.gemm(a, b), a.double() @ b.double()) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(512, 512, 512), (200, 312, 96), (1, 8, 8), (130, 1000, 2048)], ids=str)
@pytest.mark.quick(rotate="shape", per=2)
def test_gpu_small_problem_path(dtype, shape):
    """gemm(variant=None) on small 16-bit problems takes the fixed 64 x 64 persistent tile: right
    answers with bias and activation, sizes not multiples of the tile, poisoned output; layouts it
    cannot vectorize (odd row lengths) and larger problems keep the old paths."""
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    w = torch.randn(N, K, device="cuda", generator=g).to(dtype)
    bias = torch.randn(N, device="cuda", generator=g)
    b = w.t()  # K-major B, no copy
    # split-K comes first: a long K over too few output tiles (130 x 1000 x 2048) slices K instead
    want = "splitk" if gc.split_k_for(M, N, K) > 1 else "small"
    assert gr.route_of(a, b, bias=bias, activation="relu").kind == want
    assert gc._small(gr.problem_of(a, b, bias, "relu"))  # the small tile's own rule takes the layout
    out = poison(torch.empty(M, N, device="cuda", dtype=dtype))
    gt.gemm(a, b, bias=bias, activation="relu", out=out)
    ref = torch.relu(a.double() @ b.double() + bias.double())
    assert rel_error(out, ref) <= TOL[dtype]
    c = gt.gemm(a, b)
    assert rel_error(c, a.double() @ b.double()) <= TOL[dtype]
    odd = torch.randn(M, K + 1, device="cuda", generator=g).to(dtype)[:, :K]  # rows of K + 1: not 16-byte
    assert gr.route_of(odd, b).kind != "small"
    assert rel_error(gt.gemm(odd, b), odd.double() @ b.double()) <= TOL[dtype]
    big = torch.randn(768, 768, device="cuda", dtype=dtype)
    assert gr.route_of(big, big).kind != "small"


def test_auto_routes_large_16bit_outputs_to_v1(monkeypatch):
    """gemm(variant=None): TMA-able operands go to v3_tma_persistent, except 16-bit outputs of at
    least V1_FROM_MN elements (v1_tiled measured ahead at 8192^3); fp32 stays on v3."""
    unplanned = gc.GemmPolicy(plans=False)  # routing is what this test watches
    taken = []
    for name in ("v1_tiled", "v3_tma_persistent"):
        real = gt.VARIANTS[name]
        monkeypatch.setitem(gt.VARIANTS, name, lambda *a, _n=name, _r=real, **k: taken.append(_n) or _r(*a, **k))
    a16, b16, _ = _operands(40, 48, 32, torch.bfloat16, "rowmajor")
    a32, b32, _ = _operands(40, 48, 32, torch.float32, "rowmajor")
    monkeypatch.setattr(gc, "SMALL_MAX_TILES", 0)  # not the small-problem tile (on a GPU)
    gt.gemm(a16, b16, policy=unplanned)
    monkeypatch.setattr(gc, "V1_FROM_MN", 40 * 48)
    out = gt.gemm(a16, b16, policy=unplanned)
    gt.gemm(a32, b32, policy=unplanned)
    assert taken == ["v3_tma_persistent", "v1_tiled", "v3_tma_persistent"]
    assert rel_error(out, gt.reference(a16, b16).float()) < TOL[torch.bfloat16]


# --------------------------------------------------------------------------- call plans


def test_plan_key_separates_what_the_route_depends_on():
    """plan_key: shapes, strides, dtypes, 16-byte alignment, bias and out layouts, flags; equal
    for two calls that differ only in the tensors' (aligned) addresses."""
    buf = torch.empty(4 * 64 * 64 + 8, dtype=torch.bfloat16)
    a = buf[:64 * 64].view(64, 64)
    b = buf[64 * 64:2 * 64 * 64].view(64, 64)
    key = lambda *args, **kw: gr.plan_key(*args, **kw)  # noqa: E731
    base = key(a, b, None, None, None, "tf32", None)
    assert base == key(b, a, None, None, None, "tf32", None)  # other addresses, same layout
    shifted = buf[1:64 * 64 + 1].view(64, 64)  # 2 bytes off an aligned base
    assert key(shifted, b, None, None, None, "tf32", None) != base
    assert key(a, b.t(), None, None, None, "tf32", None) != base  # strides
    assert key(a, b.float(), None, None, None, "tf32", None) != base  # dtype
    assert key(a, b, torch.zeros(64), None, None, "tf32", None) != base
    assert key(a, b, None, "relu", None, "tf32", None) != base
    assert key(a, b, None, None, torch.float32, "tf32", None) != base
    assert key(a, b, None, None, None, "ieee", None) != base
    out = buf[2 * 64 * 64:3 * 64 * 64].view(64, 64)
    assert key(a, b, None, None, None, "tf32", out) != base
    assert key(a, b, None, None, None, "tf32", out) == key(a, b, None, None, None, "tf32", out.clone())
    assert key([[1.0]], b, None, None, None, "tf32", None) is None  # not a tensor: the checked path
    assert key(a, b, None, ["relu"], None, "tf32", None) is None  # unhashable: the checked path


@pytest.mark.parametrize("transposed", [False, True])
def test_descriptor_maker_matches_from_tensor(transposed):
    """A plan's descriptors (checked once, then made without re-checking) equal
    TensorDescriptor.from_tensor's, field by field; for a K-major B the base is b itself."""
    import dataclasses

    from triton.tools.tensor_descriptor import TensorDescriptor

    b = torch.randn(96, 40, dtype=torch.float16)
    if transposed:  # B = w.t() of a (40, 96) weight: the descriptor covers w, the base is b
        b = torch.randn(40, 96, dtype=torch.float16).t()
    make = gr._desc_maker(TensorDescriptor.from_tensor(b.t() if transposed else b, [32, 16]))
    other = torch.randn(40, 96, dtype=torch.float16).t() if transposed else torch.randn(96, 40, dtype=torch.float16)
    d = make(other)
    ref = TensorDescriptor.from_tensor(other.t() if transposed else other, [32, 16])
    assert type(d) is TensorDescriptor and d.base is other
    for f in dataclasses.fields(TensorDescriptor):
        if f.name != "base":
            assert list(getattr(d, f.name)) == list(getattr(ref, f.name)) if isinstance(
                getattr(ref, f.name), (list, tuple, torch.Size)) else getattr(d, f.name) == getattr(ref, f.name)
    assert d.base.data_ptr() == ref.base.data_ptr()
    with pytest.raises(AssertionError):  # 18-byte rows: refused where the prototype is built, once
        gr._desc_maker(TensorDescriptor.from_tensor(torch.empty(8, 9, dtype=torch.float16), [8, 8]))
    import gc
    import weakref

    first = torch.randn(96, 40, dtype=torch.float16)
    alive = weakref.ref(first)
    make = gr._desc_maker(TensorDescriptor.from_tensor(first, [32, 16]))
    del first
    gc.collect()
    assert alive() is None  # the maker keeps no reference to the prototype's tensor


def test_descriptor_maker_without_the_fast_path(monkeypatch):
    """Where TensorDescriptor cannot be filled in directly (``_TD_FAST`` off), the maker builds it
    through its constructor: the same fields."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    monkeypatch.setitem(gr._TD_FAST, TensorDescriptor, False)
    a = torch.randn(64, 48, dtype=torch.bfloat16)
    d = gr._desc_maker(TensorDescriptor.from_tensor(a, [16, 16]))(a.clone())
    ref = TensorDescriptor.from_tensor(a, [16, 16])
    assert type(d) is TensorDescriptor
    assert list(d.shape) == list(ref.shape) and list(d.strides) == list(ref.strides)
    assert list(d.block_shape) == [16, 16]


@pytest.mark.parametrize("route", ["small", "v1", "tma", "tma_64x128", "tma_split"])
@pytest.mark.parametrize("b_layout", ["rowmajor", "kmajor"])
def test_plan_rebuilds_the_launch_its_variant_builds(route, b_layout, monkeypatch):
    """Without a GPU: a plan's bound launches for new tensors get the arguments the route's own
    launch builder (what the variants run) gives for them: the same tensors at the pointer
    positions, descriptors with the same shape, strides, block and address, the same constants."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    monkeypatch.setattr(tk, "INTERPRET", False)  # the GPU routes' configs; nothing is launched
    launched, bound_calls = [], []

    class FakeBound:
        def __call__(self, *args):
            bound_calls.append(args)

    def fake_bind(fn, grid, *args, run_pre_hook=True, **kw):
        if fn is tk._tma:  # what the autotuner's pre-hook would leave: the chosen config's blocks
            args[0].block_shape, args[2].block_shape = [128, 64], [128, 128]
            args[1].block_shape = [128, 64] if b_layout == "kmajor" else [64, 128]
        launched.append((fn, args, kw))
        return FakeBound()

    monkeypatch.setattr(gr, "_bind", fake_bind)
    M, N, K = 200, 320, 96
    dtype = torch.bfloat16

    def operands(seed):
        a, b, bias = _operands(M, N, K, dtype, b_layout, seed=seed)
        return a, b, bias.to(dtype), torch.empty(M, N, dtype=dtype)

    a, b, bias, out = operands(1)
    plan = gr.make_plan(route, a, b, bias, "relu", "tf32", out)
    plan(a, b, bias, out)  # first call: the builder's launch, bound
    assert len(launched) == 1 and not bound_calls
    a2, b2, bias2, out2 = operands(2)
    plan(a2, b2, bias2, out2)
    got = bound_calls[-1]
    fn, _, want, kw = plan.spec(a2, b2, bias2, out2)
    assert fn is launched[0][0] and kw == launched[0][2] and len(got) == len(want)
    for i, (g_, w) in enumerate(zip(got, want)):
        if isinstance(w, TensorDescriptor):
            blocks = launched[0][1][i].block_shape  # the first launch's, after the (fake) pre-hook
            assert isinstance(g_, TensorDescriptor), i
            assert g_.base.data_ptr() == w.base.data_ptr(), i
            assert (list(g_.shape), list(g_.strides), list(g_.block_shape)) == (
                list(w.shape), list(w.strides), list(blocks)), i
        elif isinstance(w, torch.Tensor):
            assert g_ is w, i
        else:
            assert g_ == w, i


def _reused_poison(M, N, dtype):
    """Leave a freed NaN block of (M, N) in the caching allocator, so that the next allocation of
    that size (a plan's output) starts as NaN: an element the kernel misses fails the test."""
    junk = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    del junk


_PLAN_CASES = [
    # (M, N, K, dtype, b layout, bias + activation, the plan's kind)
    (200, 312, 96, torch.bfloat16, "kmajor", "relu", "ptr"),        # small problem: 64 x 64 persistent
    (1000, 1024, 1000, torch.bfloat16, "rowmajor", None, "tma"),    # fixed 64 x 128 TMA
    (1000, 1000, 1000, torch.bfloat16, "rowmajor", None, "sm90"),   # B rows 2,000 bytes: gemm_sm90 64 x 128
    (1000, 1000, 520, torch.float16, "kmajor", "gelu", "tma"),
    (1536, 1536, 264, torch.bfloat16, "rowmajor", "relu", "split"),  # v3_tma_split
    (1536, 1536, 264, torch.float16, "kmajor", None, "split"),
    (2048, 2048, 136, torch.bfloat16, "rowmajor", None, "tma"),      # the autotuner's tile
    (300, 200, 136, torch.float32, "kmajor", "relu", "tma"),         # tf32, autotuned
    (600, 400, 200, torch.float16, "a_transposed", None, "ptr"),     # no TMA: v1_tiled
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", _PLAN_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}-{c[5]}")
@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.quick(rotate="with_out")
def test_gpu_plans_match_the_checked_path(case, with_out):
    """gemm()'s plans (the first call checks and routes, later calls launch directly) give
    bit-identical results to the checked path (plans off) on fresh inputs each call, into
    outputs that start as NaN, for every route the plans cover."""
    M, N, K, dtype, layout, act, kind = case
    if kind == "sm90" and not gs.available():
        pytest.skip("the gemm_sm90 route needs an sm_90 GPU and cuda-bindings")
    for i in range(4):  # plan made; descriptors bound; the bound launch, twice
        a, b, bias = _operands(M, N, K, dtype, "kmajor" if layout == "kmajor" else "rowmajor", seed=10 * i + M)
        if layout == "a_transposed":
            a = a.t().contiguous().t()  # (M, K) with unit stride along M
        bias = bias.to(dtype) if act else None
        ref = gt.gemm(a, b, bias=bias, activation=act, policy=gc.GemmPolicy(plans=False))
        if with_out:
            out = poison(torch.empty(M, N, device="cuda", dtype=ref.dtype))
            got = gt.gemm(a, b, bias=bias, activation=act, out=out)
            assert got is out
        else:
            _reused_poison(M, N, ref.dtype)
            got = gt.gemm(a, b, bias=bias, activation=act)
        assert torch.equal(got, ref), f"call {i}: plan differs from the checked path"
        exact = a.double() @ b.double() + (bias.double() if act else 0)
        exact = {None: exact, "relu": torch.relu(exact), "gelu": torch.nn.functional.gelu(exact)}[act]
        assert rel_error(got, exact) <= TOL[dtype]
    assert len(gr.PLANS) == 1
    plan = next(iter(gr.PLANS.values()))
    if kind == "sm90":
        assert isinstance(plan, gr._Sm90Plan) and plan.config == "64x128_c2x1"
    else:
        assert plan.kind == kind and plan.bound is not None


@pytest.mark.gpu
def test_gpu_plans_refuse_overlap_and_follow_alignment():
    """A plan made for one layout: an out that overlaps an input is still refused; an input of
    the same shape 2 bytes off an aligned base gets its own route (TMA needs 16-byte bases)."""
    n = 256
    buf = torch.randn(3 * n * n + 8, device="cuda", dtype=torch.bfloat16)
    a, b, c = (buf[i * n * n:(i + 1) * n * n].view(n, n) for i in range(3))
    gt.gemm(a, b, out=c)
    gt.gemm(a, b, out=c)
    with pytest.raises(ValueError, match="shares memory"):
        gt.gemm(a, b, out=a)  # same layout as c: the plan's key matches, its range test refuses
    with pytest.raises(ValueError, match="shares memory"):
        gt.gemm(a, b, out=buf[n * n // 2:n * n // 2 + n * n].view(n, n))
    big = torch.randn(1000 * 1000 + 8, device="cuda", dtype=torch.bfloat16)
    x = big[:1000 * 1000].view(1000, 1000)
    y = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
    gt.gemm(x, y)
    gt.gemm(x, y)  # the fixed 64 x 128 TMA plan, bound
    shifted = big[8:8 + 1000 * 1000].view(1000, 1000)  # 16 bytes off: TMA still applies
    odd = big[1:1 + 1000 * 1000].view(1000, 1000)  # 2 bytes off: no TMA
    for t in (shifted, odd, x, odd):
        assert rel_error(gt.gemm(t, y), t.double() @ y.double()) <= TOL[torch.bfloat16]
    assert len(gr.PLANS) >= 3


@pytest.mark.gpu
def test_gpu_plans_under_graph_capture():
    """A bound plan captured into a CUDA graph (output allocated in the graph's pool) replays on
    new data."""
    a = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        gt.gemm(a, b)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gt.gemm(a, b)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gt.gemm(a, b)
    a.copy_(torch.randn_like(a))
    poison(y)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_error(y, a.double() @ b.double()) <= TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_tf32_row_major_b_is_transposed_first():
    """gemm() with a row-major fp32 B: plain products go to gemm_sm90.gemm_tf32 on an sm_90 GPU (B
    as given); with a bias (which that kernel does not fuse) B is transposed first and given to
    the tf32 kernels K-major (wgmma takes tf32 operands K-major only; 0.20-0.25x cuBLAS without
    this): the same bits as the K-major product, right within tf32's tolerance on odd sizes into
    a poisoned out; a given out that overlaps B is still refused; "ieee" precision and small B keep
    B as given."""
    M, N, K = 333, 520, 264
    g = torch.Generator(device="cuda").manual_seed(9)
    a = torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(K, N, device="cuda", generator=g)
    bias = torch.randn(N, device="cuda", generator=g)
    assert gr.route_of(a, b, bias=bias).transpose_b
    assert not gr.route_of(a, b, bias=bias, precision="ieee").transpose_b
    assert not gr.route_of(a[:, :64], b[:64, :64].contiguous(), bias=bias[:64]).transpose_b
    got = gt.gemm(a, b, bias=bias, out=poison(torch.empty(M, N, device="cuda")))
    assert torch.equal(got, gt.gemm(a, b.t().contiguous().t(), bias=bias))
    assert rel_error(got, a.double() @ b.double() + bias.double()) <= TOL[torch.float32]
    plain = gt.gemm(a, b, out=poison(torch.empty(M, N, device="cuda")))
    if gs.available(a.get_device()):
        assert gr.route_of(a, b).kind == "tf32_sm90"
        assert torch.equal(plain, gs.gemm_tf32(a, b))
    assert rel_error(plain, a.double() @ b.double()) <= TOL[torch.float32]
    buf = torch.randn(K * N + M * N, device="cuda", generator=g)
    b2 = buf[:K * N].view(K, N)
    with pytest.raises(ValueError):
        gt.gemm(a, b2, out=buf[K * N - 8:K * N - 8 + M * N].view(M, N))


def test_non_tensors_are_type_errors_naming_the_argument():
    # Issue 29: lists reached the routing before the checks and failed with an AttributeError.
    with pytest.raises(TypeError, match="'a' must be a torch.Tensor, got list"):
        gt.gemm([[1.0]], [[1.0]])
    a = torch.randn(4, 5, device=DEV)
    with pytest.raises(TypeError, match="'b' must be a torch.Tensor, got NoneType"):
        gt.gemm(a, None)
    with pytest.raises(TypeError, match="'out' must be a torch.Tensor or None"):
        gt.gemm(a, a.t(), out=[0.0])
    with pytest.raises(TypeError, match="'out_dtype' must be a torch.dtype"):
        gt.gemm(a, a.t(), out_dtype="float32")
    with pytest.raises(TypeError, match="linear: 'w' must be a torch.Tensor"):
        gt.linear(a, [[1.0]])
    with pytest.raises(ValueError, match="linear: 'x' has dtype torch.int64"):  # not gemm's 'a'
        gt.linear(a.long(), a)
