"""The open issues' speed targets read from the bench CSVs: issue 30's attention grid against SDPA's cuDNN backend
(a table and a heat map), then the other targets of issues 30 and 31 (packed sequences, the sliding window, host
time, the Llama training step).

The grid: (H, Hkv) in {(16, 16), (32, 8)}, D in {64, 128}, S in {1024 .. 16384} with B x S = 16384, causal and not,
forward and forward + backward. A cell is ``flash_attention`` (the default route, what a user calls) against the
``sdpa_cudnn`` row of the same run (git sha and date), from the newest run that measured both; a point no run
measured stays empty. Targets: forward >= 1.05x from S 2048 and >= 1.0x at S 1024; forward + backward >= 1.0x.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from .report import _md, replace_section
from .roofline import save_figure

TARGETS_START = "<!-- targets:start -->"
TARGETS_END = "<!-- targets:end -->"

TOKENS = 16384  # B x S at every grid point
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
HEADS = ((16, 16), (32, 8))
HEAD_DIMS = (64, 128)
PASSES = (("attention_fwd", "fwd"), ("attention_fwd_bwd", "fwd+bwd"))
OURS, CUDNN = "flash_attention", "sdpa_cudnn"


def target(op: str, seq: int) -> float:
    """The ratio issue 30 asks of a grid point (ours / cuDNN in speed)."""
    return 1.05 if op == "attention_fwd" and seq >= 2048 else 1.0


def parse_shape(shape: str) -> dict | None:
    """``B=4,H=32,Hkv=8,S=4096,D=64,causal`` -> its fields (Hkv defaults to H); None for a shape with anything
    else (a bias, a window, packed documents): those rows are not grid points."""
    out: dict = {"causal": False}
    for part in shape.split(","):
        key, eq, val = part.partition("=")
        if not eq:
            if part != "causal" or out["causal"]:
                return None
            out["causal"] = True
        elif key in ("B", "H", "Hkv", "S", "D") and key not in out and val.isdigit():
            out[key] = int(val)
        else:
            return None
    if not all(k in out for k in ("B", "H", "S", "D")):
        return None
    out.setdefault("Hkv", out["H"])
    return out


@dataclass(frozen=True)
class Cell:
    ratio: float  # cuDNN's time / ours: above 1 is faster than cuDNN
    ours_ms: float
    cudnn_ms: float
    git_sha: str
    date: str


# (device, dtype) -> {(op, (H, Hkv), D, causal, S): Cell}
Grid = dict[tuple[str, str], dict[tuple, Cell]]


def same_run_pairs(rows: list[Mapping[str, str]], op: str, variant: str, ref_op: str, ref_variant: str,
                   ref_shape=None):
    """(ours, reference) for each row of ``op`` / ``variant`` whose run (device, git sha, date) also timed the
    reference (``ref_op`` / ``ref_variant`` at ``ref_shape(shape)``, default the same shape) in its dtype; both
    times positive."""
    index = {(r["device"], r["op"], r["variant"], r["shape"], r["dtype"], r["git_sha"], r["date"]): r for r in rows
             if r["op"] == ref_op and r["variant"] == ref_variant}
    for r in rows:
        if r["op"] != op or r["variant"] != variant:
            continue
        shape = ref_shape(r["shape"]) if ref_shape else r["shape"]
        ref = index.get((r["device"], ref_op, ref_variant, shape, r["dtype"], r["git_sha"], r["date"]))
        if ref is not None and float(r["median_ms"]) > 0 and float(ref["median_ms"]) > 0:
            yield r, ref


def grid(rows: Iterable[Mapping[str, str]]) -> Grid:
    """Every grid point's newest measured pair, per device and dtype."""
    rows = list(rows)
    out: Grid = {}
    for op, _ in PASSES:
        for r, ref in same_run_pairs(rows, op, OURS, op, CUDNN):
            s = parse_shape(r["shape"])
            if s is None or s["B"] * s["S"] != TOKENS or (s["H"], s["Hkv"]) not in HEADS \
                    or s["D"] not in HEAD_DIMS or s["S"] not in SEQ_LENS:
                continue
            key = (op, (s["H"], s["Hkv"]), s["D"], s["causal"], s["S"])
            cells = out.setdefault((r["device"], r["dtype"]), {})
            if key not in cells or r["date"] >= cells[key].date:
                ours_ms, cudnn_ms = float(r["median_ms"]), float(ref["median_ms"])
                cells[key] = Cell(cudnn_ms / ours_ms, ours_ms, cudnn_ms, r["git_sha"], r["date"])
    return out


def _no_window(shape: str) -> str:
    return ",".join(p for p in shape.split(",") if not p.startswith("window="))


@dataclass(frozen=True)
class OtherTarget:
    """A speed target of an issue: our row against a reference row of the same run and device."""
    name: str
    op: str
    variant: str
    ref_op: str
    ref_variant: str
    measure: str  # "speed": ref / ours >= goal; "share": ours / ref <= goal; "excess_us": ours - ref <= goal
    goal: float
    ref_shape: object = None  # our shape -> the reference's (default: the same shape)
    issue: int = 30

    def value(self, ours_ms: float, ref_ms: float) -> float:
        if self.measure == "speed":
            return ref_ms / ours_ms
        if self.measure == "share":
            return ours_ms / ref_ms
        return (ours_ms - ref_ms) * 1e3

    def met(self, value: float) -> bool:
        return value >= self.goal if self.measure == "speed" else value <= self.goal


OTHER_TARGETS = (
    OtherTarget("packed forward x Flex (document mask)", "attention_varlen_fwd", "flash_attention_varlen",
                "attention_varlen_fwd", "flex_attention", "speed", 1.0),
    OtherTarget("packed forward + backward x Flex", "attention_varlen_fwd_bwd", "flash_attention_varlen",
                "attention_varlen_fwd_bwd", "flex_attention", "speed", 1.0),
    OtherTarget("packed forward x our dense call on the padded batch", "attention_varlen_fwd",
                "flash_attention_varlen", "attention_varlen_fwd", "flash_attention[padded]", "speed", 1.0),
    OtherTarget("packed forward + backward x padded dense", "attention_varlen_fwd_bwd", "flash_attention_varlen",
                "attention_varlen_fwd_bwd", "flash_attention[padded]", "speed", 1.0),
    OtherTarget("sliding window, forward: share of full causal's time", "attention_window_fwd", "flash_attention",
                "attention_window_fwd", "flash_attention[full causal]", "share", 0.15, _no_window),
    OtherTarget("sliding window, forward + backward: share of full causal's", "attention_window_fwd_bwd",
                "flash_attention", "attention_window_fwd_bwd", "flash_attention[full causal]", "share", 0.15,
                _no_window),
    OtherTarget("host time beyond the GPU time, eager forward + backward (us)", "attention_host_fwd_bwd",
                "flash_attention", "attention_graph_fwd_bwd", "flash_attention", "excess_us", 40.0),
    *(OtherTarget(f"Llama-3.2-1B training step, {ours} x {name}", "llama_train_step", ours, "llama_train_step", ref,
                  "speed", goal, issue=31)
      for ours in ("hf_tilewise", "hf_tilewise_adamw")
      for ref, name, goal in (("hf_sdpa", "HF default (SDPA)", 1.2), ("hf_liger", "HF + Liger", 1.05))),
)


@dataclass(frozen=True)
class OtherCell:
    target: OtherTarget
    shape: str
    dtype: str
    value: float
    git_sha: str
    date: str


def other_targets(rows: Iterable[Mapping[str, str]]) -> dict[str, list[OtherCell]]:
    """Per device, each of ``OTHER_TARGETS`` at each shape and dtype it was measured at: the newest run with both
    rows."""
    rows = list(rows)
    best: dict[tuple, OtherCell] = {}
    for t in OTHER_TARGETS:
        for r, ref in same_run_pairs(rows, t.op, t.variant, t.ref_op, t.ref_variant, t.ref_shape):
            key = (r["device"], t.name, r["shape"], r["dtype"])
            if key not in best or r["date"] >= best[key].date:
                value = t.value(float(r["median_ms"]), float(ref["median_ms"]))
                best[key] = OtherCell(t, r["shape"], r["dtype"], value, r["git_sha"], r["date"])
    out: dict[str, list[OtherCell]] = {}
    order = {t.name: i for i, t in enumerate(OTHER_TARGETS)}
    for (device, *_), cell in sorted(best.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2:])):
        out.setdefault(device, []).append(cell)
    return out


def _other_markdown(others: Mapping[str, list[OtherCell]]) -> list[str]:
    parts = []
    for (device, issue) in sorted({(d, c.target.issue) for d, cells in others.items() for c in cells}):
        title = "other speed targets" if issue == 30 else "speed targets"
        lines = [f"**{_md(device)}: issue {issue}'s {title}** (bold: not met)", "",
                 "| target | shape | dtype | value | goal | run |", "|---|---|---|---:|---|---|"]
        for c in (c for c in others[device] if c.target.issue == issue):
            t = c.target
            val = f"{c.value:.1f}" if t.measure == "excess_us" else f"{c.value:.3f}"
            goal = f"{'at least' if t.measure == 'speed' else 'at most'} {t.goal:g}"
            shown = val if t.met(c.value) else f"**{val}**"
            lines.append(f"| {_md(t.name)} | {_md(c.shape)} | {_md(c.dtype)} | {shown} | {_md(goal)} | "
                         f"{_md(c.git_sha[:7])}, {_md(c.date[:10])} |")
        parts.append("\n".join(lines))
    return parts


def _row_keys():
    for op, label in PASSES:
        for heads in HEADS:
            for d in HEAD_DIMS:
                for causal in (False, True):
                    yield op, label, heads, d, causal


def _heads(heads: tuple[int, int]) -> str:
    return f"{heads[0]}" if heads[0] == heads[1] else f"{heads[0]} / {heads[1]}"


def met(cells: Mapping[tuple, Cell], op: str) -> tuple[int, int]:
    """(points at or above target, points measured) for one pass."""
    mine = [(k, c) for k, c in cells.items() if k[0] == op]
    return sum(c.ratio >= target(op, k[4]) for k, c in mine), len(mine)


def markdown(g: Grid, others: Mapping[str, list[OtherCell]] | None = None) -> str:
    """One table per device and dtype: ours / cuDNN at each point, under target in bold, unmeasured as '-'; then,
    per device, the other targets' newest values (``other_targets``)."""
    if not g and not others:
        return "No grid rows (`flash_attention` and `sdpa_cudnn` of one run) in the bench CSVs yet."
    parts = []
    for (device, dtype), cells in sorted(g.items()):
        lines = [f"**{_md(device)}, {_md(dtype)}** (x cuDNN; bold: under target)", "",
                 "| pass | H / Hkv | D | causal | " + " | ".join(f"S {s}" for s in SEQ_LENS) + " |",
                 "|---|---|---|---|" + "---:|" * len(SEQ_LENS)]
        for op, label, heads, d, causal in _row_keys():
            vals = []
            for s in SEQ_LENS:
                c = cells.get((op, heads, d, causal, s))
                vals.append("-" if c is None else (f"{c.ratio:.3f}" if c.ratio >= target(op, s)
                                                   else f"**{c.ratio:.3f}**"))
            lines.append(f"| {label} | {_heads(heads)} | {d} | {'yes' if causal else 'no'} | " + " | ".join(vals)
                         + " |")
        fwd, bwd = met(cells, "attention_fwd"), met(cells, "attention_fwd_bwd")
        shas = sorted({c.git_sha[:7] for c in cells.values()})
        dates = sorted({c.date[:10] for c in cells.values()})
        lines += ["", _md(f"At target: forward {fwd[0]} of {fwd[1]} measured points, forward + backward {bwd[0]} "
                          f"of {bwd[1]}. Commits {', '.join(shas)}; run {', '.join(dates)}.")]
        parts.append("\n".join(lines))
    parts += _other_markdown(others or {})
    return "\n\n".join(parts) + "\n\nGenerated by `tilewise report --targets --readme README.md`."


def update_readme(readme: str | Path, g: Grid, others: Mapping[str, list[OtherCell]] | None = None) -> bool:
    """Rewrite the README's targets section (its own markers); whether the file changed."""
    return replace_section(readme, TARGETS_START, TARGETS_END, markdown(g, others))


def plot(g: Grid, out: str | Path) -> Path:
    """A heat map a device and dtype (rows: pass, heads, D, causal; columns: S), green at or above target and
    red under it; the ratio written in each cell, an empty cell where no run measured the point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    if not g:
        raise ValueError("no grid rows to plot: the CSVs hold no flash_attention / sdpa_cudnn pair of one run")
    keys = list(_row_keys())
    cols = min(2, len(g))
    nrows = -(-len(g) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.4 * cols, (0.36 * len(keys) + 1.4) * nrows), squeeze=False)
    for ax in axes.flat[len(g):]:
        ax.axis("off")
    for ax, ((device, dtype), cells) in zip(axes.flat, sorted(g.items())):
        state = np.full((len(keys), len(SEQ_LENS)), np.nan)
        for i, (op, _, heads, d, causal) in enumerate(keys):
            for j, s in enumerate(SEQ_LENS):
                c = cells.get((op, heads, d, causal, s))
                if c is not None:
                    state[i, j] = 1.0 if c.ratio >= target(op, s) else 0.0
                    ax.text(j, i, f"{c.ratio:.3f}", ha="center", va="center", fontsize=8)
        ax.imshow(np.ma.masked_invalid(state), cmap=ListedColormap(["#f4a6a6", "#a6dba0"]), vmin=0, vmax=1,
                  aspect="auto")
        ax.set_xticks(range(len(SEQ_LENS)), [f"S {s}" for s in SEQ_LENS], fontsize=8)
        ax.set_yticks(range(len(keys)), [f"{label} H {_heads(h)} D {d}{' causal' if c else ''}"
                                         for _, label, h, d, c in keys], fontsize=8)
        fwd, bwd = met(cells, "attention_fwd"), met(cells, "attention_fwd_bwd")
        dates = sorted({c.date[:10] for c in cells.values()})
        runs = dates[0] if len(dates) == 1 else f"{dates[0]} .. {dates[-1]}"
        ax.set_title(f"{device}, {dtype}: x cuDNN (runs {runs})\n"
                     f"at target: fwd {fwd[0]}/{fwd[1]}, fwd+bwd {bwd[0]}/{bwd[1]}", fontsize=9)
        ax.axhline(len(keys) / 2 - 0.5, color="k", lw=1)
    return save_figure(fig, out, dpi=110)
