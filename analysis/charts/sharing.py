"""Charts of what the sweep answers across configs: kurtosis against the number of blocks
that share a basis (the paper's question 5), and each config's fitted slope with its
interval, side by side."""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.charts.frames import as_frame, pick_size, tooltip
from analysis.charts.layers import figure_width, reference_label, seeds_phrase, reference_rule, titled
from analysis.charts.style import COLOR_LEGEND, HEIGHT, PANEL_HEIGHT, PANEL_WIDTH, WIDTH, SizeChoice, optimizer_scale
from analysis.labels import ENDS
from analysis.null import NULL_LABEL

__all__ = ["kurtosis_vs_group_size", "slopes"]


def kurtosis_vs_group_size(
    table: pl.DataFrame | pl.LazyFrame,
    *,
    size: SizeChoice = "largest",
    y_title: str = "Kurtosis / null 3(d−1)/(d+1)",
    reference: float | None = 1.0,
    title: str | None = "Shared bases and alignment",
    baseline: pl.DataFrame | pl.LazyFrame | None = None,
    caption: str | None = None,
    confidence: float = 0.95,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Computation-basis kurtosis (from ``selection.group_size_table``) against the number of
    consecutive blocks sharing one basis: seed means with t-intervals, colour = optimiser,
    dash and marker = layer input (attention / MLP), one panel per ``ends`` (embeddings
    rotated or not); a rule at ``reference`` (1 = the exact null for kurtosis / null).
    ``baseline`` (from ``selection.unrotated_table``): the same model trained without
    rotation, drawn in every panel as a dotted line per layer input at its seed mean over a
    band of its interval, labelled "no rotation"."""
    df, size_note = pick_size(as_frame(table), size)
    df = df.with_columns(
        pl.col("group_size_x").cast(pl.Int64),
        # one line per optimiser, norm and layer input across group sizes (ends: the panel)
        config=pl.concat_str([pl.col(c).cast(pl.String).fill_null("") for c in ("optimizer", "norm", "site_name")
                              if c in df.columns], separator=" · "),
    )
    sizes = sorted({int(v) for v in df.get_column("group_size_x").drop_nulls().to_list()})
    x = alt.X("group_size_x:Q", title="Blocks sharing one basis (group size)",
              axis=alt.Axis(values=sizes, format="d"), scale=alt.Scale(nice=False, padding=12))  # fmt: skip
    y_scale = alt.Scale(zero=False, nice=False, padding=8)
    color = alt.Color("optimizer:N", scale=optimizer_scale(df.get_column("optimizer").to_list()),
                      title="Optimizer", legend=COLOR_LEGEND)  # fmt: skip
    sites = df.get_column("site_name").unique(maintain_order=True).to_list()
    plan = alt.datum.kind == "plan"
    layers = [
        alt.Chart().mark_line(strokeWidth=1.4).encode(
            x=x, y=alt.Y("mean:Q", title=y_title, scale=y_scale), color=color, detail="config:N",
            strokeDash=alt.StrokeDash("site_name:N", title="Layer input", sort=sites, legend=None),
            order=alt.Order("group_size_x:Q")).transform_filter(plan),
        alt.Chart().mark_rule(strokeWidth=1.2).encode(
            x=x, y=alt.Y("ci_low:Q", scale=y_scale), y2="ci_high:Q", color=color).transform_filter(plan),
        alt.Chart().mark_point(filled=True, size=34, opacity=1).encode(
            x=x, y=alt.Y("mean:Q", scale=y_scale), color=color,
            shape=alt.Shape("site_name:N", title="Layer input", sort=sites),
            tooltip=tooltip(df, ["optimizer", "rotation_label", "site_name", "group_size_x", "mean", "ci_low", "ci_high", "n"]),
        ).transform_filter(plan),
    ]  # fmt: skip
    keep = ["group_size_x", "mean", "ci_low", "ci_high", "n", "optimizer", "rotation_label", "site_name", "config", "ends"]
    data = df.select([c for c in keep if c in df.columns]).with_columns(kind=pl.lit("plan"))
    drawn_none = False
    if baseline is not None:
        none = _same_size(as_frame(baseline), df)
        drawn_none = none.height > 0
        if none.height:
            layers += _unrotated_layers(y_scale, color, sites, PANEL_WIDTH + 40 if data.get_column("ends").n_unique() > 1 else WIDTH)
            ends = data.select("ends").unique()
            none = none.select([c for c in keep if c in none.columns and c != "ends"]).join(ends, how="cross")
            data = pl.concat([data, none.with_columns(kind=pl.lit("none"))], how="diagonal_relaxed")
    if reference is not None:
        layers += [reference_rule(reference), reference_label(reference, NULL_LABEL)]
    panels = data.get_column("ends").n_unique() > 1
    base = alt.layer(*layers, data=data).properties(
        width=PANEL_WIDTH + 40 if panels else WIDTH, height=PANEL_HEIGHT + 30 if panels else HEIGHT
    )
    chart = base.facet(column=alt.Column("ends:N", title=None, sort=list(ENDS))) if panels else base
    panel_words = (" Panels: where the ends (the embedding's write, the unembedding's read) compute: in bases of "
                   "their own, in their group's basis (k = all blocks is then the unrotated model in another "
                   "basis), or unrotated." if panels else "")
    none_words = (" Dotted over a faint band: no rotation (its seed mean and interval)." if drawn_none
                  else " (No unrotated run of this model in the sweep.)")
    caption = caption or (
        "Attention and MLP inputs in their computation basis: kurtosis over the exact null (mean over blocks) "
        f"against the blocks sharing one basis; {seeds_phrase(df, confidence, 'bars')}. Dashed: 1, the null."
        + none_words + panel_words)
    width = figure_width(2, PANEL_WIDTH + 40) if panels else figure_width()
    return titled(chart, title or "Shared bases and alignment", [size_note], caption, width, configure)


def _same_size(baseline: pl.DataFrame, table: pl.DataFrame) -> pl.DataFrame:
    """The baseline rows of the model shape(s), optimisers and norms the chart shows."""
    both = [c for c in baseline.columns if c in table.columns]
    shape = [c for c in ("d_model", "n_layers") if c in both] or [c for c in ("params_non_embedding",) if c in both]
    keys = shape + [c for c in ("optimizer", "norm") if c in both]
    return baseline.join(table.select(keys).unique(), on=keys, how="semi", nulls_equal=True) if keys else baseline


def _unrotated_layers(y_scale: alt.Scale, color: alt.Color, sites: list[str], width: int) -> list[alt.Chart]:
    """The no-rotation reference: its interval as a faint band, its mean as a dotted line per
    layer input, and a label at the panel's right edge."""
    none = alt.datum.kind == "none"
    return [
        alt.Chart().mark_rect(opacity=0.08).encode(
            y=alt.Y("ci_low:Q", scale=y_scale), y2="ci_high:Q", color=color).transform_filter(none),
        alt.Chart().mark_rule(strokeWidth=1.2, strokeDash=[1, 3]).encode(
            y=alt.Y("mean:Q", scale=y_scale), color=color, detail="site_name:N",
            tooltip=[alt.Tooltip("optimizer:N"), alt.Tooltip("site_name:N", title="layer input"),
                     alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("ci_low:Q", format=".3f"),
                     alt.Tooltip("ci_high:Q", format=".3f"), alt.Tooltip("n:Q", title="seeds")],
        ).transform_filter(none),
        alt.Chart().mark_text(align="right", dx=-3, dy=-5, fontSize=8).encode(
            x=alt.value(width), y=alt.Y("mean:Q", scale=y_scale), color=color, text=alt.value("no rotation"),
        ).transform_filter(none).transform_filter(alt.datum.site_name == sites[0]),
    ]  # fmt: skip


def slopes(
    fits: pl.DataFrame | pl.LazyFrame,
    *,
    title: str | None = "Fitted exponents",
    caption: str | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Each config's fitted exponent with its interval (a fits table: ``fit``, ``config``,
    ``optimizer``, ``exponent``, ``exponent_low``, ``exponent_high``), one row of dots and
    whiskers per config and one panel per fit, a rule at 0 (no scaling)."""
    df = as_frame(fits).filter(pl.col("exponent").is_not_null())
    df = df.with_columns(
        exponent_low=pl.col("exponent_low").fill_nan(None), exponent_high=pl.col("exponent_high").fill_nan(None),
        fit_short=pl.col("fit").str.replace(r" \([^()]*\)$", ""),  # without "(mean over blocks)"
    )
    color = alt.Color("optimizer:N", scale=optimizer_scale(df.get_column("optimizer").to_list()),
                      title="Optimizer", legend=COLOR_LEGEND)  # fmt: skip
    order = df.sort("optimizer", "config").get_column("config").unique(maintain_order=True).to_list()
    y = alt.Y("config:N", title=None, sort=order, axis=alt.Axis(labelLimit=320))
    x_title = "Exponent (per-config power law), interval"
    layers = [
        alt.Chart().mark_rule(strokeWidth=1.6).encode(
            x=alt.X("exponent_low:Q", title=x_title), x2="exponent_high:Q", y=y, color=color),
        alt.Chart().mark_point(filled=True, size=40, opacity=1).encode(
            x="exponent:Q", y=y, color=color,
            tooltip=tooltip(df, ["fit", "config", "exponent", "exponent_low", "exponent_high", "interval", "n"])),
        reference_rule(0.0, axis="x"),
    ]  # fmt: skip
    keep = ["fit_short", "config", "optimizer", "exponent", "exponent_low", "exponent_high", "interval", "n", "fit"]
    data = df.select([c for c in keep if c in df.columns])
    rows = max(1, len(order))
    base = alt.layer(*layers, data=data).properties(width=WIDTH, height=max(40, 16 * rows))
    chart = base.facet(row=alt.Row("fit_short:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left",
                       labelOrient="top", labelAnchor="start", labelFontWeight="bold")))  # fmt: skip
    chart = chart.resolve_scale(x="independent", y="independent")
    kinds = sorted({str(v) for v in df.get_column("interval").drop_nulls().to_list()}) if "interval" in df.columns else []
    how = f" ({', '.join(kinds)})" if kinds else ""
    caption = caption or (
        f"Each config's fitted power-law exponent against model size, with its interval{how}; one panel per "
        "fit; dashed rule: 0, no growth with size.")
    return titled(chart, title or "Fitted exponents", [], caption, figure_width(1, WIDTH) + 200, configure)
