"""The second suspect charted: where attention parks its mass, layer by layer, and the outlier
measures against it (issue 36; the measures are defined in study/sinks.py).

Each block's attention pattern A[b, h, i, j] (query i, key j, head h) gives per layer: the mass on
position 0 and on delimiter tokens (means over queries and heads), the mass on no key of the
sequence (softmax1's zero logit, kv_bias's learned key, what clipped softmax clips) and the
fraction of heads whose top key is a sink for most of their queries. The reference is what
uniform causal attention reads on the same eval tokens (position 0: H_T / T, 0.042 at T = 128).
"""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.charts.frames import as_frame, decorate, pick_size, tooltip, variant_order, variant_title, varies
from analysis.charts.layers import assemble, assembled_width, band_and_line, interval_words, seeds_phrase, titled
from analysis.charts.style import COLOR_LEGEND, DASH_LEGEND, SizeChoice, dashes, optimizer_scale
from analysis.charts.versus import metric_vs_metric
from resultstore.vocabulary import Sink

__all__ = ["MEASURE_TITLES", "sinks_by_layer", "sinks_vs_outliers"]

MEASURE_TITLES = {
    Sink.FIRST_MASS: "Mass on position 0",
    Sink.DELIMITER_MASS: "Mass on delimiters",
    Sink.SINK_HEADS: "Heads whose top key is a sink",
    Sink.NULL_MASS: "Mass on no key",
}
"""Each sink measure's panel title, in panel order."""

REFERENCE_COLOR = "#555555"


def sinks_by_layer(
    profile: pl.DataFrame | pl.LazyFrame,
    *,
    size: SizeChoice = "largest",
    title: str | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """The sink measures by block (``profile``: ``queries.layer_profile`` rows of each measure,
    stacked, with its name in ``measure`` and, where uniform causal attention has a value, that
    value in ``uniform``): one panel per measure, one line per config with its seed band, colour
    = optimiser, dash = the other axes that vary (the attention variant); dashed grey in a panel:
    uniform causal attention on the same tokens. One model size (``size``, as kurtosis_by_layer)."""
    df, size_note = pick_size(as_frame(profile), size)
    if df.height == 0:
        raise ValueError("sinks_by_layer: no rows to chart")
    order = [MEASURE_TITLES[m] for m in MEASURE_TITLES if m in set(df.get_column("measure"))]
    df = decorate(df, None).with_columns(facet=pl.col("measure").replace_strict(MEASURE_TITLES), kind=pl.lit("line"))
    reference = (df.filter(pl.col("uniform").is_not_null()).group_by("facet").agg(pl.col("uniform").mean())
                 .with_columns(kind=pl.lit("uniform"), optimizer=pl.lit(None, pl.String)))
    data = pl.concat([df, reference], how="diagonal_relaxed")
    low = min([0.0, *(v for v in df.get_column("ci_low").to_list() if v is not None)])  # one seed: no interval
    y_scale = alt.Scale(domain=[low, 1.0], nice=False)
    x = alt.X("layer:Q", title="Block", axis=alt.Axis(values=sorted({int(v) for v in df.get_column("layer")}), format="d"))
    color = alt.Color("optimizer:N", scale=optimizer_scale(df.get_column("optimizer").to_list()), title="Optimizer",
                      legend=COLOR_LEGEND)
    dash = {}
    if varies(df, "variant"):
        vo = variant_order(df)
        dash["strokeDash"] = alt.StrokeDash("variant:N", title=variant_title(df), sort=vo, legend=DASH_LEGEND,
                                            scale=alt.Scale(domain=vo, range=dashes(len(vo))))
    is_line = alt.datum.kind == "line"
    layers = [layer.transform_filter(is_line) for layer in band_and_line(
        x, "mean", "ci_low", "ci_high", y_scale=y_scale, color=color, y_title="Share", line={"point": True},
        tooltip=tooltip(df, ["optimizer", "variant", "layer", "mean", "ci_low", "ci_high", "n"]), **dash)]
    layers.append(alt.Chart().mark_rule(color=REFERENCE_COLOR, strokeDash=[3, 3])
                  .encode(y=alt.Y("uniform:Q", scale=y_scale), tooltip=[alt.Tooltip("uniform:Q", format=".3f")])
                  .transform_filter(alt.datum.kind == "uniform"))
    chart = assemble(layers, data, "measure", keep=["layer", "kind", "uniform"], facet_sort=order)
    caption = caption or (
        f"Per block, final step: attention mass on the first position and on delimiter tokens, mean over queries "
        f"and heads; the fraction of heads whose top key is a sink (position 0 or a delimiter) for most of their "
        f"queries; the mass on no key of the sequence (softmax1's zero logit, kv_bias's learned key, what clipped "
        f"softmax clips). One line per config, {seeds_phrase(df, confidence)}. Dashed grey: uniform causal attention "
        f"on the same tokens (position 0: H_T / T).")
    return titled(chart, title or "Attention sinks by layer", [size_note], caption, assembled_width(data), configure)


def sinks_vs_outliers(
    table: pl.DataFrame | pl.LazyFrame,
    *,
    x_title: str = "Mass on position 0 (mean over blocks)",
    y_title: str = "Kurtosis / null, residual stream",
    uniform: float | None = None,
    reference: float | None = 1.0,
    title: str | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """An outlier measure against a sink measure, one point per config (``selection.versus``
    rows: x = the sink measure, mean = the outlier measure, each with its seed interval), colour
    = optimiser, shape = the attention variant (and any other axis that varies), marker size =
    model size; dashed: ``reference`` on y (1 = kurtosis at its null) and ``uniform`` on x (what
    uniform causal attention reads). Does the sink track the outliers, and across which axis?"""
    df = as_frame(table)
    if {"d_model", "n_layers", "params_non_embedding"} <= set(df.columns):  # marker size = the model's shape:
        # a variant's own weights (the gate's d^2 a block) do not make it another model size
        df = df.with_columns(pl.col("params_non_embedding").min().over("d_model", "n_layers"))
    words = interval_words(df, confidence)
    points = words if words.startswith("one seed") else f"each a seed mean with its {words.replace('t-intervals', 't-interval')} both ways"
    sizes = "" if "params_non_embedding" in df.columns and df.get_column("params_non_embedding").n_unique() == 1 else (
        ", marker size = model shape (its softmax parameter count)")
    caption = caption or (
        f"One point per config at the final step: the outlier measure against the attention sink, {points}; "
        f"colour = optimiser, shape = attention{sizes}. Points that move along x with "
        "the attention and along y with the optimiser separate the two suspects."
        + (f" Dashed vertical: uniform causal attention ({uniform:.3f})." if uniform is not None else "")
        + (f" Dashed horizontal: {reference:g} (no privileged basis)." if reference is not None else ""))
    return metric_vs_metric(df, x_title=x_title, y_title=y_title, reference=reference, x_reference=uniform,
                            connect=False, title=title or "Outliers against the attention sink", caption=caption,
                            confidence=confidence, configure=configure)
