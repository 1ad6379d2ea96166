"""Call plans: an eager flash_attention call without mask, bias, window or score mod, replayed.

An eager forward + backward spends most of its host time re-deciding what the previous call of the
same layout decided: the checks, the policy, the layouts, each TMA descriptor built and validated,
and each launch's signature hashed from every argument (``research/attention_call_plan.py``). A
plan is what one call did, kept under that call's key (shapes, strides, dtypes, devices, 16-byte
alignment, causal, scale, deterministic, policy, align): the copies ``layout.for_ws`` made, the
allocations, and every launch as a ``triton_launch.Bound`` with a template of its arguments. A later
call with that key allocates, fills the templates with its own tensors and relaunches.

A key's first call only marks it seen; its second runs the ordinary path with a recording launcher,
so what a plan holds is what that path launched. Each argument of each launch must be one of the call's tensors (by
identity), a descriptor over one of them (by address and dtype, exactly one candidate), or a
constant; the only tensor the path allocates besides its results is the preprocess kernel's Delta
(written whole before it is read). Anything else (a zero-filled accumulator, a copied dO, a launch
without a ``Bound``) leaves the key unplanned, and its calls keep the ordinary path. The backward is
planned the same way, per (dO strides, dtype, alignment; whether dLSE is given).

``AttentionPolicy(plans=False)`` turns plans off for a call; nothing runs under ``torch.compile``
(the custom ops) or for CPU tensors. Measured effect: docs/tuning/attention.md, "Call plans".
"""

from __future__ import annotations

import threading

import torch

from ...runtime.triton_launch import bound_for

_MAX_PLANS = 512  # keys of a training run are a handful; cleared when full
NONE = object()  # a key the ordinary path keeps
SEEN = object()  # a key called once: its next call builds the plan
PLANS: dict = {}
_LOCK = threading.Lock()
_STATS = {"hits": 0, "built": 0, "refused": 0}

# Roles: the call's tensors a launch argument may be, in the order of a replay's list.
Q, K, V, OUT, LSE, DO, DLSE, DELTA, DQ, DK, DV = range(11)
_PREPROCESS = "_attn_bwd_preprocess_kernel"
_DELTA_ARG = 3  # its Delta: the backward's one scratch tensor, written whole before it is read


def key(q, k, v, causal, scale, deterministic, policy, align):
    """The plan key of a plain call, or None where plans do not apply to it."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    if (policy is not None and (not getattr(policy, "plans", False) or policy.backward == "cudnn")
            or type(deterministic) is not bool):
        return None  # (a cuDNN backward is no launch a plan could record)
    if not (scale is None or type(scale) is float) or type(align) is not str:
        return None
    # The current device too: the launches go to its stream, as the ordinary path's do.
    return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
            k.device, v.device, q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, bool(causal), scale,
            deterministic, policy, align, torch.cuda.current_device() if q.is_cuda else -1)


def stats() -> dict:
    """Planned calls (hits), plans built, keys left to the ordinary path (refused); plans held."""
    return {**_STATS, "plans": sum(type(p) is Plan for p in PLANS.values())}


def lookup(k):
    """The plan under key ``k`` (None: none, or the key is not planned)."""
    p = PLANS.get(k)
    return p if type(p) is Plan else None


def admit(k, plannable: bool) -> bool:
    """Whether this ordinary-path call of key ``k`` builds its plan: the key's second call does, so a key
    called once (a prompt's length) pays nothing for recording. ``plannable``: the call's arguments
    allow a plan (else the key is refused)."""
    state = PLANS.get(k)
    if not plannable:
        if state is not NONE:
            refuse(k)
        return False
    if state is None:
        _keep(k, SEEN)
        return False
    return state is SEEN


def clear() -> None:
    """Drop every plan and zero the counts."""
    PLANS.clear()
    _STATS.update(hits=0, built=0, refused=0)


def _keep(k, plan) -> None:
    with _LOCK:
        if len(PLANS) >= _MAX_PLANS:
            PLANS.clear()
        PLANS[k] = plan


def refuse(k) -> None:
    """Leave ``k`` to the ordinary path from now on."""
    _STATS["refused"] += 1
    _keep(k, NONE)


class _Recorder:
    """A launcher for ``api._fwd_impl`` / ``_bwd_impl``: launches through ``launch`` (api's launcher) and
    keeps each launch with its ``Bound`` (None where ``launch`` left nothing to relaunch)."""

    def __init__(self, launch):
        self.launch = launch
        self.launches = []
        self.complete = True

    def __call__(self, fn, grid, *args, **kwargs):
        self.launch(fn, grid, *args, **kwargs)
        b = bound_for(fn, grid, *args, **kwargs)
        if b is None:
            self.complete = False
        self.launches.append((getattr(fn, "__name__", ""), b, args))


def _is_desc(a) -> bool:
    return hasattr(a, "base") and hasattr(a, "block_shape") and hasattr(a, "__dict__")


def _template(launches, roles):
    """Per launch (Bound, constants, [(position, role, descriptor fields or None)]), or None where an
    argument is not a role, a descriptor over exactly one role, or a constant."""
    ptrs = [(t.data_ptr(), t.dtype) if t is not None else None for t in roles]
    live = [p for p in ptrs if p is not None]
    if len(set(live)) != len(live):  # two roles at one address: a descriptor could not tell them apart
        return None
    out = []
    for name, bound, args in launches:
        if name == _PREPROCESS and len(roles) > DELTA and roles[DELTA] is None:
            d = args[_DELTA_ARG]  # the backward's scratch
            if not isinstance(d, torch.Tensor) or any(t is d for t in roles):
                return None
            roles[DELTA], ptrs[DELTA] = d, (d.data_ptr(), d.dtype)
        consts, slots = list(args), []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                r = next((j for j, t in enumerate(roles) if t is a), None)
                if r is None:
                    return None
                slots.append((i, r, None))
                consts[i] = None
            elif _is_desc(a):
                hits = [j for j, p in enumerate(ptrs) if p == (a.base.data_ptr(), a.base.dtype)]
                if len(hits) != 1:
                    return None
                fields = dict(vars(a))
                del fields["base"]
                slots.append((i, hits[0], (type(a), fields)))
                consts[i] = None
            elif not (a is None or type(a) in (int, float, bool, str)):
                return None
        out.append((bound, consts, tuple(slots)))
    return out


def _replay(template, env) -> None:
    for bound, consts, slots in template:
        vals = list(consts)
        for i, r, desc in slots:
            t = env[r]
            if desc is None:
                vals[i] = t
            else:
                cls, fields = desc
                d = cls.__new__(cls)  # validated when the plan was built, for this key's layouts
                d.__dict__.update(fields)
                d.base = t
                vals[i] = d
        bound(*vals)


def _spec(t):
    return (tuple(t.shape), t.stride(), t.dtype)


def _alloc(spec, device):
    return torch.empty_strided(spec[0], spec[1], dtype=spec[2], device=device)


class Plan:
    """One key's forward (built by its first call) and backward (per dO layout). ``copies``: which of
    q, k, v the first call copied to contiguous (``layout.for_ws``). ``impl``: api's (``_fwd_impl``,
    ``_bwd_impl``, launcher), the ordinary path a first call records."""

    def __init__(self, k, copies, causal, scale, policy, out_seq, impl):
        self.key, self.copies, self.causal, self.scale, self.policy = k, copies, causal, scale, policy
        self.out_seq, self.impl = out_seq, impl
        self.fwd = None  # (template, out spec, lse spec)
        self.bwd: dict = {}

    def __call__(self, q, k, v):
        _STATS["hits"] += 1
        cq, ck, cv = self.copies
        return _Planned.apply(q.contiguous() if cq else q, k.contiguous() if ck else k, v.contiguous() if cv else v,
                              self)

    def forward(self, q, k, v):
        if self.fwd is not None:
            template, out_spec, lse_spec = self.fwd
            out, lse = _alloc(out_spec, q.device), _alloc(lse_spec, q.device)
            _replay(template, (q, k, v, out, lse))
            return out, lse
        fwd_impl, _, launch = self.impl
        rec = _Recorder(launch)
        out, lse = fwd_impl(q, k, v, None, None, self.causal, self.scale, self.policy, None, 0.0, None, 0,
                             self.out_seq, launcher=rec)
        template = _template(rec.launches, [q, k, v, out, lse]) if rec.complete else None
        if template is None or not _writes(template, (OUT, LSE)):
            refuse(self.key)
        else:
            self.fwd = (template, _spec(out), _spec(lse))
            _STATS["built"] += 1
            _keep(self.key, self)
        return out, lse

    def backward(self, do, dlse, q, k, v, out, lse):
        _, bwd_impl, launch = self.impl
        sub = (do.stride(), do.dtype, do.data_ptr() % 16, None if dlse is None else dlse.data_ptr() % 16)
        got = self.bwd.get(sub)
        if got is not None and got is not NONE:
            template, specs = got
            dq, dk, dv, delta = (_alloc(s, q.device) for s in specs)
            _replay(template, (q, k, v, out, lse, do, dlse, delta, dq, dk, dv))
            return dq, dk, dv
        rec = None if got is NONE else _Recorder(launch)
        dq, dk, dv, _ = bwd_impl(do, q, k, v, out, lse, dlse, None, None, self.causal, self.scale, False,
                                  self.policy, None, 0.0, None, 0, grads_like=True, launcher=rec)
        if rec is not None:
            roles = [q, k, v, out, lse, do, dlse, None, dq, dk, dv]
            template = _template(rec.launches, roles) if rec.complete else None
            ok = template is not None and roles[DELTA] is not None and _writes(template, (DQ, DK, DV))
            self.bwd[sub] = (template, tuple(_spec(t) for t in (dq, dk, dv, roles[DELTA]))) if ok else NONE
        return dq, dk, dv


def _writes(template, roles) -> bool:
    """Whether each of ``roles`` (the call's results) is an argument of some launch: a result the
    ordinary path made after its launches (a cast, a copy) would not be replayed."""
    seen = {r for _, _, slots in template for _, r, _ in slots}
    return all(r in seen for r in roles)


class _Planned(torch.autograd.Function):
    """``api._EagerFlash`` for a planned call: the plan's forward and backward."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        out, lse = plan.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None and dlse is None:
            return None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        if dlse is not None:
            dlse = dlse.float().contiguous()  # as api._backward
        dq, dk, dv = ctx.plan.backward(dout, dlse, q, k, v, out, lse)
        return dq, dk, dv, None


def first_call(k, given, q, k_, v, out_seq, causal, scale, policy, impl):
    """The first call of key ``k``: q, k, v as ``layout.for_ws`` left them (``given``: as passed), run
    through a new plan (``impl``: as ``Plan``'s), which keeps itself under ``k`` if its launches replay."""
    copies = tuple(t is not g for t, g in zip((q, k_, v), given))
    return _Planned.apply(q, k_, v, Plan(k, copies, causal, scale, policy, out_seq, impl))
