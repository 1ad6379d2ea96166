"""Benchmark harness: check, time, relate to the roofline, print, append to CSV.

Every timed version is first checked against its reference on the same inputs (output poisoned
with NaN before the run). Times are medians of ``triton.testing.do_bench`` (device events, L2
flushed between runs). ``gbps`` and ``tflops`` come from the op's ``cost()``; ``roofline_pct`` is
the achieved rate over min(peak, intensity x copy bandwidth) with this device's measured ceilings.
"""

from __future__ import annotations

import csv
import io
import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .. import settings
from .._files import exclusive_lock, write_atomic
from ..cost import Cost

CSV_COLUMNS = ("op", "variant", "shape", "dtype", "median_ms", "gbps", "tflops", "roofline_pct",
               "baseline", "baseline_ms", "speedup", "device", "git_sha", "date")

# ||out - ref|| / ||ref|| allowed per dtype of the computation.
TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "tf32": 1e-3, "float16": 2e-3, "bfloat16": 1e-2,
             "float8_e4m3fn": 6e-2, "float8_e5m2": 1.2e-1}

_CEILING_KEY = {"float32": "fp32", "tf32": "tf32", "float16": "fp16", "bfloat16": "bf16",
                "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


class CheckError(AssertionError):
    """A version's output did not match its reference: it is not timed."""


class BenchFileError(ValueError):
    """A bench CSV, ceilings JSON or README that cannot be used as it is; the message names the file."""


def device_slug(device: str) -> str:
    """A device name as a file name: ``NVIDIA H200`` -> ``NVIDIA_H200`` (suites' extra tables and plots)."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in device).strip("_") or "device"


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out holds NaN/inf that ref does not."""
    import torch

    o, r = out.detach().double(), ref.detach().double()
    if o.shape != r.shape:
        raise CheckError(f"shape {tuple(o.shape)} != reference {tuple(r.shape)}")
    if not torch.equal(torch.isnan(o), torch.isnan(r)) or not torch.equal(torch.isinf(o), torch.isinf(r)):
        return math.inf
    finite = torch.isfinite(r)
    o, r = o[finite], r[finite]
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    return num / den if den else num


def check(name: str, out, ref, dtype=None, tol: float | None = None) -> float:
    """Raise ``CheckError`` unless ``out`` matches ``ref`` within the dtype's tolerance."""
    key = dtype_name(dtype if dtype is not None else out.dtype)
    tol = TOLERANCE.get(key, 1e-5) if tol is None else tol
    err = rel_error(out, ref)
    if not err <= tol:  # NaN fails too
        raise CheckError(f"{name}: relative error {err:.3g} > {tol:.1g} ({key})")
    return err


def time_ms(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median device time of ``fn()`` in ms (events, after warm-up, L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def balanced_orders(names: list) -> list[tuple]:
    """Orders for timing several versions by turns, each version at every position and right after every other
    one equally often: a Williams Latin square (with its mirror for an odd count; all six permutations of three),
    the rounds chained so that each starts with the version the round before ended with, which keeps the
    versions' successions balanced across rounds too (two versions: A B, B A, A B, B A)."""
    n = len(names)
    if n <= 1:
        return [tuple(names)]
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo if len(first) % 2 else hi)
        lo, hi = (lo + 1, hi) if len(first) % 2 == 0 else (lo, hi - 1)
    rows = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2:
        rows += [r[::-1] for r in rows]
    if n == 2:
        rows = rows * 2
    chained = [rows.pop(0)]
    while rows:
        nxt = next((r for r in rows if r[0] == chained[-1][-1]), rows[0])
        rows.remove(nxt)
        chained.append(nxt)
    return [tuple(names[i] for i in r) for r in chained]


def time_ms_rounds(fns: dict[str, Callable[[], object]], *, warmup_ms: float = 25,
                   rep_ms: float = 100) -> dict[str, float]:
    """``time_ms`` for several versions of one computation, by turns in ``balanced_orders``: each round
    ``rep_ms / rounds`` of calls a version (at least 10 ms), each version's median over its rounds. Timed one
    after the other, a version starts at the clock the one before left it: on the H100 the forward timed right
    after compiled FlexAttention read 3-8 % slower than when timed first (docs/tuning/attention.md, "The grid's
    order"). The first round warms each version up for ``warmup_ms``, the others for 5 ms."""
    orders = balanced_orders(list(fns))
    per = max(10.0, rep_ms / len(orders))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for i, order in enumerate(orders):
        for k in order:
            samples[k].append(time_ms(fns[k], warmup_ms=warmup_ms if i == 0 else 5, rep_ms=per))
    return {k: statistics.median(v) for k, v in samples.items()}


def graph_of(fn: Callable[[], object], calls: int):
    """``calls`` back-to-back ``fn()`` calls captured in one CUDA graph, after warm-up on a side
    stream (autotuning and lazy loading happen outside the capture); replayed once."""
    import torch

    fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_ms(graph, calls: int) -> float:
    """One replay of ``graph`` between events, in ms a call (``calls`` calls in the graph)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def time_ms_graph(fn: Callable[[], object], *, calls: int = 20, repeats: int = 15) -> float:
    """Median device time of one ``fn()`` in ms with the host out of the picture: ``calls``
    back-to-back calls captured in one CUDA graph (after warm-up on a side stream, so autotuning
    and lazy loading happen outside the capture), the graph replayed ``repeats`` times between
    events. For kernels shorter than their host launch path (small GEMMs: a planned gemm() call
    costs 10-20 us of host time on the H200's host, 50-230 us through Triton's own dispatch,
    more than a 512^3 GEMM's device time), where ``time_ms`` measures the host. No L2 flush
    between the calls: inputs stay hot, as in a training step; report it beside ``time_ms``, not
    instead of it. To compare versions, ``time_ms_graphs`` (interleaved) is fairer."""
    if calls < 1 or repeats < 1:
        raise ValueError(f"time_ms_graph: calls and repeats must be >= 1, got {calls}, {repeats}")
    graph = graph_of(fn, calls)
    samples = sorted(replay_ms(graph, calls) for _ in range(repeats))
    del graph
    return samples[len(samples) // 2]


def time_ms_graphs(fns: dict[str, Callable[[], object]], *, calls: int = 20, rounds: int = 7,
                   replays: int = 3, warmup_ms: float = 150.0) -> dict[str, float]:
    """``time_ms_graph`` for several versions of one computation, interleaved: each version's
    ``calls`` calls in one graph, the graphs replayed round-robin (``rounds`` rounds of
    ``replays`` replays each, the order reversed every other round), each version's median over
    its samples. A compute-bound GPU's clock drifts with its power draw over a run (the H200 at
    8192^3: cuBLAS timed first, on a cool GPU, measured 1.46 ms against 1.64-1.69 ms inside
    interleaved rounds), so versions timed one after the other are compared at different clocks;
    interleaved, every version sees the same drift. Before the rounds, all graphs are replayed
    round-robin for ``warmup_ms`` of wall time: a cool H200 runs 4096^3 bf16 at 1,980 MHz for the
    first ~20 ms and settles at ~1,500 MHz at its 700 W cap within ~0.2 s (175 -> 205 us a call),
    and rounds taken during that fall favour whichever version each round times first
    (docs/tuning/bench.md, "time_ms_graphs: interleaved rounds and warm-up")."""
    if calls < 1 or rounds < 1 or replays < 1 or warmup_ms < 0:
        raise ValueError(f"time_ms_graphs: calls, rounds and replays must be >= 1 and warmup_ms >= 0, got {calls}, "
                         f"{rounds}, {replays}, {warmup_ms}")
    import torch

    graphs = {k: graph_of(fn, calls) for k, fn in fns.items()}
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        for graph in graphs.values():
            graph.replay()
        torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in graphs}
    keys = list(graphs)
    for r in range(rounds):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            samples[k].extend(replay_ms(graphs[k], calls) for _ in range(replays))
    del graphs
    return {k: sorted(v)[len(v) // 2] for k, v in samples.items()}


def host_us_per_call(fn: Callable[[], object], *, calls: int = 2000, repeats: int = 9) -> float:
    """Median host time of one ``fn()`` call in us over back-to-back calls (no sync between them).

    For launch overhead: the kernels are tiny, so the host, not the GPU, sets the pace.
    """
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        samples.append((t1 - t0) / calls * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak CUDA memory fn() allocates beyond what was allocated before it (its result included
    while it lives: dropped before returning)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    del out
    return extra


def git_sha() -> str:
    sha = settings.git_sha()
    if sha:
        return sha
    try:
        here = Path(__file__).resolve().parent
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass
class Row:
    op: str
    variant: str
    shape: str
    dtype: str
    median_ms: float
    gbps: float | None = None
    tflops: float | None = None
    roofline_pct: float | None = None
    baseline: str = ""
    baseline_ms: float | None = None
    speedup: float | None = None
    device: str = ""
    git_sha: str = ""
    date: str = ""

    def as_csv(self) -> dict[str, str]:
        def f(v, digits):
            return "" if v is None else f"{v:.{digits}g}"

        return {"op": self.op, "variant": self.variant, "shape": self.shape, "dtype": self.dtype,
                "median_ms": f(self.median_ms, 6), "gbps": f(self.gbps, 6), "tflops": f(self.tflops, 6),
                "roofline_pct": f(self.roofline_pct, 4), "baseline": self.baseline,
                "baseline_ms": f(self.baseline_ms, 6), "speedup": f(self.speedup, 4),
                "device": self.device, "git_sha": self.git_sha, "date": self.date}


def make_row(op: str, variant: str, shape: str, dtype: str, ms: float, cost: Cost | None, ceilings=None,
             ceiling_dtype: str | None = None, baseline: str = "", baseline_ms: float | None = None,
             device: str = "", sha: str = "", date: str = "") -> Row:
    """A CSV row; rates from ``cost``, roofline share from ``ceilings`` (copy bw, peak of the dtype)."""
    gbps = tflops = pct = None
    if cost is not None and ms > 0:
        gbps = cost.bytes / (ms * 1e-3) / 1e9
        tflops = cost.flops / (ms * 1e-3) / 1e12
        if ceilings is not None:
            key = _CEILING_KEY.get(ceiling_dtype or dtype, "fp32")
            peak = ceilings.peak_tflops.get(key)
            floor_s = cost.bytes / (ceilings.copy_gbps * 1e9)
            if peak:
                floor_s = max(floor_s, cost.flops / (peak * 1e12))
            pct = 100.0 * floor_s / (ms * 1e-3)
    speedup = baseline_ms / ms if baseline_ms and ms > 0 else None
    return Row(op, variant, shape, dtype, ms, gbps, tflops, pct, baseline, baseline_ms, speedup,
               device, sha, date)


def append_csv(path: str | os.PathLike, rows: Iterable[Row]) -> Path:
    """Append rows to ``path`` (header written when the file is new; a different header is an error).

    All of one call's rows land, or none (an error while rendering them leaves the file as it was)."""
    path = Path(path)
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
    for r in rows:
        w.writerow(r.as_csv())
    path.parent.mkdir(parents=True, exist_ok=True)
    # Whole file rewritten to a temporary and renamed, under a lock on the directory. The rename makes a
    # kill mid-write harmless (O_APPEND can leave a torn last row) and readers never see half a run; the
    # lock keeps two runs appending at once from each renaming its own copy and losing the other's rows.
    # On a filesystem without flock the rows still land, unlocked (required=False).
    with exclusive_lock(path.parent, required=False):
        old = path.read_bytes() if path.exists() else b""
        if old.strip():
            header = next(csv.reader(io.StringIO(old.decode("utf-8", "replace"), newline="")), [])
            if tuple(header) != CSV_COLUMNS:
                raise BenchFileError(f"{path} has columns {header}, expected {list(CSV_COLUMNS)}")
            if not old.endswith(b"\n"):
                old += b"\r\n"  # csv's line end: the first new row must not join a hand-edited last line
        else:
            head = io.StringIO(newline="")
            csv.DictWriter(head, fieldnames=CSV_COLUMNS).writeheader()
            old = head.getvalue().encode()
        write_atomic(path, old + buf.getvalue().encode())
    return path


_NUMERIC = ("median_ms", "gbps", "tflops", "roofline_pct", "baseline_ms", "speedup")


def read_csv(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a bench CSV; ``BenchFileError`` naming the file (and line) if it is not one:
    unreadable, empty, not text, a column of ``CSV_COLUMNS`` missing, a row of the wrong length, or a
    numeric column that is not a finite number (``median_ms`` may not be empty)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise BenchFileError(f"{path}: not a bench CSV (not UTF-8 text)") from None
    except OSError as e:
        raise BenchFileError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not text.strip():
        raise BenchFileError(f"{path}: empty file, expected a bench CSV (header {','.join(CSV_COLUMNS)})")
    rows = []
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        missing = [c for c in CSV_COLUMNS if c not in header]
        if missing:
            raise BenchFileError(f"{path}: not a bench CSV: column(s) {', '.join(missing)} missing "
                                 f"(header line: {','.join(header)[:200]!r})")
        for r in reader:
            where = f"{path}, line {reader.line_num}"
            if None in r or None in r.values():
                raise BenchFileError(f"{where}: {'more' if None in r else 'fewer'} fields than the header's "
                                     f"{len(header)}")
            for k in _NUMERIC:
                v = r[k]
                if not v and k != "median_ms":
                    continue
                try:
                    ok = math.isfinite(float(v))
                except ValueError:
                    ok = False
                if not ok:
                    raise BenchFileError(f"{where}: {k} is {v!r}, expected a finite number")
            rows.append(r)
    except csv.Error as e:
        raise BenchFileError(f"{path}: not a CSV ({e})") from None
    return rows


class Runner:
    """Collects rows for one bench run (one device, git sha and timestamp for every row).

    With ``csv_path`` the rows also reach that CSV as the run goes: pending rows are appended at
    most ``flush_s`` seconds after they were measured and at every ``flush()``, so a run stopped by
    a time limit keeps what it measured (a suite can take minutes)."""

    def __init__(self, ceilings=None, device: str = "", quick: bool = False, console=None,
                 out_dir: str | os.PathLike | None = None, csv_path: str | os.PathLike | None = None,
                 flush_s: float = 5.0):
        self.ceilings = ceilings
        self.device = device
        self.quick = quick
        # Where the CSV goes (None: not known, e.g. a runner built in a test); suites that write
        # extra files (a plot, its data) put them beside the CSV.
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.csv_path = Path(csv_path) if csv_path is not None else None
        self.flush_s = flush_s
        self.sha = git_sha()
        self.date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.rows: list[Row] = []
        self.written = 0  # rows[:written] are in csv_path
        self._flushed_at = time.monotonic()
        self.console = console
        self.status: Callable[[str], None] = lambda s: None

    def add(self, op: str, variant: str, shape: str, dtype, ms: float, cost: Cost | None = None, *,
            baseline: str = "", baseline_ms: float | None = None, ceiling_dtype: str | None = None) -> Row:
        row = make_row(op, variant, shape, dtype_name(dtype), ms, cost, self.ceilings, ceiling_dtype,
                       baseline, baseline_ms, self.device, self.sha, self.date)
        self.rows.append(row)
        if time.monotonic() - self._flushed_at >= self.flush_s:
            self.flush()
        return row

    def flush(self) -> Path | None:
        """Append the rows not yet in ``csv_path`` (nothing without one)."""
        self._flushed_at = time.monotonic()
        if self.csv_path is None or self.written == len(self.rows):
            return self.csv_path
        append_csv(self.csv_path, self.rows[self.written:])
        self.written = len(self.rows)
        return self.csv_path

    def log(self, msg: str) -> None:
        if self.console is not None:
            self.console.print(msg)
