"""Does a ladder's best lr depend on comparing unequal seed sets? A ladder runs seed 0 at every lr
and seeds 1-2 at the best, so `sweep report` (analysis.selection.best_lr) sets a 3-seed mean
against 1-seed neighbours. Seeds are paired across lrs (same init and data order). This prints,
per ladder with unequal seed sets, the report's choice beside the choice on the seeds every lr of
the ladder has (seed 0 in a ladder), with the report's runner-up, how much worse it ends on the
seeds the two share (``runner_up_margin``, final val loss) and its tie flag (paired at 2+ shared
seeds), and says how many ladders the two choices agree on.

    python docs/scripts/paired_best.py STORE [STORE ...]     # e.g. docs/stores/families docs/stores/english
"""
import sys

import polars as pl

from analysis.load import load
from analysis.query_base import prepare_runs, runs_of
from analysis.selection import best_lr


def paired_choices(path: str) -> pl.DataFrame:
    results = load(path)
    runs = prepare_runs(runs_of(results)).filter(pl.col("status") == "done").collect()
    seed_sets = runs.group_by("tuning_id", "lr").agg(pl.col("seed").unique().sort())
    rows = []
    for (tuning_id,), ladder in runs.group_by("tuning_id"):
        sets = {tuple(s) for s in seed_sets.filter(pl.col("tuning_id") == tuning_id)["seed"]}
        common = set.intersection(*(set(s) for s in sets))
        if len(sets) < 2 or not common:
            continue  # the same seeds at every lr (the report compares pairs already), or none shared
        on_common = (ladder.filter(pl.col("seed").is_in(sorted(common))).group_by("lr")
                     .agg(pl.col("final_val_loss").mean()).sort("final_val_loss", "lr"))
        rows.append({"tuning_id": tuning_id, "common_seeds": len(common), "common_seeds_lr": on_common["lr"][0]})
    if not rows:
        return pl.DataFrame()
    chosen = best_lr(results).select("tuning_id", "optimizer", "attention", "d_model", report_lr="lr", runner_up="runner_up_lr",
                                     margin="runner_up_margin", shared="shared_seeds", tie="tie")
    return pl.DataFrame(rows).join(chosen, on="tuning_id").select(
        pl.lit(path).alias("store"), "optimizer", "attention", "d_model", "report_lr", "common_seeds_lr", "common_seeds",
        "runner_up", "margin", "shared", "tie")


def main(paths: list[str]) -> None:
    table = pl.concat([t for t in (paired_choices(p) for p in paths) if t.height], how="vertical")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, float_precision=4):
        print(table.sort("store", "optimizer", "d_model"))
    agree = (table["common_seeds_lr"] == table["report_lr"]).sum()
    print(f"{agree} of {table.height} ladders with unequal seed sets choose the same lr on the seeds all their lrs share")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
