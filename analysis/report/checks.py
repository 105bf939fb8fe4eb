"""The report's invariance-check section: the loss change after rotating the residual basis,
summarised per check, norm and dtype over the done trials (or one note where none ran)."""

from __future__ import annotations

import polars as pl

from analysis.report.section import Context, Section

__all__ = ["SECTION", "check_summary"]


def add(ctx: Context) -> None:
    """The summary into ``ctx.content.check_summary``."""
    checks = ctx.results.checks.collect()
    if checks.height == 0:
        ctx.note("No invariance checks recorded (checks/ is empty or missing).")
    ctx.content.check_summary = check_summary(checks, ctx.done)


def check_summary(checks: pl.DataFrame, done: pl.DataFrame) -> pl.DataFrame:
    """mean and max |Δ loss| and the trial count per check, norm and dtype (float64 first)."""
    if checks.height == 0:
        return checks
    keys = [c for c in ("norm", "rotation", "optimizer") if c in done.columns]
    joined = checks.join(done.select("trial_id", *keys), on="trial_id", how="inner")
    order = {"float64": 0, "float32": 1, "bfloat16": 2}
    return (
        joined.group_by("check", "norm", "dtype")
        .agg(
            mean_abs=pl.col("value").abs().mean(),
            max_abs=pl.col("value").abs().max(),
            n=pl.len(),
        )
        .with_columns(_o=pl.col("dtype").replace_strict(order, default=9, return_dtype=pl.Int64))
        .sort("check", "norm", "_o")
        .drop("_o")
    )


SECTION = Section("checks", add, needs_done=False)
