"""The lr ladders: final validation loss against learning rate, one line per ladder, one panel
per model size. The figure a referee asks for first: is each optimiser's best lr an optimum
(inside its ladder) or a bound (at its edge)?"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from analysis.charts.frames import as_frame, decorate, size_column, tooltip, varies
from analysis.charts.layers import assemble, assembled_width, interval_words, titled
from analysis.charts.style import COLOR_LEGEND, METRIC_TITLES, format_count, lr_axis, optimizer_scale

__all__ = ["lr_ladders"]


def lr_ladders(
    table: pl.DataFrame | pl.LazyFrame,
    best: pl.DataFrame,
    diverged: pl.DataFrame | None = None,
    *,
    title: str = "Learning-rate ladders",
    caption: str | None = None,
    confidence: float = 0.95,
    y_span: float | None = 0.5,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """``table``: ``queries.loss_table`` (one row per config: lr, seed ``mean`` / ``ci_low`` /
    ``ci_high`` / ``n`` of the final val loss, ``tuning_id``); ``best``: ``selection.best_lr``
    (its ``config_id`` and ``edge`` mark each ladder's choice); ``diverged``: configs whose every
    seed diverged (``tuning_id``, ``lr`` and the label and size columns), drawn as crosses along
    the panel's top. Ladders of one lr are left out: they have no shape to show. ``y_span``: an lr
    whose loss is more than this many nats above its own ladder's best is drawn at that level, as a
    triangle labelled with its loss, so one bad lr does not flatten every ladder's optimum
    (None: draw every point where it lies)."""
    df = as_frame(table)
    laddered = best.filter(pl.col("n_lrs") > 1).get_column("tuning_id").implode()
    df = df.filter(pl.col("tuning_id").is_in(laddered))
    chosen = best.select("config_id", edge=pl.col("edge").fill_null("inside"))
    df = df.join(chosen, on="config_id", how="left").with_columns(
        mark=pl.when(pl.col("edge").is_null()).then(pl.lit("other"))
        .when(pl.col("edge") == "inside").then(pl.lit("best"))
        .otherwise(pl.lit("best, at an edge")), kind=pl.lit("point"))  # fmt: skip
    gone = pl.DataFrame()
    if diverged is not None and diverged.height:
        gone = diverged.filter(pl.col("tuning_id").is_in(laddered)).with_columns(
            kind=pl.lit("diverged"), mark=pl.lit("diverged"))
    df = pl.concat([df, gone], how="diagonal_relaxed") if gone.height else df
    df = _panels(decorate(df.rename({"lr": "lr_x"}), None))  # the lr is the x axis, not a line's variant
    df, clipped = _clip(df, y_span)
    top = df.get_column("ci_high").max() if df.height and "ci_high" in df.columns else None
    top = top if top is not None else (df.get_column("mean").max() if "mean" in df.columns else None)
    df = df.with_columns(y_cross=pl.lit(top, pl.Float64))
    color = alt.Color("optimizer:N", scale=optimizer_scale(df.get_column("optimizer").to_list()),
                      title="Optimizer", legend=COLOR_LEGEND)
    lrs = [v for v in df.get_column("lr_x").to_list() if v]
    x = alt.X("lr_x:Q", title="Learning rate", scale=alt.Scale(type="log", nice=False, padding=8),
              axis=lr_axis(lrs))
    y_title = METRIC_TITLES["final_val_loss"]
    y = alt.Y("mean:Q", title=y_title, scale=alt.Scale(zero=False, nice=False, padding=8))
    dash: dict[str, Any] = {"strokeDash": alt.StrokeDash("variant:N", title=None)} if varies(df, "variant") else {}
    points = alt.datum.kind == "point"
    marks = ["best", "best, at an edge", "other", "diverged", "above"]
    shape = alt.Shape("mark:N", legend=None,  # the caption says what each marker is
                      scale=alt.Scale(domain=marks, range=["circle", "square", "circle", "cross", "triangle-up"]))
    filled = alt.condition((alt.datum.mark == "other") | (alt.datum.mark == "above"), alt.value("white"), color)
    tips = tooltip(df, ["optimizer", "variant", "lr_x", "loss", "ci_low", "ci_high", "n", "mark"])
    layers = [
        alt.Chart().mark_line(strokeWidth=1.2).encode(x=x, y=y, color=color, detail="tuning_id:N", **dash)
        .transform_filter(points),
        alt.Chart().mark_rule(strokeWidth=1).encode(x=x, y="ci_low:Q", y2="ci_high:Q", color=color)
        .transform_filter(points),
        alt.Chart().mark_point(size=46, strokeWidth=1.4, opacity=1).encode(
            x=x, y=y, stroke=color, fill=filled, shape=shape, tooltip=tips).transform_filter(points),
        alt.Chart().mark_point(size=40, strokeWidth=1.6, filled=True).encode(
            x=x, y=alt.Y("y_cross:Q", title=y_title), color=color, shape=shape, tooltip=tips)
        .transform_filter(alt.datum.kind == "diverged"),
        alt.Chart().mark_text(dy=-9, fontSize=8).encode(  # a capped point's own value, readable on paper
            x=x, y=y, color=color, text=alt.Text("loss:Q", format=".2f")).transform_filter(alt.datum.mark == "above"),
    ]  # fmt: skip
    chart = assemble(layers, df, "size", keep=["lr_x", "y_cross", "mark", "kind", "loss"], facet_sort=_size_order(df))
    crosses = "; ×: every seed diverged there (drawn at the top)" if gone.height else ""
    if clipped:
        crosses += (f"; hollow triangle: a loss more than {y_span:g} nats above its ladder's best, drawn at that "
                    "level with its value")
    caption = caption or (
        "Final validation loss against learning rate, one line per lr ladder, one panel per model size; "
        f"{_bars(df, confidence)}. Filled circle: the ladder's best lr (the lowest seed-mean final val loss), "
        f"inside it; filled square: a best at the ladder's edge (a bound: the optimum may lie beyond); "
        f"hollow: the other lrs{crosses}.")
    return titled(chart, title, [], caption, assembled_width(df), configure)


def _clip(df: pl.DataFrame, y_span: float | None) -> tuple[pl.DataFrame, int]:
    """``loss`` keeps each point's seed mean; ``mean`` / ``ci_low`` / ``ci_high`` (what is drawn) are
    capped at the ladder's best + ``y_span``, and a capped point's mark is "above". Returns the frame
    and how many points were capped."""
    if "mean" not in df.columns:
        return df, 0
    df = df.with_columns(loss=pl.col("mean"))
    if y_span is None or not df.height:
        return df, 0
    points = pl.col("kind") == "point"
    ladder = ["tuning_id", "facet"] if "facet" in df.columns else ["tuning_id"]
    cap = pl.col("mean").filter(points).min().over(ladder) + y_span
    df = df.with_columns(cap=pl.when(points).then(cap))
    above = points & (pl.col("mean") > pl.col("cap"))
    n = df.filter(above).height
    df = df.with_columns(
        mark=pl.when(above).then(pl.lit("above")).otherwise(pl.col("mark")),
        **{c: pl.when(points).then(pl.min_horizontal(c, "cap")).otherwise(pl.col(c)) for c in ("mean", "ci_low", "ci_high")},
    ).drop("cap")
    return df, n


def _panels(df: pl.DataFrame) -> pl.DataFrame:
    """A ``facet`` column naming each model size, where there are several."""
    size = size_column(df)
    if size is None or not varies(df, size):
        return df
    return df.with_columns(facet=pl.col(size).map_elements(lambda v: f"{format_count(v)} params", return_dtype=pl.String))


def _size_order(df: pl.DataFrame) -> list[str] | None:
    size = size_column(df)
    if size is None or "facet" not in df.columns:
        return None
    return df.select(size, "facet").unique().sort(size).get_column("facet").to_list()


def _bars(df: pl.DataFrame, confidence: float) -> str:
    words = interval_words(df.filter(pl.col("kind") == "point"), confidence)
    return words if words.startswith("one seed") else f"seed means, bars: {words}"
