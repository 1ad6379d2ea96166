import math

import pytest
import torch

import tilewise
from tilewise.ops.norm import api as N
from tilewise.ops.norm import configs as NC

from conftest import poison


def _hf_llama(x, w, eps):
    """transformers' LlamaRMSNorm.forward, written out (transformers is not a dependency)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _hf_gemma(x, w, eps):
    """transformers' GemmaRMSNorm.forward, written out."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + w.float())).type_as(x)


def _inputs(shape, dtype, wdtype=None, seed=0, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(shape, generator=g, device=device) * 3 + 0.5).to(dtype)
    w = (torch.rand(shape[-1], generator=g, device=device) + 0.5).to(wdtype or dtype)
    return x, w


@pytest.mark.parametrize("mode", N.MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_the_hf_formula(mode, dtype):
    x, w = _inputs((3, 7, 33), dtype)
    want = (_hf_llama if mode == "llama" else _hf_gemma)(x, w, 1e-5)
    got = N.reference(x, w, 1e-5, mode)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_cost():
    c = N.cost(4, 1000, torch.bfloat16)
    assert c.bytes == 2 * 4 * 1000 * 2 + 16 and c.flops == 16000
    assert N.cost(4, 1000, torch.bfloat16, backward=True).bytes == 3 * 4 * 1000 * 2 + 16


def test_launch_table():
    for n in (1, 100, 1024, 1025, 2048, 4096, 5000, 9000, NC.MAX_N):
        for L in (NC.launch_for(n), NC.forward_launch_for(n)):
            assert L.BLOCK >= n and L.BLOCK & (L.BLOCK - 1) == 0
            assert L.BLOCK * L.ROWS // (32 * L.warps) <= 64  # fp32 values a thread holds
        assert NC.launch_for(n).persistent  # the backward's programs each sum a slice of dW
    # one program a row block: the grid covers M whatever the SM count
    assert N._programs(10_000, NC.forward_launch_for(4096), -1) == 10_000
    assert N._programs(10_000, NC.launch_for(4096), -1) == 4 * NC.PROGRAMS_PER_SM


SHAPES = [(37, 100), (2, 3, 1000), (5, 1), (3, 2049), (1, 4097), (3, 9000), (0, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mode", N.MODES)
def test_triton_interpreter_forward_backward(shape, mode):
    """fp32 in the interpreter against the float64 reference: y, dx, dw; odd sizes, one element,
    empty; x as a strided slice of a larger tensor (rows of unit stride kept, not copied)."""
    x, w = _inputs(shape, torch.float32, seed=sum(shape))
    wide = torch.zeros(*shape[:-1], shape[-1] + 3)
    wide[..., 1:shape[-1] + 1] = x
    xs = wide[..., 1:shape[-1] + 1]  # row stride shape[-1] + 3
    xi, wi = xs.clone().requires_grad_(True), w.clone().requires_grad_(True)
    xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
    y = tilewise.rms_norm(xi if x.numel() else xi, wi, 1e-6, mode=mode)
    ref = N.reference(xr, wr, 1e-6, mode)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    y.backward(g)
    ref.backward(g.double())
    torch.testing.assert_close(xi.grad.double(), xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(wi.grad.double(), wr.grad, rtol=1e-4, atol=1e-4)


def test_triton_interpreter_llama_casts_before_the_weight():
    """bf16 x with an fp32 weight: HF multiplies the bf16-rounded row by the fp32 weight (an fp32
    result); so does the kernel, within one bf16 rounding of the row (the interpreter's float-to-bf16
    conversion and rsqrt are not the GPU's). bf16 weight: a bf16 result."""
    x, w = _inputs((9, 130), torch.bfloat16, torch.float32, seed=3)
    y = tilewise.rms_norm(x, w, 1e-5)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, _hf_llama(x, w, 1e-5), rtol=8e-3, atol=1e-6)
    y16 = tilewise.rms_norm(x, w.bfloat16(), 1e-5)
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), _hf_llama(x, w.bfloat16(), 1e-5).float(), rtol=1.6e-2, atol=8e-3)


def test_triton_interpreter_weight_gradient_is_deterministic_and_compiles():
    x, w = _inputs((64, 48), torch.float32, seed=5)
    grads = []
    for _ in range(2):
        wi = w.clone().requires_grad_(True)
        tilewise.rms_norm(x, wi).sum().backward()
        grads.append(wi.grad)
    assert torch.equal(grads[0], grads[1])
    f = torch.compile(lambda a, b: tilewise.rms_norm(a, b, mode="gemma") * 2, backend="aot_eager", fullgraph=True)
    xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = f(xi, wi)
    out.sum().backward()
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    (2 * N.reference(xr, wr, 1e-6, "gemma")).sum().backward()
    torch.testing.assert_close(out, 2 * N.reference(x, w, 1e-6, "gemma"), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xi.grad, xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(wi.grad, wr.grad, rtol=1e-4, atol=1e-4)


def test_rejects_bad_arguments():
    x, w = _inputs((4, 8), torch.float32)
    for kw, msg in [(dict(x=x.long()), "'x' has dtype"), (dict(weight=w[:5]), "'weight' has shape"),
                    (dict(weight=[1.0] * 8), "'weight' must be a torch.Tensor"), (dict(eps=-1.0), "'eps'"),
                    (dict(eps=math.nan), "'eps'"), (dict(eps="x"), "'eps'"), (dict(mode="rms"), "'mode'"),
                    (dict(x=torch.ones(2, NC.MAX_N + 1), weight=torch.ones(NC.MAX_N + 1)), "rows of"),
                    (dict(x=torch.tensor(1.0)), "'weight' has shape")]:
        args = dict(x=x, weight=w, eps=1e-6, mode="llama") | kw
        with pytest.raises(ValueError, match=msg):
            tilewise.rms_norm(args["x"], args["weight"], args["eps"], mode=args["mode"])


def test_cpu_tensors_outside_the_interpreter_run_the_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w = _inputs((4, 8), torch.float32)
    torch.testing.assert_close(tilewise.rms_norm(x, w, mode="gemma"), N.reference(x, w, mode="gemma"))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4097, 4096), (1000, 5120), (33, 16384), (3, 7, 2048)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("mode", N.MODES)
@pytest.mark.quick(rotate="shape")
def test_gpu_forward_backward(shape, dtype, mode, monkeypatch):
    """Against the fp32 reference at H200 sizes not multiple of the launch tiles; outputs poisoned."""
    real_empty = torch.empty

    def poisoned_empty(*a, **k):  # float outputs start NaN: an element the kernels never write fails
        t = real_empty(*a, **k)
        return poison(t) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    x, w = _inputs(shape, dtype, seed=shape[0], device="cuda")
    xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = N.rms_norm(xi, wi, 1e-5, mode=mode)  # (the module's names: the coverage ledger sees them)
    xr, wr = x.float().requires_grad_(True), w.float().requires_grad_(True)
    ref = N.v1_reference(xr, wr, 1e-5, mode=mode)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=tol)
    g = torch.randn(y.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2)).to(y.dtype)
    y.backward(g)
    ref.backward(g.float())
    for name, a, b in (("dx", xi.grad, xr.grad), ("dw", wi.grad, wr.grad)):
        assert not torch.isnan(a).any(), name
        err = ((a.double() - b.double()).norm() / b.double().norm()).item()
        assert err < (1e-5 if dtype == torch.float32 else 1e-2), f"{name}: relative error {err:.3g}"


ADD_SHAPES = [(37, 100), (2, 3, 1000), (5, 1), (3, 2049), (3, 9000), (0, 64)]


@pytest.mark.parametrize("shape", ADD_SHAPES, ids=str)
@pytest.mark.parametrize("mode", N.MODES)
@pytest.mark.parametrize("uses", ["both", "y", "s"])
def test_triton_interpreter_add_rms_norm(shape, mode, uses):
    """fp32 in the interpreter against the float64 reference: y and the sum; the gradients of x,
    residual and weight when the loss uses y and s (the backward adds s's gradient in), y only, or s
    only; the residual a strided slice."""
    x, w = _inputs(shape, torch.float32, seed=sum(shape))
    r = _inputs(shape, torch.float32, seed=sum(shape) + 1)[0]
    wide = torch.zeros(*shape[:-1], shape[-1] + 5)
    wide[..., 2:shape[-1] + 2] = r
    rs = wide[..., 2:shape[-1] + 2]
    xi, ri, wi = x.clone().requires_grad_(True), rs.clone().requires_grad_(True), w.clone().requires_grad_(True)
    xr, rr, wr = (t.double().requires_grad_(True) for t in (x, r, w))
    y, s = tilewise.add_rms_norm(xi, ri, wi, 1e-6, mode=mode)
    yr, sr = N.add_reference(xr, rr, wr, 1e-6, mode)
    torch.testing.assert_close(y.double(), yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s.double(), sr, rtol=1e-6, atol=1e-6)
    gen = torch.Generator().manual_seed(1)
    gy, gs = torch.randn(y.shape, generator=gen), torch.randn(s.shape, generator=gen)

    def loss(a, b, dt):
        return ((a * gy.to(dt)).sum() if uses != "s" else 0) + ((b * gs.to(dt)).sum() if uses != "y" else 0)

    loss(y, s, torch.float32).backward()
    loss(yr, sr, torch.float64).backward()
    for name, a, b in (("x", xi, xr), ("residual", ri, rr)):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-5, msg=name)
    if uses == "s":
        assert wi.grad is None or not wi.grad.any()
    else:
        torch.testing.assert_close(wi.grad.double(), wr.grad, rtol=1e-4, atol=1e-4)


def test_triton_interpreter_add_rms_norm_rounds_the_sum_as_the_model_does():
    """bf16: s is x + residual rounded to bf16 (HF's ``residual + hidden_states``; within one rounding
    here, the interpreter's float-to-bf16 conversion not being the GPU's, which the GPU test checks
    bit for bit) and y the norm of that rounded s: rms_norm(s), bit for bit."""
    x, w = _inputs((9, 130), torch.bfloat16, seed=4)
    r = _inputs((9, 130), torch.bfloat16, seed=5)[0]
    y, s = tilewise.add_rms_norm(x, r, w, 1e-5)
    assert s.dtype == torch.bfloat16
    torch.testing.assert_close(s.float(), (x.float() + r.float()), rtol=2 ** -7, atol=1e-6)
    torch.testing.assert_close(y, tilewise.rms_norm(s, w, 1e-5), rtol=0, atol=0)


def test_triton_interpreter_add_rms_norm_compiles():
    x, w = _inputs((16, 48), torch.float32, seed=6)
    r = _inputs((16, 48), torch.float32, seed=7)[0]
    f = torch.compile(lambda a, b, c: [t * 2 for t in tilewise.add_rms_norm(a, b, c)], backend="aot_eager",
                      fullgraph=True)
    xi, ri, wi = (t.clone().requires_grad_(True) for t in (x, r, w))
    y, s = f(xi, ri, wi)
    (y.sum() + (s * s).sum()).backward()
    xr, rr, wr = (t.clone().requires_grad_(True) for t in (x, r, w))
    yr, sr = N.add_reference(xr, rr, wr)
    (2 * yr.sum() + (4 * sr * sr).sum()).backward()
    torch.testing.assert_close(y, 2 * yr, rtol=1e-5, atol=1e-5)
    for a, b in ((xi, xr), (ri, rr), (wi, wr)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


def test_add_rms_norm_rejects_bad_arguments():
    x, w = _inputs((4, 8), torch.float32)
    for r, msg in [(x[:, :5], "'residual' is \\(4, 5\\)"), (x.double(), "'residual' has dtype"),
                   (x.half(), "'residual' is \\(4, 8\\) torch.float16"), ([1.0], "'residual' must be a torch.Tensor")]:
        with pytest.raises(ValueError, match=msg):
            tilewise.add_rms_norm(x, r, w)
    with pytest.raises(ValueError, match="add_rms_norm: 'eps'"):
        tilewise.add_rms_norm(x, x, w, -1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4097, 2048), (1000, 5120), (3, 7, 4096)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.quick(rotate="shape")
def test_gpu_add_rms_norm(shape, dtype, monkeypatch):
    """Against the fp32 reference at sizes not multiple of the launch tiles; outputs poisoned; the
    loss uses y and s, so the backward's added gradient is checked."""
    real_empty = torch.empty

    def poisoned_empty(*a, **k):
        t = real_empty(*a, **k)
        return poison(t) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    x, w = _inputs(shape, dtype, seed=shape[0], device="cuda")
    r = _inputs(shape, dtype, seed=shape[0] + 1, device="cuda")[0]
    xi, ri, wi = (t.clone().requires_grad_(True) for t in (x, r, w))
    y, s = N.add_rms_norm(xi, ri, wi, 1e-5)
    assert torch.equal(s, x + r)
    xr, rr, wr = (t.float().requires_grad_(True) for t in (x, r, w))
    yr, sr = N.add_reference(xr, rr, wr, 1e-5)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(y.float(), yr, rtol=tol, atol=tol)
    gen = torch.Generator(device="cuda").manual_seed(2)
    gy, gs = (torch.randn(shape, device="cuda", generator=gen) for _ in range(2))
    ((y.float() * gy).sum() + (s.float() * gs).sum()).backward()
    ((yr * gy).sum() + (sr * gs).sum()).backward()
    for name, a, b in (("dx", xi.grad, xr.grad), ("dresidual", ri.grad, rr.grad), ("dw", wi.grad, wr.grad)):
        assert not torch.isnan(a).any(), name
        err = ((a.double() - b.double()).norm() / b.double().norm()).item()
        assert err < (1e-5 if dtype == torch.float32 else 1e-2), f"{name}: relative error {err:.3g}"


def test_triton_interpreter_strided_weight():
    """A weight that is a strided view (every other element, or expanded) reads as its values."""
    x, _ = _inputs((6, 40), torch.float32, seed=9)
    big = torch.rand(80) + 0.5
    for w in (big[::2], torch.tensor(1.25).expand(40)):
        torch.testing.assert_close(tilewise.rms_norm(x, w), N.reference(x, w.contiguous()), rtol=1e-5, atol=1e-5)


def test_rmsnorm_module_matches_hf_and_loads_its_state_dict():
    from tilewise.nn import RMSNorm

    x, w = _inputs((2, 5, 24), torch.float32, seed=11)
    m = RMSNorm(24, eps=1e-5)
    assert m.load_state_dict({"weight": w}) is not None and m.variance_epsilon == 1e-5
    torch.testing.assert_close(m(x), _hf_llama(x, w, 1e-5), rtol=1e-5, atol=1e-5)
    g = RMSNorm(24, mode="gemma")
    assert (g.weight == 0).all()  # Gemma's weight starts at 0: (1 + 0) times the row
    torch.testing.assert_close(g(x), _hf_gemma(x, g.weight.detach(), 1e-6), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="'mode'"):
        RMSNorm(4, mode="layer")


def test_dw_sum_tile_loads_every_partial_row_at_once():
    from tilewise.ops.norm.configs import DW_SUM_TILE, dw_sum_tile

    assert dw_sum_tile(528) == (1024, DW_SUM_TILE // 1024)
    assert dw_sum_tile(16) == (16, DW_SUM_TILE // 16)
    assert dw_sum_tile(DW_SUM_TILE * 2) == (DW_SUM_TILE * 2, 1)


@pytest.mark.parametrize("rows,n", [(528, 2048), (16, 45), (3, 1)])
def test_triton_interpreter_dw_sum_is_the_column_sum_in_the_weights_dtype(rows, n):
    """``_dw_sum_kernel`` (Triton's interpreter): the backward's (rows, BLOCK) fp32 partials, wider than N,
    summed by column into the weight's dtype; the columns past N are not read into dW."""
    import triton

    from tilewise.ops.norm import triton_kernels as K
    from tilewise.ops.norm.configs import dw_sum_tile

    block = triton.next_power_of_2(n)
    part = torch.randn(rows, block, generator=torch.Generator().manual_seed(rows), dtype=torch.float32)
    part[:, n:] = float("nan")  # what the kernel must not read
    for dtype in (torch.float32, torch.bfloat16):
        dw = torch.full((n,), float("nan"), dtype=dtype)
        br, bn = dw_sum_tile(rows)
        K._dw_sum_kernel[(-(-n // bn),)](part, dw, rows, n, part.stride(0), BLOCK_R=br, BLOCK_N=bn)
        want = part[:, :n].double().sum(0)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(dw.double(), want, rtol=tol, atol=tol * 10)
