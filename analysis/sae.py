"""Queries over the `sae` table (`sweep probe sae`): SAEs on raw and rotated residual streams.

The question (the paper's fourth): do SAEs find more basis-aligned features on a per-coordinate
optimiser's residual stream, do they lose explained variance or latents to its outlier
dimensions, and does the SAE's own optimiser change that? Each row is one (trial, layer, basis,
SAE optimiser); these functions join the trial's runs columns and aggregate over seeds.
"""

from __future__ import annotations

import polars as pl

from analysis.power_law import t_critical
from analysis.load import Results

__all__ = ["SAE_METRICS", "sae_rows", "sae_summary"]

SAE_METRICS = ("decoder_kurtosis_excess", "decoder_max_share", "fve", "dead_fraction", "loss_recovered", "agreement")
"""What the summary aggregates; decoder_kurtosis_excess = decoder_kurtosis - its random-direction
null 3(d-1)/(d+1) (0: no more basis-aligned than random directions)."""

_RUN_COLUMNS = ("trial_id", "config_id", "optimizer", "optimizer_family", "norm", "rotation_label", "d_model",
                "n_layers", "seed")


def sae_rows(results: Results) -> pl.DataFrame:
    """Every sae row with its trial's runs columns, the layer's depth label (`middle`, `last`, or
    `layer l`) and the excess decoder kurtosis."""
    sae = results.sae.collect()
    if sae.height == 0:
        return sae
    runs = results.runs.collect()
    runs = runs.select([c for c in _RUN_COLUMNS if c in runs.columns])
    out = sae.drop("d_model").join(runs, on="trial_id", how="inner")
    depth = (pl.when(pl.col("layer") == pl.col("n_layers")).then(pl.lit("last"))
             .when(pl.col("layer") == pl.col("n_layers") // 2).then(pl.lit("middle"))
             .otherwise(pl.format("layer {}", pl.col("layer"))))
    return out.with_columns(depth=depth, decoder_kurtosis_excess=pl.col("decoder_kurtosis") - pl.col("decoder_kurtosis_null"))


def sae_summary(results: Results, confidence: float = 0.95) -> pl.DataFrame:
    """Seed means per (config, layer depth, basis, SAE optimiser) of each SAE_METRICS, with the
    half-width of a t-interval (null with one seed) and the number of seeds `n`. Long format:
    one row per metric."""
    rows = sae_rows(results)
    if rows.height == 0:
        return pl.DataFrame(schema={"config_id": pl.String, "metric": pl.String, "mean": pl.Float64})
    keys = ["config_id", "optimizer", "optimizer_family", "norm", "rotation_label", "d_model", "depth", "basis",
            "sae_optimizer"]
    keys = [k for k in keys if k in rows.columns]
    long = rows.unpivot(index=keys + ["seed"], on=list(SAE_METRICS), variable_name="metric", value_name="value")
    agg = long.group_by(keys + ["metric"]).agg(pl.col("value").mean().alias("mean"), pl.col("value").std().alias("sd"),
                                              pl.col("value").is_not_null().sum().alias("n"))
    half = [None if n < 2 or sd is None else t_critical(n - 1, confidence) * sd / n**0.5
            for n, sd in zip(agg["n"].to_list(), agg["sd"].to_list())]
    return agg.with_columns(ci_half=pl.Series(half, dtype=pl.Float64)).sort(keys + ["metric"])
