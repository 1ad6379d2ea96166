"""gemm()'s dispatch glue: the description of a call that ``configs.route`` decides on
(``problem_of``), the call plans that let later calls of a layout skip the checks and the route, the
padded route's copies and the gemm_sm90 runner. ``api.gemm`` composes them.

Call plans: gemm()'s route for a call without aux or scales depends only on what ``plan_key``
holds (shapes, strides, dtypes, 16-byte alignment of each pointer, devices, bias layout,
activation, out_dtype, precision, the policy), and so do the checks and the launch's arguments
other than the tensors. The first call of a key checks, routes and launches; it leaves a plan that
later calls run directly: allocate the output, build the descriptors without re-validating them,
launch the compiled kernel (runtime.triton_launch.Bound). ``PLANS`` caches what the route (a pure
function of the key) and that first launch gave; it is shared by threads (a lock guards writes; a
plan publishes its bound launch in one assignment). Host time: docs/tuning/gemm.md, "Call plans and
the direct launcher".
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from ...runtime.triton_launch import bind as _bind
from .._memory import may_overlap, span
from ..transpose import api as _transpose
from . import sm90 as _sm90
from . import triton_kernels as tk
from .configs import (DEFAULT_POLICY, SM90_CONFIGS, SMALL_TILE, TMA_64x128, GemmPolicy, Operand, Problem, Route,
                      Target, cdiv, route)


# --------------------------------------------------------------------------- the call's description


def target_of(a: torch.Tensor) -> Target:
    """The facts of a's device the route reads: SM count, whether gemm_sm90 / gemm_tf32 run there,
    whether the Triton kernels are the interpreter's."""
    dev = a.get_device()
    return Target(sms=tk.num_sms(dev), sm90=not tk.INTERPRET and a.is_cuda and _sm90.available(dev),
                  interpret=tk.INTERPRET)


def _operand(t) -> Operand | None:
    return Operand.of(t) if isinstance(t, torch.Tensor) and t.dim() == 2 else None


def problem_of(a, b, bias=None, activation=None, out_dtype=None, scale_a=None, scale_b=None, precision="tf32",
               out=None, aux=None, target: Target | None = None) -> Problem:
    """``configs.route``'s description of a gemm() call; ``target`` defaults to a's device's."""
    pa, pb = _operand(a), _operand(b)
    if pa is None or pb is None:
        return Problem(None, None)
    po = _operand(out) if out is not None else None
    return Problem(pa, pb, out=po, out_given=out is not None, aux=_operand(aux) if aux is not None else None,
                   aux_given=aux is not None, out_dtype=out_dtype, bias=bias is not None, activation=activation,
                   scales=scale_a is not None or scale_b is not None, precision=precision,
                   cuda=a.is_cuda and b.is_cuda and a.device == b.device,
                   out_on_device=po is not None and out.device == a.device,
                   out_meets_a=po is not None and may_overlap(out, a),
                   out_meets_b=po is not None and may_overlap(out, b),
                   target=target or target_of(a))


def route_of(a, b, *, bias=None, activation=None, out_dtype=None, scale_a=None, scale_b=None, precision="tf32",
             out=None, aux=None, target: Target | None = None) -> Route:
    """The route gemm() takes for these arguments (variant None)."""
    return route(problem_of(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux, target))


# --------------------------------------------------------------------------- the padded route


def _padded_cols(t: torch.Tensor, cols: int) -> torch.Tensor:
    """A row-major copy of 2-D t with ``cols`` >= t.shape[1] columns, the extra ones zero."""
    p = torch.empty((t.shape[0], cols), device=t.device, dtype=t.dtype)
    p[:, t.shape[1]:].zero_()
    p[:, :t.shape[1]].copy_(t)
    return p


def padded_operands(a, b, out, pad):
    """The padded route's (a, b, c): copies of a and b with rows of whole 16 bytes where ``pad``
    says (zero pad columns of A meet zero pad rows of B, so the sum is unchanged), and c, an output
    with 16-byte rows (out itself unless pad[2]; else a view of a padded buffer to copy from)."""
    pad_a, pad_b, pad_out = pad
    M, K = a.shape
    N = b.shape[1]
    k_pad = cdiv(K, 16 // a.element_size()) * (16 // a.element_size())
    a_p = _padded_cols(a, k_pad) if pad_a else a
    if pad_b:
        if b.stride(0) == 1 and b.stride(1) != 1:  # K-major (w.t() of an (N, K) weight): pad w's rows
            b_p = _padded_cols(b.t(), k_pad).t()
        else:  # N-major: K rows padded with zero rows, each row padded to 16 bytes
            n_pad = cdiv(N, 16 // b.element_size()) * (16 // b.element_size())
            buf = torch.empty((k_pad, n_pad), device=b.device, dtype=b.dtype)
            buf[K:].zero_()
            buf[:K, :N].copy_(b)
            b_p = buf[:, :N]
    else:
        b_p = b
    if pad_out:
        n_pad = cdiv(N, 16 // out.element_size()) * (16 // out.element_size())
        c = torch.empty((M, n_pad), device=out.device, dtype=out.dtype)[:, :N]
    else:
        c = out
    return a_p, b_p, c


# --------------------------------------------------------------------------- call plans

PLANS: dict = {}
_PLANS_MAX = 4096  # cleared when full
_PLANS_LOCK = threading.Lock()


def plan_key(a, b, bias, activation, out_dtype, precision, out, policy: GemmPolicy = DEFAULT_POLICY):
    """Everything gemm()'s route, checks and launch arguments depend on, besides the tensors'
    addresses (and whether ``out`` overlaps an input, which each call checks); None for arguments
    that are not plain tensors (the caller then takes the checked path)."""
    try:
        bk = None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.data_ptr() & 15,
                                        bias.get_device())
        ok = None if out is None else (out.dtype, out.shape, out.stride(), out.data_ptr() & 15, out.get_device())
        dev = a.get_device()
        key = (a.dtype, b.dtype, a.shape, b.shape, a.stride(), b.stride(), a.data_ptr() & 15, b.data_ptr() & 15,
               dev, b.get_device(), torch.cuda.current_device() if dev >= 0 else -1, bk, ok, activation, out_dtype,
               precision, policy)
        hash(key)
    except (AttributeError, TypeError, RuntimeError):
        return None
    return key


def keep(key, plan) -> None:
    with _PLANS_LOCK:
        if len(PLANS) >= _PLANS_MAX:
            PLANS.clear()
        PLANS[key] = plan


def _extent(t: torch.Tensor) -> int:
    """Bytes from a tensor's first to its last element's last byte (``_memory.span``'s width)."""
    first, last = span(t)
    return last - first


def _extents(a, b, bias, out) -> tuple:
    return (_extent(a), _extent(b), _extent(bias) if bias is not None else 0, _extent(out) if out is not None else 0)


_TD_FAST: dict = {}  # TensorDescriptor class -> whether a copy can be filled in without its checks


def _desc_maker(proto):
    """x -> a copy of TensorDescriptor ``proto`` (checked when it was built) with base x, for tensors
    of the dtype, shape, strides and alignment proto's base has (a plan's key): the checks of
    TensorDescriptor's constructor are not run again. ``x`` only lends its address: for a K-major
    B, proto's base is b.t() and x is b. Holds no reference to proto's base."""
    TD = type(proto)
    fast = _TD_FAST.get(TD)
    if fast is None:
        fast = _TD_FAST[TD] = not hasattr(TD, "__slots__") and all(
            f.default is not dataclasses.MISSING for f in dataclasses.fields(TD)
            if f.name not in ("base", "shape", "strides", "block_shape"))
    fields = {f.name: getattr(proto, f.name) for f in dataclasses.fields(TD) if f.name != "base"}
    if not fast:
        return lambda x: TD(x, **fields)
    new = TD.__new__

    def make(x):
        d = new(TD)
        d.__dict__.update(fields)
        d.base = x
        return d

    return make


# Per plan kind: how many leading kernel arguments are the call's tensors (descriptors and
# pointers, rebuilt each call); the rest (sizes, strides, SM count) are the plan's constants.
PLAN_LEAD = {"ptr": 7, "tma": 7, "split": 10}


def _meets_inputs(out, extents, a, b, bias) -> bool:
    """Whether a given out's byte range meets a's, b's or bias's (as the checks' check_no_overlap),
    from the plan's byte extents (a, b, bias, out) and the tensors' addresses."""
    ea, eb, ebias, eo = extents
    o0 = out.data_ptr()
    o1 = o0 + eo
    x = a.data_ptr()
    if x <= o1 and o0 <= x + ea:
        return True
    x = b.data_ptr()
    if x <= o1 and o0 <= x + eb:
        return True
    if bias is not None:
        x = bias.data_ptr()
        if x <= o1 and o0 <= x + ebias:
            return True
    return False


class _Plan:
    """One Triton route for one ``plan_key``: ``plan(a, b, bias, out)`` allocates the output (out
    None) and launches; None when the call needs the checked path (a given out whose addresses
    meet an input's, an allocation without 16-byte alignment).
    kind: "tma" (``_tma_launch``: a fixed config or the autotuner's), "split" (``_split_launch``),
    "ptr" (``_pointer_launch``: v1_tiled autotuned, or the persistent kernel with a fixed tile).
    ``spec(a, b, bias, out)`` is the route's launch (kernel, grid, args, kwargs), as its variant
    builds it: the plan launches it through Triton until runtime.triton_launch.bind gives a Bound,
    then keeps (in ``state``, set once) the Bound, the trailing constant arguments and, for TMA,
    descriptor makers taken from that launch's descriptors (the autotuner's pre-hook has set their
    blocks by then)."""

    __slots__ = ("kind", "spec", "out_shape", "out_dtype", "device", "extents", "state")

    @property
    def bound(self):
        state = self.state
        return None if state is None else state[0]

    def __call__(self, a, b, bias, out):
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
            if out.data_ptr() & 15:
                return None
        elif _meets_inputs(out, self.extents, a, b, bias):
            return None
        state = self.state
        if state is None:
            return self._bind(a, b, bias, out)
        bound, tail, makers = state
        dummy = out
        bptr = bias if bias is not None else dummy
        if self.kind == "ptr":
            bound(a, b, out, bptr, dummy, dummy, dummy, *tail)
        elif self.kind == "tma":
            ma, mb, mc = makers
            c = mc(out)
            bound(ma(a), mb(b), c, c, bptr, dummy, dummy, *tail)
        else:  # split
            ma, mb, mb2, mc, mc2 = makers
            c, c2 = mc(out), mc2(out)
            bound(ma(a), mb(b), mb2(b), c, c2, c, c2, bptr, dummy, dummy, *tail)
        return out

    def _bind(self, a, b, bias, out):
        """A launch through Triton (``spec``), then the Bound where the cached path applies (not
        while launch hooks are installed, nor in the interpreter: the next call tries again). The
        only pre-hook among these kernels' configs, ``_tma_pre_hook``, sets the descriptors'
        blocks, which the makers copy, so the Bound runs none."""
        fn, grid, args, kw = self.spec(a, b, bias, out)
        bound = _bind(fn, grid, *args, run_pre_hook=False, **kw)
        if bound is not None:
            descs = {"ptr": (), "tma": (0, 1, 2), "split": (0, 1, 2, 3, 4)}[self.kind]
            self.state = (bound, args[PLAN_LEAD[self.kind]:], tuple(_desc_maker(args[i]) for i in descs))
        return out


def make_plan(kind: str, a, b, bias, activation, precision, out) -> _Plan:
    """The plan of a Triton route ("small", "tma_64x128", "tma", "tma_split" or "v1") for these
    operands (``out``: the (M, N) output the checks accepted); its first call launches through
    Triton's dispatch."""
    p = _Plan()
    p.out_dtype = out.dtype
    p.out_shape = (a.shape[0], b.shape[1])
    p.device = a.device
    p.extents = _extents(a, b, bias, out)
    p.state = None
    launch, p.kind, extra = {"small": (tk._pointer_launch, "ptr", ("persistent",)),
                             "v1": (tk._pointer_launch, "ptr", ("tiled",)),
                             "tma": (tk._tma_launch, "tma", ()), "tma_64x128": (tk._tma_launch, "tma", ()),
                             "tma_split": (tk._split_launch, "split", ())}[kind]
    fixed = {"small": dict(fixed=SMALL_TILE), "tma_64x128": dict(fixed=TMA_64x128)}.get(kind, {})
    p.spec = lambda a, b, bias, out: launch(*extra, a, b, out, bias, activation, None, None, precision, None, **fixed)
    return p


def planned(kind: str, a, b, bias, activation, precision, out, allocated: bool):
    """The first call of a Triton route's plan key, after the checks (``out``: the output they
    accepted, or ``allocated``): (result, the plan, or None where no plan applies)."""
    if allocated and out.data_ptr() & 15:  # an allocator without 16-byte aligned blocks: no plan
        return tk.run_pointer("tiled", a, b, out, bias, activation, None, None, precision, None), None
    plan = make_plan(kind, a, b, bias, activation, precision, out)
    return plan(a, b, bias, out), plan  # out passes the overlap test: the checks refused any other


class _Sm90Plan:
    """gemm()'s route to gemm_sm90 for one plan key: the same call contract as _Plan (None when a
    given out meets an input's bytes: the checked path refuses it). The key covers what
    gemm_sm90's checks read (dtypes, shapes, strides, 16-byte alignment, devices): its launch runs
    without them."""

    __slots__ = ("config", "cfg", "pdl", "out_shape", "out_dtype", "device", "extents")

    def __call__(self, a, b, bias, out):
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
            if out.data_ptr() & 15:
                return None  # (the checked path allocates its own)
        elif _meets_inputs(out, self.extents, a, b, None):
            return None
        return _sm90._launch(a, b, out, self.cfg, pdl=self.pdl)


def run_sm90(config: str, a, b, out, policy: GemmPolicy):
    """gemm_sm90 in ``config`` for checked operands: (result, its plan)."""
    res = _sm90.gemm_sm90(a, b, out=out, config=config, pdl=policy.pdl)
    p = _Sm90Plan()
    p.config, p.pdl, p.out_shape, p.out_dtype, p.device = config, policy.pdl, tuple(res.shape), res.dtype, a.device
    p.cfg = SM90_CONFIGS[config]  # (the route takes B with unit-stride rows: trans_b 1, as the table)
    p.extents = _extents(a, b, None, res)
    return res, p


class Tf32Plan:
    """gemm()'s route to gemm_tf32 (B as given) for one plan key: its launch without the checks
    the route made; None when a given out meets a's or b's bytes."""

    __slots__ = ("extents",)

    def __init__(self, a, b, out):
        self.extents = _extents(a, b, None, out)

    def __call__(self, a, b, bias, out):
        if out is not None and _meets_inputs(out, self.extents, a, b, None):
            return None
        return _sm90._tf32_launch(a, b, out)


class TransposedPlan:
    """gemm()'s route for a row-major fp32 B that it transposes first (configs.route's
    transpose_b): the K-major copy, then the plan made for the copy's layout; None when a given
    out meets an input's bytes or the copy is not 16-byte aligned (the checked path then decides)."""

    __slots__ = ("inner", "extents")

    def __init__(self, inner, a, b, bias, out):
        self.inner = inner
        self.extents = _extents(a, b, bias, out)

    def __call__(self, a, b, bias, out):
        if out is not None and _meets_inputs(out, self.extents, a, b, bias):
            return None
        bt = transpose_b(b)
        if bt.data_ptr() & 15:
            return None
        return self.inner(a, bt, bias, out)


def transpose_b(b: torch.Tensor) -> torch.Tensor:
    """The same (K, N) values with unit stride along K (tilewise's transpose: one read and one write)."""
    return _transpose.transpose(b).t()
