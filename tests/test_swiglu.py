import pytest
import torch
import torch.nn.functional as F

import tilewise
from tilewise.ops.pointwise import swiglu as SG


def _inputs(shape, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=g, device=device) * 3).to(dtype), torch.randn(shape, generator=g,
                                                                                         device=device).to(dtype)


def test_cost():
    assert SG.cost(10, torch.bfloat16).bytes == 60 and SG.cost(10, torch.bfloat16, backward=True).bytes == 100


@pytest.mark.parametrize("shape", [(37, 100), (2, 3, 1000), (1,), (0, 5), (4097,)], ids=str)
def test_triton_interpreter_forward_backward(shape):
    """Against float64 autograd through silu(gate) * up: y, dgate, dup; sizes not multiples of the
    block, one element, empty; a strided (transposed) gate."""
    g, u = _inputs(shape, seed=len(shape))
    if g.dim() == 2 and g.numel():
        g = g.t().contiguous().t()
    gi, ui = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
    y = tilewise.swiglu(gi, ui)
    gr, ur = g.double().requires_grad_(True), u.double().requires_grad_(True)
    ref = F.silu(gr) * ur
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    y.backward(dy)
    ref.backward(dy.double())
    torch.testing.assert_close(gi.grad.double(), gr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ui.grad.double(), ur.grad, rtol=1e-5, atol=1e-5)


def test_triton_interpreter_compile_and_module():
    from tilewise.nn import SwiGLU

    g, u = _inputs((6, 33), seed=2)
    f = torch.compile(lambda a, b: tilewise.swiglu(a, b) * 2, backend="aot_eager", fullgraph=True)
    gi, ui = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
    out = f(gi, ui)
    out.sum().backward()
    torch.testing.assert_close(out, 2 * SG.reference(g, u), rtol=1e-5, atol=1e-5)
    gr, ur = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
    (2 * SG.reference(gr, ur)).sum().backward()
    torch.testing.assert_close(gi.grad, gr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ui.grad, ur.grad, rtol=1e-5, atol=1e-5)
    m = SwiGLU(16, 40)
    x = torch.randn(3, 16)
    want = m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
    assert set(m.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}  # LlamaMLP's


def test_rejects_bad_arguments():
    g, u = _inputs((4, 8))
    for a, b, msg in [(g.long(), u, "'gate' has dtype"), (g, u[:, :5], "'up' is"), (g, u.double(), "'up' has dtype"),
                      (g, u.half(), "'up' is"), ([1.0], u, "'gate' must be a torch.Tensor")]:
        with pytest.raises(ValueError, match=msg):
            tilewise.swiglu(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 14336), (1000, 8193), (3, 5)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.quick(rotate="shape")
def test_gpu_forward_backward(shape, dtype):
    g, u = _inputs(shape, dtype, "cuda", seed=shape[0])
    gi, ui = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
    y = SG.swiglu(gi, ui)  # (the module's names: the coverage ledger sees them)
    gr, ur = g.float().requires_grad_(True), u.float().requires_grad_(True)
    ref = SG.v1_reference(gr, ur)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol)
    dy = torch.randn(shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3)).to(dtype)
    y.backward(dy)
    ref.backward(dy.float())
    torch.testing.assert_close(gi.grad.float(), gr.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(ui.grad.float(), ur.grad, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- swiglu_packed


def _packed_check(gu, dy_seed=1, tol=1e-5):
    gi = gu.clone().requires_grad_(True) if gu.is_contiguous() else gu.detach().requires_grad_(True)
    y = tilewise.swiglu_packed(gi)
    gr = gu.detach().double().requires_grad_(True)
    ref = SG.reference_packed(gr)
    assert y.shape == ref.shape and y.is_contiguous()
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)
    dy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(dy_seed))
    y.backward(dy)
    ref.backward(dy.double())
    torch.testing.assert_close(gi.grad.double(), gr.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(37, 2 * 1500), (3, 2 * 4096), (2, 2 * 6144), (2, 3, 2 * 5), (1, 2), (0, 6),
                                   (3, 0)], ids=str)
def test_packed_triton_interpreter_forward_backward(shape):
    """Against float64 autograd through silu(first half) * second half: y and the one gradient; a
    half wider than a program's columns and not a multiple of them, halves on the 4096- and 2048-column
    blocks, 3-D, one pair, no rows, no columns."""
    g = torch.Generator().manual_seed(len(shape))
    _packed_check(torch.randn(shape, generator=g) * 3)


def test_packed_block_divides_the_half_or_falls_back():
    from tilewise.ops.pointwise.configs import SWIGLU_PACKED_BLOCK, swiglu_packed_block

    blocks = [swiglu_packed_block(i) for i in (8192, 14336, 6144, 4099, 5)]
    assert blocks == [4096, 2048, 2048, SWIGLU_PACKED_BLOCK, SWIGLU_PACKED_BLOCK]


def test_packed_strided_rows_and_columns():
    """Rows with a stride past 2 * I (a column slice of a wider tensor) run in place; a transposed
    (column-strided) input is copied first; both give the reference's values and gradient."""
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(9, 2 * 70 + 6, generator=g)
    rows = wide[:, : 2 * 70]
    assert rows.stride(0) == 2 * 70 + 6 and SG._rows(rows)[0].data_ptr() == rows.data_ptr()
    _packed_check(rows)
    cols = torch.randn(2 * 12, 7, generator=g).t()
    assert cols.stride(-1) != 1
    _packed_check(cols)


def test_packed_compile_and_module():
    from tilewise.nn import SwiGLU

    gu = torch.randn(6, 2 * 33, generator=torch.Generator().manual_seed(2))
    f = torch.compile(lambda t: tilewise.swiglu_packed(t) * 2, backend="aot_eager", fullgraph=True)
    gi = gu.clone().requires_grad_(True)
    out = f(gi)
    out.sum().backward()
    gr = gu.clone().requires_grad_(True)
    (2 * SG.reference_packed(gr)).sum().backward()
    torch.testing.assert_close(out, 2 * SG.reference_packed(gu), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gi.grad, gr.grad, rtol=1e-5, atol=1e-5)
    torch.manual_seed(0)
    plain = SwiGLU(16, 40, bias=True)
    fused = SwiGLU.sharing(plain.gate_proj, plain.up_proj, plain.down_proj, fuse_gate_up=True)
    assert "fuse_gate_up=True" in repr(fused) and set(fused.state_dict()) == set(plain.state_dict())
    x = torch.randn(3, 5, 16)
    xp, xf = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yp, yf = plain(xp), fused(xf)
    torch.testing.assert_close(yf, yp, rtol=1e-5, atol=1e-5)
    dy = torch.randn(yp.shape)
    gp = torch.autograd.grad(yp, [xp, *plain.parameters()], dy)
    gf = torch.autograd.grad(yf, [xf, *plain.parameters()], dy)
    for a, b in zip(gf, gp):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_packed_rejects_bad_arguments():
    x = torch.randn(4, 8)
    for a, msg in [(x[:, :7], "last dimension even"), (torch.tensor(1.0), "last dimension even"),
                   (x.long(), "'gate_up' has dtype"), ([1.0], "'gate_up' must be a torch.Tensor")]:
        with pytest.raises(ValueError, match=msg):
            tilewise.swiglu_packed(a)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 2 * 8192), (333, 2 * 6144), (1000, 2 * 4099), (3, 2)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.quick(rotate="shape")
def test_gpu_packed_forward_backward(shape, dtype):
    g = torch.Generator(device="cuda").manual_seed(shape[0])
    gu = (torch.randn(shape, device="cuda", generator=g) * 3).to(dtype)
    gi = gu.clone().requires_grad_(True)
    y = SG.swiglu_packed(gi)  # (the module's names: the coverage ledger sees them)
    gr = gu.float().requires_grad_(True)
    ref = SG.reference_packed(gr)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol)
    dy = torch.randn(ref.shape, device="cuda", generator=g).to(dtype)
    y.backward(dy)
    ref.backward(dy.float())
    torch.testing.assert_close(gi.grad.float(), gr.grad, rtol=tol, atol=tol)
