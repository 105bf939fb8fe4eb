"""The width-free reading of the level at lr*: the raw top-1 share of each token's centred energy.

The report's slopes are of log(top-1 share / null). The null (``analysis.null.top_share_null``)
falls with width (0.108 at d 64, 0.0636 at d 128), so a coordinate holding a fixed share f of
every token's energy, which reads f at every width, has a rising log(share / null). This prints,
per ladder with an optimum, the raw top-1 share at lr* (the report's level times the null, with
its seed-bootstrap interval), and per line the slope of log(raw share) against log N: the
report's slope plus the null's own (a constant: the null has no seed noise), so that a fixed-share
coordinate reads 0. Only the widths given are used (a one-seed width leaves a slope no interval).

    python docs/scripts/width_free.py STORE [WIDTH ...]     # e.g. docs/stores/width 64 128
"""
import math
import sys

import numpy as np
import polars as pl

from analysis import optimum
from analysis.load import load
from analysis.null import top_share_null


def main(path: str, widths: list[int]) -> None:
    trials = optimum.trials_from(load(path))
    if widths:
        trials = trials.filter(pl.col("d_model").is_in(widths))
    levels, slopes = optimum.optimum_tables(trials)
    null = pl.col("d_model").map_elements(top_share_null, return_dtype=pl.Float64)
    raw = levels.filter(pl.col("flag") == "").with_columns(null=null).select(
        "optimizer", "parametrization", "d_model", "n_seeds_best", pl.col("lr_star").round(4), pl.col("null").round(4),
        *[(pl.col(f"top1_share_over_null{s}") * pl.col("null")).round(4).alias(f"top1_share{s}") for s in ("", "_low", "_high")])
    print(raw.sort("parametrization", "optimizer", "d_model"))
    rows = []
    for r in slopes.filter(pl.col("measure") == optimum.WORDS["top1_share"]).iter_rows(named=True):
        d = sorted(levels.filter(pl.col("flag") == "", pl.col("tuned_line_id") == r["tuned_line_id"])["d_model"].to_list()
                   if r["tuned_line_id"] else raw.filter(pl.col("parametrization") == r["parametrization"])["d_model"].unique().to_list())
        n = levels.filter(pl.col("d_model").is_in(d)).group_by("d_model").agg(pl.col("params_non_embedding").first()).sort("d_model")
        null_slope = np.polyfit(np.log(n["params_non_embedding"].cast(pl.Float64).to_numpy()),
                                np.log([top_share_null(int(v)) for v in n["d_model"]]), 1)[0] if n.height > 1 else math.nan
        rows.append({"optimizer": r["optimizer"], "parametrization": r["parametrization"], "widths": str(d),
                     "slope_over_null": round(r["slope"], 3), "null_slope": round(null_slope, 3),
                     "slope_raw": round(r["slope"] + null_slope, 3), "raw_low": round(r["slope_low"] + null_slope, 3),
                     "raw_high": round(r["slope_high"] + null_slope, 3), "decision_over_null": r["decision"]})
    print("slope_raw: the slope of log(raw top-1 share) against log N, the report's slope of log(share / null) plus"
          " the null's own; a coordinate holding a fixed share reads 0. For a twin contrast the null cancels at each"
          " width, and slope_raw is the optimiser's raw-share slope less its twin's drift from the null.")
    print(pl.DataFrame(rows))


if __name__ == "__main__":
    pl.Config.set_tbl_rows(100)
    pl.Config.set_tbl_cols(20)
    pl.Config.set_tbl_width_chars(220)
    main(sys.argv[1], [int(v) for v in sys.argv[2:]])
