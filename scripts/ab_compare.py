"""Compare bench CSVs of two trees: base and new, in one or more rounds run alternately.

    python scripts/ab_compare.py [--tolerance 0.03] BASE1.csv NEW1.csv [BASE2.csv NEW2.csv ...]

A row is (op, variant, shape, dtype); its ratio is new / base median time per round. A row is
flagged when every round moved it beyond the tolerance in the same direction (one round alone
cannot tell a change from run-to-run noise). The library's own rows are held to a wider band where
the same op's external rows (PyTorch, cuBLAS, SDPA, ...: the same code in both trees) moved more
than the tolerance: that move is the run's noise for the op, and a row inside it is tagged
"noise", not flagged. Rows in one tree only are listed. Exit status 1 if any row is flagged or
missing.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys


def read_rows(path: str) -> dict[tuple[str, str, str, str], float]:
    with open(path, newline="") as f:
        rows = {}
        for i, r in enumerate(csv.DictReader(f), start=2):
            try:
                rows[(r["op"], r["variant"], r["shape"], r["dtype"])] = float(r["median_ms"])
            except (KeyError, ValueError) as e:
                raise SystemExit(f"{path}:{i}: not a bench row ({e})") from None
    return rows


# Variants that run code outside the library: the trees cannot change them.
EXTERNAL = ("torch", "cublas", "sdpa_", "flex_attention", "F.", "cuda.core", "triton")


def external(variant: str) -> bool:
    return variant.startswith(EXTERNAL)


def noise_bands(rounds: list[tuple[dict, dict]]) -> dict[str, float]:
    """op -> the largest move of its external rows (|median ratio - 1|)."""
    bands: dict[str, float] = {}
    for k in set().union(*(set(b) & set(n) for b, n in rounds)):
        ratios = [n[k] / b[k] for b, n in rounds if k in b and k in n and b[k] > 0]
        if external(k[1]) and len(ratios) == len(rounds):
            bands[k[0]] = max(bands.get(k[0], 0.0), abs(statistics.median(ratios) - 1))
    return bands


def compare(rounds: list[tuple[dict, dict]], tolerance: float) -> tuple[list[str], int]:
    """Report lines and the number of flagged or missing rows."""
    keys = sorted(set().union(*(set(b) | set(n) for b, n in rounds)))
    bands = noise_bands(rounds)
    lines, bad = [], 0
    for k in keys:
        ratios = [n[k] / b[k] for b, n in rounds if k in b and k in n and b[k] > 0]
        if len(ratios) < len(rounds):
            lines.append(f"MISSING  {' | '.join(k)}: in {len(ratios)} of {len(rounds)} rounds")
            bad += 1
            continue
        worse = all(r > 1 + tolerance for r in ratios)
        better = all(r < 1 - tolerance for r in ratios)
        band = 0.0 if external(k[1]) else bands.get(k[0], 0.0)
        inside = (worse or better) and abs(statistics.median(ratios) - 1) <= band
        tag = "noise  " if inside else "SLOWER " if worse else "FASTER " if better else "same   "
        bad += (worse or better) and not inside
        why = f"; {k[0]}'s external rows moved up to {band:.1%}" if inside else ""
        lines.append(f"{tag}  {' | '.join(k)}: new/base {' '.join(f'{r:.3f}' for r in ratios)}"
                     f" (median {statistics.median(ratios):.3f}{why})")
    return lines, bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tolerance", type=float, default=0.03)
    p.add_argument("csv", nargs="+", help="BASE1 NEW1 [BASE2 NEW2 ...]")
    a = p.parse_args(argv)
    if len(a.csv) % 2:
        p.error("give the CSVs in base / new pairs")
    rounds = [(read_rows(a.csv[i]), read_rows(a.csv[i + 1])) for i in range(0, len(a.csv), 2)]
    lines, bad = compare(rounds, a.tolerance)
    print("\n".join(lines))
    print(f"{len(lines)} rows, {bad} moved beyond {a.tolerance:.0%} in every round or missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
