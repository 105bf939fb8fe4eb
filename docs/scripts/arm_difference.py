"""Whether one training choice moves the twin contrast's trend: two stores of one design that differ
in one choice (say the batch at fixed steps), each optimiser minus its rotated twin read at every
ladder's fitted lr*, and the difference of the two arms' slopes in log N with its seed-bootstrap
interval (analysis.width_trend.arm_difference; both readings, line and interpolated).

    python docs/scripts/arm_difference.py STORE_A STORE_B [OUT_CSV]   # e.g. docs/stores/width_fixed_batch_dense docs/stores/width_fixed_steps_dense

OUT_CSV (its folder must exist): also write both readings' rows there; tools/quoted_intervals.py
reads a report folder's arm_difference*.csv beside its tables.
"""
import sys

import polars as pl

from analysis import optimum, width_trend
from analysis.load import NoSweepError, load


def interval(row: dict, name: str) -> str:
    return f"{row[name]:+.2f} [{row[name + '_low']:+.2f}, {row[name + '_high']:+.2f}]".replace("-", "−")


if len(sys.argv) not in (3, 4):
    print("usage: python docs/scripts/arm_difference.py STORE_A STORE_B [OUT_CSV]", file=sys.stderr)
    sys.exit(2)
try:
    a, b = (width_trend.trials_from(load(path)) for path in sys.argv[1:3])
except NoSweepError as e:  # a path that holds no sweep: say which, exit 2
    print(f"arm_difference: {e}", file=sys.stderr)
    sys.exit(2)
tables = [width_trend.arm_difference(a, b, reading=reading) for reading in optimum.READINGS]
if not tables[0].height:
    print("arm_difference: no optimiser has its rotated twin at two widths or more in both stores", file=sys.stderr)
    sys.exit(1)
print(f"a = {sys.argv[1]}\nb = {sys.argv[2]}")
for reading, table in zip(optimum.READINGS, tables):
    for row in table.iter_rows(named=True):
        print(f"{row['optimizer']} ({row['parametrization']}), {row['measure']}, {reading}: "
              f"a {interval(row, 'slope_a')}, b {interval(row, 'slope_b')}, "
              f"a − b {interval(row, 'difference')}: {row['decision']}")
if len(sys.argv) == 4:
    try:
        pl.concat(tables, how="diagonal").with_columns(store_a=pl.lit(sys.argv[1]), store_b=pl.lit(sys.argv[2])).write_csv(sys.argv[3])
    except OSError as e:  # a folder that does not exist, or one not writable
        print(f"arm_difference: OUT_CSV {sys.argv[3]}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {sys.argv[3]}")
