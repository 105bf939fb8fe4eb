"""The same trial on a CPU and on a GPU: every trial id that one or more stores hold trained on
each (the runs row's ``device``), side by side, at the final step: final val loss, the residual
stream's kurtosis over its null 3(d-1)/(d+1) (stored basis, mean over blocks) and its top-1 energy
share. Both ran full fp32 (the GPU with ``precision: fp32``: no autocast, no TF32), from the same
seed and data order, so they differ only in the order of their floating-point sums, which a long
run can amplify. The null for "the device does not matter": the spread between seeds of one
config (the sd of the seed-to-seed difference, from every config the stores hold 2+ seeds of on
one device), against which the CPU-GPU differences are set.

    python docs/scripts/device_pairs.py STORE [STORE ...]     # e.g. docs/stores/families docs/stores/gpucheck
"""
import sys

import numpy as np
import polars as pl

from analysis import queries
from analysis.load import load

MEASURES = {"final_val_loss": "val loss", "kurt": "kurtosis / null", "top1": "top-1 share"}


def read(path: str) -> pl.DataFrame:
    results = load(path)
    runs = (results.runs.collect().filter(pl.col("status") == "done")
            .select("trial_id", "config_id", "optimizer", "lr", "d_model", "seed", "device", "final_val_loss"))
    kurt = queries.per_trial(results, "kurtosis", "resid", "stored", over_null=True).collect()
    top1 = queries.per_trial(results, "top1_share", "resid", "stored").collect()
    return (runs.join(kurt.select("trial_id", kurt="value"), on="trial_id", how="left")
            .join(top1.select("trial_id", top1="value"), on="trial_id", how="left")
            .with_columns(on=pl.when(pl.col("device").str.starts_with("cpu")).then(pl.lit("cpu")).otherwise(pl.lit("gpu"))))


rows = pl.concat([read(p) for p in sys.argv[1:]], how="diagonal_relaxed").unique(["trial_id", "on"])
cpu, gpu = rows.filter(pl.col("on") == "cpu"), rows.filter(pl.col("on") == "gpu")
pairs = cpu.join(gpu.select("trial_id", *[pl.col(c).alias(f"{c}_gpu") for c in MEASURES]), on="trial_id")
pairs = pairs.sort("d_model", "optimizer", "lr", "seed")
print(f"{pairs.height} trials trained on both a CPU and a GPU (full fp32, the same seed and data order)")
pairs = pairs.with_columns(pl.col("lr").map_elements(lambda v: f"{v:g}", return_dtype=pl.String))
with pl.Config(tbl_rows=80, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True, float_precision=3,
               tbl_width_chars=250, tbl_cols=-1, fmt_str_lengths=14):
    print(pairs.select("trial_id", "d_model", "optimizer", "lr", "seed",
                       *[x for c in MEASURES for x in (pl.col(c).alias(f"{MEASURES[c]} cpu"),
                                                       pl.col(f"{c}_gpu").alias(f"{MEASURES[c]} gpu"))]))

# the seed null: per config and device with 2+ seeds, the sd of single seeds; a difference of two
# independent seeds has sd sqrt(2) x that
seeds = rows.group_by("config_id", "on").agg(*[pl.col(c).std().alias(c) for c in MEASURES], n=pl.len()).filter(pl.col("n") >= 2)
print(f"\nthe device against the seed ({seeds.height} configs with 2+ seeds on one device give the seed null):")
for c, name in MEASURES.items():
    d = (pairs[f"{c}_gpu"] - pairs[c]).drop_nulls().to_numpy()
    if not len(d):
        continue
    seed_sd = float(np.sqrt(np.nanmean(seeds[c].drop_nulls().to_numpy() ** 2)))  # pooled over configs
    print(f"  {name:<16} gpu - cpu: mean {d.mean():+.4f}, sd {d.std(ddof=1):.4f}, largest |diff| {np.abs(d).max():.4f} "
          f"({len(d)} pairs); two seeds of one config differ with sd {np.sqrt(2) * seed_sd:.4f}")
