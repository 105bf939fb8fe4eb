"""One seed-aggregated measure against another, per config: matched loss, quantisation."""

from __future__ import annotations

import math
from typing import Any, Literal

import altair as alt
import polars as pl

from analysis.charts.frames import (
    as_frame, decorate, size_column, tooltip, variant_order, variant_title, varies, with_null,
)  # fmt: skip
from analysis.charts.layers import (
    assemble, assembled_width, interval_words, null_per_width, reference_rule, titled, y_scale_for,
)  # fmt: skip
from analysis.charts.style import (
    COLOR_LEGEND, METRIC_TITLES, REFERENCES, format_count, metric_title, optimizer_scale,
)  # fmt: skip
from resultstore.vocabulary import Basis, Metric

__all__ = ["LADDER_VIEWS", "best_of_each_ladder", "kurtosis_vs_loss", "metric_vs_metric", "quant_penalty"]

SIZE_LEGEND = alt.Legend(symbolFillColor="#555555", symbolStrokeColor="#555555", symbolOpacity=1)
"""Marker size's legend in grey at full strength (the faint ladder points share its scale)."""

Ladder = Literal["best", "faded", "all"]
LADDER_VIEWS: tuple[str, ...] = ("best", "faded", "all")
"""How a chart of every config shows an lr ladder: only each ladder's best lr, the best lr
with the other lrs faded behind it, or every lr alike."""


def best_of_each_ladder(df: pl.DataFrame, best: pl.DataFrame | None = None) -> pl.Series:
    """Whether each row (a config: ``config_id``, ``tuning_id``, ``x`` = its seed-mean final
    val loss) is its lr ladder's chosen point: the ``config_id`` of ``best`` (e.g.
    ``selection.best_lr``) where given, else the lr with the lowest ``x`` in its ``tuning_id``
    (the config without its seed and lr), which is best_lr's choice unless a seed diverged."""
    if best is not None and "config_id" in best.columns:
        return df.get_column("config_id").is_in(best.get_column("config_id").implode())
    if "tuning_id" not in df.columns or "x" not in df.columns:
        return pl.Series([True] * df.height, dtype=pl.Boolean)
    first = df.with_row_index("_i").sort("x", "lr" if "lr" in df.columns else "x", nulls_last=True)
    chosen = first.group_by("tuning_id", maintain_order=True).first().get_column("_i")
    return pl.Series(range(df.height)).is_in(chosen.implode())



def metric_vs_metric(
    table: pl.DataFrame | pl.LazyFrame,
    *,
    x_title: str,
    y_title: str,
    facet: str | None = None,
    log_x: bool = False,
    log_y: bool | None = None,
    reference: float | None = None,
    x_reference: float | None = None,
    null_axis: str | None = None,
    connect: bool = True,
    title: str | None = None,
    ladder: Ladder = "all",
    best: pl.DataFrame | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """One seed-aggregated measure against another, per config (from ``selection.versus``:
    ``x``/``x_low``/``x_high`` against ``mean``/``ci_low``/``ci_high``): a point per config
    with both t-intervals as error bars, colour = optimiser, marker size = model size;
    ``connect`` joins each optimiser's (and variant's) points in order of size.
    ``null_axis`` ("x" or "y": the axis that shows kurtosis) draws the exact null
    3(d-1)/(d+1) of each model width as a rule there, instead of ``reference``.
    ``ladder``: "all" draws every config alike; "best" only each lr ladder's chosen point
    (``best_of_each_ladder``, from ``best`` where given); "faded" those, with the ladder's
    other lrs as faint points behind them (no intervals, no lines)."""
    frame = as_frame(table)
    others = None
    if ladder != "all" and frame.height:
        chosen = best_of_each_ladder(frame, best)
        others = frame.filter(~chosen) if ladder == "faded" else None
        frame = frame.filter(chosen)
    df = decorate(frame, facet)
    if null_axis is not None:
        df = with_null(df, Metric.KURTOSIS)
        if "null_ref" in df.columns:
            reference = x_reference = None
    size_col = size_column(df)
    df = df.with_columns(kind=pl.lit("point"))
    if size_col:
        df = df.with_columns(
            size=pl.col(size_col).map_elements(lambda v: format_count(v), return_dtype=pl.String),
            _order=pl.col(size_col).cast(pl.Float64),
        )
    layers = _xy_layers(df, x_title, y_title, log_x, log_y, reference, x_reference, connect, size_col, null_axis)
    faded = others is not None and others.height > 0
    if faded:
        layers = [lay.transform_filter(alt.datum.kind == "point") for lay in layers[:4 if connect else 3]] + \
            layers[4 if connect else 3:]
        rest = decorate(others, facet).with_columns(kind=pl.lit("ladder"), variant=pl.lit(""))
        if size_col:
            rest = rest.with_columns(
                size=pl.col(size_col).map_elements(lambda v: format_count(v), return_dtype=pl.String),
                _order=pl.col(size_col).cast(pl.Float64))
        layers.insert(0, _ladder_layer(rest, df, x_title, y_title))
        df = pl.concat([df, rest], how="diagonal_relaxed")
    chart = assemble(layers, df, facet, keep=["x", "x_low", "x_high", "_order", "x_n", "lr"])
    points = df.filter(pl.col("kind") == "point")
    what = "" if ladder == "all" else " at the best lr of each ladder (the lowest seed-mean final val loss)"
    sized = ", marker size = model size" if size_col and varies(points, "size") else ""
    joined = ", joined across sizes" if connect else ""
    faint = "; faint: the ladder's other lrs that finished" if faded else ""
    bars = interval_words(points, confidence)
    bars = "One seed: no intervals." if bars.startswith("one seed") else f"Bars: {bars}, both ways."
    widths = sorted({int(v) for v in df.get_column("d_model").drop_nulls().to_list()}) if "d_model" in df.columns else []
    which = f" (d_model {', '.join(map(str, widths))}, {'bottom to top' if null_axis == 'y' else 'left to right'})" \
        if len(widths) > 1 else ""
    null = (f" Dashed: the exact null 3(d−1)/(d+1) of each width shown{which}." if "null_ref" in df.columns and null_axis
            else f" Dashed: {reference:g}." if reference is not None else "")
    caption = caption or f"One point per config{what}{sized}{joined}{faint}. {bars}{null}"
    return titled(chart, title or f"{y_title.split(' (')[0]} against {x_title.split(' (')[0].lower()}", [],
                   caption, assembled_width(df), configure)


def _ladder_layer(rest: pl.DataFrame, df: pl.DataFrame, x_title: str, y_title: str) -> alt.Chart:
    """The ladder's other lrs: faint points on the chart's scales, behind everything."""
    color = alt.Color("optimizer:N", scale=optimizer_scale([*df.get_column("optimizer").to_list(),
                                                            *rest.get_column("optimizer").to_list()]),
                      title="Optimizer", legend=COLOR_LEGEND)  # fmt: skip
    extra: dict[str, Any] = {}
    if "size" in rest.columns and "size" in df.columns and varies(df, "size"):  # the same scale as the main points
        order = df.select("size", "_order").unique().sort("_order").get_column("size").to_list()
        extra["size"] = alt.Size("size:N", sort=order, title="Model size", legend=SIZE_LEGEND, scale=alt.Scale(
            domain=order, range=[18 + 90 * i / max(1, len(order) - 1) for i in range(len(order))]))
    return (
        alt.Chart().mark_point(filled=True, opacity=0.28)
        .encode(x=alt.X("x:Q", title=x_title), y=alt.Y("mean:Q", title=y_title), color=color, tooltip=tooltip(rest, ["optimizer", "lr", "size", "x", "mean", "n"]),
                **extra)
        .transform_filter(alt.datum.kind == "ladder")
    )  # fmt: skip


def kurtosis_vs_loss(
    table: pl.DataFrame | pl.LazyFrame, *, facet: str | None = None, ladder: Ladder = "faded", **kw: Any
) -> alt.TopLevelMixin:
    """The matched-loss view: residual kurtosis (y) against final validation loss (x) per
    config (``selection.versus(loss_table, scale_table)``); configs at the same loss compare
    optimisers at matched quality, not matched steps. ``ladder`` (default "faded"): each lr
    ladder's best lr drawn, its other lrs faint behind ("best": hidden; "all": every lr alike;
    see ``metric_vs_metric``)."""
    kw.setdefault("title", "Kurtosis at matched loss")
    kw["ladder"] = ladder
    return metric_vs_metric(
        table, x_title=METRIC_TITLES["final_val_loss"], y_title=metric_title(Metric.KURTOSIS),
        facet=facet, reference=REFERENCES[Metric.KURTOSIS], null_axis="y", **kw,
    )  # fmt: skip


def quant_penalty(
    table: pl.DataFrame | pl.LazyFrame, *, facet: str | None = None, **kw: Any
) -> alt.TopLevelMixin:
    """What outliers cost: the quantisation penalty (y, from ``selection.quant_penalty``)
    against residual kurtosis (x), per config, coloured by optimiser."""
    df = as_frame(table)
    quant = df.get_column("quant").first() if "quant" in df.columns and df.height else Basis.W8A8
    kw.setdefault("title", f"{str(quant).upper()} quantisation penalty")
    return metric_vs_metric(
        df, x_title=metric_title(Metric.KURTOSIS),
        y_title=f"{str(quant).upper()} penalty (Δ val loss, nats/token)",
        facet=facet, x_reference=REFERENCES[Metric.KURTOSIS], null_axis="x", **kw,
    )  # fmt: skip


def _xy_layers(
    df: pl.DataFrame,
    x_title: str,
    y_title: str,
    log_x: bool,
    log_y: bool | None,
    reference: float | None,
    x_reference: float | None,
    connect: bool,
    size_col: str | None,
    null_axis: str | None = None,
) -> list[alt.Chart]:
    """Point + two-way error bars (+ connecting line) layers for ``metric_vs_metric``."""
    has_null = "null_ref" in df.columns and null_axis is not None
    y_scale = y_scale_for(df, log_y, reference, cols=("null_ref",) if has_null and null_axis == "y" else ())
    if has_null and null_axis == "x":  # the null is an x value: keep it out of the y domain
        y_scale = y_scale_for(df.drop("null_ref"), log_y, reference)
    xs = [v for c in ("x", "x_low", "x_high") if c in df.columns for v in df.get_column(c).to_list()
          if v is not None and math.isfinite(v)]  # fmt: skip
    if x_reference is not None:
        xs.append(x_reference)
    x_scale = alt.Scale(type="log" if log_x else "linear", zero=False, nice=False, padding=10)
    x_enc = alt.X("x:Q", title=x_title, scale=x_scale)
    color = alt.Color(
        "optimizer:N", scale=optimizer_scale(df.get_column("optimizer").to_list()),
        title="Optimizer", legend=COLOR_LEGEND,
    )  # fmt: skip
    extra: dict[str, Any] = {}
    if varies(df, "variant"):
        extra["shape"] = alt.Shape("variant:N", title=variant_title(df), sort=variant_order(df))
    if size_col and varies(df, "size"):
        order = df.select("size", "_order").unique().sort("_order").get_column("size").to_list()
        extra["size"] = alt.Size(
            "size:N", sort=order, title="Model size", legend=SIZE_LEGEND,
            scale=alt.Scale(domain=order, range=[18 + 90 * i / max(1, len(order) - 1) for i in range(len(order))]),
        )  # fmt: skip
    tip = tooltip(df, ["optimizer", "variant", "size", "x", "x_low", "x_high", "mean", "ci_low", "ci_high", "n"])
    layers: list[alt.Chart] = []
    if connect:
        layers.append(
            alt.Chart().mark_line(strokeWidth=1, opacity=0.6)
            .encode(x=x_enc, y=alt.Y("mean:Q", scale=y_scale), color=color, detail="variant:N",
                    order=alt.Order("_order:Q") if size_col else alt.Undefined)
        )  # fmt: skip
    layers += [
        alt.Chart().mark_rule(strokeWidth=1).encode(
            x=x_enc, y=alt.Y("ci_low:Q", scale=y_scale), y2="ci_high:Q", color=color),
        alt.Chart().mark_rule(strokeWidth=1).encode(
            x=alt.X("x_low:Q", scale=x_scale), x2="x_high:Q", y=alt.Y("mean:Q", scale=y_scale), color=color),
        alt.Chart().mark_point(filled=True, opacity=1).encode(
            x=x_enc, y=alt.Y("mean:Q", title=y_title, scale=y_scale), color=color, tooltip=tip, **extra),
    ]  # fmt: skip
    if reference is not None:
        layers.append(reference_rule(reference))
    if x_reference is not None:
        layers.append(reference_rule(x_reference, axis="x"))
    if has_null:
        layers += null_per_width(df, y_scale if null_axis == "y" else x_scale, axis=null_axis)
    return layers
