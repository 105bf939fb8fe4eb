"""Charts along the model: a metric by layer, over training, and by basis."""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.charts.frames import (
    as_frame, decorate, panels_for_variants, pick_size, rotation_sort, slim, thin_steps, tooltip, varies, with_null,
)  # fmt: skip
from analysis.charts.layers import (
    MAX_COLUMNS, assemble, assembled_width, figure_width, seeds_phrase, lines_with_band, null_rule, panel_width,
    reference_rule, titled, y_scale_for,
)  # fmt: skip
from analysis.charts.style import (
    AXIS_TITLES, METRIC_TITLES, PANEL_HEIGHT, REFERENCES, SERIES_ORDER, SHAPES, SizeChoice, dashes,
    metric_title, optimizer_scale,
)  # fmt: skip
from resultstore.vocabulary import Metric

__all__ = ["basis_comparison", "kurtosis_by_layer", "metric_over_training"]



def kurtosis_by_layer(
    profile: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = Metric.KURTOSIS,
    size: SizeChoice = "largest",
    facet: str | None = "norm",
    reference: float | None = None,
    log_y: bool | None = None,
    title: str | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Metric by layer (from ``queries.layer_profile``): one line per config with its CI
    band, a dashed rule at the reference: for kurtosis the exact null 3(d-1)/(d+1) at the
    panel's width (``analysis.null``), labelled. One model size (``size``: "largest",
    "smallest", a params value, or None for a row per size). Configs that differ in more than
    MAX_DASHED ways (e.g. five rotation plans) get a panel each instead of a dash each.
    ``caption`` (default: what the marks are) is drawn under the title, inside the image."""
    df, size_note = pick_size(as_frame(profile), size)
    df, panels = panels_for_variants(decorate(df, facet))
    df = with_null(df, metric) if reference is None else df
    reference = REFERENCES.get(metric) if reference is None else reference
    y_title = metric_title(metric)
    if size is None and varies(df, "size"):  # rows of short panels: the long unit goes to the caption
        y_title = y_title.split(" (")[0]
    layers = lines_with_band(df, "layer", y_title, "Layer (0 = embeddings)", log_y, reference)
    df, layers, unrotated = _unrotated_in_every_panel(df, layers, panels)
    chart = assemble(layers, df, facet, rows="size" if size is None else None, keep=["layer", "kind"],
                     facet_sort=panels)
    what = _short(metric)
    title = title or f"{what} by layer{', residual stream' if metric == Metric.KURTOSIS else ''}"
    caption = caption or (
        f"{what} at the final step by layer, one line per config{_panels_words(df)}: "
        f"{seeds_phrase(df.filter(pl.col('kind') != 'unrotated'), confidence)}. "
        + ("Grey dotted in every other panel: the same model without rotation (none), for reference. "
           if unrotated else "") + _null_words(df, reference, "at the model's width") + _constant_words(df, metric))
    return titled(chart, title, [size_note], caption, assembled_width(df), configure)


def _unrotated_in_every_panel(
    df: pl.DataFrame, layers: list[alt.Chart], panels: list[str] | None
) -> tuple[pl.DataFrame, list[alt.Chart], bool]:
    """Where each rotation plan has a panel (``panels_for_variants``), the unrotated model's
    lines again, grey and dotted, in every other panel: the reference the plans are read
    against. Returns the frame (a ``kind`` column: "line" or "unrotated"), the layers and
    whether it was drawn."""
    df = df.with_columns(kind=pl.lit("line"))
    none = [p for p in panels or [] if p.split(" · ")[-1] == "rotation: none"]
    if not none:
        return df, layers, False
    ref = df.filter(pl.col("facet").is_in(none))
    others = [p for p in panels if p not in none]
    copies = [ref.with_columns(facet=pl.lit(p), kind=pl.lit("unrotated")) for p in others
              if p.rsplit(" · ", 1)[0] == none[0].rsplit(" · ", 1)[0] or " · " not in p]
    if not copies:
        return df, layers, False
    is_line = alt.datum.kind == "line"
    layers = [layer.transform_filter(is_line) for layer in layers[:2]] + layers[2:]
    grey = (alt.Chart().mark_line(color="#888888", strokeDash=[1, 2], strokeWidth=1.2)
            .encode(x=alt.X("layer:Q", title="Layer (0 = embeddings)", axis=alt.Axis(
                        values=sorted({int(v) for v in ref.get_column("layer").to_list()}), format="d")),
                    y="mean:Q", detail="optimizer:N").transform_filter(alt.datum.kind == "unrotated"))
    return pl.concat([df, *copies], how="diagonal_relaxed"), [grey, *layers], True


def _constant_words(df: pl.DataFrame, metric: str) -> str:
    """Says so when every point is the same value (e.g. no outlier dimension at any width): a
    flat chart is a finding, not a drawing error; and names the unit a short axis title left out."""
    unit = METRIC_TITLES.get(metric, "").partition(" (")[2].rstrip(")")
    words = f" Unit: {unit}." if unit and metric != Metric.KURTOSIS else ""
    values = df.filter(pl.col("kind") != "unrotated").get_column("mean").drop_nulls().unique()
    return words + (f" Every config reads {values[0]:g} at every layer." if values.len() == 1 else "")


def _short(metric: str) -> str:
    """A metric's name without its unit note: "Kurtosis (Gaussian = 3)" -> "Kurtosis"."""
    return METRIC_TITLES.get(metric, metric.replace("_", " ").capitalize()).split(" (")[0]


def _panels_words(df: pl.DataFrame) -> str:
    return ", one panel per " + df.get_column("facet").first().split(":")[0] if varies(df, "facet") else ""


def _null_words(df: pl.DataFrame, reference: float | None, where: str) -> str:
    if "null_ref" in df.columns:
        return f"Dashed: the exact null 3(d−1)/(d+1) {where} (kurtosis in a Haar-random basis)."
    return f"Dashed: {reference:g}." if reference is not None else ""





def metric_over_training(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = Metric.KURTOSIS,
    x: str = "tokens",
    size: SizeChoice = "largest",
    facet: str | None = "norm",
    reference: float | None = None,
    log_x: bool = False,
    log_y: bool | None = None,
    title: str | None = None,
    threshold: float | None = None,
    onsets: pl.DataFrame | pl.LazyFrame | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
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
    df, panels = panels_for_variants(decorate(df, facet))
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
        if panels is not None and "config_id" in on.columns:  # each onset in its config's panel
            facets = df.select("config_id", "facet").unique("config_id")
            on = on.drop("facet", strict=False).join(facets, on="config_id", how="left").with_columns(variant=pl.lit(""))
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
        keep=[x, "kind", "onset", "onset_low", "onset_high", "onset_y", "n_never"], facet_sort=panels,
    )  # fmt: skip
    what = _short(metric)
    title = title or f"{what} over training"
    marks = (f" Dotted: {threshold:g}; diamonds: the mean first eval above it, with its interval over the seeds "
             "that crossed." if threshold is not None and onsets is not None else
             f" Dotted: {threshold:g}." if threshold is not None else "")
    rows = " (a row per model size)" if size is None and varies(df, "size") else ""
    caption = caption or (
        f"{what} (mean over blocks) against {AXIS_TITLES.get(x, x).lower()}, one line per config"
        f"{_panels_words(df)}{rows}: {seeds_phrase(df, confidence)}. "
        + _null_words(df, reference, "at each model's width") + marks)
    return titled(chart, title, [size_note], caption, assembled_width(df), configure)


def basis_comparison(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = Metric.KURTOSIS,
    size: SizeChoice = "largest",
    reference: float | None = None,
    log_y: bool | None = None,
    title: str | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
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
    one_row = df.get_column("row").n_unique() == 1
    shown = min(n_cols, MAX_COLUMNS) if one_row else n_cols
    base = alt.layer(*layers, data=slim(df)).properties(
        width=panel_width(shown) if n_cols > 1 else 240, height=PANEL_HEIGHT)
    if one_row and n_cols > MAX_COLUMNS:  # one config per panel: wrap them (the row's name goes in the caption)
        chart = base.facet(facet=alt.Facet("column:N", title=None, sort=rotation_sort(df)), columns=MAX_COLUMNS)
    else:
        chart = base.facet(
            row=alt.Row("row:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")),
            column=alt.Column("column:N", title=None, sort=rotation_sort(df)),
        )
    chart = chart.resolve_scale(y="shared")
    title = title or f"{_short(metric)} by layer and basis"
    who = f" ({df.get_column('row').first()})" if one_row else ""
    caption = caption or (
        f"{_short(metric)} at the final step by layer{who}: the residual stream in its stored basis and in random "
        "bases (the measured control), and the attention and MLP inputs in the basis their layer computes in; "
        f"{seeds_phrase(df, confidence)}. " + _null_words(df, reference, "at the model's width"))
    width = figure_width(shown, panel_width(shown) if n_cols > 1 else 240) + (0 if one_row else 80)
    return titled(chart, title, [size_note], caption, width, configure)
