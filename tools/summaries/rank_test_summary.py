"""The per-trial rank test, read out: each trial's stored-basis kurtosis of the residual stream
against its 32 random bases (mean, median, sd, rank p) and the top-1 share, per seed and block at
the final step, over the null 3(d-1)/(d+1); then per (optimiser, attention where it varies, width, lr, seed) the block means
and how many blocks sit below the random median or at p = 1/33 (a store of lr ladders has one row
per lr; `sweep report`'s privilege.md reads the best lr only).

    python tools/summaries/rank_test_summary.py results/equivariance
"""
import sys
import polars as pl
store = sys.argv[1]
m = pl.read_parquet(f"{store}/metrics/*.parquet")
r = pl.read_parquet(f"{store}/runs/*.parquet")
arm = ["optimizer", *(["attention"] if "attention" in r.columns and r["attention"].n_unique() > 1 else []), "d_model", "lr"]
r = r.select("trial_id", *arm, "seed", "final_val_loss").with_columns(
    pl.col("lr").map_elements(lambda v: f"{v:g}", return_dtype=pl.String))
last = m.join(r, on="trial_id").filter(pl.col("step") == pl.col("step").max().over("trial_id"), pl.col("site") == "resid", pl.col("layer") > 0)
wide = last.pivot(on=["basis", "metric"], index=[*arm, "seed", "layer"], values="value")
wide.columns = [c.replace('{"', "").replace('","', ".").replace('"}', "") for c in wide.columns]
null = 3 * (wide["d_model"] - 1) / (wide["d_model"] + 1)
wide = wide.with_columns(stored_over_null=pl.col("stored.kurtosis") / null, random_over_null=pl.col("random.kurtosis") / null,
                         median_over_null=pl.col("random.kurtosis_median") / null, sd_over_null=pl.col("random.kurtosis_sd") / null)
cols = [*arm, "seed", "layer", "stored_over_null", "random_over_null", "median_over_null", "sd_over_null",
        "random.kurtosis_rank_p", "stored.top1_share", "random.top1_share", "random.top1_share_rank_p"]
with pl.Config(tbl_rows=-1, tbl_cols=20, float_precision=3):
    print(wide.select(cols).sort(*arm, "seed", "layer"))
    print(wide.group_by(*arm, "seed").agg(pl.col("stored_over_null").mean().alias("stored/null (blocks 1-4)"),
          pl.col("random_over_null").mean().alias("random/null"), pl.col("median_over_null").mean().alias("median/null"),
          (pl.col("random.kurtosis_rank_p") > 0.5).sum().alias("blocks below the random median"),
          (pl.col("random.kurtosis_rank_p") <= 1 / 33 + 1e-9).sum().alias("blocks at p = 1/33")).sort(*arm, "seed"))
