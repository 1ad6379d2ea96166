import pytest
import torch
import triton

import tilewise
from tilewise.ops.rope import api as R


def _llama3_cos_sin(B, S, D, device="cpu", dtype=torch.float32, theta=500000.0, factor=8.0, low=1.0, high=4.0,
                    original=8192, positions=None):
    """transformers' Llama 3 rotary embedding, written out: frequencies scaled by rope_type "llama3",
    cos / sin (B, S, D) of positions (default 0 .. S - 1, shifted by b per batch row)."""
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    wavelen = 2 * torch.pi / inv
    low_wl, high_wl = original / low, original / high
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    inv = torch.where((wavelen >= high_wl) & (wavelen <= low_wl), mid, scaled)
    pos = positions if positions is not None else torch.arange(S)[None, :] + torch.arange(B)[:, None]
    freqs = pos[..., None].double() * inv[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


def _qk(B, Hq, Hk, S, D, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Hq, S, D, generator=g, device=device).to(dtype)
    k = torch.randn(B, Hk, S, D, generator=g, device=device).to(dtype)
    return q, k


def test_reference_rotates_pairs_of_halves():
    """rotate_half written out by hand on one vector: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)."""
    q = torch.tensor([[[[1.0, 2.0, 3.0, 4.0]]]])
    cos = torch.tensor([[[0.5, 0.25, 0.5, 0.25]]])
    sin = torch.tensor([[[0.1, 0.2, 0.1, 0.2]]])
    qo, _ = R.reference(q, q, cos, sin)
    want = torch.tensor([1 * 0.5 - 3 * 0.1, 2 * 0.25 - 4 * 0.2, 3 * 0.5 + 1 * 0.1, 4 * 0.25 + 2 * 0.2])
    torch.testing.assert_close(qo.flatten(), want)


def test_cost():
    c = R.cost(2, 8, 2, 16, 64, torch.bfloat16)
    assert c.flops == 6 * 2 * 10 * 16 * 64 and c.bytes == 2 * 2 * 10 * 16 * 64 * 2 + 2 * 16 * 64 * 2


# the last: q's 12 heads take two head steps of 8
CASES = [(2, 4, 2, 9, 16), (1, 3, 3, 33, 128), (3, 1, 1, 5, 6), (1, 8, 1, 17, 64), (1, 12, 4, 7, 128)]


@pytest.mark.parametrize("shape", CASES, ids=str)
@pytest.mark.parametrize("batch_cos", [False, True])
def test_triton_interpreter_forward_backward(shape, batch_cos):
    """Against the float64 reference with Llama 3 scaled frequencies: q_embed, k_embed and both
    gradients; GQA, D not a power of two, cos shared by the batch or per batch row; q strided."""
    B, Hq, Hk, S, D = shape
    q, k = _qk(B, Hq, Hk, S, D, seed=S)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, D) storage, as HF's q before its transpose
    cos, sin = _llama3_cos_sin(B if batch_cos else 1, S, D)
    qi, ki = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    qo, ko = tilewise.apply_rotary(qi, ki, cos, sin)
    qr, kr = q.double().requires_grad_(True), k.double().requires_grad_(True)
    rq, rk = R.reference(qr, kr, cos.double(), sin.double())
    torch.testing.assert_close(qo.double(), rq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ko.double(), rk, rtol=1e-5, atol=1e-5)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    (qo * gq).sum().add_((ko * gk).sum()).backward()
    (rq * gq.double()).sum().add_((rk * gk.double()).sum()).backward()
    torch.testing.assert_close(qi.grad.double(), qr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ki.grad.double(), kr.grad, rtol=1e-5, atol=1e-5)


def test_triton_interpreter_unequal_halves_one_output_used_and_compile():
    """cos / sin whose halves differ (the backward takes each half's own sin), a loss on q alone (k's
    gradient is zero), and the custom op under torch.compile."""
    q, k = _qk(2, 2, 1, 7, 8, seed=3)
    g = torch.Generator().manual_seed(4)
    cos, sin = torch.rand(1, 7, 8, generator=g), torch.rand(1, 7, 8, generator=g)
    qi, ki = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    tilewise.apply_rotary(qi, ki, cos, sin)[0].pow(2).sum().backward()
    qr, kr = q.double().requires_grad_(True), k.double().requires_grad_(True)
    R.reference(qr, kr, cos.double(), sin.double())[0].pow(2).sum().backward()
    torch.testing.assert_close(qi.grad.double(), qr.grad, rtol=1e-5, atol=1e-5)
    assert (ki.grad == 0).all()
    f = torch.compile(lambda a, b: [t * 2 for t in tilewise.apply_rotary(a, b, cos, sin)], backend="aot_eager",
                      fullgraph=True)
    qc, kc = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    oq, ok = f(qc, kc)
    (oq.sum() + ok.sum()).backward()
    rq, rk = R.reference(q, k, cos, sin)
    torch.testing.assert_close(oq, 2 * rq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ok, 2 * rk, rtol=1e-5, atol=1e-5)
    assert qc.grad is not None and kc.grad is not None


def test_launch_table():
    from tilewise.ops.rope import configs as RC

    for Hq, Hk, D in ((32, 8, 128), (16, 16, 64), (24, 8, 96), (1, 1, 2), (64, 8, 256), (40, 40, 80)):
        L = RC.launch_for(Hq, Hk, D // 2)
        assert L.DB >= D // 2 and L.DB & (L.DB - 1) == 0 and L.HB & (L.HB - 1) == 0
        assert L.HB * L.DB <= RC.TILE or L.HB == 1  # a step's tile stays within TILE
        assert L.HB <= triton.next_power_of_2(max(Hq, Hk)) and L.warps == (2 if L.DB <= 32 else 4)


def test_rejects_bad_arguments():
    q, k = _qk(2, 2, 1, 5, 8)
    cos, sin = _llama3_cos_sin(1, 5, 8)
    for kw, msg in [(dict(q=q[..., :7], k=k[..., :7], cos=cos[..., :7], sin=sin[..., :7]), "must be even"),
                    (dict(k=k[:, :, :4]), "'k' has shape"), (dict(cos=cos[:, :4]), "'cos' has shape"),
                    (dict(sin=torch.ones(3, 5, 8)), "'sin' has shape"), (dict(q=q.long()), "'q' has dtype"),
                    (dict(q=q[0]), "must be \\(B, heads, S, D\\)"), (dict(cos=[1.0]), "'cos' must be a torch.Tensor")]:
        args = dict(q=q, k=k, cos=cos, sin=sin) | kw
        with pytest.raises(ValueError, match=msg):
            tilewise.apply_rotary(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 32, 8, 4097, 128), (2, 16, 16, 1000, 64), (1, 24, 8, 333, 96)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.quick(rotate="shape")
def test_gpu_forward_backward(shape, dtype):
    B, Hq, Hk, S, D = shape
    q, k = _qk(B, Hq, Hk, S, D, dtype, "cuda", seed=S)
    cos, sin = _llama3_cos_sin(1, S, D, "cuda", dtype)
    qi, ki = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    qo, ko = R.apply_rotary(qi, ki, cos, sin)  # (the module's names: the coverage ledger sees them)
    qr, kr = q.float().requires_grad_(True), k.float().requires_grad_(True)
    rq, rk = R.v1_reference(qr, kr, cos.float(), sin.float())
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(qo.float(), rq, rtol=tol, atol=tol)
    torch.testing.assert_close(ko.float(), rk, rtol=tol, atol=tol)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    (qo.float() * gq.float()).sum().add_((ko.float() * gk.float()).sum()).backward()
    (rq * gq.float()).sum().add_((rk * gk.float()).sum()).backward()
    torch.testing.assert_close(qi.grad.float(), qr.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(ki.grad.float(), kr.grad, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- apply_rotary_qkv


def _qkv(B, S, Hq, Hk, D, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(B, S, (Hq + 2 * Hk) * D, generator=g, device=device).to(dtype)


@pytest.mark.parametrize("shape", [(2, 9, 4, 2, 8), (1, 5, 3, 3, 6), (2, 1, 2, 1, 4)], ids=str)
@pytest.mark.parametrize("uses", ["all", "q"])
def test_triton_interpreter_qkv_forward_backward(shape, uses):
    """Against the float64 reference (the three column blocks, HF's RoPE on q and k): the outputs, each
    (B, S, heads, D) in memory, and qkv's gradient with every output used or q alone."""
    B, S, Hq, Hk, D = shape
    qkv = _qkv(B, S, Hq, Hk, D, seed=S)
    cos, sin = _llama3_cos_sin(B, S, D)
    xi, xr = qkv.clone().requires_grad_(True), qkv.double().requires_grad_(True)
    out = tilewise.apply_rotary_qkv(xi, cos, sin, Hq, Hk)
    ref = R.qkv_reference(xr, cos.double(), sin.double(), Hq, Hk)
    for o, r, h in zip(out, ref, (Hq, Hk, Hk)):
        assert o.shape == (B, h, S, D) and o.transpose(1, 2).is_contiguous()
        torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-5)
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(o.shape, generator=gen) for o in out]
    n = 3 if uses == "all" else 1
    sum((o * g).sum() for o, g in list(zip(out, grads))[:n]).backward()
    sum((r * g.double()).sum() for r, g in list(zip(ref, grads))[:n]).backward()
    torch.testing.assert_close(xi.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)


def test_triton_interpreter_qkv_compiles():
    qkv = _qkv(2, 7, 2, 1, 8, seed=8)
    cos, sin = _llama3_cos_sin(1, 7, 8)
    f = torch.compile(lambda x: [t * 2 for t in tilewise.apply_rotary_qkv(x, cos, sin, 2, 1)], backend="aot_eager",
                      fullgraph=True)
    xc, xr = qkv.clone().requires_grad_(True), qkv.clone().requires_grad_(True)
    out = f(xc)
    sum(o.sum() for o in out).backward()
    ref = R.qkv_reference(xr, cos, sin, 2, 1)
    sum((2 * r).sum() for r in ref).backward()
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, 2 * r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xc.grad, xr.grad, rtol=1e-5, atol=1e-5)


def test_qkv_rejects_bad_arguments():
    qkv = _qkv(2, 5, 2, 1, 8)
    cos, sin = _llama3_cos_sin(1, 5, 8)
    for args, msg in [((qkv[..., :-1], cos, sin, 2, 1), "'qkv' has shape"),
                      ((qkv[0], cos, sin, 2, 1), "'qkv' has shape"), ((qkv, cos, sin, 1, 2), "'qkv' has shape"),
                      ((qkv, cos, sin, 0, 1), "'num_heads' must be"),
                      ((qkv, cos, sin, 2, 1.0), "'num_kv_heads' must be"),
                      ((qkv, cos[:, :4], sin, 2, 1), "apply_rotary_qkv: 'cos' has shape"),
                      ((qkv.long(), cos, sin, 2, 1), "'qkv' has dtype")]:
        with pytest.raises(ValueError, match=msg):
            tilewise.apply_rotary_qkv(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 4097, 32, 8, 64), (1, 333, 24, 8, 128)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.quick(rotate="shape")
def test_gpu_qkv_forward_backward(shape, dtype, monkeypatch):
    """Against the fp32 reference at sizes not multiple of the launch tiles, outputs poisoned (an element
    the kernel skips stays NaN); v equal to its column block bit for bit."""
    from conftest import poison

    real_empty = torch.empty
    def poisoned_empty(*a, **k):
        t = real_empty(*a, **k)
        return poison(t) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    B, S, Hq, Hk, D = shape
    qkv = _qkv(B, S, Hq, Hk, D, dtype, "cuda", seed=S)
    cos, sin = _llama3_cos_sin(1, S, D, "cuda", dtype)
    xi, xr = qkv.clone().requires_grad_(True), qkv.float().requires_grad_(True)
    out = R.apply_rotary_qkv(xi, cos, sin, Hq, Hk)
    ref = R.qkv_reference(xr, cos.float(), sin.float(), Hq, Hk)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.float(), r, rtol=tol, atol=tol)
    assert torch.equal(out[2], R.qkv_reference(qkv, cos, sin, Hq, Hk)[2])
    gen = torch.Generator(device="cuda").manual_seed(3)
    grads = [torch.randn(o.shape, device="cuda", generator=gen).to(dtype) for o in out]
    sum((o.float() * g.float()).sum() for o, g in zip(out, grads)).backward()
    sum((r * g.float()).sum() for r, g in zip(ref, grads)).backward()
    torch.testing.assert_close(xi.grad.float(), xr.grad, rtol=tol, atol=tol)
