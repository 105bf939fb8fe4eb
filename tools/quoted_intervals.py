"""Every signed interval a document quotes ("+0.14 [+0.09, +0.19]"), checked against `sweep report` output.

    python tools/quoted_intervals.py DOC REPORT_DIR [REPORT_DIR ...] [--start TEXT] [--stop TEXT]

Reads each report's optimum_slopes.csv (both readings) and twins.csv, and any arm_difference*.csv
(`docs/scripts/arm_difference.py A B OUT_CSV`: each arm's slope and their difference, both readings),
formats every slope and paired difference as the documents print them (two decimals, signed,
Unicode minus), and prints each quoted interval between the first line holding TEXT (--start) and
the next holding --stop that no row gives, with its line number. Exit 1 when any is left: a number the report no longer reproduces (often
0.01 of drift: the bootstrap draws every ladder from one stream, so trials joining a store move
other ladders' intervals). Unsigned intervals (levels, lr*) are not checked.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import polars as pl

INTERVAL = re.compile(r"[+−-]\d+\.\d\d \[[+−-]\d+\.\d\d, [+−-]\d+\.\d\d\]")
COLUMNS = {"optimum_slopes.csv": [("slope", "slope_low", "slope_high"),
                                  ("slope_interpolated", "slope_low_interpolated", "slope_high_interpolated")],
           "twins.csv": [("difference", "ci_low", "ci_high")],
           "arm_difference*.csv": [("difference", "difference_low", "difference_high"),
                                   ("slope_a", "slope_a_low", "slope_a_high"), ("slope_b", "slope_b_low", "slope_b_high")]}


def printed(value: float, low: float, high: float) -> str:
    return f"{value:+.2f} [{low:+.2f}, {high:+.2f}]".replace("-", "−")


def reproduced(report_dirs: list[Path]) -> set[str]:
    out = set()
    for folder in report_dirs:
        for name, triples in COLUMNS.items():
            for path in sorted(folder.glob(name)):
                table = pl.read_csv(path)
                for cols in triples:
                    if all(c in table.columns for c in cols):
                        out |= {printed(*row) for row in table.select(cols).drop_nulls().drop_nans().iter_rows()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("doc", type=Path)
    parser.add_argument("reports", type=Path, nargs="+")
    parser.add_argument("--start", default="")
    parser.add_argument("--stop", default=None)
    args = parser.parse_args()
    known, lines = reproduced(args.reports), args.doc.read_text().splitlines()
    first = next((i for i, line in enumerate(lines) if args.start in line), None)
    if first is None:
        print(f"--start {args.start!r}: no line of {args.doc} holds it", file=sys.stderr)
        return 2
    last = next((i for i in range(first + 1, len(lines)) if args.stop and args.stop in lines[i]), len(lines))
    missing = [(i + 1, q) for i in range(first, last) for q in INTERVAL.findall(lines[i]) if q.replace("-", "−") not in known]
    for number, quote in missing:
        print(f"{args.doc}:{number}: {quote}")
    print(f"{len(missing)} quoted interval(s) no report row gives", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
