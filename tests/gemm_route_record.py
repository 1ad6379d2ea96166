"""What gemm() launches for a grid of calls, without a GPU: the kernels, their launch arguments and
the autotuner's pruned configs, recorded by stubbing the launches (Triton's, gemm_sm90's,
gemm_tf32's) and the transposing copy on CPU tensors that claim to be on an H200 (132 SMs, the
sm_90 kernels available). Run in a process without TRITON_INTERPRET, so that the kernels are the
GPU build's (autotuned where the GPU's are); ``record(hooks)`` returns {case: events}."""

from __future__ import annotations

import json

import torch

SMS = 132

_SHAPES = [
    (1, 1, 1), (1, 8, 8), (8, 8, 8), (33, 40, 24), (37, 29, 19), (9, 7, 1030), (200, 312, 96), (300, 200, 136),
    (130, 1000, 2048), (129, 200, 4104), (256, 50, 4096), (257, 8, 4096), (512, 512, 512), (768, 768, 768),
    (768, 776, 3000), (960, 960, 960), (1000, 1000, 8), (1000, 1000, 520), (1000, 1000, 1000), (1000, 1024, 1000),
    (1024, 1024, 1024), (1000, 1096, 520), (1001, 1536, 1003), (1280, 1280, 1280), (1536, 1536, 264),
    (1536, 1536, 1536), (2048, 2048, 136), (2048, 2048, 2048), (2056, 1024, 2056), (2304, 2304, 2304),
    (2560, 2560, 2560), (2999, 2999, 2999), (3072, 3072, 3072), (4096, 1000, 517), (4097, 1000, 1000),
    (1000, 4097, 64), (4096, 4096, 1016), (4096, 4096, 4096), (5000, 5000, 4096), (7168, 7168, 64),
    (7160, 7168, 64), (8192, 2040, 4096), (8192, 8192, 8192), (768, 768, 8192), (1024, 1024, 16384),
]
_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f8": torch.float8_e4m3fn}
_LAYOUTS = ("rm", "km", "at", "odd")  # B (K, N) row-major; B = w.T; A with unit stride along M; A 2 bytes+ off
_EPILOGUES = ("plain", "bias_relu", "alt")  # alt: fp32 output for 16-bit / fp8 inputs, "ieee" for fp32


def cases() -> list[str]:
    out = []
    for M, N, K in _SHAPES:
        for d in _DTYPES:
            for lay in _LAYOUTS:
                if lay == "odd" and max(M * K, K * N) > (1 << 22):
                    continue  # the padded route would copy it: keep the run short
                for epi in _EPILOGUES:
                    out.append(f"{M}x{N}x{K}-{d}-{lay}-{epi}")
    # given outputs, aux, empty sides, "none", an out that overlaps B, fp8 without scales
    for M, N, K in ((1000, 1000, 1000), (333, 520, 264), (4096, 4096, 4096), (200, 312, 96), (1536, 1536, 1536)):
        for d in ("bf16", "f32"):
            for extra in ("out", "out_strided", "aux", "none", "out_over_b"):
                out.append(f"{M}x{N}x{K}-{d}-rm-plain-{extra}")
    for M, N, K in ((0, 64, 64), (64, 0, 64), (64, 64, 0)):
        for d in ("bf16", "f32"):
            out.append(f"{M}x{N}x{K}-{d}-rm-plain")
    out.append("64x64x64-f8-rm-plain-noscale")
    for M, N, K in ((37, 29, 19), (333, 520, 264), (1000, 1000, 1000), (2048, 2048, 2048)):
        for d in ("bf16", "f32", "f8"):
            for lay in ("rm", "km"):
                for v in ("v1_tiled", "v2_persistent", "v3_tma_persistent", "v3_tma_split", "v4_streamk"):
                    out.append(f"{M}x{N}x{K}-{d}-{lay}-bias_relu-variant={v}")
    return out


def _operands(case: str):
    shape, d, lay, epi, *extra = case.split("-")
    M, N, K = map(int, shape.split("x"))
    dtype = _DTYPES[d]
    if lay == "odd":
        buf = torch.empty(M * K + 16, dtype=dtype)
        a = buf[1:1 + M * K].view(M, K)
    elif lay == "at":
        a = torch.empty(K, M, dtype=dtype).t()
    else:
        a = torch.empty(M, K, dtype=dtype)
    b = torch.empty(N, K, dtype=dtype).t() if lay == "km" else torch.empty(K, N, dtype=dtype)
    kw = {}
    if epi == "bias_relu":
        kw.update(bias=torch.empty(N), activation="relu")
    elif epi == "alt":
        if dtype == torch.float32:
            kw.update(precision="ieee")
        else:
            kw.update(out_dtype=torch.float32)
    if dtype == torch.float8_e4m3fn and "noscale" not in extra:
        kw.update(scale_a=torch.ones(1), scale_b=torch.ones(1))
    od = kw.get("out_dtype") or (torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype)
    if "out" in extra:
        kw["out"] = torch.empty(M, N, dtype=od)
    elif "out_strided" in extra:
        kw["out"] = torch.empty(M, N + 8, dtype=od)[:, :N]
    elif "aux" in extra:
        kw["aux"] = torch.empty(M, N, dtype=od)
    elif "none" in extra:
        kw["activation"] = "none"
    elif extra and extra[0].startswith("variant="):
        kw["variant"] = extra[0].split("=")[1]
    elif "out_over_b" in extra:
        buf = torch.empty(K * N + M * N, dtype=dtype)
        b = buf[:K * N].view(K, N)
        kw["out"] = buf[K * N - 8:K * N - 8 + M * N].view(M, N)
    return a, b, kw


def _t(x) -> str:
    return f"T{str(x.dtype)[6:]}{tuple(x.shape)}{tuple(x.stride())}@{x.data_ptr() % 16}"


def _arg(x) -> str:
    if isinstance(x, torch.Tensor):
        return _t(x)
    base = getattr(x, "base", None)
    if isinstance(base, torch.Tensor):  # a TensorDescriptor
        return f"D{str(base.dtype)[6:]}{list(x.shape)}{list(x.strides)}{list(x.block_shape)}"
    return repr(x)


def _kernel_event(fn, grid, args, kw) -> str:
    from triton.runtime.jit import JITFunction

    inner, tuned = fn, False
    while not isinstance(inner, JITFunction) and hasattr(inner, "fn"):
        inner, tuned = inner.fn, True
    ev = f"{inner.__name__}{'*' if tuned else ''}" + (f" grid={tuple(grid)}" if isinstance(grid, tuple) else "")
    ev += " args=" + ",".join(_arg(x) for x in args)
    ev += " kw=" + json.dumps({k: v for k, v in kw.items() if k != "run_pre_hook"}, sort_keys=True)
    if tuned:
        nargs = dict(zip(fn.arg_names, args))
        nargs.update(kw)
        kept = fn.early_config_prune(fn.configs, nargs) if fn.early_config_prune else fn.configs
        ev += " pruned=" + ";".join(
            ",".join(str(c.kwargs[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")) + f",{c.num_stages},"
            f"{c.num_warps}" for c in kept)
    return ev


def record(hooks, call, clear, names=None) -> dict[str, list[str]]:
    """hooks(events) -> a list of (object, attribute, replacement): the launches and facts to stub,
    each appending to ``events``; call(a, b, kwargs, plans) runs gemm() with its call plans on or
    off; clear() forgets the plans. Each case runs twice with plans on (the first call makes the
    plan, the second runs it) and once with plans off."""
    events: list[str] = []
    saved = [(o, n, getattr(o, n)) for o, n, _ in hooks(events)]
    # CPU tensors claim to be on the GPU; copies and fills (the padded route's) do nothing: the
    # launches, not the values, are the record
    kept = {n: torch.Tensor.__dict__.get(n) for n in ("is_cuda", "copy_", "zero_")}
    torch.Tensor.is_cuda = property(lambda self: True)
    torch.Tensor.copy_ = lambda self, src, non_blocking=False: self
    torch.Tensor.zero_ = lambda self: self
    for o, n, v in hooks(events):
        setattr(o, n, v)
    out = {}
    try:
        for case in names or cases():
            runs = []
            for plans in (True, True, False):
                events.clear()
                a, b, kw = _operands(case)
                try:
                    call(a, b, kw, plans)
                except Exception as e:  # noqa: BLE001 - the error is part of the record
                    events.append(f"raise {type(e).__name__}: {e}")
                runs.append(" | ".join(events))
            out[case] = runs
            clear()
    finally:
        for n, v in kept.items():
            if v is None:
                delattr(torch.Tensor, n)  # the base class's again
            else:
                setattr(torch.Tensor, n, v)
        for o, n, v in saved:
            setattr(o, n, v)
    return out


def kernel_hook(events):
    """A stub of runtime.triton_launch.launch / bind that records the launch."""
    def stub(fn, grid, *args, **kw):
        events.append(_kernel_event(fn, grid, args, kw))
        return None
    return stub


def sm90_hook(events):
    def stub(a, b, out, cfg, *rest, **kw):
        events.append(f"sm90 {cfg.name(a.dtype)} a={_t(a)} b={_t(b)} out={_t(out)}")
        return out
    return stub


def tf32_hook(events, bm_for, cluster_for):
    def stub(a, b, out, *rest, **kw):
        M, N = a.shape[0], b.shape[1]
        bm = bm_for(M, N, SMS)
        events.append(f"tf32 bm={bm} cluster={cluster_for(M, N, bm)} a={_t(a)} b={_t(b)} "
                      f"out={_t(out) if out is not None else None}")
        return out if out is not None else torch.empty(M, N)
    return stub


def transpose_hook(events):
    def stub(x, *rest, **kw):
        events.append(f"transpose {_t(x)}")
        return torch.empty(x.shape[1], x.shape[0], dtype=x.dtype)
    return stub


def summary(events: str) -> str:
    """The kernels of one call's events with their fixed tiles (BLOCK_M, BLOCK_N[, BLOCK_N2],
    BLOCK_K, stages, warps), "*" for the autotuner's; "T" for the transposing copy."""
    out = []
    for e in events.split(" | ") if events else []:
        head = e.split(" ")
        if head[0] in ("raise", "transpose"):
            out.append({"raise": "raise", "transpose": "T"}[head[0]])
        elif head[0] in ("sm90", "tf32"):
            out.append(" ".join(head[:3]) if head[0] == "tf32" else head[1])
        else:
            kw = json.loads(e.split(" kw=", 1)[1].split(" pruned=", 1)[0])
            tile = [kw[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_N2", "BLOCK_K", "num_stages", "num_warps") if k in kw]
            out.append(head[0] + (str(tile) if tile else ""))
    return " + ".join(out) or "nothing launched"


def compact(rec: dict[str, list[str]]) -> dict:
    """{"summaries": [...], "cases": {case: [summary index, sha256 of the events (12 hex)]}}; a
    case whose runs (plans on twice, plans off) launched differently keeps one pair a run."""
    import hashlib

    summaries: list[str] = []
    cases = {}
    for case, runs in sorted(rec.items()):
        pairs = []
        for ev in runs:
            s = summary(ev)
            if s not in summaries:
                summaries.append(s)
            pairs.append([summaries.index(s), hashlib.sha256(ev.encode()).hexdigest()[:12]])
        cases[case] = pairs[0] if all(p == pairs[0] for p in pairs) else pairs
    return {"summaries": summaries, "cases": cases}


def dump(table: dict) -> str:
    """The record as JSON, one case a line."""
    lines = ['{"rules": ' + json.dumps(table["rules"], sort_keys=True) + ',',
             '"summaries": ' + json.dumps(table["summaries"], indent=1) + ',', '"cases": {']
    items = list(table["cases"].items())
    lines += [f"{json.dumps(k)}: {json.dumps(v)}" + ("," if i < len(items) - 1 else "")
              for i, (k, v) in enumerate(items)]
    return "\n".join(lines + ["}}", ""])


_SIDES = [1, 8, 64, 100, 128, 200, 256, 500, 512, 768, 936, 1000, 1024, 1100, 1536, 2048, 2056, 2304, 2560, 3000,
          3072, 4096, 5000, 6144, 8192, 65536]
_KS = [8, 64, 1016, 1024, 4096, 8128, 8192, 16384]


def rules(fns: dict) -> dict[str, str]:
    """sha256 (12 hex) of each rule's values over a grid: fns maps a rule's name to the function
    (config_for, route_for, tma_tile_for, split_k_for, tf32_bm_for, tf32_cluster_for, tail_splits,
    split_k, padded_time_ratio)."""
    import hashlib

    vals: dict[str, list] = {k: [] for k in fns}
    for M in _SIDES:
        for N in _SIDES:
            vals["tma_tile_for"].append(fns["tma_tile_for"](M, N, SMS))
            bm = fns["tf32_bm_for"](M, N, SMS)
            vals["tf32_bm_for"].append(bm)
            vals["tf32_cluster_for"].append(fns["tf32_cluster_for"](M, N, bm))
            for K in _KS:
                vals["config_for"].append(fns["config_for"](M, N, K, SMS))
                vals["route_for"].append(fns["route_for"](M, N, K, SMS))
                vals["route_for"].append(fns["route_for"](M, N, K, SMS, N + 8))
                vals["split_k_for"].append(fns["split_k_for"](M, N, K))
                for it in (1, 2, 4):
                    ratio = fns["padded_time_ratio"](M, N, K, it, 2, (True, True, False))
                    vals["padded_time_ratio"].append(round(ratio, 9))
    for tiles in range(1, 700, 3):
        for clusters in (33, 66, 132):
            for kt in (1, 4, 16, 79, 127, 128, 256, 4096):
                vals["tail_splits"].append(fns["tail_splits"](tiles, clusters, kt))
                vals["split_k"].append(fns["split_k"](tiles, clusters, kt))
    return {k: hashlib.sha256(repr(v).encode()).hexdigest()[:12] for k, v in vals.items()}
