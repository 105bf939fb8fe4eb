"""Would successive halving (Ray Tune's ASHA) pick the lr the full ladder picks? For every lr
ladder of a store whose trials all finished (seed 0), the lr with the lowest val loss at each
eval step against the lr with the lowest final val loss (issue 33: ASHA over the ladders is
welcome once one width shows it picks the same lr as the full ladder).

    python docs/scripts/rung_check.py RESULTS/SWEEP      # e.g. results/families
"""
import json
import sys

import polars as pl

from analysis.load import load

results = load(sys.argv[1])
runs = results.runs.filter(pl.col("status") == "done", pl.col("seed") == 0).collect()
curves = results.curves.select("trial_id", "step", "val_loss").drop_nulls("val_loss").collect()


def ladder_key(text: str) -> str:  # the config without its lr and seed
    c = json.loads(text)
    c["optimizer"] = {k: v for k, v in c["optimizer"].items() if k != "lr"}
    return json.dumps({k: v for k, v in c.items() if k not in ("seed", "sweep", "runtime")}, sort_keys=True)


runs = runs.with_columns(ladder=pl.col("config_json").map_elements(ladder_key, return_dtype=pl.String))
runs = runs.filter(pl.len().over("ladder") >= 3)
joined = curves.join(runs.select("trial_id", "ladder", "optimizer", "d_model", "lr", "steps"), on="trial_id")
final = joined.filter(pl.col("step") == pl.col("steps"))
best = final.sort("val_loss").group_by("ladder").first().select("ladder", final_best="lr")
at = joined.filter(pl.col("step") > 0, pl.col("step") < pl.col("steps")).sort("val_loss")
rung = at.group_by("ladder", "step").first().select("ladder", "step", rung_best="lr", loss="val_loss")
second = at.group_by("ladder", "step").agg(pl.col("val_loss").sort().get(1).alias("runner_up"))
table = (rung.join(second, on=["ladder", "step"]).join(best, on="ladder")
         .join(runs.select("ladder", "optimizer", "d_model").unique("ladder"), on="ladder")
         .with_columns(agrees=pl.col("rung_best") == pl.col("final_best"), margin=(pl.col("runner_up") - pl.col("loss")).round(4))
         .sort("d_model", "optimizer", "step").select("d_model", "optimizer", "step", "rung_best", "final_best", "agrees", "margin"))
with pl.Config(tbl_rows=200, tbl_cols=-1):
    print(table)
    print(table.group_by("step").agg(ladders=pl.len(), agree=pl.col("agrees").sum()).sort("step"))
