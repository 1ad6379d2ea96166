"""The classifier's AdamW (sst2/adamw.py) against torch.optim.AdamW: the same parameters after each
step, state dicts that load into either, and no torch._dynamo import on the way."""

import copy
import subprocess
import sys

import pytest
import torch

from tilewise.sst2.adamw import AdamW

from conftest import HAS_CUDA


def _params(device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(37, 5), (5,), (3, 7, 2)]
    return [torch.randn(s, generator=g).to(device).requires_grad_(True) for s in shapes]


def _groups(params, tensor_lr=False, device="cpu"):
    lr_a, lr_b = 3e-3, 1e-2
    if tensor_lr:
        lr_a, lr_b = (torch.tensor(v, device=device) for v in (lr_a, lr_b))
    return [{"params": params[:1], "lr": lr_a, "weight_decay": 0.1}, {"params": params[1:], "lr": lr_b}]


def _grads(params, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.device)


def _run(opt, params, steps, first=0):
    for i in range(first, first + steps):
        _grads(params, i)
        opt.step()


def _lockstep(ours, a, ref, b, steps, rtol, atol):
    # Both optimizers step on the same gradients; their parameters are compared after every step.
    for i in range(steps):
        _grads(a, i)
        _grads(b, i)
        ours.step()
        ref.step()
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def test_same_parameters_as_torch_adamw_each_step():
    a, b = _params(), _params()
    ours = AdamW(_groups(a), weight_decay=0.01)
    ref = torch.optim.AdamW(_groups(b), weight_decay=0.01, foreach=True)
    _lockstep(ours, a, ref, b, 12, rtol=0, atol=0)


@pytest.mark.parametrize("direction", ["torch->ours", "ours->torch"])
def test_state_dicts_move_between_the_two(direction):
    a, b = _params(), _params()
    first = (lambda ps: AdamW(_groups(ps))) if direction == "ours->torch" else \
        (lambda ps: torch.optim.AdamW(_groups(ps), foreach=True))
    second = (lambda ps: torch.optim.AdamW(_groups(ps), foreach=True)) if direction == "ours->torch" else \
        (lambda ps: AdamW(_groups(ps)))
    o1 = first(a)
    _run(o1, a, 4)
    with torch.no_grad():
        for x, y in zip(a, b):
            y.copy_(x)
    o2 = second(b)
    o2.load_state_dict(copy.deepcopy(o1.state_dict()))  # as through a checkpoint file: no shared tensors
    _run(o1, a, 5, first=4)
    _run(o2, b, 5, first=4)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_capturable_path_matches_the_host_path():
    # Device-side bias corrections with a tensor lr (what a captured step reads) against the CPU counters.
    a, b = _params(), _params()
    host = AdamW(_groups(a))
    dev = AdamW(_groups(b, tensor_lr=True), capturable=True)
    _run(host, a, 8)
    _run(dev, b, 8)
    for x, y in zip(a, b):  # the same update in another order of fp32 operations: an ulp or two apart
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    assert all(st["step"].device == b[0].device for st in dev.state.values())
    assert all(st["step"].device.type == "cpu" and float(st["step"]) == 8 for st in host.state.values())


def test_zero_grad_and_errors():
    ps = _params()
    opt = AdamW(ps)
    _grads(ps, 0)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in ps)
    opt.zero_grad()
    assert all(p.grad is None for p in ps)
    opt.step()  # no grads: nothing moves, no state
    assert opt.state == {}
    with pytest.raises(ValueError, match="'groups' is empty"):
        AdamW([])
    with pytest.raises(ValueError, match="needs capturable=True"):
        AdamW(ps, lr=torch.tensor(1e-3))
    with pytest.raises(ValueError, match="requires grad"):
        AdamW([torch.zeros(3)])
    other = AdamW(_params()[:2])
    with pytest.raises(ValueError, match="do not match"):
        other.load_state_dict(opt.state_dict())


def test_no_dynamo_import():
    code = ("import sys, torch\nfrom tilewise.sst2.adamw import AdamW\n"
            "p = torch.zeros(4, requires_grad=True)\np.grad = torch.ones(4)\n"
            "o = AdamW([p])\no.step()\no.load_state_dict(o.state_dict())\n"
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_capturable_matches_torch_and_captures():
    a, b = _params("cuda"), _params("cuda")
    ours = AdamW(_groups(a, tensor_lr=True, device="cuda"), capturable=True)
    ref = torch.optim.AdamW(_groups(b, tensor_lr=True, device="cuda"), capturable=True, foreach=True)
    _lockstep(ours, a, ref, b, 3, rtol=1e-6, atol=1e-7)
    # a CUDA graph of the step replays the update (the lr read from its tensor)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ours.step()
        ref.step()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        ours.step()
    for grp in ours.param_groups:
        grp["lr"].fill_(float(grp["lr"]) / 2)
    for grp in ref.param_groups:
        grp["lr"].fill_(float(grp["lr"]) / 2)
    g.replay()
    ref.step()
    torch.cuda.synchronize()
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)
