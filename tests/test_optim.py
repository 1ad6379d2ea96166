import copy

import pytest
import torch

import tilewise
from tilewise.ops.optim import api as O
from tilewise.ops.optim import configs as OC

from conftest import HAS_CUDA

HYPER = dict(lr=0.05, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.5)  # decay 2.5 %: seen in bf16


def _state(n, dtype, device="cpu", seed=0, state_dtype=None, step=1):
    """p, g, m, v of n elements (m, v as after a few steps: v > 0), on device."""
    g = torch.Generator(device=device).manual_seed(seed)
    r = lambda: torch.randn(n, generator=g, device=device)  # noqa: E731
    sd = state_dtype or dtype
    m = (r() * 0.1).to(sd) if step > 1 else torch.zeros(n, device=device, dtype=sd)
    v = (r().square() * 0.01).to(sd) if step > 1 else torch.zeros(n, device=device, dtype=sd)
    return (r() * 0.01).to(dtype), r().to(dtype), m, v  # p small beside the update (lr 0.05): its errors show


def _ref64(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW's update written out in float64."""
    p, g, m, v = (t.double() for t in (p, g, m, v))
    p = p * (1 - lr * weight_decay)
    m = m + (1 - beta1) * (g - m)
    v = beta2 * v + (1 - beta2) * g * g
    denom = v.sqrt() / (1 - beta2 ** step) ** 0.5 + eps
    return p - lr / (1 - beta1 ** step) * m / denom, m, v


def _close(name, got, want, dtype):
    """Each element within the dtype's rounding of the largest (m can cancel to ~0 where g ~ m)."""
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]  # fp32: 3.1e-6 seen (H100)
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    assert err < tol, f"{name}: {err:.3g}"


@pytest.mark.parametrize("variant", ["v1_reference", "v2_fused", "v3_multi_tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n,step", [(1, 1), (4097, 3), (10007, 40), (8192 + 48, 2)])
def test_update_matches_float64(variant, dtype, n, step):
    """Every element of p, m and v after one update (sizes not multiples of a program's block; under
    Triton's interpreter on the CPU for v2_fused) against the float64 formula."""
    p, g, m, v = _state(n, dtype, step=step, seed=n)
    want = _ref64(p, g, m, v, step, **HYPER)
    O.VARIANTS[variant]([p], [g], [m], [v], [step], **HYPER)
    for name, got, w in zip("pmv", (p, m, v), want):
        _close(name, got, w, dtype)


def test_multi_tensor_update_of_mixed_tensors(monkeypatch):
    """v3 over tensors of two dtypes, their own steps, and sizes its launch cannot take (not a multiple of 16:
    one launch each, as v2): every element of every tensor against float64; only those two go one by one."""
    one_by_one = []
    real = O._fused
    monkeypatch.setattr(O, "_fused", lambda p, *a: one_by_one.append(p.numel()) or real(p, *a))
    cases = [(16, torch.bfloat16, 1), (4096 + 32, torch.bfloat16, 2), (100, torch.bfloat16, 3),
             (8192 + 48, torch.float32, 4), (4097, torch.float32, 5), (2048, torch.float16, 6)]
    states = [_state(n, dt, step=t, seed=i) for i, (n, dt, t) in enumerate(cases)]
    want = [_ref64(*st, t, **HYPER) for st, (_, _, t) in zip(states, cases)]
    O.adamw_(*(list(x) for x in zip(*states)), [t for *_, t in cases], variant="v3_multi_tensor", **HYPER)
    assert sorted(one_by_one) == [100, 4097]
    for st, w, (n, dt, _) in zip(states, want, cases):
        for name, got, ww in zip("pgmv", st, (w[0], None, w[1], w[2])):
            if ww is not None:
                _close(f"{name} of {n} {dt}", got, ww, dt)


def test_block_map_lists_every_block_once():
    numels, tensor, index = O._block_map(torch.device("cpu"), 64, (64, 1, 130, 0, 65))
    assert numels.tolist() == [64, 1, 130, 0, 65]
    assert list(zip(tensor.tolist(), index.tolist())) == [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (4, 0), (4, 1)]


def test_fp32_moments_beside_bf16_parameters():
    p, g, m, v = _state(3001, torch.bfloat16, state_dtype=torch.float32, step=5)
    want = _ref64(p, g, m, v, 5, **HYPER)
    O.adamw_([p], [g], [m], [v], [5], **HYPER)
    _close("p", p, want[0], torch.bfloat16)
    _close("m", m, want[1], torch.float32)
    _close("v", v, want[2], torch.float32)


def test_non_contiguous_parameter_takes_the_reference_arithmetic():
    base = torch.randn(37, 23)
    p = base.t()  # a transposed view: the fused pass would walk it in the wrong order
    g, m, v = torch.randn(23, 37), torch.zeros(23, 37), torch.zeros(23, 37)
    want = _ref64(p.clone(), g, m, v, 1, **HYPER)
    O.adamw_([p], [g], [m], [v], [1], **HYPER)
    _close("p", p, want[0], torch.float32)
    _close("p's storage", base.t(), want[0], torch.float32)


def _two_models(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(13, 7), torch.nn.Linear(7, 3, bias=False)).to(device, dtype)
    return a, copy.deepcopy(a)


def _train(model, opt, steps=5, device="cpu", dtype=torch.float32, skip_grad_of=None):
    g = torch.Generator(device=device).manual_seed(1)
    for i in range(steps):
        opt.zero_grad()
        x = torch.randn(9, 13, generator=g, device=device).to(dtype)
        model(x).square().mean().backward()
        if skip_grad_of is not None and i % 2:
            skip_grad_of.grad = None  # a parameter without a gradient this step keeps its state and step
        opt.step()


def test_optimizer_follows_torch_adamw():
    """Five steps with two param groups (one without weight decay) and a parameter that skips every other
    step: the same parameters and state as torch.optim.AdamW."""
    ours, theirs = _two_models()
    groups = lambda m: [{"params": m[0].parameters(), "weight_decay": 0.0}, {"params": m[1].parameters()}]  # noqa
    o = tilewise.AdamW(groups(ours), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    t = torch.optim.AdamW(groups(theirs), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)
    _train(ours, o, skip_grad_of=ours[0].bias)
    _train(theirs, t, skip_grad_of=theirs[0].bias)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert o.state[ours[0].bias]["step"].item() == 3 and o.state[ours[0].weight]["step"].item() == 5
    for a, b in zip(ours.parameters(), theirs.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(o.state[a][key], t.state[b][key], rtol=1e-5, atol=1e-7)


def test_state_dict_moves_between_torch_and_tilewise():
    ours, theirs = _two_models()
    t = torch.optim.AdamW(theirs.parameters(), lr=1e-2, foreach=False)
    _train(theirs, t, steps=3)
    ours.load_state_dict(theirs.state_dict())
    o = tilewise.AdamW(ours.parameters(), lr=1e-2)
    o.load_state_dict(copy.deepcopy(t.state_dict()))  # as from a checkpoint (a loaded dict shares its tensors)
    _train(ours, o, steps=2)
    _train(theirs, t, steps=2)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    back = torch.optim.AdamW(theirs.parameters(), lr=1e-2, foreach=False)
    back.load_state_dict(copy.deepcopy(o.state_dict()))  # and ours into torch's
    assert back.state_dict()["state"][0]["step"].item() == 5


def test_lr_scheduler_and_closure():
    model, _ = _two_models()
    o = tilewise.AdamW(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(o, lambda step: 0.5 ** step)
    x = torch.randn(4, 13)

    def closure():
        o.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    assert o.step(closure) is not None
    sched.step()
    assert o.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("kw,match", [
    (dict(amsgrad=True), "amsgrad"), (dict(maximize=True), "maximize"), (dict(capturable=True), "capturable"),
    (dict(differentiable=True), "differentiable"), (dict(lr=float("nan")), "'lr'"), (dict(betas=(0.9, 1.0)), "beta2"),
    (dict(betas=0.9), "'betas'"), (dict(eps=-1.0), "eps"), (dict(lr=torch.tensor(1e-3)), "tensor 'lr'"),
    (dict(config=(4096, 8)), "'config'")])
def test_optimizer_arguments_are_named(kw, match):
    model, _ = _two_models()
    with pytest.raises(ValueError, match=match):
        tilewise.AdamW(model.parameters(), **kw)


def test_sparse_gradient_is_refused():
    emb = torch.nn.Embedding(10, 3, sparse=True)
    o = tilewise.AdamW(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match="sparse"):
        o.step()


@pytest.mark.parametrize("case,match", [
    ("length", "'grads' has 0 tensors"), ("shape", r"'exp_avgs\[0\]' is \(4,\)"), ("gdtype", r"'grads\[0\]' has dtype"),
    ("int", r"'params\[0\]' has dtype torch.int64"), ("step0", r"'steps\[0\]' must be an int >= 1"),
    ("steps", "'steps' must be a list"), ("variant", "'variant'"), ("tensor", r"'exp_avg_sqs\[0\]' must be a torch")])
def test_functional_arguments_are_named(case, match):
    p, g, m, v = _state(5, torch.float32)
    args = {"params": [p], "grads": [g], "exp_avgs": [m], "exp_avg_sqs": [v], "steps": [1]}
    kw = dict(HYPER)
    if case == "length":
        args["grads"] = []
    elif case == "shape":
        args["exp_avgs"] = [torch.zeros(4)]
    elif case == "gdtype":
        args["grads"] = [g.double()]
    elif case == "int":
        args["params"] = [torch.zeros(5, dtype=torch.int64)]
    elif case == "step0":
        args["steps"] = [0]
    elif case == "steps":
        args["steps"] = 1
    elif case == "variant":
        kw["variant"] = "v9"
    else:
        args["exp_avg_sqs"] = [None]
    with pytest.raises(ValueError, match=match):
        O.adamw_(*args.values(), **kw)


def test_cost_and_launch_table():
    c = O.cost(1000, torch.bfloat16)
    assert c.bytes == 14 * 1000 and c.flops == 12 * 1000
    assert O.cost(10, torch.bfloat16, torch.float32).bytes == 10 * (3 * 2 + 4 * 4)
    for itemsize in (2, 4):
        L = OC.launch_for(itemsize)
        assert L.BLOCK % (32 * L.warps) == 0 and (L.BLOCK // (32 * L.warps)) * itemsize % 16 == 0
    mine = OC.AdamWLaunch(1024, 4)
    assert OC.launch_for(2, mine) is mine


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["v1_reference", "v2_fused", "v3_multi_tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [1, 4095, 1 << 20 | 16, 1 << 20 | 17])
def test_gpu_update_matches_float64(variant, dtype, n):
    """Every element (an unwritten one keeps its old value, which the update always moves)."""
    p, g, m, v = _state(n, dtype, device="cuda", step=7, seed=n)
    want = _ref64(p, g, m, v, 7, **HYPER)
    O.VARIANTS[variant]([p], [g], [m], [v], [7], **HYPER)
    for name, got, w in zip("pmv", (p, m, v), want):
        assert torch.isfinite(got).all(), name
        _close(name, got, w, dtype)


@pytest.mark.gpu
def test_gpu_fused_update_refuses_aliased_tensors():
    p, g, m, v = _state(100, torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="exp_avgs"):
        O.adamw_([p], [g], [p], [v], [1], **HYPER)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_optimizer_follows_torch_fused_adamw(dtype):
    """Four steps of a small model on the GPU: the parameters of tilewise.AdamW and torch.optim.AdamW(fused=True)
    (both round p, m and v once a step from fp32 arithmetic) stay within the dtype's rounding."""
    ours, theirs = _two_models(dtype, "cuda")
    o = tilewise.AdamW(ours.parameters(), lr=1e-2, weight_decay=0.1)
    t = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    _train(ours, o, steps=4, device="cuda", dtype=dtype)
    _train(theirs, t, steps=4, device="cuda", dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.skipif(HAS_CUDA, reason="the CPU rule: CPU tensors outside the interpreter")
def test_cpu_tensors_outside_the_interpreter_take_the_reference(monkeypatch):
    from tilewise import settings

    monkeypatch.setattr(settings, "triton_interpret", lambda: False)
    p, g, m, v = _state(33, torch.float32, step=2)
    want = _ref64(p, g, m, v, 2, **HYPER)
    O.adamw_([p], [g], [m], [v], [2], **HYPER)
    _close("p", p, want[0], torch.float32)


def test_optimizer_checks_a_loaded_state_against_its_parameter():
    model, _ = _two_models()
    o = tilewise.AdamW(model.parameters())
    _train(model, o, steps=1)
    sd = copy.deepcopy(o.state_dict())
    sd["state"][0]["exp_avg"] = torch.zeros(3)  # the kernel would run past it
    o.load_state_dict(sd)
    with pytest.raises(ValueError, match="state 'exp_avg' is torch.float32 \\(3,\\)"):
        _train(model, o, steps=1)


def test_sharded_tensors_are_updated_through_their_local_shard():
    """FSDP2's DTensors: the update runs on each rank's local tensor (the kernels never see the wrapper, whose
    data pointer is not its data); a tensor subclass that is not unwrapped takes the reference's torch ops."""

    class Sharded(torch.Tensor):
        placements = ("Shard(0)",)

        def to_local(self):
            return self.as_subclass(torch.Tensor)

    t = torch.zeros(3).as_subclass(Sharded)
    assert type(O._local(t)) is torch.Tensor and O._local(t).data_ptr() == t.data_ptr()
    plain = torch.zeros(3)
    assert O._local(plain) is plain
    assert not O._on_kernels(t, plain, plain, plain)
