"""gemm: ``C = act(scale_a * scale_b * (A @ B) + bias)`` on tensor cores, and ``linear``.

A is (M, K), B is (K, N); fp16 / bf16 (fp32 accumulate), fp32 as TF32 (or IEEE fp32), fp8 e4m3
with per-tensor scales (float32 tensors of one element). The epilogue runs on the fp32
accumulator in registers before the one store: scales, bias (N,), activation (relu, gelu with
erf), the cast to the output dtype; optionally the pre-activation is stored too (``aux``, for
the backward of GELU). ``linear(x, w, b, activation)`` is ``act(x @ w.T + b)`` as an autograd op
whose backward runs on this GEMM too.

The family: this module checks arguments and dispatches; ``configs`` holds every tuning table and
``route``, the pure function that picks the path and tile for a call; ``route`` (the module)
describes calls and keeps the per-layout call plans; ``triton_kernels`` has the Triton kernels
(the versions of ``VARIANTS``) and their launchers; ``sm90`` the CUDA C sm_90a kernels.
Per-call choices: ``configs.GemmPolicy``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...cost import Cost
from .._checks import runs_reference
from .._memory import check_no_overlap
from . import route as _rt
from . import sm90 as _sm90
from . import triton_kernels as tk
from .configs import (DEFAULT_POLICY, FP8, IN_DTYPES, SMALL_TILE, TMA_64x128, GemmPolicy, Operand, Route,
                      default_out_dtype, pad_plan, split_k_for)
from .configs import route as _route

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PRECISIONS = ("tf32", "ieee")


# --------------------------------------------------------------------------- reference and cost


def reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
              activation: str | None = None, out_dtype: torch.dtype | None = None,
              scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None) -> torch.Tensor:
    """float32 PyTorch: reads A, B (and bias) once, writes C once; unfused, it also writes and
    re-reads the M x N product once per epilogue step (bias add, activation, cast)."""
    c = a.float() @ b.float()
    if scale_a is not None:
        c = c * (scale_a.float() * scale_b.float())
    if bias is not None:
        c = c + bias.float()
    if activation == "relu":
        c = torch.relu(c)
    elif activation == "gelu":
        c = torch.nn.functional.gelu(c)
    return c.to(out_dtype or default_out_dtype(a.dtype))


def cost(M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None,
         bias: bool = False) -> Cost:
    """2 M N K FLOPs (the epilogue's M N are not counted); bytes: A, B, bias once, C once."""
    it = dtype.itemsize
    ot = (out_dtype or default_out_dtype(dtype)).itemsize
    return Cost(flops=2 * M * N * K, bytes=it * (M * K + K * N) + ot * M * N + (4 * N if bias else 0))


# --------------------------------------------------------------------------- checks


def _check_kinds(a, b, bias, out_dtype, out, aux) -> None:
    """The arguments' kinds, before routing reads them (a list reached the routers as an
    AttributeError). _check does the rest."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("bias", bias), ("out", out), ("aux", aux)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: '{name}' must be a torch.Tensor or None, got {type(t).__name__}")
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"gemm: 'out_dtype' must be a torch.dtype or None, got {out_dtype!r}")


def _check(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, cpu=False):
    """The arguments' errors, each naming what is wrong; returns the output (out, or a new (M, N))."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"gemm: '{name}' must be 2-D, got shape {tuple(t.shape)} "
                             f"(for batches use tilewise.matmul or flatten leading dimensions)")
        if not t.is_cuda and not tk.INTERPRET and not (cpu and t.device.type == "cpu"):
            raise ValueError(f"gemm: '{name}' is on {t.device}; Triton kernels need CUDA tensors "
                             f"(use tilewise.gemm for CPU tensors)")
        if t.dtype not in IN_DTYPES:
            raise ValueError(f"gemm: '{name}' has dtype {t.dtype}; supported: float16, bfloat16, float32, "
                             f"float8_e4m3fn")
        if t.numel() >= 2**31:
            raise ValueError(f"gemm: '{name}' has {t.numel()} elements; 32-bit offsets allow < 2^31")
    if a.dtype != b.dtype:
        raise ValueError(f"gemm: 'a' is {a.dtype} but 'b' is {b.dtype}; both must have one dtype")
    if a.device != b.device:
        raise ValueError(f"gemm: 'a' is on {a.device} but 'b' is on {b.device}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm: inner dimensions differ: 'a' is {tuple(a.shape)}, 'b' is {tuple(b.shape)}")
    M, K = a.shape
    N = b.shape[1]
    if not isinstance(activation, (str, type(None))) or activation not in tk.ACTIVATIONS:
        raise ValueError(f"gemm: activation {activation!r} is not one of None, 'relu', 'gelu'")
    if precision not in _PRECISIONS:
        raise ValueError(f"gemm: precision {precision!r} is not one of {_PRECISIONS}")
    out_dtype = out_dtype or default_out_dtype(a.dtype)
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"gemm: out_dtype {out_dtype} is not one of float16, bfloat16, float32")
    fp8 = a.dtype == FP8
    if fp8 and (scale_a is None or scale_b is None):
        raise ValueError("gemm: float8_e4m3fn inputs need scale_a and scale_b (float32 tensors of one "
                         "element: the per-tensor dequantization scales); pass torch.ones(1) for none")
    if not fp8 and (scale_a is not None or scale_b is not None):
        raise ValueError("gemm: scale_a / scale_b apply to float8_e4m3fn inputs only")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s is not None and (not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32
                              or s.device != a.device):
            raise ValueError(f"gemm: '{name}' must be a float32 tensor of one element on {a.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (N,) or bias.device != a.device:
            raise ValueError(f"gemm: bias must be a tensor of shape ({N},) on {a.device}")
        if not bias.is_contiguous():
            raise ValueError("gemm: bias must be contiguous")
    if out is None:
        out = torch.empty((M, N), device=a.device, dtype=out_dtype)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N) or out.dtype != out_dtype
          or out.device != a.device):
        raise ValueError(f"gemm: out must be a ({M}, {N}) {out_dtype} tensor on {a.device}")
    else:
        check_no_overlap("gemm", "out", out, a=a, b=b, bias=bias)
    return out


# --------------------------------------------------------------------------- the versions


def _variant(kind):
    def fn(a, b, bias=None, activation=None, out_dtype=None, scale_a=None, scale_b=None,
           precision="tf32", out=None, aux=None):
        out = _check(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out)
        M, N = out.shape
        if aux is not None and (tuple(aux.shape) != (M, N) or not aux.is_contiguous()):
            raise ValueError(f"gemm: aux must be a contiguous ({M}, {N}) tensor")
        if aux is not None:
            check_no_overlap("gemm", "aux", aux, a=a, b=b, bias=bias, out=out)
        if M == 0 or N == 0:
            return out
        if kind == "tma":
            return tk.run_tma(a, b, out, bias, activation, scale_a, scale_b, precision, aux)
        if kind == "tma_64x128":
            return tk.run_tma(a, b, out, bias, activation, scale_a, scale_b, precision, aux, fixed=TMA_64x128)
        if kind == "tma_split":
            return tk.run_tma_split(a, b, out, bias, activation, scale_a, scale_b, precision, aux)
        if kind == "streamk":
            return tk.run_streamk(a, b, out, bias, activation, scale_a, scale_b, precision, aux)
        return tk.run_pointer(kind, a, b, out, bias, activation, scale_a, scale_b, precision, aux)

    return fn


VARIANTS = {"v1_tiled": _variant("tiled"), "v2_persistent": _variant("persistent"),
            "v3_tma_persistent": _variant("tma"), "v3_tma_split": _variant("tma_split"),
            "v4_streamk": _variant("streamk")}
_TMA_FIXED_64x128 = _variant("tma_64x128")  # gemm()'s pick where tma_tile_for says "64x128"


def gemm_splitk(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
                activation: str | None = None, out_dtype: torch.dtype | None = None,
                precision: str = "tf32", out: torch.Tensor | None = None, splits: int | None = None) -> torch.Tensor:
    """``act(a @ b + bias)`` with K split into ``splits`` slices (default ``configs.split_k_for``): one
    kernel writes each slice's fp32 partial product to a workspace (splits x M x N x 4 bytes), a
    second sums the slices in a fixed order (deterministic) and applies bias, activation and the
    output cast. For small outputs with a long K, where one CTA per output tile leaves most SMs
    idle. Same operands as ``gemm`` without fp8 scales or aux."""
    out = _check(a, b, bias, activation, out_dtype, None, None, precision, out)
    M, K = a.shape
    N = b.shape[1]
    if a.dtype == FP8:
        raise ValueError("gemm_splitk: float8 inputs are not supported (use gemm)")
    if M == 0 or N == 0:
        return out
    if K == 0:  # an empty sum: act(bias) or act(0)
        z = torch.zeros((M, N), device=a.device, dtype=torch.float32) + (bias.float() if bias is not None else 0.0)
        z = torch.relu(z) if activation == "relu" else F.gelu(z) if activation == "gelu" else z
        return out.copy_(z)
    S = split_k_for(M, N, K) if splits is None else int(splits)
    if S < 1:
        raise ValueError(f"gemm_splitk: splits must be >= 1, got {splits}")
    return tk.run_splitk(a, b, out, bias, activation, precision, S)


# --------------------------------------------------------------------------- gemm


def gemm(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, activation: str | None = None,
         out_dtype: torch.dtype | None = None, scale_a: torch.Tensor | None = None,
         scale_b: torch.Tensor | None = None, precision: str = "tf32", out: torch.Tensor | None = None,
         aux: torch.Tensor | None = None, variant: str | None = None,
         policy: GemmPolicy | None = None) -> torch.Tensor:
    """``act(scale_a * scale_b * (a @ b) + bias)`` on tensor cores, fp32 accumulate.

    a:          (M, K) CUDA tensor, float16 / bfloat16 / float32 / float8_e4m3fn, any strides; CPU
                tensors run the fp32 PyTorch reference (any variant, precision and policy).
    b:          (K, N), same dtype as a, any strides (``w.t()`` of an (N, K) weight needs no copy).
    bias:       optional (N,) contiguous tensor (any float dtype; added in fp32).
    activation: None, "relu" or "gelu" (exact, erf form, as torch.nn.functional.gelu).
    out_dtype:  float16 / bfloat16 / float32; default a's dtype (bfloat16 for fp8 inputs).
    scale_a, scale_b: float32 one-element tensors, required for fp8 inputs (per-tensor scales),
                rejected otherwise.
    precision:  for float32 inputs: "tf32" (default; tensor cores) or "ieee" (full fp32).
    out:        optional (M, N) tensor of out_dtype to write into (any strides for v1/v2); it may
                not share memory with a, b or bias (refused: tiles would read overwritten inputs).
    aux:        optional contiguous (M, N) tensor receiving the pre-activation values.
    variant:    None: the path and tile ``configs.route`` picks for the call (gemm_tf32 for plain
                fp32 with a row-major B on sm_90, gemm_splitk, the small-problem tile, gemm_sm90,
                padded copies for unaligned rows, the TMA kernels, v1_tiled; the rules and their
                measurements: configs, docs/tuning/gemm.md); or a key of VARIANTS.
    policy:     per-call choices (``configs.GemmPolicy``: call plans, gemm_sm90's dependent launch);
                None for the defaults.
    Returns the (M, N) result of dtype out_dtype.

    With variant None and no aux or scales, the first call of a layout leaves a plan that later
    calls with the same layout and policy run without routing or re-checking (route.py; the
    overlap of a given out with the inputs is still checked each call).
    """
    if runs_reference("gemm", {"a": a, "b": b, "bias": bias, "scale_a": scale_a, "scale_b": scale_b, "out": out,
                               "aux": aux}, interpreter=True):
        return _cpu_gemm(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux, variant)
    if variant is not None:
        _check_kinds(a, b, bias, out_dtype, out, aux)
        if variant not in VARIANTS:
            raise ValueError(f"gemm: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
        return VARIANTS[variant](a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux)
    policy = policy or DEFAULT_POLICY
    key = None
    if policy.plans and aux is None and scale_a is None and scale_b is None and not tk.INTERPRET:
        key = _rt.plan_key(a, b, bias, activation, out_dtype, precision, out, policy)
        if key is not None:
            plan = _rt.PLANS.get(key)
            if plan is not None:
                res = plan(a, b, bias, out)
                if res is not None:
                    return res
            elif a.dim() != 2 or b.dim() != 2 or a.numel() == 0 or b.numel() == 0:
                key = None  # no plan for these: the checks' errors, or the variants' empty handling
    # A plan exists only for a key built from tensors and a dtype that passed these checks once,
    # so the planned path above skips them.
    _check_kinds(a, b, bias, out_dtype, out, aux)
    r = _route(_rt.problem_of(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux))
    return _run(r, key, a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux, policy)


def _cpu_gemm(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux, variant):
    """gemm on CPU tensors: the same checks, then the fp32 reference (the one CPU rule)."""
    _check_kinds(a, b, bias, out_dtype, out, aux)
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"gemm: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    res = _check(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, cpu=True)
    if aux is not None:
        if tuple(aux.shape) != tuple(res.shape) or not aux.is_contiguous():
            raise ValueError(f"gemm: 'aux' must be a contiguous {tuple(res.shape)} tensor, got {tuple(aux.shape)}")
        aux.copy_(reference(a, b, bias, None, aux.dtype, scale_a, scale_b))
    return res.copy_(reference(a, b, bias, activation, res.dtype, scale_a, scale_b))


def _run(r: Route, key, a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux, policy):
    """gemm() along route ``r``, leaving a plan under ``key`` (None: none) where the route has one."""
    if r.kind == "tf32_sm90":  # (the route made gemm_tf32's checks)
        res = _sm90._tf32_launch(a, b, out)
        if key is not None:
            _rt.keep(key, _rt.Tf32Plan(a, b, out))
        return res
    b_given = b
    if r.transpose_b:
        b = _rt.transpose_b(b)  # the same (K, N) values, K-major
        if b.data_ptr() & 15:  # the route assumed an aligned copy
            r = _route(_rt.problem_of(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux))
    if r.kind == "splitk":
        return gemm_splitk(a, b, bias=bias, activation=activation, out_dtype=out_dtype, precision=precision, out=out)
    if r.kind == "padded":
        return _run_padded(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, r.pad, policy)
    if r.kind == "sm90":  # plain products only: no epilogue or precision to check
        res, plan = _rt.run_sm90(r.config, a, b, _check(a, b, None, None, None, None, None, "tf32", out), policy)
    elif key is None:
        if r.kind == "small":
            out = _check(a, b, bias, activation, out_dtype, None, None, precision, out)
            return tk.run_pointer("persistent", a, b, out, bias, activation, None, None, precision, None,
                                  fixed=SMALL_TILE)
        fn = _TMA_FIXED_64x128 if r.kind == "tma_64x128" else VARIANTS[
            {"tma": "v3_tma_persistent", "tma_split": "v3_tma_split", "v1": "v1_tiled"}[r.kind]]
        return fn(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, aux)
    else:
        checked = _check(a, b, bias, activation, out_dtype, None, None, precision, out)
        res, plan = _rt.planned(r.kind, a, b, bias, activation, precision, checked, allocated=out is None)
    if key is not None and plan is not None:
        _rt.keep(key, _rt.TransposedPlan(plan, a, b_given, bias, out) if b is not b_given else plan)
    return res


def _run_padded(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out, pad=None,
                policy: GemmPolicy | None = None):
    """gemm() through zero-padded copies with 16-byte rows (configs, "Unaligned rows: padded
    route"); ``pad``: which of a, b, out to copy (default ``configs.pad_plan``'s)."""
    out = _check(a, b, bias, activation, out_dtype, scale_a, scale_b, precision, out)
    if pad is None:
        pad = pad_plan(Operand.of(a), Operand.of(b), Operand.of(out), out_dtype)
    a_p, b_p, c = _rt.padded_operands(a, b, out, pad)
    gemm(a_p, b_p, bias=bias, activation=activation, out_dtype=out.dtype, scale_a=scale_a, scale_b=scale_b,
         precision=precision, out=c, policy=policy)
    if c is not out:
        out.copy_(c)
    return out


# --------------------------------------------------------------------------- linear (autograd)


def _gelu_grad(pre: torch.Tensor) -> torch.Tensor:
    x = pre.float()
    cdf = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + x * pdf


# torch.library custom ops, so that torch.compile traces through linear (the fake implementations
# give shapes and dtypes) and autograd runs the backward below, itself made of gemm ops.


@torch.library.custom_op("tilewise::gemm_triton", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    return gemm(a, b, bias=bias, activation=activation or None)


@_gemm_op.register_fake
def _(a, b, bias, activation):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=default_out_dtype(a.dtype))


def _act_grad(gy, saved, activation, dtype):
    if activation == "relu":
        return (gy * (saved > 0)).to(dtype)
    if activation == "gelu":
        return (gy.float() * _gelu_grad(saved)).to(dtype)
    return gy.to(dtype)


def _linear_backward(x2, w, bias_dtype, saved, activation, gy, needs, eager=False):
    g = _act_grad(gy, saved, activation, x2.dtype)
    mm = (lambda a, b, bias, act: gemm(a, b)) if eager else _gemm_op
    gx = mm(g, w, None, "") if needs[0] else None  # (M, N) @ (N, K)
    gw = mm(g.t(), x2, None, "") if needs[1] else None  # (N, M) @ (M, K), g.t() by strides
    gb = g.float().sum(0).to(bias_dtype) if bias_dtype is not None and needs[2] else None
    return gx, gw, gb


def _linear_fwd(x2, w, b, activation, need_pre):
    pre = (torch.empty((x2.shape[0], w.shape[0]), device=x2.device, dtype=x2.dtype) if need_pre
           else x2.new_empty((0,)))
    y = gemm(x2, w.t(), bias=b, activation=activation or None, aux=pre if need_pre else None)
    return y, pre


@torch.library.custom_op("tilewise::gemm_triton_linear", mutates_args=())
def _linear_op(x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, activation: str,
               need_pre: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(act(x2 @ w.T + b), pre-activation when need_pre else an empty tensor)."""
    return _linear_fwd(x2, w, b, activation, need_pre)


@_linear_op.register_fake
def _(x2, w, b, activation, need_pre):
    shape = (x2.shape[0], w.shape[0])
    return x2.new_empty(shape), x2.new_empty(shape if need_pre else (0,))


def _linear_setup(ctx, inputs, output):
    x2, w, b, activation, need_pre = inputs
    y, pre = output
    ctx.activation = activation
    ctx.bias_dtype = b.dtype if b is not None else None
    # ReLU's derivative comes from the output; GELU's from the pre-activation the forward stored.
    ctx.save_for_backward(x2, w, y if activation == "relu" else pre)


def _linear_bwd(ctx, gy, _gpre):
    x2, w, saved = ctx.saved_tensors
    if ctx.activation == "gelu" and saved.numel() == 0 and gy.numel() != 0:
        raise RuntimeError("linear: GELU backward needs the pre-activation; call linear() with grad enabled")
    gx, gw, gb = _linear_backward(x2, w, ctx.bias_dtype, saved, ctx.activation, gy, ctx.needs_input_grad[:3],
                                  eager=getattr(ctx, "eager", False))
    return gx, gw, gb, None, None


_linear_op.register_autograd(_linear_bwd, setup_context=_linear_setup)


class _EagerLinear(torch.autograd.Function):
    """``_linear_op`` with its autograd, for eager calls: no custom-op dispatcher (about 20 us a
    call on a fast host, more on the H200's;
    docs/tuning/gemm.md, "Eager linear without the custom-op dispatcher"). Traced code
    (torch.compile) keeps the custom ops."""

    @staticmethod
    def forward(ctx, x2, w, b, activation, need_pre):
        y, pre = _linear_fwd(x2, w, b, activation, need_pre)
        _linear_setup(ctx, (x2, w, b, activation, need_pre), (y, pre))
        ctx.eager = True
        ctx.mark_non_differentiable(pre)
        return y, pre

    @staticmethod
    def backward(ctx, gy, gpre):
        return _linear_bwd(ctx, gy, gpre)


def _check_linear(x, w, b, activation, cpu=False) -> None:
    """linear's arguments by their own names (gemm's checks would call x and w.t() 'a' and 'b')."""
    for name, t in (("x", x), ("w", w), ("b", b)):
        if name == "b" and t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"linear: '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _OUT_DTYPES and not (name == "b" and t.is_floating_point()):
            raise ValueError(f"linear: '{name}' has dtype {t.dtype}; supported: float16, bfloat16, float32 "
                             f"(fp8 is not differentiable here: use gemm() with scales)")
        if t.device != x.device:
            raise ValueError(f"linear: '{name}' is on {t.device} but 'x' is on {x.device}")
    if not x.is_cuda and not tk.INTERPRET and not (cpu and x.device.type == "cpu"):
        raise ValueError(f"linear: 'x' is on {x.device}; Triton kernels need CUDA tensors")
    if w.dtype != x.dtype:
        raise ValueError(f"linear: 'w' has dtype {w.dtype} but 'x' has {x.dtype}")
    if x.dim() < 1 or w.dim() != 2:
        raise ValueError(f"linear: 'x' must be (..., K) and 'w' (N, K); got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: 'x' has K={x.shape[-1]} but 'w' is {tuple(w.shape)} (N, K)")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ValueError(f"linear: 'b' has shape {tuple(b.shape)}; 'w' {tuple(w.shape)} needs ({w.shape[0]},)")
    if b is not None and not b.is_contiguous():
        raise ValueError(f"linear: 'b' is not contiguous (strides {tuple(b.stride())}); pass b.contiguous()")
    if not isinstance(activation, (str, type(None))) or activation not in tk.ACTIVATIONS:
        raise ValueError(f"linear: activation {activation!r} is not one of None, 'relu', 'gelu'")


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, activation: str | None = None,
           *, variant: str | None = None) -> torch.Tensor:
    """``act(x @ w.T + b)`` with bias and activation fused into the GEMM's store; differentiable.

    x: (..., K) CUDA float16 / bfloat16 / float32 (TF32); w: (N, K) same dtype; b: optional (N,).
    CPU tensors run the fp32 PyTorch reference (differentiable by PyTorch).
    activation: None, "relu" or "gelu". The backward (grad x = g @ w, grad w = g.T @ x) runs on
    ``gemm`` as well; GELU stores its pre-activation in the forward for the backward.
    Returns (..., N) of x's dtype.
    """
    cpu = runs_reference("linear", {"x": x, "w": w, "b": b}, interpreter=True)
    _check_linear(x, w, b, activation, cpu=cpu)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if cpu:  # the one CPU rule: the fp32 reference, differentiable by PyTorch
        if variant is not None and variant not in VARIANTS:
            raise ValueError(f"linear: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
        return reference(x2, w.t(), b, activation, x.dtype).reshape(*lead, w.shape[0])
    if variant is not None:  # a named version: plain call, no autograd (for benchmarks and tests)
        y = gemm(x2, w.t(), bias=b, activation=activation, variant=variant)
    else:
        need_pre = activation == "gelu" and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, w, b))
        op = _linear_op if torch.compiler.is_compiling() else _EagerLinear.apply
        y, _ = op(x2, w, b, activation or "", need_pre)
    return y.reshape(*lead, w.shape[0])
