"""Shared chart layers and layout: y scales, the band-and-line, log axes, the reference rule,
and assembling layers into one sized (faceted) chart."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

import altair as alt
import polars as pl

from analysis.charts.frames import slim, variant_order, variant_title, varies, rotation_sort, size_sort, tooltip
from analysis.charts.style import (
    COLOR_LEGEND, DASH_LEGEND, FAMILY_ORDER, HEIGHT, PANEL_HEIGHT, PANEL_WIDTH, SI_LABEL, WIDTH, apply_theme, dashes,
    optimizer_scale,
)  # fmt: skip

__all__ = [
    "MAX_COLUMNS", "assemble", "assembled_width", "band_and_line", "chart_title", "figure_title", "figure_width", "interval_words", "lines_with_band", "seeds_phrase",
    "log_axis", "max_ticks", "null_per_size", "null_per_width", "null_rule", "panel_width", "reference_label",
    "reference_rule", "titled", "with_caption", "y_scale_for",
]  # fmt: skip
"""The layers and layout helpers the chart builders share."""



def y_scale_for(
    df: pl.DataFrame, log_y: bool | None, reference: float | None, cols: Sequence[str] = ()
) -> alt.Scale:
    vals: list[float] = []
    for c in ("mean", "ci_low", "ci_high", "null_ref", *cols):
        if c in df.columns:
            vals += [v for v in df.get_column(c).to_list() if v is not None and math.isfinite(v)]
    if reference is not None:
        vals.append(reference)
    positive = bool(vals) and min(vals) > 0
    if log_y is None:
        log_y = positive and max(vals) / min(vals) > 20
    if log_y and positive:
        return alt.Scale(type="log", nice=False, padding=8)
    return alt.Scale(zero=False, nice=False, padding=8)


def lines_with_band(
    df: pl.DataFrame,
    x: str,
    y_title: str,
    x_title: str,
    log_y: bool | None,
    reference: float | None,
    *,
    log_x: bool = False,
) -> list[alt.Chart]:
    y_scale = y_scale_for(df, log_y, reference)
    color_scale = optimizer_scale(df.get_column("optimizer").to_list())
    color = alt.Color("optimizer:N", scale=color_scale, title="Optimizer", legend=COLOR_LEGEND)
    if x == "layer":  # explicit integer ticks: tickMinStep alone still yields 0.5 steps
        x_axis = alt.Axis(values=sorted({int(v) for v in df.get_column(x).to_list()}), format="d")
    elif log_x:
        x_axis = log_axis(df.get_column(x).to_list(), max_ticks(df))
    else:
        # tickCount 5 and labelOverlap: a one-panel chart 300 px wide ran "0 200k400k600k" together
        x_axis = alt.Axis(format="~s", labelExpr=SI_LABEL, labelFlush=True, tickCount=5, labelOverlap=True)
    x_enc = alt.X(
        f"{x}:Q", title=x_title, axis=x_axis, scale=alt.Scale(type="log") if log_x else alt.Undefined
    )
    has_variant = varies(df, "variant")
    dash: dict[str, Any] = {}
    if has_variant:
        order = variant_order(df)
        dash["strokeDash"] = alt.StrokeDash(
            "variant:N",
            title=variant_title(df),
            sort=order,
            scale=alt.Scale(domain=order, range=dashes(len(order))),
            legend=DASH_LEGEND,
        )
    tip = tooltip(df, ["optimizer", "variant", "size", x, "mean", "ci_low", "ci_high", "n"])
    layers = band_and_line(
        x_enc, "mean", "ci_low", "ci_high", y_scale=y_scale, color=color, y_title=y_title,
        line={"point": alt.OverlayMarkDef(size=16) if df.get_column(x).n_unique() <= 25 else False},
        tooltip=tip, **dash,
    )  # fmt: skip
    if "null_ref" in df.columns:
        layers += null_rule(y_scale)
    elif reference is not None:
        layers.append(reference_rule(reference))
    return layers


def band_and_line(
    x: alt.X,
    mid: str,
    low: str,
    high: str,
    *,
    y_scale: alt.Scale,
    color: alt.Color,
    y_title: Any = alt.Undefined,
    band: dict[str, Any] | None = None,
    line: dict[str, Any] | None = None,
    **line_encoding: Any,
) -> list[alt.Chart]:
    """A band from ``low`` to ``high`` under a line at ``mid``, one per optimiser (colour) and
    variant: the shape of every line-with-interval chart (CI bands, fitted-curve bands).
    ``band``/``line``: mark properties; ``line_encoding``: more channels for the line."""
    return [
        alt.Chart().mark_area(**(band or {}))
        .encode(x=x, y=alt.Y(f"{low}:Q", scale=y_scale), y2=f"{high}:Q", color=color, detail="variant:N"),
        alt.Chart().mark_line(**(line or {}))
        .encode(x=x, y=alt.Y(f"{mid}:Q", title=y_title, scale=y_scale), color=color, detail="variant:N",
                **line_encoding),
    ]  # fmt: skip


def log_axis(values: Sequence[float | None], max_ticks: int = 6) -> alt.Axis:
    """A log axis labelled only at 1-2-5 x 10^k (or 10^k when the range is wide), with SI
    suffixes (50k, 1M), instead of Vega's crowded default labels."""
    vals = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not vals:
        return alt.Axis(format="~s")
    lo, hi = min(vals) / 1.12, max(vals) * 1.12
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks = [m * 10.0**k for k in decades for m in (1, 2, 5) if lo <= m * 10.0**k <= hi]
    if len(ticks) > max_ticks:
        ticks = [10.0**k for k in decades if lo <= 10.0**k <= hi]
        if len(ticks) > 7:
            ticks = ticks[:: math.ceil(len(ticks) / 6)]
    if len(ticks) < 2:  # a range under a 1-2-5 step (e.g. 0.8M-1.8M): every leading digit
        ticks = [m * 10.0**k for k in decades for m in range(1, 10) if lo <= m * 10.0**k <= hi]
        ticks = ticks[:: math.ceil(len(ticks) / max_ticks)] if len(ticks) > max_ticks else ticks
    if len(ticks) < 2:  # narrower still: the ends, to two significant digits
        ticks = sorted({float(f"{v:.2g}") for v in (min(vals), max(vals))})
    return alt.Axis(values=ticks, format="~s", labelExpr=SI_LABEL, grid=True)


def reference_rule(value: float, axis: str = "y", color: str = "#555555", dash: Sequence[int] = (3, 3)) -> alt.Chart:
    """A constant line at ``value`` on ``axis``, drawn once per panel. ``alt.datum`` alone draws
    it once per data row: 4,422 identical lines per rule in a 10M-row report's SVG."""
    return (
        alt.Chart()
        .mark_rule(color=color, strokeDash=list(dash), strokeWidth=1)
        .encode(**{axis: alt.datum(value)})
        .transform_aggregate(rows="count()")  # one row per panel
    )


NULL_COLOR = "#555555"


def reference_label(value: float, text: str, axis: str = "y") -> alt.Chart:
    """``text`` beside the reference rule at ``value``, once per panel (at its left edge on
    a y rule, its top on an x rule)."""
    pos = {axis: alt.datum(value), ("x" if axis == "y" else "y"): alt.value(0)}
    return (
        alt.Chart()
        .mark_text(align="left", dx=3 if axis == "y" else 4, dy=-5 if axis == "y" else 6, fontSize=8,
                   color=NULL_COLOR)
        .encode(**pos, text=alt.value(text))
        .transform_aggregate(rows="count()")
    )  # fmt: skip


def null_rule(y_scale: alt.Scale) -> list[alt.Chart]:
    """The exact null as a rule at the panel's ``null_ref`` (one model width per panel),
    labelled "null" right of the panel, drawn once per panel."""
    y = alt.Y("null_ref:Q", scale=y_scale)
    return [
        alt.Chart().mark_rule(color=NULL_COLOR, strokeDash=[3, 3], strokeWidth=1).encode(y=y)
        .transform_aggregate(null_ref="mean(null_ref)"),
        _end_label(y).transform_aggregate(null_ref="mean(null_ref)"),
    ]  # fmt: skip


def _end_label(y: alt.Y, text: str = "null") -> alt.Chart:
    """A reference line's name just right of the plot, level with the line's right end: a
    direct label that never sits on the data (the caption gives the formula)."""
    return alt.Chart().mark_text(align="left", baseline="middle", dx=4, fontSize=9, color=NULL_COLOR).encode(
        x=alt.value("width"), y=y, text=alt.value(text))


def null_per_size(x_enc: alt.X, x: str, y_scale: alt.Scale, kind: Any = None) -> list[alt.Chart]:
    """The exact null at each model size on a size axis: a dashed grey line through
    (size, 3(d-1)/(d+1)), labelled "null" right of the panel at the largest size. ``x`` is the
    true size column; ``x_enc`` the chart's x encoding of ``x_plot``. ``kind`` filters the rows
    used."""

    def base() -> alt.Chart:
        c = alt.Chart()
        if kind is not None:
            c = c.transform_filter(kind)
        return c.transform_aggregate(null_ref="mean(null_ref)", groupby=[x]).transform_calculate(
            x_plot=f"datum['{x}']"
        )

    y = alt.Y("null_ref:Q", scale=y_scale)
    return [
        base().mark_line(color=NULL_COLOR, strokeDash=[4, 2], strokeWidth=1, point=alt.OverlayMarkDef(
            color=NULL_COLOR, size=10)).encode(x=x_enc, y=y, order=alt.Order("x_plot:Q")),
        # the label right of the plot, level with the null at the largest size (it grows with d)
        (_end_label(y).transform_filter(kind) if kind is not None else _end_label(y))
        .transform_aggregate(null_ref="max(null_ref)"),
    ]  # fmt: skip


def null_per_width(df: pl.DataFrame, scale: alt.Scale, axis: str = "y") -> list[alt.Chart]:
    """The exact null of each model width in ``df`` as a rule on ``axis`` (a chart whose
    points span several sizes), one label naming the widths."""
    from analysis.null import NULL_LABEL

    widths = sorted({int(v) for v in df.get_column("d_model").drop_nulls().to_list()})
    text = NULL_LABEL + (f", d {widths[0]}–{widths[-1]}" if len(widths) > 1 else f", d {widths[0]}")
    enc = {axis: alt.Y("null_ref:Q", scale=scale) if axis == "y" else alt.X("null_ref:Q", scale=scale)}
    label_pos = {("x" if axis == "y" else "y"): alt.value(0)}
    rules = alt.Chart().mark_rule(color=NULL_COLOR, strokeDash=[4, 2], strokeWidth=1).encode(**enc) \
        .transform_aggregate(null_ref="mean(null_ref)", groupby=["d_model"])
    if axis == "y":  # named right of the plot, level with the highest (the caption says whose widths)
        return [rules, _end_label(enc["y"]).transform_aggregate(null_ref="max(null_ref)")]
    return [
        rules,
        alt.Chart().mark_text(align="left", dx=4, dy=6, fontSize=8, color=NULL_COLOR)
        .encode(**enc, **label_pos, text=alt.value(text))
        .transform_aggregate(null_ref="max(null_ref)"),
    ]  # fmt: skip


MAX_COLUMNS = 4
"""Panels in one row of a faceted figure; more wrap onto further rows."""


def assemble(
    layers: list[alt.Chart],
    df: pl.DataFrame,
    facet: str | None,
    *,
    rows: str | None = None,
    keep: Sequence[str] = (),
    facet_sort: Sequence[str] | None = None,
) -> alt.TopLevelMixin:
    """``layers`` over ``df``, one chart or one panel per ``facet`` value (``facet_sort``: their
    order) and, with ``rows``, one row of panels per value of that column. More than
    MAX_COLUMNS panels with no rows wrap onto several rows."""
    has_facet = "facet" in df.columns and varies(df, "facet")
    has_rows = rows is not None and varies(df, rows)
    df = slim(df, keep)
    if not has_facet and not has_rows:
        return alt.layer(*layers, data=df).properties(width=WIDTH, height=HEIGHT)
    n_cols = df.get_column("facet").n_unique() if has_facet else 1
    wrap = has_facet and not has_rows and n_cols > MAX_COLUMNS
    width = panel_width(min(n_cols, MAX_COLUMNS)) if has_facet else WIDTH  # rows only: full-width panels
    base = alt.layer(*layers, data=df).properties(width=width, height=PANEL_HEIGHT)
    kw: dict[str, Any] = {}
    if has_facet:
        sort: Any = "ascending"
        if facet_sort is not None:
            sort = list(facet_sort)
        elif facet == "rotation":
            sort = rotation_sort(df)
        elif facet == "optimizer_family":  # per-coordinate first, then the basis-free families
            sort = [f"family: {f.replace('_', ' ')}" for f in FAMILY_ORDER]
        if wrap:
            return base.facet(facet=alt.Facet("facet:N", title=None, sort=sort), columns=MAX_COLUMNS)
        kw["column"] = alt.Column("facet:N", title=None, sort=sort)
    if has_rows:  # size labels above each row's panels, not beside the y-axis title
        header = alt.Header(labelOrient="top", labelAngle=0, labelAnchor="start", labelFontWeight="bold")
        kw["row"] = alt.Row(f"{rows}:N", title=None, sort=size_sort(df), header=header)
    chart = base.facet(**kw)
    if has_rows and any(k in keep for k in ("tokens", "step")):
        chart = chart.resolve_scale(x="independent")  # each size trains for its own length
    return chart


def assembled_width(df: pl.DataFrame) -> int:
    """The drawn width of ``assemble``'s figure over ``df`` (for wrapping its caption)."""
    if "facet" not in df.columns or not varies(df, "facet"):
        return figure_width()
    n = min(df.get_column("facet").n_unique(), MAX_COLUMNS)
    return figure_width(n, panel_width(n))


def max_ticks(df: pl.DataFrame) -> int:
    """Labelled ticks that fit: 6 across a full-width chart, 4 in a facet panel."""
    return 4 if "facet" in df.columns and varies(df, "facet") else 6


def panel_width(n_cols: int) -> int:
    # Two panels share one column; more panels make a two-column (page-wide) figure.
    return max(100, min(PANEL_WIDTH, (4 * WIDTH) // max(n_cols, 1) - 20))


def chart_title(title: str | None, size_note: str | None) -> alt.TitleParams | str:
    if not title:
        return size_note or ""
    return alt.TitleParams(text=title, subtitle=size_note or alt.Undefined)


# ---------------------------------------------------------------- titles and captions in the image

CAPTION_FONT_SIZE = 9
_CHAR_PX = 4.9  # average advance of a 9 px sans-serif character: wraps a caption to the figure's width
_AXIS_PX = 60  # a y axis with its title and labels, left of the first panel


def figure_width(n_cols: int = 1, panel: int | None = None, spacing: int = 20) -> int:
    """The drawn width in px of a figure of ``n_cols`` panels of ``panel`` px (default: one
    chart of WIDTH, or facet panels of panel_width(n_cols)), its y axis included."""
    if panel is None:
        panel = WIDTH if n_cols <= 1 else panel_width(n_cols)
    return _AXIS_PX + n_cols * panel + (n_cols - 1) * spacing


def figure_title(title: str, notes: Sequence[str | None] = (), caption: str | None = None,
                 width: int | None = None) -> alt.TitleParams:
    """The figure's title with, under it, each note (e.g. the size shown) and the caption
    wrapped to ``width`` px: a PNG lifted into a paper or a slide says what it shows."""
    width = width or figure_width()
    chars = max(44, int(width / _CHAR_PX))
    lines = [n for n in notes if n]
    if caption:
        lines += textwrap.wrap(caption, chars, break_on_hyphens=False)
    return alt.TitleParams(
        text=title, subtitle=lines or alt.Undefined, subtitleFontSize=CAPTION_FONT_SIZE, subtitleColor="#444444",
        subtitleLineHeight=CAPTION_FONT_SIZE + 3, subtitlePadding=4, anchor="start",
    )  # fmt: skip


def titled(chart: alt.TopLevelMixin, title: str, notes: Sequence[str | None], caption: str | None,
           width: int, configure: bool = True) -> alt.TopLevelMixin:
    """``chart`` with ``figure_title(...)``; with ``configure``, themed (``apply_theme``) and
    with what ``with_caption`` needs in its usermeta (a top-level property: an unthemed chart,
    which may still be composed, goes without)."""
    chart = chart.properties(title=figure_title(title, notes, caption, width))
    if not configure:
        return chart
    meta = {"title": title, "notes": [n for n in notes if n], "width": width}
    return apply_theme(chart).properties(usermeta={"figure": meta})


def with_caption(chart: alt.TopLevelMixin, caption: str) -> alt.TopLevelMixin:
    """``chart`` (from a builder of analysis.charts, themed or not) with ``caption`` inside the
    image in place of the builder's own: under the title, wrapped to the figure's width (e.g.
    the report's caption, so the PNG and index.html say the same)."""
    meta = (chart.usermeta if isinstance(chart.usermeta, dict) else {}).get("figure")
    if meta is None:
        title = chart.title
        text = title.text if isinstance(title, alt.TitleParams) else title
        meta = {"title": text if isinstance(text, str) else "", "notes": [], "width": figure_width()}
    return chart.properties(title=figure_title(meta["title"], meta["notes"], caption, meta["width"]))


def interval_words(df: pl.DataFrame, confidence: float = 0.95) -> str:
    """"95% t-intervals over 3 seeds" (or "over 1-3 seeds", "one seed: no interval") from a
    seed summary's ``n`` column."""
    ns = sorted({int(v) for v in df.get_column("n").drop_nulls().to_list()}) if "n" in df.columns else []
    if not ns:
        return f"{confidence:.0%} t-intervals over seeds"
    if ns == [1]:
        return "one seed (no interval)"
    seeds = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    return f"{confidence:.0%} t-intervals over {seeds} seeds"


def seeds_phrase(df: pl.DataFrame, confidence: float = 0.95, marks: str = "bands") -> str:
    """"seed means with bands of 95% t-intervals over 3 seeds", or "one seed (no interval)"."""
    words = interval_words(df, confidence)
    return words if words.startswith("one seed") else f"seed means with {marks} of {words}"
