"""Does a ladder's best lr depend on comparing unequal seed sets? A ladder runs seed 0 at every lr
and seeds 1-2 at the best, so `sweep report` (analysis.selection.best_lr) sets a 3-seed mean
against 1-seed neighbours. Seeds are paired across lrs (same init and data order), so the fair
choice uses only the seeds every lr of the ladder has. This prints, per ladder with unequal seed
sets, the report's choice beside the choice on the common seeds, and the runner-up's paired
margin over the best on those seeds (final val loss), and says how many ladders the two agree on.

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
    chosen = best_lr(results).select("tuning_id", report_lr="lr")
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
                     "tuning_id": tuning_id, "common_seeds": len(common), "paired_lr": means["lr"][0],
                     "runner_up": means["lr"][1], "margin": means["final_val_loss"][1] - means["final_val_loss"][0]})
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows).join(chosen, on="tuning_id", how="left").drop("tuning_id")


def main(paths: list[str]) -> None:
    table = pl.concat([t for t in (paired_choices(p) for p in paths) if t.height], how="vertical")
    with pl.Config(tbl_rows=-1, tbl_width_chars=160, float_precision=4):
        print(table.sort("store", "optimizer", "d_model"))
    agree = (table["paired_lr"] == table["report_lr"]).sum()
    print(f"{agree} of {table.height} ladders with unequal seed sets choose the same lr on their common seeds")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
