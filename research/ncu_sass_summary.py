"""Read Nsight Compute's SASS source page (``ncu --page source --csv --print-source sass``, plain or gzipped; other
lines of the file, such as the profiled program's output, are skipped) and say where a kernel's warp-stall samples
fall: by instruction class (tensor-core issue and waits, mbarrier waits, named barriers, stores, the softmax's
MUFU / FFMA, ...), by stall reason, and the lines with the most samples, each with its reasons. Several kernels in
one file are summarized one after another.

For research/attention_item_ncu.sh's pages (issue 30: where the D 128 forward's work items lose time against
cuDNN's), and any other source page: PYTHONPATH=src python3 research/ncu_sass_summary.py FILE [--top 25]
(CPU only; no GPU needed). --regions: also the page cut by execution count (each partition's loop and item end).
"""
import argparse
import csv
import gzip
import io
import re
from collections import Counter, defaultdict

CLASSES = [  # (class, regex on the opcode): the first match names an instruction's class
    ("wgmma issue", r"^HGMMA"), ("wgmma wait", r"^WARPGROUP\.(DEPBAR|ARRIVE)"),
    ("mbarrier wait", r"^SYNCS\.PHASECHK"), ("mbarrier arrive / expect", r"^SYNCS\."),
    ("named barrier", r"^BAR\."), ("TMA", r"^UTMA|^UBLKCP"), ("global store", r"^(STG|RED|ATOM)"),
    ("global load", r"^LDG"), ("shared memory", r"^(LDS|STS|LDSM|STSM)"), ("MUFU (exp2, rcp, lg2)", r"^MUFU"),
    ("FP32 math", r"^(FFMA|FMUL|FADD|FMNMX|FSEL|FSETP)"), ("conversion / pack", r"^(F2F|F2FP|I2F|F2I|PRMT)"),
    ("register moves / shuffles", r"^(MOV|IMAD\.MOV|SHFL|R2UR|S2R|S2UR|UMOV|CS2R)"),
    ("branch / control", r"^(BRA|EXIT|BSSY|BSYNC|WARPSYNC|ELECT|NOP|YIELD|RET|CALL)"),
    ("setmaxnreg", r"^USETMAXREG"), ("cluster barrier / fence", r"^(UCGABAR|ERRBAR|MEMBAR|FENCE|CCTL)"),
]


def opcode(source: str) -> str:
    s = source.strip()
    s = re.sub(r"^@!?U?P[T0-9]+\s+", "", s)  # the predicate
    return s.split()[0] if s else ""


def kind(op: str) -> str:
    for name, pattern in CLASSES:
        if re.match(pattern, op):
            return name
    return "integer / other"


def kernels(path: str):
    """(kernel name, rows as dicts) for each kernel of the page."""
    raw = (gzip.open(path, "rt") if path.endswith(".gz") else open(path)).read().splitlines()
    name, block = None, []
    for line in raw + ['"Kernel Name",""']:
        if line.startswith('"Kernel Name"'):
            if name is not None and block:
                yield name, list(csv.DictReader(io.StringIO("\n".join(block))))
            name, block = next(csv.reader([line]))[1], []
        elif name is not None and (line.startswith('"Address"') or line.startswith('"0x')):
            block.append(line)


def number(v) -> float:
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def summarize(name: str, rows: list, top: int) -> None:
    reasons = [c for c in rows[0] if c.startswith("stall_") and not c.endswith("(Not Issued)")]
    total = sum(number(r["Warp Stall Sampling (All Samples)"]) for r in rows) or 1.0
    by_class, by_reason = Counter(), Counter()
    class_reasons = defaultdict(Counter)
    for r in rows:
        n = number(r["Warp Stall Sampling (All Samples)"])
        k = kind(opcode(r["Source"]))
        by_class[k] += n
        for c in reasons:
            by_reason[c] += number(r[c])
            class_reasons[k][c] += number(r[c])
    print(f"== {name[:150]}")
    print(f"   {len(rows)} SASS lines, {total:.0f} samples")
    print("   by instruction class (% of samples; its top stall reasons):")
    for k, n in by_class.most_common():
        top3 = ", ".join(f"{c[6:]} {100 * v / total:.1f}" for c, v in class_reasons[k].most_common(3) if v)
        print(f"     {k:28s} {100 * n / total:5.1f} %   {top3}")
    print("   by stall reason (% of samples): " + ", ".join(
        f"{c[6:]} {100 * v / total:.1f}" for c, v in by_reason.most_common(8) if v))
    print(f"   the {top} lines with the most samples (index in the page, % of samples, reasons):")
    ranked = sorted(range(len(rows)), key=lambda i: -number(rows[i]["Warp Stall Sampling (All Samples)"]))
    for i in ranked[:top]:
        r = rows[i]
        why = ", ".join(f"{c[6:]} {number(r[c]):.0f}" for c in sorted(reasons, key=lambda c: -number(r[c]))[:3]
                        if number(r[c]))
        print(f"     #{i:5d} {100 * number(r['Warp Stall Sampling (All Samples)']) / total:5.2f} %  "
              f"{r['Source'].strip()[:70]:70s} {why}")


def regions(rows: list, least: float = 0.3) -> None:
    """The page cut into runs of lines executed equally often (within 2 %; unexecuted lines join the run before):
    a warp-specialized kernel's partitions, each one's loop and its once-an-item code. A run's share of the samples
    over its execution count per line is where a partition's time goes (a key tile against an item's end)."""
    total = sum(number(r["Warp Stall Sampling (All Samples)"]) for r in rows) or 1.0
    runs, cur = [], None
    for i, r in enumerate(rows):
        ex, n = number(r["Instructions Executed"]), number(r["Warp Stall Sampling (All Samples)"])
        if ex and (cur is None or abs(ex - cur[2]) > 0.02 * max(ex, cur[2])):
            cur = [i, i, ex, 0.0, Counter()]
            runs.append(cur)
        if cur is None:
            continue
        cur[1], cur[3] = i, cur[3] + n
        cur[4][kind(opcode(r["Source"]))] += n
    print(f"   runs of equally executed lines with >= {least} % of the samples:")
    for a, b, ex, n, classes in runs:
        if 100 * n / total >= least:
            top = ", ".join(f"{k} {100 * v / total:.1f}" for k, v in classes.most_common(4))
            print(f"     lines {a:5d}-{b:5d}  executed {ex:9.0f} a line  {100 * n / total:5.1f} %  [{top}]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--regions", action="store_true", help="also the runs of equally executed lines")
    args = ap.parse_args()
    found = False
    for name, rows in kernels(args.path):
        if rows:
            found = True
            summarize(name, rows, args.top)
            if args.regions:
                regions(rows)
    if not found:
        raise SystemExit(f"{args.path}: no source page rows (a '\"Kernel Name\"' line and its table) found")


if __name__ == "__main__":
    main()
