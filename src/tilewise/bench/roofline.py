"""The roofline picture: measured ceilings, one point per op and version from the bench CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ..runtime.device import Ceilings


def plot(rows: Sequence[Mapping[str, str]], ceilings: Ceilings, out: str | Path) -> Path:
    """Left: FLOP/s against arithmetic intensity (ops with FLOPs); right: share of the roofline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pts = [r for r in rows if r.get("gbps") and r.get("tflops") and float(r["tflops"]) > 0]
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
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
