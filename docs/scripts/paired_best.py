"""Does a ladder's best lr depend on comparing unequal seed sets? A ladder runs seed 0 at every lr
and seeds 1-2 at the best, so `sweep report` (analysis.selection.best_lr) sets a 3-seed mean
against 1-seed neighbours. Seeds are paired across lrs (same init and data order), so a fair
choice compares lrs on the seeds they share. This prints, per ladder with unequal seed sets, the
report's choice, the choice on the seeds every lr of the ladder has (seed 0 in a ladder), and the
runner-up minus the report's best on the seeds those two share (final val loss: mean, and its
95% t interval where they share 2+ seeds), and says how many ladders the two choices agree on.

    python docs/scripts/paired_best.py STORE [STORE ...]     # e.g. docs/stores/families docs/stores/english
"""
import sys

import numpy as np
import polars as pl
from scipy import stats

from analysis.load import load
from analysis.query_base import prepare_runs, runs_of
from analysis.selection import best_lr


def paired_choices(path: str) -> pl.DataFrame:
    results = load(path)
    runs = prepare_runs(runs_of(results)).filter(pl.col("status") == "done").collect()
    chosen = best_lr(results).select("tuning_id", report_lr="lr", runner_up="runner_up_lr")
    rows = []
    for (tuning_id,), ladder in runs.group_by("tuning_id"):
        seeds = ladder.group_by("lr").agg(pl.col("seed").unique())
        if seeds.height < 2 or len({tuple(sorted(s)) for s in seeds["seed"]}) == 1:
            continue  # one lr, or the same seeds at every lr: the report already compares pairs
        common = set.intersection(*(set(s) for s in seeds["seed"]))
        if not common:
            continue
        means = (ladder.filter(pl.col("seed").is_in(sorted(common))).group_by("lr")
                 .agg(pl.col("final_val_loss").mean()).sort("final_val_loss", "lr"))
        first = ladder.row(0, named=True)
        rows.append({"store": path, "optimizer": first["optimizer"], "d_model": first["d_model"],
                     "tuning_id": tuning_id, "common_seeds": len(common), "common_seeds_lr": means["lr"][0]})
    if not rows:
        return pl.DataFrame()
    table = pl.DataFrame(rows).join(chosen, on="tuning_id", how="left")
    return table.with_columns(pl.struct("tuning_id", "report_lr", "runner_up").map_elements(
        lambda r: paired_margin(runs, r["tuning_id"], r["report_lr"], r["runner_up"]), return_dtype=pl.String,
    ).alias("runner-up − best, shared seeds")).drop("tuning_id")


def paired_margin(runs: pl.DataFrame, tuning_id: str, best: float, runner_up: float) -> str:
    """The runner-up's final val loss minus the best's, seed by seed on the seeds both have."""
    ladder = runs.filter(pl.col("tuning_id") == tuning_id)
    pair = (ladder.filter(pl.col("lr") == best).select("seed", b="final_val_loss")
            .join(ladder.filter(pl.col("lr") == runner_up).select("seed", r="final_val_loss"), on="seed"))
    diff = (pair["r"] - pair["b"]).to_numpy()
    if len(diff) < 2:
        return f"{diff.mean():+.3f} (1 seed)"
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
    return f"{diff.mean():+.3f} [{diff.mean() - half:+.3f}, {diff.mean() + half:+.3f}] ({len(diff)} seeds)"


def main(paths: list[str]) -> None:
    table = pl.concat([t for t in (paired_choices(p) for p in paths) if t.height], how="vertical")
    with pl.Config(tbl_rows=-1, tbl_width_chars=200, fmt_str_lengths=40, float_precision=4):
        print(table.sort("store", "optimizer", "d_model"))
    agree = (table["common_seeds_lr"] == table["report_lr"]).sum()
    print(f"{agree} of {table.height} ladders with unequal seed sets choose the same lr on the seeds all their lrs share")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
