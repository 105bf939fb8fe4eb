"""The report's section on the level at the loss-optimal lr (issue 45): at a fixed lr a
per-coordinate optimiser's excess rises with width while its optimal lr falls, so a trend across
widths is read at each ladder's fitted lr* (``analysis.optimum``), with a seed bootstrap over the
whole surface. Tables (``ctx.table``, written as CSV): ``optimum`` (optimum.csv: per ladder lr*
and the level there with intervals, tokens per parameter), ``optimum_slopes`` (optimum_slopes.csv:
per line and measure the slope against log N, its interval, its decision and the tokens per
parameter of each width; beside the top-1 share, its width-free reading: the raw share's slope;
beside each slope and level, the same read by interpolation between the measured rungs around lr*,
columns ``*_interpolated``: a check on the registered line fit, from the same bootstrap draws),
``optimum_families`` (optimum_families.csv: per width per-coordinate minus the rest at lr*, Welch
beside the exact permutation p, Holm over widths) and ``twins`` (twins.csv: each optimiser minus
its rotated twin, paired by seed). The charts: the level along the whole ladder, and at lr*
against N."""

from __future__ import annotations

import math

import polars as pl

from analysis import optimum, optimum_exact, width_trend
from analysis.charts.optimum import ladder_cells, level_along_ladder, level_at_optimum
from analysis.report.section import Context, Options, Section
from resultstore.vocabulary import Basis, Metric, Site

__all__ = ["SECTION", "reading_note", "slope_note", "twin_note", "with_interpolated"]


def add(ctx: Context) -> None:
    """The tables (``ctx.table``), the chart, and notes on the slopes and the twin contrasts."""
    if not ctx.tuned or (Site.RESID, Basis.STORED, Metric.KURTOSIS) not in ctx.have:
        return
    ctx.say("reading each ladder at its fitted loss-optimal lr")
    trials = width_trend.trials_from(ctx.results)
    if trials.height == 0:
        return
    o = ctx.options
    levels, slopes = width_trend.optimum_tables(trials, ctx.x, n_boot=o.n_boot, seed=o.seed, confidence=o.confidence)
    levels, slopes = with_interpolated(trials, levels, slopes, ctx.x, o)
    ctx.table("optimum", levels)
    ctx.table("optimum_slopes", slopes)
    fams = [optimum_exact.family_exact(levels, m) for m in optimum.MEASURES]
    ctx.table("optimum_families", pl.concat([f for f in fams if f.height], how="diagonal_relaxed")
              if any(f.height for f in fams) else pl.DataFrame())  # fmt: skip
    twins = optimum_exact.twin_contrasts(trials, levels, o.confidence)
    ctx.table("twins", twins)
    if levels.height and levels.filter(pl.col("flag") == "").height:
        ctx.chart("level_along_ladder", level_along_ladder(ladder_cells(trials, confidence=o.confidence), levels,
                                                           confidence=o.confidence),
                  "Kurtosis / null along the whole lr ladder, one line per width, one panel per optimiser; diamonds: "
                  "each width's fitted loss-optimal lr* and the level there with its seed-bootstrap interval "
                  f"({o.n_boot} replicates; optimum.csv). Read a trend across widths at the diamonds, not at one "
                  "lr or at the best grid point.")  # fmt: skip
        if levels.filter(pl.col("flag") == "").get_column("d_model").n_unique() > 1:
            ctx.chart("level_at_optimum", level_at_optimum(levels, ctx.x, confidence=o.confidence, n_boot=o.n_boot),
                      "The estimand: each optimiser's level at each width's fitted loss-optimal lr* against N, in "
                      "kurtosis / null and in the width-free raw top-1 share (a fixed share is flat), beside what a "
                      "random basis reads (dashed); filled points carry their seed-bootstrap interval, hollow ones ran "
                      "one seed. Slopes: optimum_slopes.csv.")  # fmt: skip
    for note in (slope_note(slopes), reading_note(slopes), twin_note(twins)):
        if note:
            ctx.note(note)


def with_interpolated(trials: pl.DataFrame, levels: pl.DataFrame, slopes: pl.DataFrame, x: str,
                      o: Options) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``levels`` and ``slopes`` with the level at lr* read again by interpolation between the two
    measured rungs around it (``optimum.interpolate_at``), as columns ``<column>_interpolated``: the
    same rows in the same order (the tables are built from the same trials) and the same bootstrap
    draws (the reading draws no random numbers)."""
    if not levels.height:
        return levels, slopes
    lv, sl = width_trend.optimum_tables(trials, x, n_boot=o.n_boot, seed=o.seed, confidence=o.confidence,
                                    reading="interpolated")  # fmt: skip
    keys = {"tuning_id": (levels, lv), "optimizer": (slopes, sl), "measure": (slopes, sl)}
    for key, (a, b) in keys.items():
        if a.height and not a.get_column(key).equals(b.get_column(key)):
            raise AssertionError(f"the interpolated reading's rows differ from the line's in {key}")
    level_cols = [c for c in lv.columns if c.endswith(("_over_null", "_over_null_low", "_over_null_high"))
                  or c.startswith("top1_share_raw")]  # fmt: skip
    slope_cols = ["slope", "slope_low", "slope_high", "decision"]
    levels = levels.with_columns(lv.select([pl.col(c).alias(f"{c}_interpolated") for c in level_cols]))
    if slopes.height:
        slopes = slopes.with_columns(sl.select([pl.col(c).alias(f"{c}_interpolated") for c in slope_cols]))
    return levels, slopes


def reading_note(slopes: pl.DataFrame) -> str:
    """Where reading the level by interpolation instead of the registered line fit changes a verdict."""
    if not slopes.height or "decision_interpolated" not in slopes.columns:
        return ""
    moved = slopes.filter(pl.col("decision") != pl.col("decision_interpolated"))
    head = ("Read by interpolation between the two measured rungs around lr* instead of the registered line through "
            "the best and both neighbours (which can land outside those rungs where the ladder bends sharply; "
            "optimum_slopes.csv's *_interpolated columns, the same bootstrap draws): ")
    if not moved.height:
        return head + "no verdict changes."
    parts = [f"{r['optimizer']} ({r['measure']}{', ' + str(r['parametrization']) if r.get('parametrization') else ''}): "
             f"{r['slope']:+.3f}, {r['decision']} by the line; {r['slope_interpolated']:+.3f} "
             f"[{r['slope_low_interpolated']:+.3f}, {r['slope_high_interpolated']:+.3f}], "
             f"{r['decision_interpolated']} by interpolation"
             for r in moved.iter_rows(named=True)]  # fmt: skip
    return head + "; ".join(parts) + "."


def slope_note(slopes: pl.DataFrame) -> str:
    """The slopes against log N at the fitted optimum, per line and measure, with their decisions."""
    if not slopes.height:
        return ""
    vary = [a for a in width_trend.LINE_AXES if a in slopes.columns and slopes.get_column(a).drop_nulls().n_unique() > 1]
    def interval(r: dict) -> str:
        return f" [{r['slope_low']:+.3f}, {r['slope_high']:+.3f}]" if math.isfinite(r["slope_low"]) else ""

    parts = [f"{' · '.join([r['optimizer'], *(str(r[a]) for a in vary if r[a] is not None)])} ({r['measure']}): "
             f"{r['slope']:+.3f}{interval(r)} {r['decision']}"
             for r in slopes.filter(pl.col("slope").is_not_nan()).iter_rows(named=True)]  # fmt: skip
    tpp = slopes.get_column("tokens_per_param")[0]
    raw = (f" The {width_trend.RAW_SHARE} rows are width-free: the slope of log(raw top-1 share), that of share / null plus "
           "the null's own (null_slope): the null falls with width, so a coordinate holding a fixed share reads a "
           "rising share / null and 0 here. For a twin contrast: the optimiser's raw-share slope less its twin's slope "
           "over the null." if (slopes.get_column("measure") == width_trend.RAW_SHARE).any() else "")
    return ("Slopes of log(level / null) against log N at each width's fitted loss-optimal lr (optimum_slopes.csv; "
            "percentile seed-bootstrap intervals; an interval excluding 0 decides growth (a fall), one inside "
            f"±0.1 no growth (both: by < 0.1), otherwise undecided; tokens per parameter {tpp}): " + "; ".join(parts)
            + "." + raw)  # fmt: skip


def twin_note(twins: pl.DataFrame) -> str:
    """Each optimiser minus its rotated twin, paired by seed, in words."""
    if not twins.height:
        return ""
    parts = [f"{r['optimizer']} − {r['twin']} at d_model {r['d_model']}, lr {r['lr']:g}: ×{r['ratio']:.2f} "
             f"(log {r['difference']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}], {r['n_seeds']} seeds, "
             f"sign-flip p = {r['p_sign_flip']:.3g}, the least {r['n_seeds']} seeds can give {r['p_min']:.3g})"
             for r in twins.iter_rows(named=True)]  # fmt: skip
    return ("The primary contrast, each per-coordinate optimiser minus its rotated twin (the same rule in a fixed "
            "random basis), paired by seed at one lr (the shared lr nearest the optimiser's fitted lr*; twins.csv), "
            "in kurtosis / null: " + "; ".join(parts) + ".")


SECTION = Section("optimum", add, metrics=(Metric.KURTOSIS, Metric.TOP1_SHARE))
