"""The width-honest privilege measure charted with its null: the top-k coordinate share of each
token's centred energy against model size, one panel per site, with the share's exact null
(``analysis.null.top_share_null``) drawn at each width.

Why beside kurtosis: per-token kurtosis is d x the token's inverse participation ratio, so a
coordinate holding a fixed share f of every token reads about d f^2 + 3(1-f)^2 and grows with
width with nothing changing; its top-1 share reads f at every width. The share's null falls with
d (0.108 / 0.064 / 0.037 at d 64 / 128 / 256), so a share that rises with size is not width alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import polars as pl

from analysis.charts.frames import as_frame, decorate, dodge, slim, tooltip, variant_order, variant_title, varies
from analysis.charts.layers import figure_width, log_axis, max_ticks, panel_width, seeds_phrase, titled, y_scale_for
from analysis.charts.style import AXIS_TITLES, COLOR_LEGEND, HEIGHT, PANEL_HEIGHT, WIDTH, dashes, optimizer_scale
from analysis.null import top_share_label, top_share_null

__all__ = ["FIXED_SHARE_WORDS", "top_share_vs_params"]

NULL_COLOR = "#555555"
_SHORT_AXIS_TITLES = {"params_non_embedding": "Non-embedding params", "params": "Params (total)"}
"""Under each of several panels, where the full title would run into its neighbour's."""

FIXED_SHARE_WORDS = (
    "A coordinate holding a fixed share f of every token's energy reads f here at every width, "
    "where kurtosis reads about d·f² and grows with width: a rise here is not width alone."
)
"""The sentence that says which measure a width trend is in (captions and notes)."""


def top_share_vs_params(
    table: pl.DataFrame | pl.LazyFrame,
    *,
    k: int = 1,
    x: str = "params_non_embedding",
    facet: str | None = None,
    panel: str = "site_name",
    panel_order: Sequence[str] | None = None,
    title: str | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """The top-``k`` share against model size (``table``: ``queries.scale_table`` rows of metric
    ``top{k}_share``, several sites stacked with their name in ``panel``): one panel per site (in
    ``panel_order``, default first seen), one row of panels per ``facet`` value (e.g. norm) where it
    varies; seed means with t-interval bars, joined across sizes per config, one colour per
    optimiser (a dash and a marker per other varying axis); dashed grey: ``top_share_null(d, k)``
    at each size's width, labelled. ``caption`` (default: what the marks are, and what a
    fixed-share coordinate reads) is drawn under the title, inside the image."""
    df = as_frame(table)
    if df.height == 0:
        raise ValueError("top_share_vs_params: no rows to chart")
    order = list(panel_order or dict.fromkeys(df.get_column(panel).to_list()))
    df = decorate(df, facet).with_columns(pl.col(panel).alias("panel"))
    if "facet" not in df.columns:
        df = df.with_columns(facet=pl.lit(""))
    points = dodge(df, x).with_columns(kind=pl.lit("point"))
    # the null: one point per panel, row and width, through the true sizes
    null = (
        points.group_by("panel", "facet", x).agg(pl.col("d_model").first())
        .with_columns(x_plot=pl.col(x).cast(pl.Float64), kind=pl.lit("null"),
                      null_ref=pl.col("d_model").map_elements(lambda d: top_share_null(int(d), k), return_dtype=pl.Float64))
        .with_columns(null_label=pl.when(pl.col(x) == pl.col(x).max().over("panel", "facet"))
                      .then(pl.lit(top_share_label(k))).otherwise(None))
    )  # fmt: skip
    data = pl.concat([points, null], how="diagonal_relaxed")
    y_scale = y_scale_for(data, None, None)
    color = alt.Color("optimizer:N", scale=optimizer_scale(points.get_column("optimizer").to_list()),
                      title="Optimizer", legend=COLOR_LEGEND)  # fmt: skip
    true_x = [v for v in points.get_column(x).cast(pl.Float64).to_list() if v and v > 0]
    x_scale = alt.Scale(type="log", nice=False, padding=10)
    if len(set(true_x)) == 1:  # one model size: centre it in a decade-wide window
        x_scale = alt.Scale(type="log", domain=[true_x[0] / 3.0, true_x[0] * 3.0])
    n_cols = len(order)
    x_title = AXIS_TITLES.get(x, x) if n_cols == 1 else _SHORT_AXIS_TITLES.get(x, AXIS_TITLES.get(x, x))
    x_enc = alt.X("x_plot:Q", title=x_title, scale=x_scale,
                  axis=log_axis(true_x, 4 if n_cols > 1 else max_ticks(points)))  # fmt: skip
    y_title = f"Top-{k} energy share"
    shape: dict[str, alt.Shape] = {}
    dash: dict[str, alt.StrokeDash] = {}
    if varies(points, "variant"):
        vo, vt = variant_order(points), variant_title(points)
        shape["shape"] = alt.Shape("variant:N", title=vt, sort=vo)
        dash["strokeDash"] = alt.StrokeDash("variant:N", title=vt, sort=vo,
                                            scale=alt.Scale(domain=vo, range=dashes(len(vo))), legend=None)  # fmt: skip
    is_point, is_null = alt.datum.kind == "point", alt.datum.kind == "null"
    layers = [
        alt.Chart().mark_line(strokeWidth=1.4)
        .encode(x=x_enc, y=alt.Y("mean:Q", scale=y_scale), color=color, detail="variant:N",
                order=alt.Order("x_plot:Q"), **dash)
        .transform_filter(is_point),
        alt.Chart().mark_rule(strokeWidth=1.2)
        .encode(x=x_enc, y=alt.Y("ci_low:Q", scale=y_scale), y2="ci_high:Q", color=color)
        .transform_filter(is_point),
        alt.Chart().mark_point(filled=True, size=34, opacity=1)
        .encode(x=x_enc, y=alt.Y("mean:Q", title=y_title, scale=y_scale), color=color,
                tooltip=tooltip(points, ["optimizer", "variant", "d_model", x, "mean", "ci_low", "ci_high", "n"]), **shape)
        .transform_filter(is_point),
        # the null last, on top: a config without a privileged basis sits on it
        alt.Chart().mark_line(color="#222222", strokeDash=[3, 3], strokeWidth=1.6,
                              point=alt.OverlayMarkDef(color=NULL_COLOR, size=10))
        .encode(x=x_enc, y=alt.Y("null_ref:Q", scale=y_scale), order=alt.Order("x_plot:Q"),
                tooltip=[alt.Tooltip("d_model:Q", title="d_model"), alt.Tooltip("null_ref:Q", title="null", format=".4f")])
        .transform_filter(is_null),
        alt.Chart().mark_text(align="right", dy=10, fontSize=8, color=NULL_COLOR)
        .encode(x=x_enc, y=alt.Y("null_ref:Q", scale=y_scale), text="null_label:N")
        .transform_filter(is_null).transform_filter("isValid(datum.null_label)"),
    ]  # fmt: skip
    rows = varies(points, "facet")
    width = panel_width(n_cols) if n_cols > 1 else WIDTH
    base = alt.layer(*layers, data=slim(data, [x, "panel", "null_label"])).properties(
        width=width, height=PANEL_HEIGHT if n_cols > 1 or rows else HEIGHT)
    chart = base.facet(
        column=alt.Column("panel:N", title=None, sort=order),
        **({"row": alt.Row("facet:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left"))} if rows else {}),
    )  # fmt: skip
    title = title or f"Top-{k} energy share against size, with its null"
    if caption is None:
        caption = (
            f"Share of each token's centred energy in its {'largest coordinate' if k == 1 else f'{k} largest coordinates'}, "
            f"mean over tokens and blocks, final step; {seeds_phrase(points, confidence, 'bars')}. Dashed: its exact "
            f"null at each width (any activations in a random basis; it falls with d). {FIXED_SHARE_WORDS}"
        )
    return titled(chart, title, [], caption, figure_width(n_cols, width), configure)
