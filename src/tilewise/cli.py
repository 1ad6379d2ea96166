"""``tilewise info | bench | roofline | report | check | verify-status | warmup | train | predict | evaluate``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

DEFAULT_RESULTS = Path("bench") / "results"


def _console() -> Console:
    return Console(highlight=False)


def _no_gpu_reason() -> str | None:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a dependency
        return f"PyTorch is not importable ({e})"
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return f"no CUDA GPU is visible to PyTorch {torch.__version__} ({build})"
    return None


def _gpu_info(con: Console, without: str):
    """The GPU's ``device_info()``; None when there is none, after saying why and, in ``without``,
    what the command does not do then (a missing GPU is not an error: the exit status stays 0)."""
    reason = _no_gpu_reason()
    if reason:
        con.print(f"No GPU: {reason}. {without}")
        return None
    from .runtime import device as dev

    return dev.device_info()


# --------------------------------------------------------------------------- info


def cmd_info(args) -> int:
    con = _console()
    from .runtime import cuda as rt

    try:
        nv = "%d.%d" % rt.nvrtc_version()
    except Exception as e:
        nv = f"unavailable ({e})"
    con.print(f"tilewise: NVRTC {nv}; kernel cache {rt.cache_dir()}")
    info = _gpu_info(con, "Device properties and measured ceilings need a CUDA GPU; kernels can still be "
                          "compiled for one with `tilewise check --arch sm_90`.")
    if info is None:
        return 0
    from .runtime import device as dev

    with con.status("measuring ceilings (copy bandwidth, cuBLAS GEMM per dtype)...") as st:
        c = dev.ceilings(remeasure=args.remeasure, progress=lambda s: st.update(f"measuring {s}..."))

    t = Table(title=f"{info.name} (cuda:{info.index}), compute capability {info.compute_capability}, "
                    f"driver {info.driver}, PyTorch {info.torch}")
    t.add_column("property")
    t.add_column("value", justify="right")
    t.add_column("note")
    t.add_row("SMs", str(info.sms), f"{info.max_threads_per_sm} threads/SM")
    t.add_row("SM clock", f"{info.sm_clock_mhz:.0f} MHz" if info.sm_clock_mhz else "?", "max")
    t.add_row("registers / SM", f"{info.regs_per_sm}", "32-bit")
    t.add_row("shared memory / SM", f"{info.smem_per_sm_kib:.0f} KiB", "")
    t.add_row("shared memory / block", f"{info.smem_per_block_optin_kib:.0f} KiB", "opt-in maximum")
    t.add_row("L2 cache", f"{info.l2_mib:.0f} MiB", "")
    t.add_row("device memory", f"{info.memory_gib:.1f} GiB", "")
    theo = info.theoretical_bandwidth_gbps
    t.add_row("memory bandwidth (copy)", f"{c.copy_gbps:,.0f} GB/s",
              f"measured, read + write; {theo:,.0f} GB/s from clock x bus" if theo else "measured")
    for d in dev.CEILING_DTYPES:
        if d in c.peak_tflops:
            t.add_row(f"{d} peak (cuBLAS)", f"{c.peak_tflops[d]:,.1f} TFLOP/s", f"ridge {c.ridge(d):.0f} FLOP/B")
    t.caption = f"ceilings measured {c.measured_at}; `tilewise info --remeasure` measures again"
    con.print(t)
    return 0


# --------------------------------------------------------------------------- bench


def cmd_bench(args) -> int:
    con = _console()
    from .bench import suites

    names = args.ops or list(suites.SUITES)
    unknown = [n for n in names if n not in suites.SUITES]
    if unknown:
        con.print(f"unknown op(s): {', '.join(unknown)}; available: {', '.join(suites.SUITES)}")
        return 2
    if args.list:
        for n in suites.SUITES:
            con.print(n)
        return 0
    info = _gpu_info(con, "Timings need a CUDA GPU, so nothing was measured. The CPU test suite (`pytest`) "
                          "checks the references and compiles every kernel.")
    if info is None:
        return 0

    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from . import _startup
    from .bench import harness, report
    from .runtime import device as dev

    with con.status("ceilings..."):
        ceil = dev.ceilings()
    out_dir = Path(args.out)
    # rows reach the CSV as they are measured: a run stopped by a time limit keeps them
    runner = harness.Runner(ceilings=ceil, device=info.name, quick=args.quick, console=con,
                            out_dir=out_dir, csv_path=out_dir / f"{info.slug}.csv")
    out_dir.mkdir(parents=True, exist_ok=True)
    dev.save_ceilings(ceil, out_dir / f"{info.slug}-ceilings.json")
    failed: list[str] = []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=con) as prog:
        task = prog.add_task("bench", total=len(names))
        steps: list[tuple[float, str]] = []  # (start, what): where a long suite spends its time

        def status(what: str) -> None:
            _startup.raise_if_interrupted()
            steps.append((time.perf_counter(), what))
            prog.update(task, description=what)

        runner.status = status
        for n in names:
            prog.update(task, description=n)
            start, rows = time.perf_counter(), len(runner.rows)
            steps.clear()
            try:
                suites.get(n).run(runner)
            except harness.CheckError as e:
                failed.append(f"{n}: {e}")
                con.print(f"[red]check failed, not timed[/red]: {e}")
            runner.flush()
            end = time.perf_counter()
            con.print(f"{n}: {len(runner.rows) - rows} rows in {end - start:.1f} s")
            if end - start > 20 and steps:
                spans = sorted(((b - a, what) for (a, what), (b, _) in zip(steps, steps[1:] + [(end, "")])),
                               reverse=True)[:3]
                con.print("  longest steps: " + "; ".join(f"{what} {dt:.1f} s" for dt, what in spans))
            prog.advance(task)
    con.print(report.rich_table([r.as_csv() for r in runner.rows],
                                title=f"{info.name}, {'quick' if args.quick else 'full'} run {runner.date}"))
    path = runner.flush()
    con.print(f"{len(runner.rows)} rows appended to {path}")
    if failed:
        con.print(f"[red]{len(failed)} suite(s) failed their checks[/red]")
        return 1
    return 0


# --------------------------------------------------------------------------- roofline / report


def _results_dirs() -> list[Path]:
    """Where results are looked for: ./bench/results, then this checkout's (when tilewise runs from one)."""
    from .verify import repo_root

    dirs = [(Path.cwd() / DEFAULT_RESULTS).resolve()]
    root = repo_root()
    if root is not None and (root / DEFAULT_RESULTS).resolve() not in dirs:
        dirs.append((root / DEFAULT_RESULTS).resolve())
    return dirs


def _device_csvs(path: str | None) -> list[Path]:
    """``--csv`` if given, else every <device>.csv of the first results folder that has one, oldest first."""
    if path:
        return [Path(path)]
    dirs = _results_dirs()
    for d in dirs:
        # <device>.csv files only: suites write extra tables beside it (e.g. <device>-wave.csv).
        found = sorted((p for p in d.glob("*.csv") if "-" not in p.stem), key=lambda p: p.stat().st_mtime)
        if found:
            return found
    raise SystemExit(f"no bench CSV (<device>.csv) in {' or '.join(map(str, dirs))}; run `tilewise bench` "
                     f"first or pass --csv")


def _pick_csv(path: str | None) -> Path:
    return _device_csvs(path)[-1]  # the newest


def _bench_file_error(cmd: str, e: Exception) -> int:
    """A bad input or an unwritable output: one line on stderr naming the file, no traceback."""
    if isinstance(e, OSError) and e.filename:
        e = f"{e.filename}: {e.strerror or e}"
    print(f"tilewise {cmd}: error: {e}", file=sys.stderr)
    return 1


def cmd_roofline(args) -> int:
    from .bench import harness, report, roofline

    csv_path = _pick_csv(args.csv)
    ceil_path = Path(args.ceilings) if args.ceilings else csv_path.with_name(csv_path.stem + "-ceilings.json")
    if not ceil_path.is_file():
        raise SystemExit(f"no ceilings file {ceil_path}; `tilewise bench` writes it beside the CSV")
    try:
        rows = report.best_of_ours(report.latest_run(harness.read_csv(csv_path)))
        out = roofline.plot(rows, roofline.load_ceilings(ceil_path), args.out or csv_path.with_suffix(".png"))
    except (harness.BenchFileError, OSError) as e:
        return _bench_file_error("roofline", e)
    _console().print(f"roofline written to {out}")
    return 0


def _report_targets(args) -> int:
    from .bench import harness, targets

    try:
        rows = [r for p in _device_csvs(args.csv) for r in harness.read_csv(p)]
        g, others = targets.grid(rows), targets.other_targets(rows)
        changed = targets.update_readme(args.readme, g, others) if args.readme else None
        png = targets.plot(g, args.png) if args.png and g else None
    except (harness.BenchFileError, OSError) as e:
        return _bench_file_error("report", e)
    _said(args.readme, changed, lambda: targets.markdown(g, others))
    if png is not None:
        _console().print(f"attention grid written to {png}")
    elif args.png:
        _console().print("no attention grid rows: no picture written")
    return 0


def cmd_report(args) -> int:
    from .bench import harness, report

    if args.targets:
        return _report_targets(args)
    if args.png:
        raise SystemExit("report: --png draws the attention grid; use it with --targets")
    try:
        every = harness.read_csv(_pick_csv(args.csv))
        rows = report.latest_run(every)
        if not args.all:
            rows = report.best_of_ours(rows)
        rows = report.with_readme_baselines(rows, every)
        changed = report.update_readme(args.readme, rows) if args.readme else None
    except (harness.BenchFileError, OSError) as e:
        return _bench_file_error("report", e)
    _said(args.readme, changed, lambda: report.markdown_table(rows))
    return 0


def _said(readme: str | None, changed: bool | None, table) -> None:
    """What a report did: whether it changed the README it was given, else its table on stdout."""
    if readme:
        _console().print(f"{readme}: {'updated' if changed else 'already up to date'}")
    else:
        print(table())


def _check_table(title: str) -> Table:
    """The check's table: numbers never wrap (short headers, so they fit 80 columns); a long kernel
    name folds onto more lines instead of squeezing them."""
    t = Table(title=title)
    t.add_column("kernel", overflow="fold", ratio=1)
    for c in ("regs", "smem B", "stack B", "spill st/ld B"):
        t.add_column(c, justify="right", no_wrap=True, min_width=len(c))
    return t


TUNED_ARCH = "sm_90"  # the architecture whose register budgets the kernels' tiles were chosen for


def cmd_check(args) -> int:
    """Compile every .cu in the package for an architecture; report resources; fail on spills."""
    from .runtime import cuda as rt

    con = _console()
    t = _check_table(f"kernels compiled for {args.arch} (NVRTC {'%d.%d' % rt.nvrtc_version()})")
    bad = []
    try:
        res = rt.check_package(args.arch, jobs=args.jobs)
    except rt.CompileError as e:
        con.print(f"[red]{e}[/red]")
        return 1
    for r in res:
        t.add_row(r.name, str(r.registers), str(r.shared_bytes), str(r.stack_bytes),
                  f"{r.spill_store_bytes}/{r.spill_load_bytes}")
        if r.spills:
            bad.append(r.name)
    con.print(t)
    for src, want in rt.arch_only_sources(args.arch).items():
        con.print(f"skipped {src.relative_to(rt.OPS_DIR)}: needs {want}")
    if bad and args.arch.rstrip("a") != TUNED_ARCH:  # register budgets were set for the H100 / H200
        con.print(f"[yellow]spills in: {', '.join(bad)} (tiles are tuned for {TUNED_ARCH}; a report, not a "
                  f"failure, for {args.arch})[/yellow]")
    elif bad:
        con.print(f"[red]spills in: {', '.join(bad)}[/red]")
        return 1
    return 0


def cmd_verify_status(args) -> int:
    """Whether the working tree's GPU sources are the ones the last GPU run verified."""
    from . import verify

    code, message = verify.status(Path(args.record) if args.record else None)
    print(message)
    return code


def cmd_warmup(args) -> int:
    """Compile what the chosen op families and workloads need into the kernel caches (warmup.py)."""
    from . import warmup

    con = _console()
    try:
        tasks = warmup.select(args.ops, args.workload)
        if args.jobs is not None and args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    except ValueError as e:
        print(f"tilewise warmup: error: {e}", file=sys.stderr)
        return 2
    if args.list:
        warmup.list_tasks(con)
        return 0
    reason = _no_gpu_reason()
    if reason:  # nothing to warm: the kernels compile by running, on the GPU they are built for
        print(f"tilewise warmup: No GPU: {reason}. Warming the kernel caches runs each kernel once, which "
              f"needs a CUDA GPU (`tilewise check --arch sm_90` compiles the CUDA C sources without one).",
              file=sys.stderr)
        return 2
    return warmup.run(tasks, args.jobs or warmup.default_jobs(), con)


def main(argv: list[str] | None = None) -> int:
    from . import _bytecode

    try:  # first: the imports below (torch's above all) then read bytecode where the interpreter has none
        _bytecode.enable()
    except ValueError as e:
        print(f"tilewise: {e}", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="tilewise", description="GPU kernels for LLM workloads, measured "
                                "against the roofline of the GPU in hand.")
    sub = p.add_subparsers(dest="cmd")

    s = sub.add_parser("info", help="GPU properties and measured ceilings (bandwidth, peak FLOP/s per dtype)")
    s.add_argument("--remeasure", action="store_true", help="measure the ceilings again instead of the cache")
    s.set_defaults(fn=cmd_info)

    s = sub.add_parser("bench", help="check then time every version of each op beside its baselines")
    s.add_argument("ops", nargs="*", help="ops to run (default: all); see --list")
    s.add_argument("--quick", action="store_true", help="one or two sizes per op")
    s.add_argument("--out", default=str(DEFAULT_RESULTS), help="directory of <device>.csv (default: %(default)s)")
    s.add_argument("--list", action="store_true", help="list the ops and exit")
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("roofline", help="draw the roofline with one point per op and version (PNG)")
    s.add_argument("--csv", help="bench CSV (default: the newest under bench/results)")
    s.add_argument("--ceilings", help="ceilings JSON (default: <csv stem>-ceilings.json)")
    s.add_argument("--out", help="PNG path (default: beside the CSV)")
    s.set_defaults(fn=cmd_roofline)

    s = sub.add_parser("report",
                       help="Markdown table of the newest rows of a bench CSV (fastest of our versions per case)")
    s.add_argument("--csv", help="bench CSV (default: the newest under bench/results)")
    s.add_argument("--readme", help="rewrite the results section of this file instead of printing")
    s.add_argument("--all", action="store_true", help="every row, not only the fastest of our versions per case")
    s.add_argument("--targets", action="store_true",
                   help="the open issues' speed targets instead: issue 30's attention grid (flash_attention x SDPA's "
                        "cuDNN) and the other targets of issues 30 and 31, per device, from every <device>.csv (or "
                        "--csv); with --readme its own section of the file")
    s.add_argument("--png", help="with --targets: also draw the attention grid as a heat map to this path")
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("check", help="compile every .cu for an architecture; registers, smem, spills")
    s.add_argument("--arch", default="sm_90")
    s.add_argument("--jobs", type=int, default=None,
                   help="compiles at once (default: one per source, up to the CPU count)")
    s.set_defaults(fn=cmd_check)

    s = sub.add_parser("verify-status",
                       help="do the GPU sources match the last verified GPU run (bench/results/verified.json)?")
    s.add_argument("--record",
                   help="the record to compare with (default: bench/results/verified.json of this checkout)")
    s.set_defaults(fn=cmd_verify_status)

    s = sub.add_parser("warmup", help="compile what op families and workloads need into the kernel caches, in "
                                      "parallel (a first run then compiles nothing)")
    s.add_argument("--ops", nargs="+", metavar="FAMILY", help="op families (default: all, and every workload); "
                                                              "see --list")
    s.add_argument("--workload", nargs="+", metavar="NAME", help="workloads, e.g. train (`tilewise train`'s "
                                                                 "default model); see --list")
    s.add_argument("--jobs", type=int, default=None,
                   help="tasks at once (default: the CPU count, at most 8); autotuning ones run alone")
    s.add_argument("--list", action="store_true", help="list the op families and workloads and exit")
    s.set_defaults(fn=cmd_warmup)

    # The classifier's commands live with the training code (tilewise/sst2/).
    from .sst2 import commands as sst2

    s = sub.add_parser("train", help="train the SST-2 text classifier (tilewise kernels or --backend torch)")
    sst2.add_arguments(s)
    s.set_defaults(fn=sst2.main)
    s = sub.add_parser("predict", help="classify sentences with a trained checkpoint")
    sst2.add_predict_arguments(s)
    s.set_defaults(fn=sst2.main_predict)
    s = sub.add_parser("evaluate", help="accuracy of a trained checkpoint on an SST-2 split")
    sst2.add_evaluate_arguments(s)
    s.set_defaults(fn=sst2.main_evaluate)

    args = p.parse_args(argv)
    if args.cmd is None:  # `tilewise` alone: what it can do
        p.print_help()
        return 0
    from . import _startup

    # A Ctrl-C that an import swallows (torch's of numpy, importlib's lock callbacks) is raised again at the
    # command's next check (train's steps, bench's cases) instead of being lost.
    with _startup.latched_interrupts():
        return args.fn(args)


def run() -> int:
    """The ``tilewise`` command (and ``python -m tilewise``): ``main``'s exit code. A ``train`` that returns
    (its outputs written and closed, the plot child finished) ends through ``_startup.end_process``, unless
    a profiler or tracer needs the teardown (``_startup.skips_teardown``). Called in-process (tests),
    ``main`` returns as usual."""
    from . import _startup

    code = main()
    if sys.argv[1:2] == ["train"] and _startup.skips_teardown():
        _startup.end_process(code)
    return code


if __name__ == "__main__":
    sys.exit(run())
