"""The level along the whole lr ladder: kurtosis / null against lr (both log), one line per width,
one panel per optimiser, each width's fitted loss-optimal lr* marked (``analysis.optimum``). A
reader sees at once whether width (the lines' order at one lr) or lr (each line's slope) moves the
level. And the estimand itself (``level_at_optimum``): the level at each width's lr* against N,
one line per optimiser, in kurtosis / null and in the width-free raw top-1 share, beside the
random-basis null."""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import numpy as np
import polars as pl

from analysis.charts.layers import titled
from analysis.charts.style import OPTIMIZER_COLORS, PANEL_WIDTH, lr_axis, optimizer_scale
from analysis.width_trend import LINE_AXES
from resultstore.vocabulary import Metric

__all__ = ["level_along_ladder", "level_at_optimum", "ladder_cells"]

WIDTH_COLORS = ["#56B4E9", "#0072B2", "#00204D", "#6A3D9A", "#B15928"]
"""Light to dark with width (a sequential, colour-blind-safe ramp)."""


def _with_line(df: pl.DataFrame, axes: list[str]) -> pl.DataFrame:
    """``line``: the optimiser, then the value of each axis in ``axes`` ("adam · mup")."""
    parts = [pl.col("optimizer"), *[pl.col(a).cast(pl.String).fill_null("") for a in axes]]
    return df.with_columns(line=pl.concat_str(parts, separator=" · "))


def ladder_cells(trials: pl.DataFrame, measure: str = Metric.KURTOSIS, confidence: float = 0.95) -> pl.DataFrame:
    """Per (optimiser, width, lr): the geometric seed mean of measure / null, exp(mean of
    ``log_<measure>``), and exp of its t-interval over seeds (null bounds with one seed), ``n``."""
    from scipy import stats

    col = f"log_{measure}"
    lines = [a for a in LINE_AXES if a in trials.columns]
    cells = trials.group_by("optimizer", "optimizer_family", *lines, "d_model", "lr").agg(
        m=pl.col(col).mean(), s=pl.col(col).std(), n=pl.len().cast(pl.Int64))
    t = np.array([stats.t.ppf((1 + confidence) / 2, n - 1) if n > 1 else math.nan for n in cells.get_column("n")])
    half = pl.Series(t) * cells.get_column("s") / cells.get_column("n").cast(pl.Float64).sqrt()
    return cells.with_columns(
        ratio=pl.col("m").exp(), low=(pl.col("m") - half).exp(), high=(pl.col("m") + half).exp(),
    ).drop("m", "s").sort("optimizer", "d_model", "lr")


def level_along_ladder(
    cells: pl.DataFrame, levels: pl.DataFrame, measure: str = Metric.KURTOSIS, *, columns: int = 4,
    title: str = "Kurtosis / null along the lr ladder, by width", caption: str | None = None,
    confidence: float = 0.95, configure: bool = True,
) -> Any:
    """``cells`` (``ladder_cells``) and ``levels`` (``width_trend.optimum_tables``' first table): lines
    per width (seed geometric means, bars: seed t-intervals), a diamond at each width's fitted lr*
    and level there (bars: its bootstrap interval in both directions), the null (1) dashed; one
    panel per optimiser, x independent (each optimiser's ladder), y shared (levels comparable)."""
    vary = [a for a in LINE_AXES if a in cells.columns and a in levels.columns and cells.get_column(a).n_unique() > 1]
    cells, levels = _with_line(cells, vary), _with_line(levels, vary)
    known = [*OPTIMIZER_COLORS, *sorted(cells.get_column("optimizer").unique())]
    order = sorted(cells.get_column("line").unique().to_list(),
                   key=lambda line: (_family_rank(cells, line), known.index(line.split(" · ")[0]), line))
    interpolated = f"{measure}_over_null_interpolated"
    ok = levels.filter(pl.col("flag") == "").select(
        "optimizer", "line", "d_model", lr="lr_star", lr_low="lr_star_low", lr_high="lr_star_high",
        ratio=f"{measure}_over_null", low=f"{measure}_over_null_low", high=f"{measure}_over_null_high",
        **({"ratio_interpolated": interpolated} if interpolated in levels.columns else {}),
    ).with_columns(kind=pl.lit("optimum"))  # fmt: skip
    df = pl.concat([cells.with_columns(kind=pl.lit("cell")), ok], how="diagonal_relaxed")
    words = {r["d_model"]: f"d_model {r['d_model']} ({r['tokens_per_param']:.1f} tokens/param)"
             for r in levels.unique("d_model").iter_rows(named=True)}  # fmt: skip
    df = df.with_columns(width=pl.col("d_model").replace_strict(words, default=None, return_dtype=pl.String)
                         .fill_null(pl.format("d_model {}", pl.col("d_model"))), null=pl.lit(1.0),
                         panel=pl.col("line").replace_strict(_panels(cells), default=None))  # fmt: skip
    widths = [words.get(d, f"d_model {d}") for d in sorted(df.get_column("d_model").unique())]
    color = alt.Color("width:N", title="Width", scale=alt.Scale(domain=widths, range=WIDTH_COLORS[: len(widths)]),
                      sort=widths, legend=alt.Legend(symbolType="stroke", symbolStrokeWidth=3))  # fmt: skip
    x = alt.X("lr:Q", title="Learning rate (log)", scale=alt.Scale(type="log", nice=False, padding=8),
              axis=lr_axis(df.get_column("lr").drop_nulls().to_list()))  # fmt: skip
    y = alt.Y("ratio:Q", title=f"{'Kurtosis' if measure == Metric.KURTOSIS else 'Top-1 share'} / null (log)",
              scale=alt.Scale(type="log", nice=False, padding=8), axis=alt.Axis(format="~g"))  # fmt: skip
    cell, opt = alt.datum.kind == "cell", alt.datum.kind == "optimum"
    tips = ["line:N", "width:N", alt.Tooltip("lr:Q", format=".3g"), alt.Tooltip("ratio:Q", format=".3f"), "n:Q"]
    layers = [
        alt.Chart().mark_rule(strokeDash=[4, 3], color="#777777", strokeWidth=1).encode(y="null:Q"),
        alt.Chart().transform_filter(cell).mark_line(strokeWidth=1.6).encode(x=x, y=y, color=color),
        alt.Chart().transform_filter(cell & (alt.datum.n > 1)).mark_rule(strokeWidth=1.2).encode(
            x=x, y="low:Q", y2="high:Q", color=color),
        alt.Chart().transform_filter(cell).mark_point(size=26, filled=True, opacity=1).encode(
            x=x, y=y, color=color, tooltip=tips),
        alt.Chart().transform_filter(opt).mark_rule(strokeWidth=1.4).encode(x=x, y="low:Q", y2="high:Q", color=color),
        alt.Chart().transform_filter(opt).mark_rule(strokeWidth=1.4).encode(
            x="lr_low:Q", x2="lr_high:Q", y=y, color=color),
        alt.Chart().transform_filter(opt).mark_point(shape="diamond", size=110, filled=True, stroke="white",
                                                     strokeWidth=0.8, opacity=1).encode(x=x, y=y, color=color,
                                                                                         tooltip=tips),
    ]  # fmt: skip
    if "ratio_interpolated" in ok.columns:  # the check on the line fit: where it differs, the ladder bends at lr*
        layers.append(alt.Chart().transform_filter(opt).mark_point(shape="diamond", size=110, filled=False,
                                                                   strokeWidth=1.4, opacity=1).encode(
            x=x, y=alt.Y("ratio_interpolated:Q"), color=color,
            tooltip=[*tips[:3], alt.Tooltip("ratio_interpolated:Q", format=".3f")]))  # fmt: skip
    panel_width = int(PANEL_WIDTH * 0.85)
    chart = (
        alt.layer(*layers, data=df)
        .properties(width=panel_width, height=int(panel_width * 0.8))
        .facet(facet=alt.Facet("panel:N", sort=[_panels(cells)[o] for o in order], title=None, header=alt.Header(labelFontSize=11)),
               columns=columns)
        .resolve_scale(x="independent")
    )  # fmt: skip
    caption = caption or (
        f"{'Kurtosis' if measure == Metric.KURTOSIS else 'Top-1 share'} / null of the residual stream (stored basis, mean "
        "over blocks, final step) against the learning rate, one line per width, one panel per optimiser: seed "
        f"geometric means, bars {confidence:.0%} t-intervals where an lr ran 2+ seeds. Diamond: the width's fitted "
        "loss-optimal lr* (the vertex of the parabola of val loss against log lr through the best lr and its "
        "neighbours) and the level there (a line fit of the log level over the same three lrs), bars its seed "
        "bootstrap interval in lr and in level. Hollow diamond, where drawn: the level read instead straight between "
        "the two measured lrs around lr* (a check: the line overshoots where the ladder bends at its best). Dashed: "
        "the null (1: no privileged basis). At one lr the lines' order is width's effect; along a line, lr's.")
    n_cols = min(columns, len(order))
    return titled(chart, title, [], caption, n_cols * (panel_width + 40), configure)


AT_OPTIMUM = {"kurtosis_over_null": "Kurtosis / null", "top1_share_raw": "Top-1 share (raw)"}
"""The measures ``level_at_optimum`` draws (levels column: row title): one over its null, one width-free."""
_PARAMETRIZATIONS = {"sp": "SP", "mup": "muP"}


def level_at_optimum(levels: pl.DataFrame, x: str = "params_non_embedding", *, confidence: float = 0.95,
                     n_boot: int | None = None, title: str = "The level at each width's fitted loss-optimal lr",
                     caption: str | None = None, configure: bool = True) -> Any:
    """``levels`` (``width_trend.optimum_tables``' first table): per optimiser, the level at each width's
    lr* against ``x`` (both log), bars its seed-bootstrap interval (a hollow point: a ladder of one
    seed, no interval); one row of panels per measure (``AT_OPTIMUM``: kurtosis / null, and the raw
    top-1 share, where a coordinate holding a fixed share is flat), one column per parametrization
    (with one parametrization, the two measures side by side);
    dashed grey: what a random basis reads (1, and ``top_share_null(d)``, which falls with d)."""
    from analysis.null import top_share_null

    have = [c for c in AT_OPTIMUM if c in levels.columns]
    if not levels.height or not have:
        return None
    ok = levels.filter(pl.col("flag") == "")
    if "parametrization" not in ok.columns:
        ok = ok.with_columns(parametrization=pl.lit("sp"))
    ok = ok.with_columns(par=pl.col("parametrization").replace_strict(_PARAMETRIZATIONS, default=pl.col("parametrization")))
    frames = []
    for col in have:
        frames.append(ok.select(
            "optimizer", "par", "d_model", n=pl.col(x).cast(pl.Float64), value=col, low=f"{col}_low", high=f"{col}_high",
            measure=pl.lit(AT_OPTIMUM[col]), kind=pl.lit("level"),
            seeds=pl.when(pl.col(f"{col}_low").is_nan()).then(pl.lit("one seed")).otherwise(pl.lit("3+ seeds"))))
        null = ok.unique(["par", "d_model"]).select("par", "d_model", n=pl.col(x).cast(pl.Float64)).with_columns(
            value=pl.col("d_model").map_elements(top_share_null, return_dtype=pl.Float64) if col == "top1_share_raw"
            else pl.lit(1.0), measure=pl.lit(AT_OPTIMUM[col]), kind=pl.lit("null"), optimizer=pl.lit("random-basis null"))
        frames.append(null)
    df = pl.concat(frames, how="diagonal_relaxed").sort("kind", "optimizer", "par", "n")
    fams = dict(ok.select("optimizer", "optimizer_family").unique("optimizer").iter_rows()) if "optimizer_family" in ok.columns else {}
    names = sorted(set(ok.get_column("optimizer")))
    known = [*OPTIMIZER_COLORS, *names]
    names.sort(key=lambda o: (fams.get(o) != "per_coordinate", known.index(o)))  # per-coordinate optimisers first
    color = alt.Color("optimizer:N", title="Optimiser", scale=optimizer_scale(names), sort=names)
    n_lo, n_hi = df.select(lo=pl.col("n").min(), hi=pl.col("n").max()).row(0)
    xs = alt.X("n:Q", title="N, non-embedding (log)" if x == "params_non_embedding" else f"{x} (log)",
               scale=alt.Scale(type="log", nice=False, padding=14), axis=alt.Axis(format="~s", values=_log_ticks(n_lo, n_hi)))
    level, null = alt.datum.kind == "level", alt.datum.kind == "null"
    tips = ["optimizer:N", "par:N", "d_model:Q", alt.Tooltip("value:Q", format=".3f"), alt.Tooltip("low:Q", format=".3f"),
            alt.Tooltip("high:Q", format=".3f"), "seeds:N"]
    pars = [p for p in ("SP", "muP") if p in set(ok.get_column("par"))] + sorted(set(ok.get_column("par")) - {"SP", "muP"})
    panel_width = int(PANEL_WIDTH * 0.85)
    rows = []
    for i, col in enumerate(have):
        part = df.filter(pl.col("measure") == AT_OPTIMUM[col])
        lo, hi = part.select(lo=pl.min_horizontal("value", "low").min(), hi=pl.max_horizontal("value", "high").max()).row(0)
        y = alt.Y("value:Q", title=f"{AT_OPTIMUM[col]} (log)", axis=alt.Axis(format="~g", values=_log_ticks(lo, hi)),
                  scale=alt.Scale(type="log", nice=False, padding=8, zero=False))
        layers = [
            alt.Chart().transform_filter(null).mark_line(strokeDash=[4, 3], color="#777777", strokeWidth=1.2).encode(
                x=xs, y=y),
            alt.Chart().transform_filter(level).mark_line(strokeWidth=1.6).encode(x=xs, y=y, color=color),
            alt.Chart().transform_filter(level & (alt.datum.seeds != "one seed")).mark_rule(strokeWidth=1.4).encode(
                x=xs, y="low:Q", y2="high:Q", color=color),
            alt.Chart().transform_filter(level).mark_point(size=46, opacity=1, strokeWidth=1.8, filled=True).encode(
                x=xs, y=y, stroke=color, fill=alt.condition(alt.datum.seeds == "one seed", alt.value("white"), color),
                tooltip=tips),
        ]  # fmt: skip
        header = alt.Header(labelFontSize=12) if i == 0 else alt.Header(labels=False)
        rows.append(alt.layer(*layers, data=part).properties(width=panel_width, height=int(panel_width * 0.8))
                    .facet(column=alt.Column("par:N", sort=pars, title=None, header=header)))
    # one parametrization: the two measures side by side; two: a row each, SP and muP in columns
    chart = (alt.hconcat(*rows, spacing=24) if len(pars) == 1 else alt.vconcat(*rows, spacing=12)).resolve_scale(
        color="shared", stroke="shared")
    boots = f"{n_boot} replicates, " if n_boot else ""
    caption = caption or (
        "Each optimiser's level at each width's fitted loss-optimal lr* (optimum.csv), against the non-embedding "
        f"parameter count: filled points with bars, a {confidence:.0%} seed-bootstrap interval ({boots}over the seeds "
        "each lr ran); hollow points, a ladder of one seed (no interval). First: kurtosis / null of the "
        "residual stream (stored basis, mean over blocks, final step). Second: the raw top-1 share of each token's "
        "centred energy, width-free: a coordinate holding a fixed share is flat. Dashed grey: what a random basis "
        "reads (kurtosis / null 1; top-1 share top_share_null(d), falling with d). Each line's slope in log-log is in "
        "optimum_slopes.csv, with its interval and verdict.")
    panels_across = len(pars) if len(pars) > 1 else len(rows)
    return titled(chart, title, [], caption, panels_across * (panel_width + 60) + 120, configure)


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Round tick values (1, 1.2, 1.5, 2, 3, 5, 7 per decade) between ``lo`` and ``hi``, at most 7:
    a log axis over less than a decade otherwise labels one or two ticks."""
    lo, hi = (lo, hi) if math.isfinite(lo) and math.isfinite(hi) and lo > 0 else (0.1, 10.0)
    steps = (1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 7.0)
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1) for m in steps]
    ticks = [t for t in ticks if lo / 1.05 <= t <= hi * 1.05]
    return [round(t, 12) for t in ticks[:: max(1, math.ceil(len(ticks) / 7))]]


def _panels(cells: pl.DataFrame) -> dict[str, str]:
    """Each line's panel title: its name and family."""
    fams = dict(cells.select("line", "optimizer_family").unique("line").iter_rows())
    return {o: f"{o} ({(f or '?').replace('_', ' ')})" for o, f in fams.items()}


def _family_rank(cells: pl.DataFrame, line: str) -> int:
    """Per-coordinate optimisers' panels first."""
    fam = cells.filter(pl.col("line") == line).get_column("optimizer_family")
    return 0 if fam.len() and fam[0] == "per_coordinate" else 1
