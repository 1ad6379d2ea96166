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
