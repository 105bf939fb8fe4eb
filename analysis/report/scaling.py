"""The report's scaling section: each fit spec (``fits.DEFAULT_FITS``) fitted against model
size per config at the best-lr points, with its chart; the fits, comparisons and levels tables
(``ctx.table``: fits.csv, comparisons.csv, levels.csv, ...). Outlier counts are fitted as
fractions by a binomial GLM (``analysis.counts``); the rest as power laws (``analysis.fits``).
The tables' Holm adjustment and the slopes chart come later (``slopes``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analysis import charts, counts, fits, queries, selection
from analysis.null import NULL_LABEL
from analysis.query_base import group_keys, summarise
from analysis.report import render
from analysis.report.fits import FitSpec, compare_family_lines, compare_lines, level_rows, primary_fit
from analysis.report.section import Context, Section, site_title

__all__ = ["SECTION"]


@dataclass
class _Rows:
    """The tables' rows, gathered over the fit specs."""

    fits: list[pl.DataFrame] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    family_comparisons: list[dict[str, Any]] = field(default_factory=list)
    levels: list[dict[str, Any]] = field(default_factory=list)
    family_levels: list[dict[str, Any]] = field(default_factory=list)


def add(ctx: Context) -> None:
    """Every fit spec in turn (a missing metric: a note, or nothing for a store that predates
    it), then the tables (``ctx.table``) and a note on the fits that are undefined."""
    rows = _Rows()
    for spec in ctx.options.fit_specs:
        if spec.count:
            _count_fit(ctx, spec, rows)
            continue
        inputs = _inputs(ctx, spec)
        if inputs is None:
            continue
        per, table = inputs
        # a fixed row order: the bootstrap resamples by position (group_by order is not fixed)
        per = per.filter(pl.col("value").is_finite()).sort(ctx.line, ctx.x, "seed", "trial_id")
        fitted = _fit(ctx, spec, per, rows)
        if spec.chart:
            _chart(ctx, spec, per, table, fitted)
    c = ctx.content
    if rows.skipped:
        c.skipped = pl.from_dicts(rows.skipped)
        ctx.note(
            f"{len(rows.skipped)} fits are undefined and not listed: "
            + "; ".join(f"{r['fit']}: {r['config']} ({_why(r['note'])})" for r in rows.skipped)
            + "."
        )
    fitted = len(ctx.sizes) >= 2
    # the fits table is written wherever fits could be made, even with none defined
    ctx.table("fits", pl.concat(rows.fits, how="diagonal_relaxed") if rows.fits else c.fits, keep_empty=fitted)
    confidence = f"{ctx.confidence:.0%}"
    for name, title, caption, table in (
        ("comparisons", "Exponent differences", "exponent(b) − exponent(a) between optimisers at the same norm and "
         f"rotation. {render.COMPARISONS}", render.comparisons_table),
        ("family_comparisons", "Family differences", "exponent(family b) − exponent(family a) at the same norm and "
         f"rotation. {render.FAMILY_COMPARISONS}", render.family_comparisons_table),
        ("levels", "Levels at each size", f"Seed mean [{confidence} CI] (seeds). {render.LEVELS}", render.levels_table),
        ("family_levels", "Family differences in level", "level(family b) − level(family a) at each size, same norm "
         f"and rotation. {render.FAMILY_LEVELS}", render.family_levels_table),
    ):  # fmt: skip
        found = getattr(rows, name)
        frame = pl.from_dicts(found) if found else pl.DataFrame()
        ctx.table(name, frame, caption, title=title, shown=table, link=name != "comparisons")


def _inputs(ctx: Context, spec: FitSpec) -> tuple[pl.DataFrame, pl.DataFrame | None] | None:
    """One spec's per-trial values (and, for a runs column, its chart's table), or None (with a
    note where the report should say why) when the store lacks what it reads."""
    if spec.site is None:
        if spec.metric not in ctx.done.columns:
            ctx.note(f"runs have no column {spec.metric}: {spec.label} skipped.")
            return None
        per = queries.runs_table(ctx.main).with_columns(value=pl.col(spec.metric)).collect()
        return per, queries.loss_table(ctx.main, spec.metric, confidence=ctx.confidence).collect()
    if spec.metric not in {m for _, _, m in ctx.have}:
        return None  # a store written before the metric existed: nothing to say
    if (spec.site, spec.basis, spec.metric) not in ctx.have:
        ctx.note(f"no {spec.metric} at {spec.site}/{spec.basis}: {spec.label} skipped.")
        return None
    control = queries.CONTROL if spec.control else None
    if control and (*control, spec.metric) not in ctx.have:
        ctx.note(f"no {spec.metric} control at {'/'.join(control)}: {spec.label} skipped.")
        return None
    per = queries.per_trial(
        ctx.main, spec.metric, spec.site, spec.basis or "", spec.layer_agg, control=control,
        over_null=spec.over_null,
    ).collect()  # fmt: skip
    return per, None


def _fit(ctx: Context, spec: FitSpec, per: pl.DataFrame, rows: _Rows) -> dict[Any, Any]:
    """The levels at each size; at two or more sizes the power-law fit per line, its table rows
    and the comparisons between optimisers and families. Returns the fits (empty: none)."""
    o, x, line = ctx.options, ctx.x, ctx.line
    is_primary = spec is primary_fit(o.fit_specs, o.primary)
    levels, family_levels = level_rows(per, x, line, spec, o.confidence, o.primary, is_primary)
    rows.levels += levels
    rows.family_levels += family_levels
    if len(ctx.sizes) < 2:
        return {}
    ctx.say(f"fitting {spec.label}")
    fitted = fits.fit_each(
        per, x, "value", [line], offset=spec.offset, n_boot=o.n_boot, seed=o.seed,
        seeds="seed", confidence=o.confidence,
    )  # fmt: skip
    ft = _labelled(fits.fits_table(fitted, [line]), per, line, spec)
    rows.fits.append(ft.filter(pl.col("exponent").is_not_null()))
    rows.skipped += ft.filter(pl.col("exponent").is_null()).select("fit", "config", "note").to_dicts()
    rows.comparisons += compare_lines(per, x, line, spec, o.n_boot, o.seed, o.confidence, fitted)
    rows.family_comparisons += compare_family_lines(per, line, spec, o.confidence, fitted, o.primary, is_primary)
    return fitted


def _chart(ctx: Context, spec: FitSpec, per: pl.DataFrame, table: pl.DataFrame | None, fitted: dict[Any, Any]) -> None:
    """The spec's values against size (seed means), with its fitted lines where there are fits."""
    confidence, x, line = ctx.confidence, ctx.x, ctx.line
    curves = None
    if fitted:
        curves = fits.fit_curves(fitted, [line], x=x).join(_carried(per, line, x), on=line, how="left")
    if spec.site is None:
        chart = charts.loss_vs_params(table, curves, column=spec.metric, x=x, facet=ctx.facet)
        caption = "Final validation loss against model size, log-log"
    else:
        table = queries.scale_table(
            ctx.main, spec.metric, spec.site, spec.basis or "", spec.layer_agg,
            confidence=confidence, control=queries.CONTROL if spec.control else None,
            over_null=spec.over_null,
        ).collect()  # fmt: skip
        ratio = {"reference": 1.0, "reference_text": NULL_LABEL,
                 "y_title": charts.METRIC_TITLES["kurtosis_over_null"]} if spec.over_null else {}  # fmt: skip
        chart = charts.metric_vs_params(
            table, curves, metric=spec.metric, x=x, facet=ctx.facet,
            title=site_title(spec.site, spec.basis), **ratio,
        )  # fmt: skip
        caption = f"{spec.label[:1].upper()}{spec.label[1:]} against model size (log x)"
        if spec.over_null:
            caption += " (1 = no privileged basis; the fitted exponent is the slope of log(kurtosis / null))"
    fitted_note = (
        f"; lines: power-law fits of y − {spec.offset:g} with {confidence:.0%} bootstrap bands"
        if fitted and spec.offset
        else "; lines: power-law fits with bootstrap bands"
        if fitted
        else ""
    )
    ctx.chart(
        f"{spec.name}_vs_params", chart, f"{caption}; {ctx.shown}: seed means with {confidence:.0%} t-intervals{fitted_note}."
    )


def _count_fit(ctx: Context, spec: FitSpec, rows: _Rows) -> None:
    """The outlier-fraction fit of one count spec (``analysis.counts``): its fits-table rows,
    the configs it could not fit, and its charts (by size with the fit, by layer per size)."""
    if (spec.site, spec.basis, spec.metric) not in ctx.have:
        ctx.note(f"no {spec.metric} at {spec.site}/{spec.basis}: {spec.label} skipped.")
        return
    ctx.say(f"fitting {spec.label}")
    confidence, x, line, shown, facet = ctx.confidence, ctx.x, ctx.line, ctx.shown, ctx.facet
    per = queries.per_trial(ctx.main, spec.metric, spec.site or "", spec.basis or "", "sum").collect()
    per = per.filter(pl.col("value").is_finite()).with_columns(
        exposure=(pl.col("d_model") * pl.col("n_layers")).cast(pl.Float64)
    ).with_columns(fraction=pl.col("value") / pl.col("exposure")).sort(line, x, "seed", "trial_id")
    table_rows = pl.DataFrame(schema={"fit": pl.String})
    curves = None
    if len(ctx.sizes) >= 2:
        fitted = counts.fit_counts_each(per, x, "value", "exposure", [line], confidence=confidence)
        ft = _labelled(counts.count_fits_table(fitted, [line]), per, line, spec)
        table_rows = ft.filter(pl.col("exponent").is_not_null())
        rows.skipped += ft.filter(pl.col("exponent").is_null()).select("fit", "config", "note").to_dicts()
        curves = counts.count_fit_curves(fitted, [line], x=x).join(_carried(per, line, x), on=line, how="left")
    rows.fits.append(table_rows)
    keys, carry = group_keys(per.lazy(), None)
    table = summarise(per.lazy(), keys, "fraction", confidence=confidence, carry=carry).collect()
    where = site_title(spec.site, spec.basis)
    drawn = [(
        f"{spec.name}_vs_params",
        charts.metric_vs_params(table, curves, metric="outlier_fraction", x=x, facet=facet, title=where),
        f"Outlier fraction ({spec.metric}: coordinates beyond 6× the token's RMS on any eval token, "
        f"summed over blocks, / (d_model × blocks)), {where}, against model size; {shown}: seed means with "
        f"{confidence:.0%} t-intervals"
        + (f"; lines: binomial GLM fits with {confidence:.0%} bands (seed-clustered)" if curves is not None and curves.height else "")
        + f". {counts.STRUCTURAL_NOTE}.",
    )]  # fmt: skip
    prof = queries.layer_profile(ctx.main, spec.metric, spec.site or "", spec.basis or "", confidence=confidence).collect()
    if prof.height:
        scaled = [c for c in ("mean", "std", "sem", "ci_low", "ci_high") if c in prof.columns]
        prof = prof.with_columns(pl.col(c) / pl.col("d_model") for c in scaled)
        drawn.append((
            f"{spec.name}_by_layer",
            charts.kurtosis_by_layer(prof, metric="outlier_fraction", size=None, facet=facet,
                                     title=f"Outlier fraction by layer, {where}"),
            f"Outlier fraction ({spec.metric} / d_model) by layer, {where}, one row per model size; {shown}; "
            f"seed means with {confidence:.0%} t-intervals. {counts.STRUCTURAL_NOTE}.",
        ))  # fmt: skip
    for name, chart, caption in drawn:  # both built before either is handed on (as ever: the same specs)
        ctx.chart(name, chart, caption)


def _labelled(table: pl.DataFrame, per: pl.DataFrame, line: str, spec: FitSpec) -> pl.DataFrame:
    """A fits table with its lines' labels and the fit's name first, in a fixed order."""
    ft = table.join(selection.line_labels(per, line), on=line, how="left")
    ft = ft.select(pl.lit(spec.label).alias("fit"), pl.all())
    return ft.sort([c for c in ("optimizer", "norm", "rotation_label", "config") if c in ft.columns])


def _carried(per: pl.DataFrame, line: str, x: str) -> pl.DataFrame:
    """Each line's constant columns, to join onto its fitted curve."""
    return per.group_by(line).agg(pl.col(c).first() for c in queries.carried(per.columns, [line, x, "lr"]))


def _why(note: str | None) -> str:
    """A skipped fit's reason in a few words."""
    note = note or ""
    if "<= 0" in note:
        return "no excess: " + note.split(":")[0]
    return note.split(";")[0]


SECTION = Section("scaling", add, fit_metrics=True)
