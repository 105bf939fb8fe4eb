"""Scaling charts: a metric or the loss against model size, seed means with error bars and
fitted power laws with their bands."""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from analysis.charts.frames import as_frame, decorate, dodge, tooltip, variant_order, variant_title, varies, with_null
from analysis.charts.layers import (
    assemble, assembled_width, band_and_line, seeds_phrase, log_axis, max_ticks, null_per_size, reference_label,
    reference_rule, titled, y_scale_for,
)  # fmt: skip
from analysis.charts.style import (
    AXIS_TITLES, COLOR_LEGEND, METRIC_TITLES, REFERENCES, dashes, metric_title, optimizer_scale,
)  # fmt: skip
from resultstore.vocabulary import Metric

__all__ = ["loss_vs_params", "metric_vs_params"]



def metric_vs_params(
    table: pl.DataFrame | pl.LazyFrame,
    curves: pl.DataFrame | pl.LazyFrame | None = None,
    *,
    metric: str = Metric.KURTOSIS,
    x: str = "params_non_embedding",
    facet: str | None = "norm",
    reference: float | None = None,
    log_y: bool | None = None,
    title: str | None = None,
    y_title: str | None = None,
    connect: bool = False,
    reference_text: str | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Metric against model size (from ``queries.scale_table``) on a log x axis: seed means
    with CI error bars, and fitted power laws with bootstrap bands (``curves`` from
    ``fits.fit_curves`` with the same config columns and x column), faceted by ``facet``
    (e.g. ``"optimizer_family"``). ``connect`` joins each config's seed means across sizes
    with a line (one line per optimiser and variant). For kurtosis (no ``reference`` given)
    the exact null 3(d-1)/(d+1) of each size is drawn (a dashed line through the sizes);
    ``reference_text`` labels a ``reference`` rule."""
    frame = as_frame(table)
    if reference is None:
        frame = with_null(frame, metric)
    reference = REFERENCES.get(metric) if reference is None and "null_ref" not in frame.columns else reference
    chart, data = scaling(
        frame, curves, x, y_title or metric_title(metric), facet, log_y, reference,
        connect=connect, reference_text=reference_text,
    )  # fmt: skip
    name = (y_title or METRIC_TITLES.get(metric, metric)).split(" (")[0]
    title = title or f"{name} against model size"
    if caption is None:
        ref = ("Dashed: the exact null 3(d−1)/(d+1) at each size (kurtosis in a Haar-random basis)."
               if "null_ref" in data.columns else
               f"Dashed: {reference:g}" + (f", the {reference_text}." if reference_text else ".")
               if reference is not None else "")
        caption = _caption(data, name, x, facet, confidence, connect, ref)
    return titled(chart, title, [], caption, assembled_width(data), configure)


def _caption(data: pl.DataFrame, name: str, x: str, facet: str | None, confidence: float, connect: bool,
             ref: str) -> str:
    """What a scaling chart draws, in words (its in-image caption)."""
    points = data.filter(pl.col("kind") == "point")
    parts = [f"points: {seeds_phrase(points, confidence, 'bars')}"]
    if connect:
        parts.append("lines join each config across sizes")
    if (data.get_column("kind") == "curve").any():
        parts.append("curves: power-law fits with bootstrap bands")
    panels = (f", one panel per {data.get_column('facet').first().split(':')[0]}"
              if "facet" in data.columns and data.get_column("facet").n_unique() > 1 else "")
    return (f"{name} against {AXIS_TITLES.get(x, x).lower()} (log axis), one colour per optimiser{panels}; "
            + "; ".join(parts) + "." + (f" {ref}" if ref else ""))


def loss_vs_params(
    table: pl.DataFrame | pl.LazyFrame,
    curves: pl.DataFrame | pl.LazyFrame | None = None,
    *,
    column: str = "final_val_loss",
    x: str = "params_non_embedding",
    facet: str | None = "norm",
    log_y: bool | None = True,
    title: str | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Final loss against model size (from ``queries.loss_table``), log-log, with fitted
    power laws (``curves``) when given: the usual scaling-law plot."""
    chart, data = scaling(as_frame(table), curves, x, metric_title(column), facet, log_y, None)
    name = metric_title(column).split(" (")[0]
    caption = caption or _caption(data, name, x, facet, confidence, False, "")
    return titled(chart, title or f"{name} against model size", [], caption, assembled_width(data), configure)


def scaling(
    table: pl.DataFrame,
    curves: pl.DataFrame | pl.LazyFrame | None,
    x: str,
    y_title: str,
    facet: str | None,
    log_y: bool | None,
    reference: float | None,
    *,
    connect: bool = False,
    reference_text: str | None = None,
) -> tuple[alt.TopLevelMixin, pl.DataFrame]:
    """The scaling chart (points, fits, null) and the frame it draws."""
    points = dodge(decorate(table, facet), x).with_columns(kind=pl.lit("point"))
    frames = [points]
    if curves is not None:
        cur = as_frame(curves)
        if cur.height:
            cur = decorate(cur, facet).with_columns(
                x_plot=pl.col(x).cast(pl.Float64), kind=pl.lit("curve")
            )
            frames.append(cur)
    data = pl.concat(frames, how="diagonal_relaxed")
    y_scale = y_scale_for(data, log_y, reference, cols=("fit", "fit_low", "fit_high"))
    color_scale = optimizer_scale(data.get_column("optimizer").to_list())
    color = alt.Color("optimizer:N", scale=color_scale, title="Optimizer", legend=COLOR_LEGEND)
    true_x = [v for v in data.get_column(x).cast(pl.Float64).to_list() if v and v > 0]
    x_scale = alt.Scale(type="log", nice=False, padding=10)
    if len(set(true_x)) == 1:  # one model size: centre it in a decade-wide window
        x_scale = alt.Scale(type="log", domain=[true_x[0] / 3.0, true_x[0] * 3.0])
    x_enc = alt.X(
        "x_plot:Q",
        title=AXIS_TITLES.get(x, x),
        scale=x_scale,
        axis=log_axis(true_x, max_ticks(data)),
    )
    has_variant = varies(points, "variant")
    shape: dict[str, Any] = {}
    dash: dict[str, Any] = {}
    if has_variant:
        order = variant_order(data)
        title = variant_title(points)
        shape["shape"] = alt.Shape("variant:N", title=title, sort=order)
        dash["strokeDash"] = alt.StrokeDash(
            "variant:N",
            title=title,
            sort=order,
            scale=alt.Scale(domain=order, range=dashes(len(order))),
            legend=None,
        )
    is_point = alt.datum.kind == "point"
    is_curve = alt.datum.kind == "curve"
    tip = tooltip(points, ["optimizer", "variant", x, "mean", "ci_low", "ci_high", "n"])
    layers: list[alt.Chart] = []
    if len(frames) > 1:
        layers += [
            layer.transform_filter(is_curve)
            for layer in band_and_line(
                x_enc, "fit", "fit_low", "fit_high", y_scale=y_scale, color=color,
                band={"opacity": 0.15}, line={"strokeWidth": 1.4}, **dash,
            )
        ]  # fmt: skip
    if connect:
        layers.append(
            alt.Chart().mark_line(strokeWidth=1.4)
            .encode(x=x_enc, y=alt.Y("mean:Q", scale=y_scale), color=color, detail="variant:N",
                    order=alt.Order("x_plot:Q"), **dash)
            .transform_filter(is_point)
        )  # fmt: skip
    layers += [
        alt.Chart()
        .mark_rule(strokeWidth=1.2)
        .encode(
            x=x_enc,
            y=alt.Y("ci_low:Q", scale=y_scale),
            y2="ci_high:Q",
            color=color,
        )
        .transform_filter(is_point),
        alt.Chart()
        .mark_point(filled=True, size=34, opacity=1)
        .encode(
            x=x_enc,
            y=alt.Y("mean:Q", title=y_title, scale=y_scale),
            color=color,
            tooltip=tip,
            **shape,
        )
        .transform_filter(is_point),
    ]
    if "null_ref" in points.columns:
        layers += null_per_size(x_enc, x, y_scale, kind=is_point)
    elif reference is not None:
        layers.append(reference_rule(reference))
        if reference_text:
            layers.append(reference_label(reference, reference_text))
    return assemble(layers, data, facet, keep=[x]), data
