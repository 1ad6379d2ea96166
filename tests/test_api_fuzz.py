"""The public API under bad and odd arguments (issue 29: no obscure errors).

From one valid call of each public function (``tilewise.__all__``), cases are generated
deterministically (seeded) by spoiling one argument at a time: a wrong dtype (int, float64, bool,
complex, another float type), device (meta; on a GPU also the CPU), rank or shape, an empty tensor,
a non-contiguous, zero-stride (``expand``), overlapping (``as_strided``) or misaligned view, NaN or
inf values, a non-tensor (list, None, int, float, string, tuple, NumPy array) or a bad option.

Every call must either return what plain PyTorch returns for the same arguments (``ref``), or
raise ValueError / TypeError whose message names the spoiled argument ('x' in quotes; a longer
name may stand bare), and a tensor's device too when the case moved it. Ops that run on CUDA only
must refuse CPU tensors that way, or name the tensor that is not on CUDA. Any other exception
(AttributeError, IndexError, KeyError, a RuntimeError from deep inside) fails, and so does a result
computed from a meta tensor. On the CPU the Triton ops run in the interpreter (conftest), so they
are compared with the reference there; ``test_public_api_fuzz_on_cuda`` runs the same cases with
CUDA tensors. ``SentimentClassifier`` (a module, not a function) is left to tests/test_classifier.py.
"""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import pytest
import torch
import torch.nn.functional as F

import tilewise as tw

SEED = 29


# --------------------------------------------------------------------------- argument specs


@dataclass
class T:
    """A tensor argument: its valid shape and dtype, and how its values are drawn (``values(g, shape,
    dtype)``; default normal floats). ``index``: it holds integers, so float spoils do not apply."""

    shape: tuple
    dtype: torch.dtype = torch.float32
    values: Callable | None = None
    index: bool = False

    def make(self, g: torch.Generator, shape=None, dtype=None) -> torch.Tensor:
        shape, dtype = tuple(self.shape if shape is None else shape), dtype or self.dtype
        if self.values is not None:
            return self.values(g, shape, dtype)
        return torch.randn(shape, generator=g).to(dtype)


@dataclass
class Op:
    """One public function: its valid arguments (``T`` for tensors, anything else as is), how to call
    it, the PyTorch reference (on CPU copies of the arguments), whether it runs on CUDA only, and
    bad values of its non-tensor arguments."""

    name: str
    fn: Callable  # called as fn(**arguments)
    args: dict  # name -> T, Made or the value itself
    ref: Callable
    cuda_only: bool = False
    options: dict = field(default_factory=dict)  # argument -> [(label, bad value), ...]
    tol: dict = field(default_factory=dict)  # dtype -> (rtol, atol), over the defaults
    fp16_ok: bool = True  # whether float16 / bfloat16 are valid dtypes of its float tensors
    # Where the reference is NaN any value passes: softmax's kernels give a row holding NaN or +inf
    # zeros (or -inf) around the NaN rather than a row of NaN (kernel semantics, left as they are).
    nan_free: bool = False
    # Results the Triton interpreter (CPU) computes too loosely to compare: only their shape and dtype
    # are checked there (its bfloat16 dot in attention is off by orders of magnitude).
    interpreter_loose: tuple = ()


@dataclass
class Made:
    """An argument made on the device by ``make(device)`` (a CSR matrix)."""

    make: Callable


class Ctx(NamedTuple):
    """What a spoiler may use: the case's random source and generator, the device, the argument's spec."""

    rng: random.Random
    gen: torch.Generator
    device: torch.device
    spec: Any


@dataclass
class Case:
    op: Op
    spoiled: str | None  # the argument this case spoils (None: a valid call)
    what: str
    seed: int
    spoil: Callable | None  # (the valid value or None, Ctx) -> the spoiled value
    cast: torch.dtype | None = None  # a valid call in another float dtype

    def __str__(self):
        return f"{self.op.name}({self.spoiled or ''}: {self.what})"

    def build(self, device: torch.device) -> dict:
        g = torch.Generator().manual_seed(self.seed)
        out = {}
        for name, spec in self.op.args.items():
            if isinstance(spec, T):
                out[name] = spec.make(g, dtype=None if spec.index else self.cast).to(device)
            else:
                out[name] = spec.make(device) if isinstance(spec, Made) else spec
        if self.spoiled is not None:  # an option the valid call leaves out is added
            ctx = Ctx(random.Random(self.seed), g, device, self.op.args.get(self.spoiled))
            out[self.spoiled] = self.spoil(out.get(self.spoiled), ctx)
        return out


# --------------------------------------------------------------------------- spoilers


def _fill(t, value, rng):
    t = t.clone()
    if t.numel():
        flat = t.view(-1)
        for i in rng.sample(range(flat.numel()), max(1, flat.numel() // 5)):
            flat[i] = value
    return t


def _as_strided_overlap(t):
    # Every dim walks with stride 1: rows overlap one another.
    n = max(1, sum(s - 1 for s in t.shape) + 1)
    base = t.reshape(-1)[:n].clone() if t.numel() >= n else torch.zeros(n, dtype=t.dtype, device=t.device)
    return base.as_strided(t.shape, (1,) * t.dim())


def _misaligned(t):
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = flat[1:].view(t.shape)
    v.copy_(t)
    return v


def _numpy(t):
    return t.detach().float().cpu().numpy() if t.dtype.is_floating_point else t.detach().cpu().numpy()


def _resized(k: int, size: int):
    def spoil(t, c):
        s = tuple(c.spec.shape)
        return c.spec.make(c.gen, s[:k] + (size(s[k]),) + s[k + 1:]).to(c.device)
    return spoil


def tensor_spoils(spec: T, device: torch.device) -> list[tuple[str, Callable]]:
    """(label, spoil) pairs for a tensor argument."""
    s = tuple(spec.shape)
    out = []
    wrong = ((torch.float32, torch.float64, torch.bool, torch.complex64, torch.int16) if spec.index else
             (torch.int32, torch.int64, torch.bool, torch.float64, torch.complex64))
    out += [(f"dtype {d}", lambda t, c, d=d: t.to(d)) for d in wrong]
    if not spec.index:  # valid for some ops, a mismatch with the other tensors for others
        out += [(f"only this one {d}", lambda t, c, d=d: t.to(d)) for d in (torch.float16, torch.bfloat16)]
    out.append(("device meta", lambda t, c: t.to("meta")))
    if device.type == "cuda":
        out.append(("device cpu", lambda t, c: t.cpu()))
    out += [("rank - 1", lambda t, c: t[0]), ("rank 0", lambda t, c: t.reshape(-1)[0])] if s else []
    out += [("rank + 1", lambda t, c: t.unsqueeze(0)), ("rank + 2", lambda t, c: t.unsqueeze(0).unsqueeze(-1))]
    for k in range(len(s)):
        out += [(f"dim {k} + 1", _resized(k, lambda n: n + 1)), (f"dim {k} = 0", _resized(k, lambda n: 0))]
        out += [(f"dim {k} = 1", _resized(k, lambda n: 1))] if s[k] > 1 else []
    if s:
        out += [("every other column", lambda t, c: torch.stack([t, t], -1).reshape(*s[:-1], 2 * s[-1])[..., ::2]),
                ("zero stride (expand)", lambda t, c: t[..., :1].expand(s)),
                ("overlapping (as_strided)", lambda t, c: _as_strided_overlap(t)),
                ("misaligned start", lambda t, c: _misaligned(t))]
    if len(s) >= 2:
        out += [("transposed view", lambda t, c: t.transpose(-1, -2).contiguous().transpose(-1, -2)),
                ("zero stride rows", lambda t, c: t[:1].expand(s))]
    if not spec.index:
        out += [("NaN", lambda t, c: _fill(t, math.nan, c.rng)), ("+inf", lambda t, c: _fill(t, math.inf, c.rng)),
                ("-inf", lambda t, c: _fill(t, -math.inf, c.rng)),
                ("requires grad", lambda t, c: t.clone().requires_grad_())]
    out += [("list", lambda t, c: t.tolist()), ("NumPy array", lambda t, c: _numpy(t)), ("None", lambda t, c: None),
            ("int", lambda t, c: c.rng.randint(-3, 7)), ("float", lambda t, c: 2.5), ("str", lambda t, c: "x"),
            ("tuple", lambda t, c: (1, 2))]
    return out


# --------------------------------------------------------------------------- the API


def _csr_dense(g, M=6, N=5):
    return torch.randn(M, N, generator=g) * (torch.rand(M, N, generator=g) < 0.5)


def _csr_arrays(seed=3):
    A = _csr_dense(torch.Generator().manual_seed(seed)).to_sparse_csr()
    return A.crow_indices(), A.col_indices(), A.values()


_RP, _COL, _VAL = _csr_arrays()


def _fixed(t):
    return lambda g, shape, dtype: (t if tuple(shape) == tuple(t.shape) else
                                    torch.randint(0, 3, shape, generator=g)).to(dtype)


def _csr_ref(row_ptr, col, val, shape):
    """The dense matrix, duplicates summed; raises where the arrays do not make one."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 1 for t in (row_ptr, col, val)) or val.is_complex():
        raise TypeError("reference: 1-D tensors, real values")
    if row_ptr.is_floating_point() or col.is_floating_point() or torch.bool in (row_ptr.dtype, col.dtype):
        raise TypeError("reference: integer indices")
    M, N = shape
    lengths = row_ptr[1:] - row_ptr[:-1]
    if row_ptr.numel() != M + 1 or row_ptr[0] != 0 or row_ptr[-1] != col.numel() or (lengths < 0).any():
        raise ValueError("reference: row_ptr")
    if col.numel() != val.numel() or ((col < 0) | (col >= N)).any():
        raise ValueError("reference: col")
    rows = torch.repeat_interleave(torch.arange(M), lengths.long())
    return torch.zeros(M, N).index_put_((rows, col.long()), val.float(), accumulate=True)


def _spmv_ref(D, x):
    """A @ x over the nonzeros of D only (a dense product would add 0 * inf = NaN)."""
    if D.dim() != 2 or D.is_complex() or x.dim() != 1 or not x.is_floating_point():
        raise ValueError("reference: a real matrix and a float vector")
    r, c = D.nonzero(as_tuple=True)
    return torch.zeros(D.shape[0], dtype=torch.float64).index_add_(0, r, D[r, c].double() * x.double()[c]).float()


def _ell_dense(E):
    col, val = E.col.cpu().tolist(), E.val.cpu().tolist()
    D = torch.zeros(E.shape, dtype=torch.float64)
    for k in range(len(col)):
        for i, c in enumerate(col[k]):
            if c >= 0:
                D[i, c] += val[k][i]
    return D.float()


def _jds_dense(J):
    perm, lens, jd, col, val = (t.cpu().tolist() for t in (J.perm, J.len_sorted, J.jd_ptr, J.col, J.val))
    D = torch.zeros(J.shape, dtype=torch.float64)
    for s in range(J.shape[0]):
        for k in range(lens[s]):
            D[perm[s], col[jd[k] + s]] += val[jd[k] + s]
    return D.float()


def _masked_mean_ref(x, lengths):
    if not isinstance(lengths, torch.Tensor) or lengths.dtype not in (torch.int32, torch.int64):
        raise TypeError("reference: integer lengths")
    T_ = x.shape[1]
    lens = lengths.long().clamp(0, T_)
    mask = torch.arange(T_)[None, :] < lens[:, None]
    # padding is never read: a NaN or inf there does not reach the mean
    return torch.where(mask[:, :, None], x, 0).sum(1) / lens.clamp(min=1).to(x.dtype)[:, None]


def _gemm_ref(a, b, out_dtype=None):
    if a.dtype != b.dtype or a.dim() != 2 or b.dim() != 2:
        raise TypeError("reference: 2-D operands of one dtype")
    return (a.double() @ b.double()).to(out_dtype or a.dtype)


def _softmax_ref(x, log=False):
    if x.dim() == 0:
        raise ValueError("reference: a row")
    f = torch.log_softmax if log else torch.softmax
    y = f(x.double(), -1)
    if not log:  # a row of only -inf gives zeros (documented), not NaN
        y = torch.where(torch.isneginf(x).all(-1, keepdim=True), torch.zeros_like(y), y)
    return y.to(x.dtype)


def _softmax_backward_ref(y, dy):
    if y.shape != dy.shape or y.dtype != dy.dtype:
        raise ValueError("reference: one shape and dtype")
    y64, g64 = y.double(), dy.double()
    return (y64 * (g64 - (y64 * g64).sum(-1, keepdim=True))).to(y.dtype)


def _ce_ref(logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError("reference: integer targets")  # (F.cross_entropy takes float targets as probabilities)
    return F.cross_entropy(logits.double(), target.long(), reduction=reduction, ignore_index=ignore_index,
                           label_smoothing=label_smoothing).to(logits.dtype)


def _flash_ref(q, k, v, causal=False, scale=None):
    if not (q.dtype == k.dtype == v.dtype) or q.dim() != 4:
        raise ValueError("reference: 4-D tensors of one dtype")
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1).double(), v.repeat_interleave(rep, 1).double()
    # Written out, not CPU SDPA: PyTorch 2.11's CPU kernel dies of SIGFPE on an empty sequence.
    s = q.double() @ kk.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:  # top-left aligned, as SDPA's is_causal
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    return (s.softmax(-1) @ vv).to(q.dtype)


def _offsets(g, shape, dtype):
    """Offsets of sequences packed into 12 rows (0 ... 12, rising) where the shape allows."""
    if len(shape) == 1 and shape[0] >= 2:
        return torch.linspace(0, 12, shape[0]).round().to(dtype)
    return torch.randint(0, 12, shape, generator=g).to(dtype)


def _varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, causal=False, scale=None,
                **kw):
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    parts = [_flash_ref(q[cq[b]:cq[b + 1]].transpose(0, 1)[None], k[ck[b]:ck[b + 1]].transpose(0, 1)[None],
                        v[ck[b]:ck[b + 1]].transpose(0, 1)[None], causal, scale)[0].transpose(0, 1)
             for b in range(len(cq) - 1)]
    return torch.cat(parts)


def _rms_norm_ref(x, weight, eps, mode):
    if x.shape[-1:] != weight.shape or not (x.is_floating_point() and weight.is_floating_point()):
        raise ValueError("reference: (..., N) and (N,) float tensors")
    h = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps)
    if mode == "gemma":
        return (h * (1.0 + weight.double())).to(x.dtype)
    return (weight.double() * h.to(x.dtype).double()).to(torch.promote_types(weight.dtype, x.dtype))


def _rope_qkv_ref(qkv, cos, sin, num_heads, num_kv_heads):
    if qkv.dim() != 3 or qkv.shape[-1] != (num_heads + 2 * num_kv_heads) * 8:
        raise ValueError("reference: (B, S, (heads + 2 kv heads) * 8)")
    nq, nk = num_heads * 8, num_kv_heads * 8
    q, k, v = (qkv[..., a:b].unflatten(-1, (-1, 8)).transpose(1, 2) for a, b in ((0, nq), (nq, nq + nk),
                                                                               (nq + nk, nq + 2 * nk)))
    return (*_rope_ref(q, k, cos, sin), v)


def _add_rms_norm_ref(x, residual, weight, eps=1e-6, mode="llama"):
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError("reference: residual of x's shape and dtype")
    s = x + residual
    return _rms_norm_ref(s, weight, eps, mode), s


def _raise(e):
    raise e


def _rope_ref(q, k, cos, sin):
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.dim() != 3 or q.shape[-1] % 2:
        raise ValueError("reference: (B, H, S, D) q and k, (B or 1, S, D) cos and sin, D even")
    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), -1)
    c, s = cos.double()[:, None], sin.double()[:, None]
    return ((q.double() * c + rot(q.double()) * s).to(q.dtype), (k.double() * c + rot(k.double()) * s).to(k.dtype))


def _embedding_ref(ids, weight, padding_idx=None):
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError("reference: integer ids")
    # ids outside [0, rows) give NaN rows (embedding()'s documented contract), not an error
    rows = weight.shape[0]
    ok = (ids >= 0) & (ids < rows)
    out = weight[torch.where(ok, ids, 0).long()] if rows else weight.new_empty((*ids.shape, weight.shape[1]))
    return torch.where(ok[..., None], out, math.nan)


def _reduce_ref(x, dim, op="sum", keepdim=False, out=None):
    if out is not None or not x.is_floating_point():
        raise TypeError("reference: a float tensor, no out")
    f = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}[op]
    return f(x.double(), dim, keepdim=keepdim).to(x.dtype)


def _numbers_as_tensors(a, b):
    """The binary ops take a Python number for one operand, as a 0-d tensor of the other's dtype."""
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    if num(a) and isinstance(b, torch.Tensor):
        a = torch.tensor(float(a), dtype=b.dtype)
    if num(b) and isinstance(a, torch.Tensor):
        b = torch.tensor(float(b), dtype=a.dtype)
    return a, b


def _no_out(f):
    def ref(*args, out=None, **kw):
        if out is not None:
            raise TypeError("reference: out is checked by the op alone")
        return f(*args, **kw)
    return ref


def _fused_relu_mul(x0, x1):
    return tw.relu(x0) * x1


_FUSED = None


def _fused():
    global _FUSED
    if _FUSED is None:
        _FUSED = tw.fuse(_fused_relu_mul)
    return _FUSED


_BAD_VARIANT = [("variant 'bogus'", "bogus"), ("variant 3", 3)]
_GEMM_TOL = {torch.float32: (3e-2, 3e-2)}  # TF32 tensor cores


def _ints(high):
    return lambda g, shape, dtype: torch.randint(0, high, shape, generator=g).to(dtype)


def _positive(g, shape, dtype):
    return (torch.rand(shape, generator=g) + 0.5).to(dtype)


def _probabilities(g, shape, dtype):
    return torch.softmax(torch.randn(shape, generator=g), -1).to(dtype)


def _sparse(g, shape, dtype):
    return _csr_dense(g, *shape).to(dtype)


def _made_csr(seed):
    return Made(lambda device: tw.CSR.from_dense(_csr_dense(torch.Generator().manual_seed(seed)).to(device)))


def _linear_ref(x, w, b=None, **kw):
    return (x.double() @ w.double().t() + (0 if b is None else b.double())).to(x.dtype)


def _lce_ref(x, weight, target, bias=None, reduction="mean", ignore_index=-100, label_smoothing=0.0, **kw):
    if weight.dtype != x.dtype:
        raise TypeError("reference: one dtype")
    logits = x.double() @ weight.double().t() + (0 if bias is None else bias.double())
    return F.cross_entropy(logits, target.long(), reduction=reduction, ignore_index=ignore_index,
                           label_smoothing=label_smoothing).float()


def _sigmoid3_ref(x, **kw):
    return torch.sigmoid(torch.sigmoid(torch.sigmoid(x.double()))).to(x.dtype)


def _out(*bad):
    return [("out list", [0.0]), *(("out of another shape", t) for t in bad)]


def public_ops() -> list[Op]:
    """One valid call of every public function, with its reference and its bad options."""
    unary = {"relu": torch.relu, "gelu": F.gelu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
             "exp": torch.exp, "log": torch.log, "sin": torch.sin, "cos": torch.cos, "neg": torch.neg}
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
              "maximum": torch.maximum, "pow": torch.pow}
    ops = [Op("vector_add", tw.vector_add, {"a": T((5, 7)), "b": T((5, 7))}, lambda a, b, **kw: torch.add(a, b),
              options={"variant": _BAD_VARIANT, "out": _out(torch.zeros(2))})]
    for name, f in unary.items():
        x = T((4, 6), values=_positive if name == "log" else None)
        # in float64: PyTorch's float32 CPU gelu gives NaN at +inf (its vectorized erf)
        ops.append(Op(name, getattr(tw, name), {"x": x}, lambda x, f=f: f(x.double()).to(x.dtype)))
    for name, f in binary.items():
        a = T((4, 6), values=_positive if name == "pow" else None)
        ops.append(Op(name, getattr(tw, name), {"a": a, "b": T((6,))},
                      lambda a, b, f=f: f(*_numbers_as_tensors(a, b))))
    ops += [
        Op("reduce", tw.reduce, {"x": T((4, 6)), "dim": 1, "op": "sum"}, _reduce_ref,
           options={"dim": [("dim 2", 2), ("dim -3", -3), ("dim '1'", "1"), ("dim 1.0", 1.0), ("dim None", None),
                            ("dim True", True)],
                    "op": [("op 'prod'", "prod"), ("op None", None), ("op 3", 3)], "variant": _BAD_VARIANT,
                    "keepdim": [("keepdim 'yes'", "yes")], "out": _out()}),
        *(Op(name, getattr(tw, name), {"x": T((4, 6)), "dim": 1},
             lambda x, dim, keepdim=False, f=f: f(x.double(), dim, keepdim=keepdim).to(x.dtype),
             options={"dim": [("dim 2", 2), ("dim '1'", "1"), ("dim None", None)],
                      "keepdim": [("keepdim 'yes'", "yes")]})
          for name, f in (("sum", torch.sum), ("amax", torch.amax), ("mean", torch.mean))),
        Op("masked_mean", tw.masked_mean, {"x": T((2, 5, 3)), "lengths": T((2,), torch.int64, _ints(6), index=True)},
           _masked_mean_ref),
        Op("transpose", tw.transpose, {"x": T((5, 7))}, _no_out(lambda x: x.transpose(-1, -2).contiguous()),
           options={"variant": _BAD_VARIANT, "out": _out(torch.zeros(35))}),
        Op("matmul", tw.matmul, {"a": T((4, 6)), "b": T((6, 5))},
           _no_out(lambda a, b: (a.double() @ b.double()).float()), fp16_ok=False,
           options={"variant": _BAD_VARIANT, "out": _out(torch.zeros(5, 4))}),
        Op("gemm", tw.gemm, {"a": T((8, 16)), "b": T((16, 8))}, _gemm_ref, tol=_GEMM_TOL,
           options={"bias": [("bias list", [0.0] * 8), ("bias of another length", torch.zeros(3)), ("bias 'x'", "x")],
                    "activation": [("activation 'tanh'", "tanh"), ("activation 1", 1), ("activation list", [])],
                    "out_dtype": [("out_dtype int32", torch.int32), ("out_dtype 'float32'", "float32")],
                    "precision": [("precision 'fp64'", "fp64")], "variant": _BAD_VARIANT,
                    "out": _out(torch.zeros(3, 3))}),
        Op("linear", tw.linear, {"x": T((3, 16)), "w": T((8, 16)), "b": T((8,))}, _linear_ref, tol=_GEMM_TOL,
           options={"activation": [("activation 'tanh'", "tanh"), ("activation 1", 1), ("activation list", [])],
                    "variant": _BAD_VARIANT}),
        Op("softmax", tw.softmax, {"x": T((4, 10))}, lambda x, **kw: _softmax_ref(x),
           options={"variant": _BAD_VARIANT}, nan_free=True),
        Op("log_softmax", tw.log_softmax, {"x": T((4, 10))}, lambda x, **kw: _softmax_ref(x, log=True),
           options={"variant": _BAD_VARIANT}, nan_free=True),
        Op("softmax_backward", tw.softmax_backward, {"y": T((4, 10), values=_probabilities), "dy": T((4, 10))},
           lambda y, dy, **kw: _softmax_backward_ref(y, dy),
           options={"variant": _BAD_VARIANT, "log": [("log 'yes'", "yes")]}),
        Op("cross_entropy", tw.cross_entropy, {"logits": T((4, 10)), "target": T((4,), torch.int64, _ints(10), True)},
           _ce_ref,
           options={"reduction": [("reduction 'avg'", "avg"), ("reduction None", None)],
                    "label_smoothing": [("label_smoothing 2", 2.0), ("label_smoothing 'x'", "x"),
                                        ("label_smoothing NaN", math.nan)],
                    "ignore_index": [("ignore_index 'x'", "x"), ("ignore_index 1.5", 1.5)],
                    "variant": _BAD_VARIANT}),
        Op("linear_cross_entropy", tw.linear_cross_entropy,
           {"x": T((6, 16)), "weight": T((10, 16)), "target": T((6,), torch.int64, _ints(10), True)},
           _lce_ref, tol=_GEMM_TOL,
           options={"reduction": [("reduction 'none'", "none"), ("reduction None", None)],
                    "label_smoothing": [("label_smoothing 2", 2.0), ("label_smoothing 'x'", "x")],
                    "ignore_index": [("ignore_index 'x'", "x"), ("ignore_index 1.5", 1.5)],
                    "chunk_rows": [("chunk_rows 0", 0), ("chunk_rows 'x'", "x"), ("chunk_rows 2.5", 2.5)],
                    "bias": [("bias of another length", torch.zeros(3)), ("bias list", [0.0])]}),
        Op("sigmoid3", tw.sigmoid3, {"x": T((5, 7))}, _sigmoid3_ref, options={"recompute": [("recompute 'no'", "no")]}),
        Op("flash_attention", tw.flash_attention, {n: T((1, 2, 8, 16)) for n in "qkv"},
           lambda q, k, v, causal=False, scale=None, **kw: _flash_ref(q, k, v, causal, scale), tol=_GEMM_TOL,
           interpreter_loose=(torch.bfloat16,),
           options={"mask": [("mask float", torch.ones(8, 8)), ("mask list", [[True]]),
                             ("mask of another shape", torch.ones(3, 3, dtype=torch.bool))],
                    "bias": [("bias int", torch.zeros(8, 8, dtype=torch.int32)), ("bias list", [0.0])],
                    "scale": [("scale 'x'", "x"), ("scale NaN", math.nan), ("scale inf", math.inf)],
                    "deterministic": [("deterministic 1", 1)],
                    "window": [("window (1,)", (1,)), ("window (-1, 2)", (-1, 2)), ("window 'x'", "x"),
                               ("window (1.5, 0)", (1.5, 0))],
                    "align": [("align 'lower_right'", "lower_right"), ("align None", None)],
                    "softcap": [("softcap 0", 0.0), ("softcap -1", -1.0), ("softcap NaN", math.nan),
                                ("softcap 'x'", "x")],
                    "alibi_slopes": [("alibi_slopes of 3 heads", torch.ones(3)), ("alibi_slopes list", [1.0, 1.0]),
                                     ("alibi_slopes int", torch.ones(2, dtype=torch.int64))]}),
        Op("flash_attention_varlen", tw.flash_attention_varlen,
           {"q": T((12, 2, 16)), "k": T((12, 2, 16)), "v": T((12, 2, 16)),
            "cu_seqlens_q": T((3,), torch.int32, _offsets, True), "cu_seqlens_k": T((3,), torch.int32, _offsets, True),
            "max_seqlen_q": 6, "max_seqlen_k": 6},
           _varlen_ref, tol=_GEMM_TOL, interpreter_loose=(torch.bfloat16,),
           options={"max_seqlen_q": [("max_seqlen_q 2", 2), ("max_seqlen_q -1", -1), ("max_seqlen_q 'x'", "x")],
                    "window": [("window (1,)", (1,))], "softcap": [("softcap 0", 0.0)],
                    "alibi_slopes": [("alibi_slopes of 3 heads", torch.ones(3))]}),
        Op("rms_norm", tw.rms_norm, {"x": T((4, 3, 10)), "weight": T((10,))},
           lambda x, weight, eps=1e-6, mode="llama": _rms_norm_ref(x, weight, eps, mode),
           tol={torch.float32: (1e-2, 1e-2)},  # a 16-bit x: the fp32 result carries the row's 16-bit rounding
           options={"eps": [("eps -1", -1.0), ("eps NaN", math.nan), ("eps 'x'", "x")],
                    "mode": [("mode 'rms'", "rms"), ("mode None", None)]}),
        Op("add_rms_norm", tw.add_rms_norm, {"x": T((4, 3, 10)), "residual": T((4, 3, 10)), "weight": T((10,))},
           _add_rms_norm_ref, tol={torch.float32: (1e-2, 1e-2)},
           options={"eps": [("eps -1", -1.0), ("eps NaN", math.nan)], "mode": [("mode 'rms'", "rms")]}),
        Op("apply_rotary_qkv", tw.apply_rotary_qkv, {"qkv": T((2, 5, 64)), "cos": T((1, 5, 8)), "sin": T((1, 5, 8)),
                                                      "num_heads": 4, "num_kv_heads": 2}, _rope_qkv_ref,
           options={"num_heads": [("num_heads 0", 0), ("num_heads 'x'", "x"), ("num_heads 3", 3)],
                    "num_kv_heads": [("num_kv_heads -1", -1), ("num_kv_heads 1.5", 1.5)]}),
        Op("apply_rotary", tw.apply_rotary, {"q": T((2, 4, 5, 8)), "k": T((2, 2, 5, 8)), "cos": T((1, 5, 8)),
                                              "sin": T((1, 5, 8))}, _rope_ref),
        Op("swiglu", tw.swiglu, {"gate": T((4, 10)), "up": T((4, 10))},
           lambda gate, up: (F.silu(gate.double()) * up.double()).to(gate.dtype) if gate.dtype == up.dtype
           else _raise(TypeError("reference: one dtype"))),
        Op("swiglu_packed", tw.swiglu_packed, {"gate_up": T((4, 10))},
           lambda gate_up: (F.silu(gate_up.double()[..., :5]) * gate_up.double()[..., 5:]).to(gate_up.dtype)),
        Op("embedding", tw.embedding, {"ids": T((3, 4), torch.int64, _ints(10), index=True), "weight": T((10, 8))},
           lambda ids, weight, **kw: _embedding_ref(ids, weight),
           options={"padding_idx": [("padding_idx 10", 10), ("padding_idx -11", -11), ("padding_idx 'x'", "x"),
                                    ("padding_idx 1.5", 1.5)], "variant": _BAD_VARIANT}),
        Op("fuse", lambda x0, x1: _fused()(x0, x1), {"x0": T((4, 6)), "x1": T((6,))},
           lambda x0, x1: torch.relu(x0) * x1),
        Op("spmv", tw.spmv, {"A": T((6, 5), values=_sparse), "x": T((5,))}, lambda A, x, **kw: _spmv_ref(A, x),
           fp16_ok=False,
           options={"alpha": [("alpha 'x'", "x")], "beta": [("beta 1 without y", 1.0)], "variant": _BAD_VARIANT,
                    "y": [("y list", [0.0]), ("y of another length", torch.zeros(3))]}),
        Op("spmv(CSR)", tw.spmv, {"A": _made_csr(5), "x": T((5,))}, lambda A, x, **kw: _spmv_ref(A.to_dense(), x),
           fp16_ok=False),
    ]
    arrays = {"row_ptr": T(tuple(_RP.shape), _RP.dtype, _fixed(_RP), index=True),
              "col": T(tuple(_COL.shape), _COL.dtype, _fixed(_COL), index=True),
              "val": T(tuple(_VAL.shape), values=_fixed(_VAL)), "shape": (6, 5)}
    bad_shapes = [("shape (5, 5)", (5, 5)), ("shape (6,)", (6,)), ("shape 'x'", "x"), ("shape None", None),
                  ("shape (-1, 5)", (-1, 5)), ("shape (6, 2)", (6, 2))]
    for name, build in (("CSR.from_arrays", tw.CSR.from_arrays), ("CSR", tw.CSR)):  # the second: issue 29
        ops.append(Op(name, lambda row_ptr, col, val, shape, _b=build: _b(row_ptr, col, val, shape).to_dense(),
                      arrays, _csr_ref, fp16_ok=False, options={"shape": bad_shapes}))
    ops += [Op("ELL.from_csr", lambda A: _ell_dense(tw.ELL.from_csr(A)), {"A": _made_csr(7)}, lambda A: A.to_dense()),
            Op("JDS.from_csr", lambda A: _jds_dense(tw.JDS.from_csr(A)), {"A": _made_csr(7)}, lambda A: A.to_dense()),
            Op("Panels.from_csr", lambda A: tw.Panels.from_csr(A, rows=4, cluster=1).nnz, {"A": _made_csr(7)},
               lambda A: A.nnz)]
    return ops


_NOT_A_CSR = [("dense tensor", lambda v, c: torch.ones(6, 5, device=c.device)), ("list", lambda v, c: [[1.0]]),
              ("None", lambda v, c: None), ("str", lambda v, c: "A")]


def cases(device: torch.device) -> list[Case]:
    """Every case, in a fixed order; each has its own seed, so a case builds the same on any run."""
    rng = random.Random(SEED)
    out: list[Case] = []

    def add(op, spoiled, what, spoil, cast=None):
        out.append(Case(op, spoiled, what, rng.randrange(2**31), spoil, cast))

    for op in public_ops():
        add(op, None, "valid", None)
        if op.fp16_ok and any(isinstance(s, T) and not s.index for s in op.args.values()):
            for d in (torch.float16, torch.bfloat16):
                add(op, None, f"valid {d}", None, cast=d)
        for name, spec in op.args.items():
            if isinstance(spec, T):
                for what, spoil in tensor_spoils(spec, device):
                    add(op, name, what, spoil)
            elif isinstance(spec, Made):
                for what, spoil in _NOT_A_CSR:
                    add(op, name, what, spoil)
        for name, bad in op.options.items():
            for what, value in bad:
                if isinstance(value, torch.Tensor):
                    add(op, name, what, lambda v, c, value=value: value.to(c.device))
                else:
                    add(op, name, what, lambda v, c, value=value: value)
    return out


# --------------------------------------------------------------------------- the judge


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _tensors(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)


def _names(msg: str, name: str) -> bool:
    """Whether an error message names argument ``name``: in quotes or backticks; a name of three
    characters or more may also stand bare (one- and two-letter names are words of the prose)."""
    if f"'{name}'" in msg or f"`{name}`" in msg or f'"{name}"' in msg:
        return True
    return len(name) >= 3 and re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", msg) is not None


def _to_cpu(v):
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, tw.CSR):
        return tw.CSR(v.row_ptr.cpu(), v.col.cpu(), v.val.cpu(), v.shape, v.stats)
    return v


def _tolerance(op: Op, dtype: torch.dtype) -> tuple[float, float]:
    base = {torch.float64: (1e-7, 1e-9), torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-2),
            torch.bfloat16: (3e-2, 3e-2)}.get(dtype, (0, 0))
    return op.tol.get(dtype, base)


def judge(case: Case, device: torch.device) -> str | None:
    """None when the call behaved, else what went wrong."""
    op = case.op
    try:
        args = case.build(device)
    except Exception as e:  # the generator itself: a bug in this file, not in tilewise
        return f"could not build the case: {type(e).__name__}: {e}"
    try:
        got = op.fn(**args)
    except (ValueError, TypeError) as e:
        msg = str(e)
        if op.cuda_only and device.type != "cuda" and "cuda" in msg.lower() and any(_names(msg, n) for n in op.args):
            return None  # refused for the device, naming the tensor that is not on CUDA
        if case.spoiled is None or not _names(msg, case.spoiled):
            return f"{type(e).__name__} that does not name {case.spoiled!r}: {msg}"
        moved = case.what.removeprefix("device ") if case.what.startswith("device ") else None
        if moved is not None and moved not in msg:
            return f"{type(e).__name__} that does not name the device {moved!r}: {msg}"
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    if op.cuda_only and device.type != "cuda":
        return "ran on a CPU tensor, but the op runs on CUDA only"
    if any(t.device.type == "meta" for t in _tensors(args)):
        return "returned a result for a meta tensor"
    cpu_args = {k: _to_cpu(v) for k, v in args.items()}
    try:
        want = op.ref(**cpu_args)
    except Exception as e:
        return f"returned a result where the reference raises {type(e).__name__}: {e}"
    if isinstance(want, tuple) and all(isinstance(w, torch.Tensor) for w in want):  # several outputs
        if not isinstance(got, tuple) or len(got) != len(want):
            return f"returned {type(got).__name__}, not {len(want)} tensors"
        for i, (g, w) in enumerate(zip(got, want)):
            why = _compare(op, g, w, device)
            if why is not None:
                return f"output {i}: {why}"
        return None
    if not isinstance(want, torch.Tensor):
        return None if got == want else f"returned {got!r}, the reference {want!r}"
    return _compare(op, got, want, device)


def _compare(op: Op, got, want: torch.Tensor, device: torch.device) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, not a tensor"
    got = got.detach().cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"returned {tuple(got.shape)} {got.dtype}; the reference {tuple(want.shape)} {want.dtype}"
    if device.type == "cpu" and got.dtype in op.interpreter_loose:
        return None
    if op.nan_free:
        got = torch.where(want.isnan(), want, got)
    rtol, atol = _tolerance(op, got.dtype)
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as e:
        return f"differs from the reference: {str(e).splitlines()[0:4]}"
    return None


def run_fuzz(device: torch.device, op: str | None = None) -> None:
    """Every case (of the public function ``op`` alone, if given) on ``device``."""
    all_cases = [c for c in cases(device) if op is None or _function(c) == op]
    assert all_cases, f"no cases for {op!r}"
    t0 = time.perf_counter()
    failures = [f"{c}: {why}" for c in all_cases if (why := judge(c, device)) is not None]
    print(f"{len(all_cases)} cases on {device.type} in {time.perf_counter() - t0:.1f} s")
    assert not failures, f"{len(failures)} of {len(all_cases)} cases failed:\n" + "\n".join(failures[:60])


# --------------------------------------------------------------------------- tests


def _function(case: Case) -> str:
    return case.op.name.split("(")[0].split(".")[0]


# One GPU test a public function: xdist spreads them, and a crash (a fatal signal) loses one function's cases.
FUNCTIONS = sorted({_function(c) for c in cases(torch.device("cpu"))})


def test_the_fuzz_covers_every_public_function():
    names = set(FUNCTIONS)
    # Cost and AttentionPolicy are settings and results (dataclasses), not functions taking tensors; AdamW is a
    # torch.optim.Optimizer, its argument checks in tests/test_optim.py.
    public = {n for n in tw.__all__
              if n not in ("Cost", "AttentionPolicy", "__version__", "SentimentClassifier", "AdamW")}
    assert public <= names, sorted(public - names)


def test_cases_are_generated_deterministically():
    a, b = cases(torch.device("cpu")), cases(torch.device("cpu"))
    assert [(str(c), c.seed) for c in a] == [(str(c), c.seed) for c in b]
    assert len(a) >= 1000
    one = next(c for c in a if c.spoiled == "x" and c.what == "NaN")
    assert torch.equal(one.build(torch.device("cpu"))["x"].isnan(), one.build(torch.device("cpu"))["x"].isnan())


def test_public_api_fuzz_on_cpu():
    run_fuzz(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("function", FUNCTIONS)
def test_public_api_fuzz_on_cuda(function):
    run_fuzz(torch.device("cuda"), function)
