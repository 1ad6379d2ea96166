"""The roofline picture: measured ceilings, one point per op and version from the bench CSV."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

from ..runtime.device import Ceilings
from .._files import write_atomic
from .harness import BenchFileError


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def load_ceilings(path: str | Path) -> Ceilings:
    """``runtime.device.load_ceilings`` with its input checked: ``BenchFileError`` naming the file
    when it is unreadable, not JSON, not an object, lacks a key, or holds a non-positive ceiling."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise BenchFileError(f"{path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise BenchFileError(f"{path}: not a ceilings JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise BenchFileError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise BenchFileError(f"{path}: expected a JSON object of ceilings, found {type(data).__name__}")
    fields = dataclasses.fields(Ceilings)
    required = [f.name for f in fields if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise BenchFileError(f"{path}: not a ceilings JSON: key(s) {', '.join(missing)} missing")
    if not _positive(data["copy_gbps"]):
        raise BenchFileError(f"{path}: copy_gbps is {data['copy_gbps']!r}, expected a positive number")
    peaks = data.get("peak_tflops", {})
    if not isinstance(peaks, dict) or not all(isinstance(k, str) and _positive(v) for k, v in peaks.items()):
        raise BenchFileError(f"{path}: peak_tflops is {peaks!r}, expected {{dtype: positive TFLOP/s}}")
    return Ceilings(**{f.name: data[f.name] for f in fields if f.name in data})  # unknown keys ignored


def plot(rows: Sequence[Mapping[str, str]], ceilings: Ceilings, out: str | Path) -> Path:
    """Left: FLOP/s against arithmetic intensity (ops with FLOPs); right: share of the roofline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pts = [r for r in rows if r.get("gbps") and r.get("tflops") and float(r["tflops"]) > 0 and float(r["gbps"]) > 0]
    shares = [r for r in rows if r.get("roofline_pct")]
    height = max(6.0, 0.22 * len(shares) + 1.5)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(18, height), gridspec_kw={"width_ratios": [3, 2]})

    bw = ceilings.copy_gbps * 1e9
    x = np.logspace(-2, 4, 400)
    for dt, peak in sorted(ceilings.peak_tflops.items(), key=lambda kv: kv[1]):
        y = np.minimum(peak * 1e12, x * bw) / 1e12
        ax.plot(x, y, lw=1.2, label=f"{dt}: {peak:.0f} TFLOP/s, ridge {peak * 1e12 / bw:.0f} FLOP/B")
    markers = "osD^v<>pP*Xh"
    for i, r in enumerate(pts):
        intensity = float(r["tflops"]) * 1e12 / (float(r["gbps"]) * 1e9)
        ax.scatter(intensity, float(r["tflops"]), marker=markers[i % len(markers)], s=50, zorder=3,
                   label=f"{r['op']} {r['variant']} {r['dtype']} {r['shape'][:28]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{ceilings.device}: copy {ceilings.copy_gbps:.0f} GB/s (measured)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", ncol=2)

    labels = [f"{r['op']} {r['variant']} {r['dtype']} {r['shape'][:32]}" for r in shares]
    vals = [float(r["roofline_pct"]) for r in shares]
    bx.barh(range(len(vals)), vals, color=["tab:green" if v >= 90 else "tab:orange" for v in vals])
    bx.set_yticks(range(len(vals)), labels, fontsize=7)
    bx.invert_yaxis()
    bx.axvline(100, color="k", lw=0.8)
    bx.set_xlabel("% of roofline (measured ceilings)")
    bx.set_title("share of the attainable rate")
    return save_figure(fig, out, dpi=120)


def save_figure(fig, out: str | Path, dpi: int) -> Path:
    """Lay out, render in memory and write ``fig`` atomically to ``out`` (format from its suffix), then close it:
    a failure keeps the previous picture."""
    import matplotlib.pyplot as plt

    out = Path(out)
    buf = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buf, format=out.suffix[1:].lower() or "png", dpi=dpi)
    finally:
        plt.close(fig)
    return write_atomic(out, buf.getvalue())
