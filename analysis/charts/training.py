"""Charts along the model: a metric by layer, over training, and by basis."""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.charts.frames import (
    as_frame, decorate, pick_size, rotation_sort, slim, thin_steps, tooltip, varies, with_null,
)  # fmt: skip
from analysis.charts.layers import (
    assemble, chart_title, lines_with_band, null_rule, panel_width, reference_rule, y_scale_for,
)  # fmt: skip
from analysis.charts.style import (
    AXIS_TITLES, PANEL_HEIGHT, REFERENCES, SERIES_ORDER, SHAPES, SizeChoice, apply_theme, dashes,
    metric_title, optimizer_scale,
)  # fmt: skip

__all__ = ["basis_comparison", "kurtosis_by_layer", "metric_over_training"]



def kurtosis_by_layer(
    profile: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = "kurtosis",
    size: SizeChoice = "largest",
    facet: str | None = "norm",
    reference: float | None = None,
    log_y: bool | None = None,
    title: str | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Metric by layer (from ``queries.layer_profile``): one line per config with its CI
    band, a dashed rule at the reference: for kurtosis the exact null 3(d-1)/(d+1) at the
    panel's width (``analysis.null``), labelled. One model size (``size``: "largest",
    "smallest", a params value, or None for a row per size)."""
    df, size_note = pick_size(as_frame(profile), size)
    df = decorate(df, facet)
    df = with_null(df, metric) if reference is None else df
    reference = REFERENCES.get(metric) if reference is None else reference
    y_title = metric_title(metric)
    layers = lines_with_band(df, "layer", y_title, "Layer (0 = embeddings)", log_y, reference)
    chart = assemble(layers, df, facet, rows="size" if size is None else None, keep=["layer"])
    chart = chart.properties(title=chart_title(title, size_note))
    return apply_theme(chart) if configure else chart


def metric_over_training(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = "kurtosis",
    x: str = "tokens",
    size: SizeChoice = "largest",
    facet: str | None = "norm",
    reference: float | None = None,
    log_x: bool = False,
    log_y: bool | None = None,
    title: str | None = None,
    threshold: float | None = None,
    onsets: pl.DataFrame | pl.LazyFrame | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Metric over training (from ``queries.metric_over_training``), tokens on x: one line
    per config with its CI band and the reference rule (kurtosis: the exact null at each
    row's width, see ``kurtosis_by_layer``). ``size=None`` gives one
    row of panels per model size. ``threshold`` draws a dotted rule there; ``onsets`` (from
    ``selection.onset``) marks each config's mean onset on it, with its seed interval."""
    df, size_note = pick_size(as_frame(frame), size)
    if log_x:
        df = df.filter(pl.col(x) > 0)
    df = thin_steps(df)
    df = decorate(df, facet)
    df = with_null(df, metric) if reference is None else df
    reference = REFERENCES.get(metric) if reference is None else reference
    layers = lines_with_band(
        df, x, metric_title(metric), AXIS_TITLES.get(x, x), log_y, reference, log_x=log_x
    )
    if threshold is not None:
        layers.append(reference_rule(threshold, color="#222222", dash=(1, 2)))
    if onsets is not None and threshold is not None:
        on, _ = pick_size(as_frame(onsets), size)
        on = decorate(on.filter(pl.col("mean").is_not_null()), facet)
        if on.height:
            on = on.with_columns(
                kind=pl.lit("onset"), onset_y=pl.lit(threshold), onset=pl.col("mean"),
                onset_low=pl.col("ci_low"), onset_high=pl.col("ci_high"),
            ).drop("mean", "ci_low", "ci_high")  # fmt: skip
            df = pl.concat([df.with_columns(kind=pl.lit("curve")), on], how="diagonal_relaxed")
            layers = [lay.transform_filter(alt.datum.kind == "curve") for lay in layers[:2]] + layers[2:]
            color = alt.Color("optimizer:N", scale=optimizer_scale(df.get_column("optimizer").to_list()))
            onset_x = alt.X("onset:Q", scale=alt.Scale(type="log") if log_x else alt.Undefined)
            layers += [
                alt.Chart().mark_rule(strokeWidth=2.5, opacity=0.8)
                .encode(x=onset_x, x2="onset_high:Q", y="onset_y:Q", color=color)
                .transform_filter(alt.datum.kind == "onset"),
                alt.Chart().mark_rule(strokeWidth=2.5, opacity=0.8)
                .encode(x=alt.X("onset_low:Q"), x2="onset:Q", y="onset_y:Q", color=color)
                .transform_filter(alt.datum.kind == "onset"),
                alt.Chart().mark_point(shape="diamond", size=60, filled=True, opacity=1)
                .encode(x=onset_x, y="onset_y:Q", color=color,
                        tooltip=tooltip(on, ["optimizer", "variant", "onset", "onset_low", "onset_high", "n", "n_never"]))
                .transform_filter(alt.datum.kind == "onset"),
            ]  # fmt: skip
    chart = assemble(
        layers, df, facet, rows="size" if size is None else None,
        keep=[x, "kind", "onset", "onset_low", "onset_high", "onset_y", "n_never"],
    )  # fmt: skip
    chart = chart.properties(title=chart_title(title, size_note))
    return apply_theme(chart) if configure else chart


def basis_comparison(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = "kurtosis",
    size: SizeChoice = "largest",
    reference: float | None = None,
    log_y: bool | None = None,
    title: str | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """The metric by layer in each basis (from ``queries.basis_comparison``): residual
    stream (stored basis, and the random-basis control) against the attention and MLP
    inputs in their computation basis, with the exact null 3(d-1)/(d+1) of the model's width
    (labelled) beside the measured control. One panel per config (rows: optimiser and norm,
    columns: rotation); colour is the optimiser, dash and marker the basis."""
    df, size_note = pick_size(as_frame(frame), size)
    df = decorate(df, None)
    df = with_null(df, metric) if reference is None else df
    reference = REFERENCES.get(metric) if reference is None else reference
    rows = ["optimizer"] + (["norm"] if varies(df, "norm") else [])
    df = df.with_columns(
        row=pl.concat_str([pl.col(c).cast(pl.String) for c in rows], separator=" · "),
        column=pl.format("rotation: {}", pl.col("rotation_label"))
        if "rotation_label" in df.columns
        else pl.lit(""),
    )
    order = [s for s in SERIES_ORDER if s in set(df.get_column("series").to_list())]
    y_scale = y_scale_for(df, log_y, reference)
    enc = {
        "x": alt.X("layer:Q", title="Layer", axis=alt.Axis(tickMinStep=1, format="d")),
        "y": alt.Y("mean:Q", title=metric_title(metric), scale=y_scale),
        "color": alt.Color(
            "optimizer:N",
            scale=optimizer_scale(df.get_column("optimizer").unique().to_list()),
            title="Optimizer",
            legend=None,
        ),
        "strokeDash": alt.StrokeDash(
            "series:N",
            title="Activations",
            sort=order,
            scale=alt.Scale(domain=order, range=dashes(len(order))),
            legend=alt.Legend(columns=2, symbolType="stroke", symbolStrokeColor="#333333"),
        ),
    }
    band = (
        alt.Chart()
        .mark_area()
        .encode(
            x="layer:Q",
            y=alt.Y("ci_low:Q", scale=y_scale),
            y2="ci_high:Q",
            color=enc["color"],
            detail="series:N",
        )
    )
    line = alt.Chart().mark_line().encode(
        **enc, tooltip=tooltip(df, ["series", "layer", "mean", "ci_low", "ci_high", "n"])
    )
    marks = alt.Chart().mark_point(size=22, filled=True).encode(
        x="layer:Q",
        y=alt.Y("mean:Q", scale=y_scale),
        color=enc["color"],
        shape=alt.Shape(
            "series:N",
            title="Activations",
            sort=order,
            scale=alt.Scale(domain=order, range=SHAPES[: len(order)]),
        ),
    )
    layers = [band, line, marks]
    if "null_ref" in df.columns:
        layers += null_rule(y_scale)
    elif reference is not None:
        layers.append(reference_rule(reference))
    n_cols = max(1, df.get_column("column").n_unique())
    chart = (
        alt.layer(*layers, data=slim(df))
        .properties(width=panel_width(n_cols) if n_cols > 1 else 240, height=PANEL_HEIGHT)
        .facet(
            row=alt.Row("row:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")),
            column=alt.Column("column:N", title=None, sort=rotation_sort(df)),
        )
        .resolve_scale(y="shared")
    )
    chart = chart.properties(title=chart_title(title, size_note))
    return apply_theme(chart) if configure else chart
