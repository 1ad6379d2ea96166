"""wave: wave quantization of square bf16 GEMMs around a tile boundary, our Triton GEMM beside
cuBLAS (torch.matmul), with the expected number of waves and the time they predict.

A GEMM split into T output tiles runs them C = SMs x (resident CTAs per SM) at a time, so it takes
``waves = ceil(T / C)`` rounds, and the last round may be nearly empty: one row of 8 more elements
can add a whole round. Predicted time = waves x the time of one full wave (C tiles, each
2 BM BN K_padded FLOPs, at the peak rate), so predicted TFLOP/s = peak x useful share of the
computed tiles. The dips of the measured curve should fall where ``waves`` steps up.

Rows (op ``wave``, bf16, shape ``nxnxn``), per size:
    cublas              torch.matmul (its tile is cuBLAS's choice: no wave count).
    gemm(auto)          the public ``gemm()``: v3_tma_persistent for these sizes (rows are 16-byte
                        multiples); its tile is the one the autotuner chose for this shape, read
                        back from the autotuner after the first call (``best_config``).
    v3_pinned_128x128   the same kernel with one pinned config (128 x 128 x 64, 4 stages, 8 warps):
                        the autotuner may switch tiles between neighbouring sizes, which moves the
                        steps; the pinned one shows the arithmetic alone.
Both of ours are persistent (grid = min(SMs, tiles)): one CTA per SM by construction, so
C = 132 on an H200 whatever the occupancy would allow.

Sizes: 1408 .. 2312 crossing 128-multiples, with +8 neighbours (one more tile row and column);
quick: 5 of them. Besides the CSV rows, ``run`` writes ``<device>-wave.csv`` (the plot data: tile,
tiles, waves, predicted and measured times) and ``<device>-wave.png`` next to the bench CSV when
the runner knows its ``out_dir``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import torch

from ...ops.gemm import api as op
from ...ops.gemm import triton_kernels as tk
from ...ops.gemm.configs import IN_DTYPES
from ..harness import CheckError, check, device_slug, time_ms_graph

SIZES = [1408, 1416, 1536, 1664, 1792, 1920, 2040, 2048, 2056, 2176, 2304, 2312]
QUICK_SIZES = [1408, 1416, 2048, 2056, 2304]

PINNED_NAME = "v3_pinned_128x128"
PINNED = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 4, "num_warps": 8}

H200_SMS = 132
SMEM_PER_SM = 228 * 1024
SMEM_PER_BLOCK_RESERVED = 1024  # the driver keeps 1 KiB of each block's shared memory
THREADS_PER_SM = 2048
REGS_PER_SM = 65536
MAX_CTAS_PER_SM = 32

POINT_COLUMNS = ("n", "variant", "block_m", "block_n", "block_k", "tiles", "waves", "median_ms", "tflops",
                 "predicted_ms", "predicted_tflops")


# --------------------------------------------------------------------------- wave arithmetic


def tiles(M: int, N: int, block_m: int, block_n: int) -> int:
    """Output tiles of an M x N result cut into block_m x block_n (edge tiles count whole)."""
    if min(M, N) < 1 or min(block_m, block_n) < 1:
        raise ValueError(f"tiles: sizes must be >= 1, got M={M}, N={N}, block {block_m}x{block_n}")
    return math.ceil(M / block_m) * math.ceil(N / block_n)


def resident_ctas_per_sm(smem_bytes: int, num_warps: int, regs_per_thread: int | None = None) -> int:
    """CTAs one SM holds at once (Hopper limits: 228 KiB shared, 2048 threads, 64K registers, 32
    blocks). Registers are counted per warp in 256-register units; None skips that limit."""
    if num_warps < 1 or smem_bytes < 0:
        raise ValueError(f"resident_ctas_per_sm: num_warps={num_warps}, smem_bytes={smem_bytes}")
    limit = min(MAX_CTAS_PER_SM, THREADS_PER_SM // (32 * num_warps))
    limit = min(limit, SMEM_PER_SM // (smem_bytes + SMEM_PER_BLOCK_RESERVED))
    if regs_per_thread is not None:
        per_warp = math.ceil(regs_per_thread * 32 / 256) * 256
        limit = min(limit, REGS_PER_SM // (per_warp * num_warps))
    return limit


def waves(M: int, N: int, block_m: int, block_n: int, sms: int = H200_SMS, ctas_per_sm: int = 1) -> int:
    """ceil(tiles / (sms x ctas_per_sm)): rounds of tiles the GPU runs (persistent kernels: ctas_per_sm=1)."""
    if sms < 1 or ctas_per_sm < 1:
        raise ValueError(f"waves: sms={sms} and ctas_per_sm={ctas_per_sm} must be >= 1")
    return math.ceil(tiles(M, N, block_m, block_n) / (sms * ctas_per_sm))


def wave_time_ms(K: int, block_m: int, block_n: int, peak_tflops: float, sms: int = H200_SMS,
                 ctas_per_sm: int = 1, block_k: int = 1) -> float:
    """Time of one full wave: sms x ctas_per_sm tiles of 2 block_m block_n K_padded FLOPs at peak
    (K padded up to a multiple of block_k: the masked tail of the K loop still runs)."""
    if peak_tflops <= 0:
        raise ValueError(f"wave_time_ms: peak_tflops={peak_tflops} must be > 0")
    k_pad = math.ceil(K / block_k) * block_k
    return sms * ctas_per_sm * 2.0 * block_m * block_n * k_pad / (peak_tflops * 1e12) * 1e3


def predicted_ms(M: int, N: int, K: int, block_m: int, block_n: int, peak_tflops: float, sms: int = H200_SMS,
                 ctas_per_sm: int = 1, block_k: int = 1) -> float:
    """waves x wave_time_ms: the time if every wave took as long as a full one at peak."""
    return (waves(M, N, block_m, block_n, sms, ctas_per_sm)
            * wave_time_ms(K, block_m, block_n, peak_tflops, sms, ctas_per_sm, block_k))


def wave_points(rows, tiles_by_variant: dict, peak_tflops: float, sms: int = H200_SMS,
                ctas_per_sm: int = 1) -> list[dict]:
    """Plot data from bench rows of op ``wave`` (dicts as ``Row.as_csv()`` / ``read_csv`` give).

    tiles_by_variant: {variant: {n: (block_m, block_n, block_k)}} for the variants whose tile is
    known; others (cublas) get measured values only. Sorted by (variant, n).
    """
    out = []
    for row in rows:
        if row["op"] != "wave":
            continue
        n = int(row["shape"].split("x")[0])
        ms = float(row["median_ms"])
        flops = 2.0 * n ** 3
        p = {"n": n, "variant": row["variant"], "block_m": None, "block_n": None, "block_k": None, "tiles": None,
             "waves": None, "median_ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "predicted_ms": None,
             "predicted_tflops": None}
        tile = tiles_by_variant.get(row["variant"], {}).get(n)
        if tile is not None:
            bm, bn, bk = tile
            pred = predicted_ms(n, n, n, bm, bn, peak_tflops, sms, ctas_per_sm, bk)
            p.update(block_m=bm, block_n=bn, block_k=bk, tiles=tiles(n, n, bm, bn),
                     waves=waves(n, n, bm, bn, sms, ctas_per_sm), predicted_ms=pred,
                     predicted_tflops=flops / (pred * 1e-3) / 1e12)
        out.append(p)
    out.sort(key=lambda p: (p["variant"], p["n"]))
    return out


def write_points(points: list[dict], path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=POINT_COLUMNS)
        w.writeheader()
        for p in points:
            w.writerow({k: ("" if p[k] is None else (f"{p[k]:.6g}" if isinstance(p[k], float) else p[k]))
                        for k in POINT_COLUMNS})
    return path


def plot(points: list[dict], path, title: str = "bf16 square GEMM: wave quantization") -> Path:
    """PNG: measured TFLOP/s per variant (solid), predicted (dashed) on the left axis; expected
    waves per tiled variant (steps) on the right axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not points:
        raise ValueError("wave.plot: no points")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 5))
    ax2 = ax.twinx()
    variants = sorted({p["variant"] for p in points})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, v in enumerate(variants):
        ps = sorted((p for p in points if p["variant"] == v), key=lambda p: p["n"])
        c = colors[i % len(colors)]
        ns = [p["n"] for p in ps]
        ax.plot(ns, [p["tflops"] for p in ps], "o-", color=c, label=f"{v} measured")
        known = [p for p in ps if p["waves"] is not None]
        if known:
            ax.plot([p["n"] for p in known], [p["predicted_tflops"] for p in known], "--", color=c, alpha=0.7,
                    label=f"{v} predicted (waves x full wave)")
            ax2.step([p["n"] for p in known], [p["waves"] for p in known], where="post", color=c, alpha=0.35,
                     linewidth=3, label=f"{v} waves")
    ax.set_xlabel("n (M = N = K)")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax2.set_ylabel("expected waves = ceil(tiles / (SMs x CTAs/SM))")
    ax2.set_ylim(0, max((p["waves"] or 0) for p in points) + 1)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower left", fontsize=8)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- the pinned launcher


def run_pinned(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: dict = PINNED) -> torch.Tensor:
    """``out = a @ b`` through gemm_triton's TMA persistent kernel with one fixed config (no autotuning).

    a (M, K), b (K, N), out (M, N): same 16-bit dtype, row-major, TMA-eligible (triton_kernels.tma_applies).
    Under TRITON_INTERPRET the config's tile runs in the interpreter (CPU tests, small tiles).
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype or out.dtype != a.dtype:
        raise ValueError(f"run_pinned: a, b, out must share one 16-bit dtype; got {a.dtype}, {b.dtype}, {out.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or tuple(out.shape) != (a.shape[0], b.shape[1]):
        raise ValueError(f"run_pinned: shapes a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}")
    if not (tk.tma_applies(a, b, out.dtype) and b.stride(1) == 1 and out.is_contiguous()):
        raise ValueError("run_pinned: a, b, out must be row-major with 16-byte aligned rows (TMA)")
    M, K = a.shape
    N = b.shape[1]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    sms = tk.num_sms(a.get_device())
    grid = (min(sms, tiles(M, N, bm, bn)),)
    # Unused pointer arguments (bias, scales) get `out`: their constexpr flags are off.
    tk._gemm_tma_persistent_kernel[grid](
        a_desc, b_desc, c_desc, c_desc, out, out, out, M, N, K, sms, 100 + IN_DTYPES.index(a.dtype),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config["GROUP_M"], B_KMAJOR=False, HAS_BIAS=False,
        HAS_SCALES=False, STORE_AUX=False, ACTIVATION=0, PRECISION="tf32",
        UPCAST=tk.INTERPRET and a.dtype == torch.bfloat16,
        num_stages=config["num_stages"], num_warps=config["num_warps"])
    return out


def chosen_tile(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int] | None:
    """(BLOCK_M, BLOCK_N, BLOCK_K) the autotuner of the kernel ``gemm(a, b)`` runs picked for the
    last call, or None when that cannot be read (interpreter, a Triton without ``best_config``)."""
    tuner = tk._tma if tk.tma_applies(a, b) else tk._tiled
    cfg = getattr(tuner, "best_config", None)
    if cfg is None or not hasattr(cfg, "kwargs"):
        return None
    kw = cfg.kwargs
    return kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]


# --------------------------------------------------------------------------- the suite


def run(r) -> None:
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    sizes = QUICK_SIZES if r.quick else SIZES
    tile_of: dict[str, dict[int, tuple[int, int, int]]] = {"gemm(auto)": {}, PINNED_NAME: {}}
    failures = []
    first_row = len(r.rows)
    for n in sizes:
        a = torch.randn(n, n, device="cuda", generator=g).to(dtype)
        b = torch.randn(n, n, device="cuda", generator=g).to(dtype)
        shape, cost = f"{n}x{n}x{n}", op.cost(n, n, n, dtype)
        out = torch.empty(n, n, device="cuda", dtype=dtype)
        r.status(f"wave {n}")
        # Device time from CUDA-graph replay: at these sizes a Triton launch spends more time on
        # the host (50-130 us on the H200's host) than the kernel runs, so eager timing shows the
        # host, not the waves (docs/tuning/gemm.md, "Wave suite: graph-replayed timing").
        base_ms = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        r.add("wave", "cublas", shape, dtype, base_ms, cost)
        ref = torch.matmul(a.float(), b.float())
        versions = {"gemm(auto)": lambda: op.gemm(a, b, out=out), PINNED_NAME: lambda: run_pinned(a, b, out)}
        for name, fn in versions.items():
            try:
                out.fill_(float("nan"))
                fn()
                if name == "gemm(auto)":
                    tile = chosen_tile(a, b)
                    if tile is not None:
                        tile_of[name][n] = tile
                else:
                    tile_of[name][n] = (PINNED["BLOCK_M"], PINNED["BLOCK_N"], PINNED["BLOCK_K"])
                check(f"wave {name} {n}", out, ref, dtype=dtype)
                ms = time_ms_graph(fn)
            except CheckError as e:
                failures.append(str(e))
                continue
            except Exception as e:  # noqa: BLE001 - one version failing to launch leaves the others' rows
                failures.append(f"wave {name} {n}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                r.log(f"[red]{failures[-1]}[/red]")
                continue
            r.add("wave", name, shape, dtype, ms, cost, baseline="cublas", baseline_ms=base_ms)
        del a, b, out, ref
    torch.cuda.empty_cache()

    peak = None
    if r.ceilings is not None:
        peak = r.ceilings.peak_tflops.get("bf16")
    peak = peak or 700.0
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    # Persistent kernels launch min(SMs, tiles) programs: one CTA per SM at a time.
    points = wave_points([row.as_csv() for row in r.rows[first_row:]], tile_of, peak, sms, ctas_per_sm=1)
    for p in points:
        if p["waves"] is not None:
            r.log(f"wave {p['variant']} n={p['n']}: tile {p['block_m']}x{p['block_n']}, {p['tiles']} tiles, "
                  f"{p['waves']} waves, predicted {p['predicted_ms']:.4f} ms, measured {p['median_ms']:.4f} ms")
    out_dir = getattr(r, "out_dir", None)
    if out_dir is not None and points:
        slug = device_slug(r.device)
        write_points(points, Path(out_dir) / f"{slug}-wave.csv")
        png = plot(points, Path(out_dir) / f"{slug}-wave.png",
                   title=f"bf16 square GEMM on {r.device or 'GPU'}: measured vs expected waves ({sms} SMs)")
        r.log(f"wave plot written to {png}")
    if failures:
        raise CheckError(f"{len(failures)} wave version(s) failed: " + "; ".join(failures))
