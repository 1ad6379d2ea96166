"""Attention's call plans (ops/attention/plans.py) on the CPU: a replayed call launches what the ordinary
path launches for the same tensors (kernels, grids' arguments, descriptors, allocations), keys that do
not replay stay on the ordinary path, and plans stay off where they must. The kernels themselves run on
the GPU (``test_gpu_planned_calls_match_the_ordinary_path`` in test_attention.py)."""

import pytest
import torch

from attention_fakes import fake_launches
from tilewise.ops.attention import api as A
from tilewise.ops.attention import configs as C
from tilewise.ops.attention import plans as P


def _make(B, H, Hkv, S, D, layout, seed, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)

    def one(h):
        t = torch.randn(B, S, h, D, generator=g, dtype=torch.bfloat16, device=device)
        if layout == "seq":  # transformers' (B, S, H, D) storage seen as (B, H, S, D)
            t = t.transpose(1, 2)
        elif layout == "strided":  # neither layout: the ws routes copy it
            t = torch.randn(B, h, S, 2 * D, generator=g, dtype=torch.bfloat16, device=device)[..., ::2]
        else:
            t = t.transpose(1, 2).contiguous()
        return t.requires_grad_(True)

    q, k, v = one(H), one(Hkv), one(Hkv)
    return [q, k, v], torch.randn(B, H, S, D, generator=g, dtype=torch.bfloat16, device=device)


def _fwd_bwd(ins, go, causal, det, lse, policy):
    """(out, dq, dk, dv) of one call; with ``lse`` the loss also sums the log-sum-exp (a dLSE)."""
    out = A.flash_attention(*ins, causal=causal, deterministic=det, policy=policy, return_lse=lse)
    if lse:
        out, l_ = out
        return (out, *torch.autograd.grad((out.float() * go.float()).sum() + l_.sum(), ins))
    return (out, *torch.autograd.grad(out, ins, go))


def _canonical(log, inputs):
    """The launch log with tensors and descriptor bases named: an input by its name, any other tensor
    by the order it first appears in (with its shape, strides and dtype), so two calls that allocate at
    different addresses compare equal when they launch the same thing."""
    named = {t.data_ptr(): n for n, t in inputs.items()}
    seen: dict = {}

    def name(t, spec=True):
        p = t.data_ptr()
        if p in named:
            return named[p]
        if p not in seen:
            seen[p] = len(seen)
        return ("alloc", seen[p]) + ((tuple(t.shape), t.stride(), t.dtype) if spec else (t.dtype,))

    out = []
    for kernel, values in log:
        row = []
        for a in values:
            if isinstance(a, torch.Tensor):
                row.append(name(a))
            elif hasattr(a, "block_shape"):
                fields = {k: v for k, v in vars(a).items() if k != "base"}
                row.append((type(a).__name__, name(a.base, spec=False), repr(sorted(fields.items()))))
            else:
                row.append((type(a).__name__, a))
        out.append((kernel, row))
    return out


CASES = {
    # (B, H, Hkv, S, D, causal, layout, deterministic, lse): the route each takes on an H200
    "host_row": (1, 16, 16, 256, 128, True, "head", True, False),  # v5, v3's backward
    "llama_seq_major": (1, 8, 2, 2048, 128, True, "seq", True, False),  # v5, v6
    "persistent": (2, 4, 4, 1000, 128, False, "head", True, False),  # v5 persistent, v6
    "d64": (1, 4, 2, 4096, 64, True, "seq", True, False),
    "copied": (1, 4, 4, 2048, 128, True, "strided", True, False),  # q, k, v copied first
    "lse_grad": (1, 4, 2, 300, 128, True, "head", True, True),  # dLSE given
    "atomic": (1, 4, 2, 512, 128, True, "head", False, False),  # backward not planned
}


@pytest.mark.parametrize("case", CASES)
def test_replayed_calls_launch_what_the_ordinary_path_launches(case):
    B, H, Hkv, S, D, causal, layout, det, lse = CASES[case]
    with fake_launches() as log:
        for seed in range(4):  # the second builds the plan, the next two replay it with new tensors
            ins, go = _make(B, H, Hkv, S, D, layout, seed)
            log.clear()
            planned = _fwd_bwd(ins, go, causal, det, lse, None)
        planned_log = _canonical(log, dict(zip("qkv", ins)))
        hits = P.stats()["hits"]
        assert hits == 2 and P.stats()["plans"] == 1 and P.stats()["built"] == 1
        off = A.default_policy(ins[0], ins[1], causal=causal, deterministic=det).replace(plans=False)
        _fwd_bwd(ins, go, causal, det, lse, off)
        log.clear()
        ordinary = _fwd_bwd(ins, go, causal, det, lse, off)
        assert P.stats()["hits"] == hits
        ordinary_log = _canonical(log, dict(zip("qkv", ins)))
    assert [k for k, _ in planned_log] == [k for k, _ in ordinary_log]
    assert planned_log == ordinary_log
    for a, b in zip(planned, ordinary):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)


def test_a_window_as_wide_as_the_sequence_launches_what_plain_causal_launches():
    """Mistral's window (sliding_window - 1, 0) at a length within it, or any wider, is causal itself: the
    same kernels and arguments as the causal call without a window (the band kernels, not faked here, would
    fail the call)."""
    ins, go = _make(1, 4, 2, 2048, 128, "seq", 0)
    logs = []
    with fake_launches() as log:
        off = A.default_policy(ins[0], ins[1], causal=True).replace(plans=False)
        for window in (None, None, (2047, 0), (5000, None)):  # the first: Triton's dispatch logs fewer values
            log.clear()
            torch.autograd.grad(A.flash_attention(*ins, causal=True, window=window, policy=off), ins, go)
            logs.append(_canonical(log, dict(zip("qkv", ins))))
    assert logs[1] and logs[2] == logs[1] and logs[3] == logs[1]


def test_a_call_that_does_not_replay_stays_on_the_ordinary_path(monkeypatch):
    """A launcher that leaves nothing to relaunch (here: one that records and launches nothing) makes
    the key the ordinary path's for good: every later call goes through it, each launch seen."""
    seen = []
    monkeypatch.setattr(A, "_launch", lambda fn, grid, *a, **k: seen.append(fn.__name__))
    ins, go = _make(1, 4, 4, 256, 128, "head", 0)
    with fake_launches():
        for _ in range(4):
            torch.autograd.grad(A.flash_attention(*ins, causal=True), ins, go)
        assert P.stats() == {"hits": 0, "built": 0, "refused": 1, "plans": 0}
    assert len(seen) == 4 * 4


def test_a_key_called_once_records_nothing(monkeypatch):
    """A layout seen once (a prompt's length) runs the ordinary path without the recording launcher:
    its plan is built on its second call."""
    recorded = []
    real = P._Recorder.__call__
    monkeypatch.setattr(P._Recorder, "__call__", lambda self, *a, **k: recorded.append(1) or real(self, *a, **k))
    with fake_launches():
        for S in (256, 320, 384):
            ins, go = _make(1, 4, 4, S, 128, "head", S)
            torch.autograd.grad(A.flash_attention(*ins, causal=True), ins, go)
        assert recorded == [] and P.stats()["built"] == 0
        torch.autograd.grad(A.flash_attention(*ins, causal=True), ins, go)
        assert len(recorded) == 4 and P.stats()["built"] == 1


def test_keys_tell_layouts_apart():
    """Strides, alignment, dtype, causality, scale and the policy each change the key; no key for a
    policy with plans off, a tensor subclass or a scale given as a tensor."""
    x = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    base = P.key(x, x, x, True, None, True, None, "top_left")
    odd = torch.randn(2 * x.numel() + 8, dtype=torch.bfloat16)[4:4 + x.numel()].view(x.shape)
    variants = [P.key(x.transpose(1, 2), x, x, True, None, True, None, "top_left"),
                P.key(odd, x, x, True, None, True, None, "top_left"),
                P.key(x.half(), x, x, True, None, True, None, "top_left"),
                P.key(x, x, x, False, None, True, None, "top_left"),
                P.key(x, x, x, True, 0.5, True, None, "top_left"),
                P.key(x, x, x, True, None, False, None, "top_left"),
                P.key(x, x, x, True, None, True, A.AttentionPolicy(), "top_left")]
    assert base is not None and all(v is not None and v != base for v in variants)
    assert len(set(variants)) == len(variants)
    assert P.key(x, x, x, True, None, True, A.AttentionPolicy(plans=False), "top_left") is None
    assert P.key(torch.nn.Parameter(x), x, x, True, None, True, None, "top_left") is None
    assert P.key(x, x, x, True, torch.tensor(0.5), True, None, "top_left") is None


def test_no_plans_under_the_interpreter():
    """Triton's interpreter (CPU tests) has no compiled launcher to relaunch: the first call of a key
    refuses it, and every call computes on the ordinary path."""
    ins = [t.float().detach().requires_grad_(True) for t in _make(1, 2, 1, 40, 32, "head", 1)[0]]
    out = A.flash_attention(*ins, causal=True)
    again = A.flash_attention(*ins, causal=True)
    torch.testing.assert_close(out, again, rtol=0, atol=0)
    torch.testing.assert_close(out, A.reference(*ins, causal=True), rtol=1e-4, atol=1e-5)
    assert P.stats()["plans"] == 0 and P.stats()["hits"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_planned_calls_match_the_ordinary_path(case, monkeypatch):
    """On the GPU, with fresh tensors each call: a replayed call's output and gradients equal the
    ordinary path's bit for bit (the atomic backward's dQ within bf16 rounding: its fp32 adds are
    unordered), every element of a replay's allocations written (they start as NaN), and the replays
    happened."""
    from conftest import poison

    real = P._alloc
    monkeypatch.setattr(P, "_alloc", lambda spec, device: poison(real(spec, device)))
    B, H, Hkv, S, D, causal, layout, det, lse = CASES[case]
    for seed in range(4):  # the ordinary path, the plan's recording, two replays
        ins, go = _make(B, H, Hkv, S, D, layout, seed, device="cuda")
        off = A.default_policy(ins[0], ins[1], causal=causal, deterministic=det).replace(plans=False)
        got = _fwd_bwd(ins, go, causal, det, lse, None)
        want = _fwd_bwd(ins, go, causal, det, lse, off)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            assert a.stride() == b.stride(), name
            if name == "dq" and not det:
                torch.testing.assert_close(a, b)
            else:
                assert torch.equal(a, b), (case, seed, name, (a.float() - b.float()).abs().max())
    assert P.stats()["hits"] == 2 and P.stats()["plans"] == 1


def test_two_q_buffers_reach_the_persistent_launch(monkeypatch):
    """``ws_q_buffers=2`` launches v5's persistent kernel, and the overlapped consumers' (``ws_overlap=
    "persistent"``), with Q_BUFS = 2; one buffer passes none, so the one-buffer builds' launches (and their
    compiled kernels) stay what they were. The default policy at D 128 without causal takes two
    (``WS_Q_BUFFER_RULES``). Either kernel with two chains its items (CHAIN) where it can: not with
    causal."""
    ins, _ = _make(2, 4, 4, 1000, 128, "head", 5)
    seen = []
    with fake_launches():
        real = A._launch

        def spy(fn, grid, *args, **kwargs):
            seen.append((getattr(fn, "__name__", str(fn)), kwargs.get("Q_BUFS"), kwargs.get("CHAIN")))
            return real(fn, grid, *args, **kwargs)
        monkeypatch.setattr(A, "_launch", spy)
        base = A.default_policy(ins[0], ins[1]).replace(forward="ws", ws_persistent=True, ws_overlap=False,
                                                        plans=False)
        assert base.ws_q_buffers == 2
        over = base.replace(ws_overlap="persistent", ws_q_buffers=1)  # the overlapped consumers on the same grid
        with torch.no_grad():
            A.flash_attention(*ins, policy=base.replace(ws_q_buffers=1))
            A.flash_attention(*ins, policy=base)
            A.flash_attention(*ins, policy=over)
            A.flash_attention(*ins, policy=over.replace(ws_q_buffers=2))
            A.flash_attention(*ins, causal=True, policy=over.replace(ws_q_buffers=2))
    assert seen == [("attn_fwd_ws_persistent_kernel", None, None), ("attn_fwd_ws_persistent_kernel", 2, True),
                    ("attn_fwd_overlap_persistent_kernel", None, None),
                    ("attn_fwd_overlap_persistent_kernel", 2, True), ("attn_fwd_overlap_persistent_kernel", 2, None)]


def test_three_consumers_keep_their_items_apart(monkeypatch):
    """D 64's route (v5's persistent kernel, three consumers, two Q buffers) does not chain its items: chained
    they measured 0.93-0.99x at S 1024-2048 (``configs.WS_CHAIN_CONSUMERS``); D 128's two consumers do."""
    seen = []
    real = A._launch

    def spy(fn, grid, *args, **kwargs):
        seen.append((getattr(fn, "__name__", str(fn)), kwargs.get("NUM_CONS"), kwargs.get("CHAIN")))
        return real(fn, grid, *args, **kwargs)
    monkeypatch.setattr(A, "_launch", spy)
    for D in (64, 128):
        ins, _ = _make(2, 4, 4, 1000, D, "head", 7)
        with fake_launches():
            policy = A.default_policy(ins[0], ins[1]).replace(forward="ws", ws_persistent=True, ws_overlap=False,
                                                              plans=False, ws_q_buffers=2)
            with torch.no_grad():
                A.flash_attention(*ins, policy=policy.replace(ws_config=C.WS_THREE if D == 64 else None))
    assert seen == [("attn_fwd_ws_persistent_kernel", 3, None), ("attn_fwd_ws_persistent_kernel", 2, True)]