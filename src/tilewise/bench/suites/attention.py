"""attention (FlashAttention-2, Triton) beside SDPA's flash, cuDNN and efficient backends and
compiled FlexAttention: forward, forward + backward, causal and not, with and without a bias.

Rows (op / variant): ``attention_fwd`` and ``attention_fwd_bwd`` (and ``attention_bias_*`` with a
(1, H, S, S) additive bias, whose gradient is taken in the backward rows):
    sdpa_flash, sdpa_cudnn, sdpa_efficient, flex_attention (torch.compile'd): the baselines;
    flash_attention (ours as a caller gets it: the forward by ``configs.WS_FWD_RULES`` (v5 or v3 /
    v4), the backward by ``configs.WS_BWD_RULES`` (v6 or v3's two kernels); the issue's targets are read
    from this row); v3_flash2 (the Triton forward: v3, or v4's TMA kernel with a bias; v3's
    backward), v5_flash2_ws (the warp-specialized Gluon forward, sm_90, D 64 / 128; v3's backward),
    v4_flash2_tma (v3 with TMA loads in the forward; v3's backward; no-bias rows only),
    v3_flash2_atomic (the default forward and, with ``deterministic=False``, the fused backward
    with atomic dQ; forward + backward rows only), v6_flash2_ws_bwd (v5's forward, v6's backward:
    dK / dV and dQ kernels warp-specialized in Gluon; no-bias forward + backward rows, D 64 / 128).
    Each of ours names as its baseline the fastest baseline this run measured at its shape
    (``best_baseline``: the best the user already has, usually cuDNN; older rows named sdpa_flash,
    docs/tuning/attention.md, "Bench rows"). Older rows of the CSV that this suite no
    longer writes, or that timed another backward under the same name: docs/tuning/attention.md,
    "Bench rows".
Quick run: B=4, H=16, S=4096, D=128. Full run: the issue's grid, S in {1024, 2048, 4096, 8192,
16384} x D in {64, 128} x causal or not x (H, Hkv) in {(16, 16), (32, 8)}, forward and forward +
backward, at a fixed B * S = 16384 tokens (B = 16 ... 1), so each shape costs about the same memory.
The grouped-query rows (32 query heads on 8 K/V heads, as Llama-3's) name Hkv in their shape and
pass ``enable_gqa`` to SDPA and FlexAttention. Bias rows go up to S = 8192 at H = 16 only
(non-causal: SDPA takes no bias with is_causal). The full run also sweeps, at S = 4096 and H = 16, the
forward block sizes of v3/v4 (variants ``v3_flash2[BM,BN,w,s]``), the dK/dV and dQ tiles of the
deterministic backward (``v3_flash2[dkdv=...]``) and the atomic backward's tiles
(``v3_flash2_atomic[atomic=...]``). ``TILEWISE_BENCH_ATTENTION_SHAPES="4096x64,8192x128x32x8"``
(S x D at H 16, or S x D x H x Hkv) times those shapes instead (without the S = 4096 sweeps in quick runs).
``TILEWISE_BENCH_ATTENTION_DTYPES="bfloat16,float16"`` adds fp16 rows (default bf16 only);
``TILEWISE_BENCH_ATTENTION_LEAN=1`` times only issue 30's grid rows: sdpa_cudnn, flex_attention (forward only
in quick runs, as always) and flash_attention, forward and forward + backward, no bias, window, varlen or host
rows (``scripts/attention-grid``); a shape's versions by turns in balanced orders (``harness.time_ms_rounds``),
where the full run times them one after another.
Full and quick runs (not lean) end with the window, varlen and host rows; the host rows
(``attention_host_fwd_bwd``: the host's time a small eager forward + backward; ``attention_graph_fwd_bwd``:
its device time from a CUDA graph) are issue 30's host-time target (``_host_rows``).
Every version is checked first: its output (and dQ, dK, dV, dBias) on batch 0, heads 0-1 against
the fp32 reference. Inputs are far larger than L2 (16384 x 16 x 128 bf16 = 64 MiB per tensor).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from ... import settings
from ...cost import Cost
from ...ops.attention import api as op
from ...ops.attention import configs as op_configs
from ..harness import CheckError, check, time_ms, time_ms_rounds

# Backward candidates (full run, S = 4096, no bias): one kernel's tile changed at a time.
_BWD_SWEEP = [("dkdv", (64, 64, 8, 2)), ("dkdv", (64, 128, 8, 2)), ("dkdv", (32, 64, 4, 2)), ("dkdv", (32, 128, 8, 3)),
              ("dq", (128, 32, 8, 2)), ("dq", (64, 64, 4, 2)), ("dq", (128, 64, 8, 3)), ("dq", (64, 128, 8, 2))]
# Atomic backward candidates (full run, S = 4096, no bias): "atomic" = pointer atomics for dQ,
# "atomic_tma" = TMA reduce-add (D = 128 only).
_ATOMIC_SWEEP = [("atomic", (64, 64, 8, 2)), ("atomic", (64, 128, 8, 2)), ("atomic", (32, 128, 8, 2)),
                 ("atomic", (16, 128, 8, 1)), ("atomic", (32, 128, 8, 1)), ("atomic_tma", (16, 128, 8, 2)),
                 ("atomic_tma", (32, 128, 8, 2))]
_FWD_SWEEP = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3),
              (128, 32, 4, 4), (64, 128, 4, 3)]


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def fn(q, k, v, causal, bias):
        with sdpa_kernel(backend):
            if bias is not None and causal:
                raise RuntimeError("SDPA takes attn_mask or is_causal, not both")
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal,
                                                  enable_gqa=k.shape[1] != q.shape[1])
    return fn


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def fn(q, k, v, causal, bias):
        if bias is not None:
            raise RuntimeError("bias rows: not benchmarked for FlexAttention")
        bm = None
        if causal:
            key = (q.shape[2], k.shape[2])
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[2], k.shape[2],
                                               device=q.device)
            bm = masks[key]
        return compiled(q, k, v, block_mask=bm, enable_gqa=k.shape[1] != q.shape[1])
    fn._compiled = compiled  # the window rows pass their own block mask
    return fn


def _variant(fn, **changes):
    """One of ``attention.VARIANTS`` (or ``flash_attention``) as the (q, k, v, causal, bias) callable
    the rows time, under the call's default policy with ``changes`` (e.g. the backward the row
    times: "two_kernel" v3's kernels, "ws" v6's; none: ``flash_attention``'s default). The policy
    is built once per input layout, outside the timed calls."""
    policies = {}

    def f(q, k, v, causal, bias):
        key = (q.shape, k.shape, causal, None if bias is None else (bias.shape, bias.requires_grad))
        policy = policies.get(key)
        if policy is None:
            policy = policies[key] = op.default_policy(q, k, causal=causal, bias=bias).replace(**changes)
        return fn(q, k, v, causal=causal, bias=bias, policy=policy)
    f.fn, f.changes = fn, changes
    return f


_V3_BWD = dict(backward="two_kernel")
_ours = _variant(op.v3_flash2, **_V3_BWD)  # the Triton forward (v4's TMA kernel for a bias, where it applies)
_ours_ws = _variant(op.v5_flash2_ws, **_V3_BWD)  # v5, the warp-specialized Gluon forward, where it applies
_ours_v6 = _variant(op.v5_flash2_ws, backward="ws")  # v5's forward, v6's backward (where they apply)
_ours_default = _variant(op.flash_attention)  # what a caller gets: v5 / v3 and v6 / v3 by the rules
_ours_atomic = _variant(op.v3_flash2_atomic)  # the default forward, the atomic backward
_ours_tma = _variant(op.v4_flash2_tma, **_V3_BWD)


def _swept(fn, tiles: dict, **changes):
    """``fn`` (a ``_variant``) with the tiles of ``tiles`` (kernel kind -> tile) and ``changes``."""
    return _variant(fn.fn, **{**fn.changes, **changes}, tiles=tiles)


def _sweeps(D, backward):
    """(row name, version) of the full run's tile sweeps at S = 4096: the forward's tiles of v3 and v4,
    or the deterministic backward's and the atomic backward's."""
    if not backward:
        return [(f"{vname}[{','.join(map(str, cfg))}]", _swept(fn, {"fwd": cfg}))
                for cfg in _FWD_SWEEP for vname, fn in (("v3_flash2", _ours), ("v4_flash2_tma", _ours_tma))]
    out = [(f"v3_flash2[{kind}={','.join(map(str, cfg))}]", _swept(_ours, {kind: cfg})) for kind, cfg in _BWD_SWEEP]
    return out + [(f"v3_flash2_atomic[{kind}={','.join(map(str, cfg))}]",
                   _swept(_ours_atomic, {kind: cfg}, dq_tma=kind == "atomic_tma"))
                  for kind, cfg in _ATOMIC_SWEEP if kind != "atomic_tma" or D in op_configs.ATOMIC_TMA]


def check_heads(H: int, Hkv: int) -> tuple[int, int]:
    """(query heads, K/V heads) the check's reference takes from the front: two query heads, or one
    whole group of grouped-query attention, so that the K/V gradients it computes are complete."""
    group = H // Hkv
    nq = 2 if group == 1 else group
    return nq, nq // group


def _check_version(name, fn, q, k, v, bias, causal, go, backward):
    """fp32 reference on the first query heads (attention is independent per (b, h); with grouped
    K/V heads, the first group: ``check_heads``); batch 0 only, except with a bias, whose gradient
    sums over the batch. The backward is ``fn``'s (its policy's)."""
    nq, nkv = check_heads(q.shape[1], k.shape[1])
    batch = slice(None) if bias is not None else slice(0, 1)
    sl, sl_kv = (batch, slice(0, nq)), (batch, slice(0, nkv))
    qs = q[sl].detach().float().requires_grad_(backward)
    ks, vs = (t[sl_kv].detach().float().requires_grad_(backward) for t in (k, v))
    bs = bias[:, :nq].detach().float().requires_grad_(backward) if bias is not None else None
    ref = op.reference(qs, ks, vs, causal=causal, bias=bs)
    qi, ki, vi = (t.detach().requires_grad_(backward) for t in (q, k, v))
    bi = bias.detach().requires_grad_(backward) if bias is not None else None
    ins = [qi, ki, vi] + ([bi] if bias is not None else [])
    ref_ins = [qs, ks, vs] + ([bs] if bias is not None else [])
    out = fn(qi, ki, vi, causal, bi)
    grads = torch.autograd.grad(out, ins, go) if backward else ()
    check(f"{name} out", out[sl].float(), ref.detach(), dtype=q.dtype, tol=2e-2)
    if backward:
        ref_grads = torch.autograd.grad(ref, ref_ins, go[sl].float())
        parts = {"dq": sl, "dk": sl_kv, "dv": sl_kv, "dbias": (slice(None), slice(0, nq))}
        for gname, g, rg in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads):
            check(f"{name} {gname}", g[parts[gname]].float(), rg, dtype=q.dtype, tol=3e-2)


def _timed(fns: dict, q, k, v, bias, causal, go, backward, timer):
    """``timer`` over each version's call (name -> a call without arguments): its forward, or with ``backward``
    its forward and backward, q, k, v (and the bias) requiring gradients while timed."""
    ins = [q, k, v] + ([bias] if bias is not None else [])
    for t in ins:
        t.requires_grad_(backward)
    try:
        return timer({n: (lambda fn=fn: torch.autograd.grad(fn(q, k, v, causal, bias), ins, go)) if backward
                      else (lambda fn=fn: fn(q, k, v, causal, bias)) for n, fn in fns.items()})
    finally:
        for t in ins:
            t.requires_grad_(False)


def _time(fn, q, k, v, bias, causal, go, backward):
    return _timed({"": fn}, q, k, v, bias, causal, go, backward, lambda calls: time_ms(calls[""]))


def _measured(r, name, shape, measure):
    """``measure()`` (it checks, then times) for a version that may not run here: its result, or None
    with the reason logged. A failed check still raises."""
    try:
        return measure()
    except CheckError:
        raise
    except Exception as e:  # noqa: BLE001 - the reason goes to the log
        r.log(f"  {name} failed on {shape}: {type(e).__name__}: {str(e)[:160]}")
        return None


def best_baseline(times: dict) -> str:
    """The fastest baseline measured at a shape (name -> ms), "" if none: what ours is compared with,
    the best the user already has on this GPU (SDPA's cuDNN backend where it runs)."""
    return min(times, key=times.get) if times else ""


def _row_against_flex(r, times, opname, name, shape, dtype, cost, ms) -> None:
    """A measured time (None: nothing) into ``times`` and its row, against FlexAttention's when timed."""
    if ms is None:
        return
    times[name] = ms
    base = "flex_attention" if name != "flex_attention" and "flex_attention" in times else ""
    r.add(opname, name, shape, dtype, ms, cost, baseline=base, baseline_ms=times.get(base) if base else None)


def _optional_row(r, name, fn, q, k, v, bias, causal, go, backward, *, opname, shape, dtype, cost, base, base_ms):
    """Check and time a version that may not run here (a failed check still raises); add its row."""
    r.status(f"{opname} {shape} {name}")

    def measure():
        _check_version(name, fn, q, k, v, bias, causal, go, backward)
        return _time(fn, q, k, v, bias, causal, go, backward)

    ms = _measured(r, name, shape, measure)
    if ms is not None:
        r.add(opname, name, shape, dtype, ms, cost, baseline=base, baseline_ms=base_ms)


def _lean_rows(r, cands, q, k, v, causal, go, backward, *, opname, shape, dtype, cost) -> None:
    """Issue 30's grid rows at one shape: the baselines of ``cands`` and flash_attention, each checked first
    (a baseline that does not run here gets no row; ours' failed check raises), then all timed by turns
    (``time_ms_rounds``: timed one after the other, ours ran right after Flex and read 3-8 % slow); ours
    against the fastest baseline."""
    fns = {}
    for name, fn in [*cands.items(), ("flash_attention", _ours_default)]:
        r.status(f"{opname} {shape} {name}")
        if name == "flash_attention":
            ok = _measured(r, name, shape, lambda fn=fn: _check_version(name, fn, q, k, v, None, causal, go,
                                                                         backward) or True)
        else:
            try:
                _check_version(name, fn, q, k, v, None, causal, go, backward)
                ok = True
            except Exception as e:  # noqa: BLE001 - a backend that does not run (or fails) this case: no row
                r.log(f"  {name} skipped on {shape}: {type(e).__name__}: {str(e)[:160]}")
                ok = False
        if ok:
            fns[name] = fn
    r.status(f"{opname} {shape}: {', '.join(fns)} by turns")
    times = _timed(fns, q, k, v, None, causal, go, backward, time_ms_rounds)
    base = best_baseline({n: t for n, t in times.items() if n != "flash_attention"})
    for name, ms in times.items():
        if name == "flash_attention":
            r.add(opname, name, shape, dtype, ms, cost, baseline=base, baseline_ms=times.get(base))
        else:
            r.add(opname, name, shape, dtype, ms, cost)


def parse_dtypes(env: str) -> list:
    """``TILEWISE_BENCH_ATTENTION_DTYPES``: comma-separated "bfloat16" / "bf16" / "float16" / "fp16", in order."""
    names = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    items = [i.strip().lower() for i in env.split(",") if i.strip()]
    if not items or any(i not in names for i in items):
        raise ValueError(f"TILEWISE_BENCH_ATTENTION_DTYPES={env!r}: expected comma-separated bfloat16 / float16 "
                         "(or bf16 / fp16), e.g. 'bfloat16,float16'")
    return list(dict.fromkeys(names[i] for i in items))


def parse_shapes(env: str, tokens: int) -> list[tuple[int, int, int, int]]:
    """``TILEWISE_BENCH_ATTENTION_SHAPES``: comma-separated "SxD" (H = Hkv = 16) or "SxDxHxHkv" items,
    S dividing ``tokens`` and Hkv dividing H, as (S, D, H, Hkv); "none": no grid shape (a full run then times
    the window, packed and host rows alone)."""
    if env.strip().lower() == "none":
        return []
    try:
        shapes = []
        for item in (i for i in env.split(",") if i.strip()):
            t = tuple(int(x) for x in item.lower().split("x"))
            t = t + (16, 16) if len(t) == 2 else t
            if len(t) != 4 or min(t) < 1 or tokens % t[0] or t[2] % t[3]:
                raise ValueError
            shapes.append(t)
        if not shapes:
            raise ValueError
    except ValueError:
        raise ValueError(f"TILEWISE_BENCH_ATTENTION_SHAPES={env!r}: expected SxD or SxDxHxHkv items, S dividing "
                         f"{tokens} tokens and Hkv dividing H, e.g. '4096x64,8192x128x32x8'") from None
    return shapes


def run(r) -> None:
    from torch.nn.attention import SDPBackend

    TOKENS = 16384
    if r.quick:
        shapes = [(4096, 128, 16, 16)]
    else:
        shapes = [(S, D, H, Hkv) for H, Hkv in ((16, 16), (32, 8)) for D in (64, 128)
                  for S in (1024, 2048, 4096, 8192, 16384)]
    env = settings.bench_attention_shapes()  # e.g. "4096x64,8192x128x32x8": part of the grid
    if env:
        shapes = parse_shapes(env, TOKENS)
    lean = settings.bench_attention_lean()
    modes = grid_modes(lean)
    dtypes = parse_dtypes(settings.bench_attention_dtypes() or "bfloat16")
    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
    baselines = {name: _sdpa(backends[name]) for name in sdpa_baselines(lean)}
    flex = _flex()
    g = torch.Generator(device="cuda").manual_seed(0)
    for (S, D, H, Hkv), dtype in itertools.product(shapes, dtypes):
        B = TOKENS // S
        q = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=g) for _ in range(2))
        go = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g)
        heads = f"H={H}" if Hkv == H else f"H={H},Hkv={Hkv}"
        for causal in (False, True):
            for opname, backward, with_bias in modes:
                if with_bias and (causal or S > 8192 or Hkv != H):
                    # SDPA has no causal + bias; at 16k the bias alone is 8.6 GB (and slow baselines);
                    # the grouped-query rows are about the K/V reads, not the bias's
                    continue
                bias = (0.1 * torch.randn(1, H, S, S, device="cuda", dtype=dtype, generator=g)
                        if with_bias else None)
                shape = f"B={B},{heads},S={S},D={D}" + (",causal" if causal else "") + (",bias" if with_bias else "")
                cost = op.cost(B, H, S, S, D, dtype, causal=causal, Hkv=Hkv, backward=backward,
                               bias_bytes=(bias.numel() * bias.element_size() * (2 if backward else 1)
                                           if with_bias else 0))
                times = {}
                cands = dict(baselines)
                if not with_bias and (not backward or not r.quick):
                    cands["flex_attention"] = flex
                if lean:  # issue 30's grid: what a caller gets, against cuDNN and Flex, timed by turns
                    _lean_rows(r, cands, q, k, v, causal, go, backward, opname=opname, shape=shape, dtype=dtype,
                               cost=cost)
                    continue
                for name, fn in cands.items():
                    if with_bias and name == "sdpa_flash":
                        continue  # the flash backend takes no attn_mask
                    r.status(f"{opname} {shape} {name}")
                    try:
                        _check_version(name, fn, q, k, v, bias, causal, go, backward)
                    except Exception as e:  # a backend that does not run (or fails) this case gets no row
                        r.log(f"  {name} skipped on {shape}: {type(e).__name__}: {str(e)[:160]}")
                        continue
                    times[name] = _time(fn, q, k, v, bias, causal, go, backward)
                    r.add(opname, name, shape, dtype, times[name], cost)
                base = best_baseline(times)
                row = dict(opname=opname, shape=shape, dtype=dtype, cost=cost, base=base, base_ms=times.get(base))
                r.status(f"{opname} {shape} v3_flash2")
                _check_version("v3_flash2", _ours, q, k, v, bias, causal, go, backward)
                ms = _time(_ours, q, k, v, bias, causal, go, backward)
                r.add(opname, "v3_flash2", shape, dtype, ms, cost, baseline=base, baseline_ms=times.get(base))
                if D in (64, 128):  # e.g. a Triton without Gluon, or not sm_90: logged, no row
                    _optional_row(r, "v5_flash2_ws", _ours_ws, q, k, v, bias, causal, go, backward, **row)
                _optional_row(r, "flash_attention", _ours_default, q, k, v, bias, causal, go, backward, **row)
                if backward:
                    r.status(f"{opname} {shape} v3_flash2_atomic")
                    _check_version("v3_flash2_atomic", _ours_atomic, q, k, v, bias, causal, go, True)
                    ms = _time(_ours_atomic, q, k, v, bias, causal, go, True)
                    r.add(opname, "v3_flash2_atomic", shape, dtype, ms, cost, baseline=base,
                          baseline_ms=times.get(base))
                    if not with_bias and D in (64, 128):  # v5's forward where it applies, v6's backward
                        _optional_row(r, "v6_flash2_ws_bwd", _ours_v6, q, k, v, None, causal, go, True, **row)
                if not with_bias:  # e.g. TMA descriptors missing from this Triton: logged, no row
                    _optional_row(r, "v4_flash2_tma", _ours_tma, q, k, v, None, causal, go, backward, **row)
                if not r.quick and not with_bias and S == 4096 and Hkv == H:  # one kernel's tile changed at a time
                    for name, swept in _sweeps(D, backward):
                        _optional_row(r, name, swept, q, k, v, None, causal, go, backward, **row)
                del bias
        del q, k, v, go
        torch.cuda.empty_cache()
    if not lean:
        _window_rows(r, flex)
        _varlen_rows(r, flex)
        _host_rows(r)


def grid_modes(lean: bool) -> list[tuple[str, bool, bool]]:
    """(op name, backward, with a bias) of each mode a shape runs; ``lean`` (TILEWISE_BENCH_ATTENTION_LEAN):
    the forward and forward + backward without a bias, issue 30's grid."""
    modes = [("attention_fwd", False, False), ("attention_fwd_bwd", True, False),
             ("attention_bias_fwd", False, True), ("attention_bias_fwd_bwd", True, True)]
    return modes[:2] if lean else modes


def sdpa_baselines(lean: bool) -> tuple[str, ...]:
    """The SDPA backends timed as baselines; ``lean``: cuDNN's alone (what sm_90 callers get)."""
    return ("sdpa_cudnn",) if lean else ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")


def _window_rows(r, flex) -> None:
    """Sliding-window causal attention at S = 16384 (Mistral's window of 4096 and a short one of
    1024): flash_attention with ``window`` (the default: v5's band forward at D = 128; and that
    kernel on the persistent grid) against FlexAttention with the same mask as a block mask, and the
    full causal forward as the yardstick (issue 30: window 1024 <= 0.15x of it)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, H, S, D, dtype = 1, 16, 16384, 128, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, go = (torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    full = _variant(op.flash_attention)
    for left in (1024,) if r.quick else (1024, 4096):
        kept = sum(min(i + 1, left + 1) for i in range(S))  # (query, key) pairs each head computes
        for opname, backward in (("attention_window_fwd", False), ("attention_window_fwd_bwd", True)):
            shape = f"B={B},H={H},S={S},D={D},causal,window={left}"
            cost = op.cost(B, H, S, S, D, dtype, backward=backward)
            cost = Cost(cost.flops * kept / (S * S), cost.bytes)
            window = (lambda a, b, c, causal, bias, _l=left: op.flash_attention(a, b, c, causal=True,
                                                                                  window=(_l, None)))
            mask = create_block_mask(lambda b, h, qi, ki, _l=left: (qi >= ki) & (qi - ki <= _l), None, None, S, S,
                                     device="cuda")
            flex_w = (lambda a, b, c, causal, bias, _m=mask: flex._compiled(a, b, c, block_mask=_m))
            # The default row is v5's band kernel at this head dim; beside it the same kernel's persistent grid.
            band_p = op.default_policy(q, k).replace(forward="ws", ws_band=True, ws_band_persistent=True)
            bands = (("flash_attention[v5 band persistent]",
                      lambda a, b, c, causal, bias, _l=left, _p=band_p: op.flash_attention(
                          a, b, c, causal=True, window=(_l, None), policy=_p)),)
            sl = (slice(0, 1), slice(0, 2))
            qs, ks, vs = (t[sl].float() for t in (q, k, v))
            ref = op.reference(qs, ks, vs, causal=True, window=(left, None))
            times = {}
            cands = (("flex_attention", flex_w),) if not r.quick else ()  # quick runs skip Flex's compiles
            for name, fn in cands + (("flash_attention", window),) + bands:
                r.status(f"{opname} {shape} {name}")

                def measure(fn=fn, name=name):
                    check(f"{name} out", fn(q, k, v, True, None)[sl].float(), ref, dtype=dtype, tol=2e-2)
                    return _time(fn, q, k, v, None, True, go, backward)

                # (e.g. FlexAttention missing: logged, no row)
                _row_against_flex(r, times, opname, name, shape, dtype, cost, _measured(r, name, shape, measure))
            if "flash_attention" in times and left == 1024:
                r.status(f"{opname} full causal")
                ms = _time(full, q, k, v, None, True, go, backward)
                r.add(opname, "flash_attention[full causal]", f"B={B},H={H},S={S},D={D},causal", dtype, ms,
                      op.cost(B, H, S, S, D, dtype, causal=True, backward=backward))
                r.log(f"  {opname}: window {left} / full causal = {times['flash_attention'] / ms:.3f} (target <= 0.15)")
            del ref, qs, ks, vs
    del q, k, v, go
    torch.cuda.empty_cache()


# Eight causal documents packed into 16,296 tokens (longest 4096): a pretraining batch without padding.
_DOCS = (4096, 3000, 2500, 2000, 1800, 1200, 1000, 700)
# (H, Hkv, D) of the packed rows: 16 heads of 128, and Llama-3.2-1B's attention (32 query heads on 8, D 64).
_VARLEN_HEADS = ((16, 16, 128), (32, 8, 64))


def _varlen_rows(r, flex) -> None:
    """Packed causal documents (``_DOCS``) at each of ``_VARLEN_HEADS``: flash_attention_varlen against
    FlexAttention with the document mask as a block mask on the same packing, and against our dense path on
    the padded batch (a key padding mask; issue 30: >= 1.0x both)."""
    for H, Hkv, D in _VARLEN_HEADS:
        _varlen_packing(r, flex, H, Hkv, D)


def _varlen_packing(r, flex, H, Hkv, D) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    from ...ops.attention import varlen as opv

    dtype = torch.bfloat16
    lens, B, S = list(_DOCS), len(_DOCS), max(_DOCS)
    total = sum(lens)
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v, go = (torch.randn(total, h, D, device="cuda", dtype=dtype, generator=g) for h in (H, Hkv, Hkv, H))
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(B)], dtype=torch.int32, device="cuda")
    doc = torch.repeat_interleave(torch.arange(B, device="cuda"), torch.tensor(lens, device="cuda"))
    bm = None  # quick runs skip Flex's compiles
    try:
        if not r.quick:
            bm = create_block_mask(lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki), None, None, total,
                                   total, device="cuda")
    except Exception as e:  # noqa: BLE001 - no Flex rows then
        r.log(f"  flex_attention: no document block mask ({type(e).__name__}: {str(e)[:120]})")
    q4, k4, v4, go4 = (t.transpose(0, 1)[None] for t in (q, k, v, go))
    # the padded batch: (B, H, S, D), document b in rows [0, lens[b]), keys past it masked
    padded = [torch.zeros(B, S, h, D, device="cuda", dtype=dtype) for h in (H, Hkv, Hkv, H)]
    for t, src in zip(padded, (q, k, v, go)):
        for b in range(B):
            t[b, :lens[b]] = src[cu[b]:cu[b + 1]]
    qp, kp, vp, gop = (t.transpose(1, 2) for t in padded)
    keys = (torch.arange(S, device="cuda")[None, :] < torch.tensor(lens, device="cuda")[:, None])[:, None, None, :]
    # Flex first: a row names Flex as its baseline only when Flex's time is already in (_row_against_flex).
    cases = {"flex_attention": ((q4, k4, v4, go4), lambda a, b, c: flex._compiled(a, b, c, block_mask=bm,
                                                                                  enable_gqa=Hkv != H)),
             "flash_attention_varlen": ((q, k, v, go), lambda a, b, c: opv.flash_attention_varlen(
                 a, b, c, cu, cu, S, S, causal=True, check_seqlens=False)),
             "flash_attention[padded]": ((qp, kp, vp, gop), lambda a, b, c: op.flash_attention(
                 a, b, c, causal=True, mask=keys))}
    if bm is None:
        del cases["flex_attention"]
    flops = sum(4.0 * H * n * n * D / 2 for n in lens)
    kv_heads = 2 * Hkv // H or 1  # query heads 0-1 and their K / V heads (one head of a group of 2 or more)
    ref0 = op.reference(*(t[:lens[0], :h].transpose(0, 1)[None].float() for t, h in ((q, 2), (k, kv_heads),
                                                                                     (v, kv_heads))),
                        causal=True)[0]  # document 0, query heads 0-1
    heads = f"H={H}" if Hkv == H else f"H={H},Hkv={Hkv}"
    shape = f"docs={B},tokens={total},max={S},{heads},D={D},causal"
    io = 2 * total * (H + Hkv) * D * dtype.itemsize  # q, o and k, v once
    for opname, backward in (("attention_varlen_fwd", False), ("attention_varlen_fwd_bwd", True)):
        cost = Cost(flops * (3.5 if backward else 1.0), io * (2 if backward else 1))
        times = {}
        for name, ((a, b, c, gg), fn) in cases.items():
            r.status(f"{opname} {name}")

            def measure(a=a, b=b, c=c, gg=gg, fn=fn, name=name):
                out = fn(a, b, c)
                first = out[:lens[0], :2].transpose(0, 1) if out.dim() == 3 else out[0, :2, :lens[0]]
                check(f"{name} out", first.float(), ref0, dtype=dtype, tol=2e-2)
                if backward:
                    ins = [t.detach().requires_grad_(True) for t in (a, b, c)]
                    return time_ms(lambda: torch.autograd.grad(fn(*ins), ins, gg))
                return time_ms(lambda: fn(a, b, c))

            _row_against_flex(r, times, opname, name, shape, dtype, cost, _measured(r, name, shape, measure))
    del q, k, v, go, padded, qp, kp, vp, gop
    torch.cuda.empty_cache()


def host_ms(fn, calls: int = 100) -> float:
    """The host's time to issue one ``fn()``, in ms: ``calls`` calls issued while the GPU is kept busy
    by a spin kernel (torch.cuda._sleep), so no call waits for the device and the wall time per call
    is the CPU's alone. The median of five such batches."""
    import statistics
    import time

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(5):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time: longer than the issue loop
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e3)
        torch.cuda.synchronize()
    return statistics.median(out)


class _AllocOnly(torch.autograd.Function):
    """The least a Python attention with autograd costs the host: its forward allocates out and the LSE,
    its backward the three gradients, and no kernel runs (the host row's ``autograd_floor``)."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        ctx.lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, go):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _host_rows(r) -> None:
    """Host time of an eager forward + backward (autograd, every launch) at a small shape where the
    GPU work is tens of microseconds (issue 30: <= 40 us of CPU time beyond the GPU time), beside SDPA's
    cuDNN backend. Rows: ``attention_host_fwd_bwd`` (the host's time a call, its baseline SDPA's;
    ``autograd_floor``: ``_AllocOnly``, what any Python autograd op costs this host at least) and
    ``attention_graph_fwd_bwd`` (the same call's device time, replayed from a CUDA graph so the host is
    out of it); the log gives their difference: the time a call adds beyond its GPU time."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..harness import time_ms_graph

    B, H, S, D, dtype = 1, 16, 256, 128, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, go = (torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    ins = [t.requires_grad_(True) for t in (q, k, v)]

    def ours():
        return torch.autograd.grad(op.flash_attention(*ins, causal=True), ins, go)

    unplanned = op.default_policy(q, k, causal=True).replace(plans=False)

    def ours_unplanned():  # every call decides again: what the call plans save (ops/attention/plans.py)
        return torch.autograd.grad(op.flash_attention(*ins, causal=True, policy=unplanned), ins, go)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(F.scaled_dot_product_attention(*ins, is_causal=True), ins, go)

    def floor():
        return torch.autograd.grad(_AllocOnly.apply(*ins), ins, go)

    shape = f"B={B},H={H},S={S},D={D},causal,host"
    times = {}
    for name, fn in (("sdpa_cudnn", cudnn), ("flash_attention", ours), ("flash_attention_unplanned", ours_unplanned),
                     ("autograd_floor", floor)):
        r.status(f"attention_host_fwd_bwd {name}")
        ms = _measured(r, name, shape, lambda fn=fn: host_ms(fn))
        if ms is None:
            continue
        times[name] = ms
        base = "sdpa_cudnn" if name not in ("sdpa_cudnn", "autograd_floor") and "sdpa_cudnn" in times else ""
        r.add("attention_host_fwd_bwd", name, shape, dtype, ms, None, baseline=base,
              baseline_ms=times.get(base) if base else None)
        if name == "autograd_floor":
            r.log(f"  attention_host_fwd_bwd autograd_floor: {ms * 1e3:.1f} us of host time a call (no kernel)")
            continue
        gpu = _measured(r, name, shape, lambda fn=fn: time_ms_graph(fn))
        if gpu is not None:
            r.add("attention_graph_fwd_bwd", name, shape, dtype, gpu, None)
        r.log(f"  attention_host_fwd_bwd {name}: {ms * 1e3:.1f} us of host time a call, "
              + (f"{gpu * 1e3:.1f} us of device time (graph): {(ms - gpu) * 1e3:+.1f} us beyond it"
                 if gpu is not None else "device time not measured"))

