"""The report's section on what the outlier dimensions are and do (issue 20): three figures
from the `dims` table, or one note where the sweep predates it.

- `dims_persistence`: dimensions x layers of the residual stream for the largest model of each
  optimiser (its best config): the share of seeds in which a dim is in the layer's top-k by
  max |x|. A row of dark cells is one dimension that stays an outlier through the depth.
- `dims_ablation`: the val-loss change of setting each top dimension to zero / to its mean at
  every layer, by candidate rank, against the band of the same ablation of random dimensions.
- `dims_tokens`: a table: the top dimensions' tokens (where they are largest, whose loss rises
  when they are zeroed), Sun's max/median ratio, position-0 and delimiter shares.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import altair as alt
import polars as pl

from analysis import attribution
from analysis.charts.layers import figure_width, titled
from analysis.charts.style import optimizer_scale
from analysis.load import Results
from analysis.report.section import Section

__all__ = ["NO_DIMS_NOTE", "SECTION", "ablation_chart", "add", "persistence_chart", "token_chart"]

NO_DIMS_NOTE = ("No outlier-dimension attribution (dims/ is empty: the sweep predates it); "
                "the dimensions section is skipped.")


def add(results: Results, done: pl.DataFrame, built: MutableMapping[str, tuple[Any, str]], notes: list[str]) -> None:
    """Add the section's charts to `built` (name -> (chart, caption)), or one note to `notes`."""
    if done.height == 0:  # nothing finished: the report already says so
        return
    dims = results.dims.filter(pl.col("trial_id").is_in(done.get_column("trial_id").implode())).collect()
    if dims.height == 0:
        notes.append(NO_DIMS_NOTE)
        return
    shown = attribution.largest_per_optimizer(done).filter(pl.col("trial_id").is_in(dims.get_column("trial_id").unique().implode()))
    which = "; ".join(f"{r['optimizer']}: d_model {r['d_model']}, lr {r['lr']:g}, {r['n']} seed(s)" for r in
                      shown.group_by("optimizer", "d_model", "lr").agg(n=pl.len()).sort("optimizer").to_dicts())
    persistence = (
        f"Outlier dimensions across layers, residual stream (stored basis), final step: cell = share of "
        f"seeds with the dim in that layer's top-k by max |x|, for the largest model of each optimiser "
        f"at its best config ({which}).")
    built["dims_persistence"] = (persistence_chart(attribution.persistence_map(dims, shown), persistence), persistence)
    ablation = (
        "Val-loss change when a top residual dimension is set to zero or to its eval-batch mean at "
        "every layer, by candidate rank (points: seeds); grey band: the same ablation of 16 random "
        "dimensions (min to max over draws and seeds), dashed: its median. Each panel has its own y scale.")
    built["dims_ablation"] = (ablation_chart(attribution.ablation_band(dims, shown), ablation), ablation)
    tokens = (
        "The top three dimensions per optimiser (first seed): Δ loss when zeroed (empirical p against "
        "the random-dimension null) and when set to its mean; at the last layer, Sun et al.'s "
        "max/median, the share of its largest values at position 0 and on delimiters, the "
        "correlation of |x| with token frequency, the input tokens where it is largest and the "
        "targets whose loss rises most when it is zeroed.")
    built["dims_tokens"] = (token_chart(attribution.token_table(dims, shown), tokens), tokens)


def persistence_chart(table: pl.DataFrame, caption: str | None = None) -> alt.TopLevelMixin:
    """Heatmap: layer (x) by dimension (y), colour = share of seeds, one panel per optimiser;
    titled, with ``caption`` (default: what a cell is) inside the image."""
    df = table.with_columns(panel=pl.format("{} · d_model {}", "optimizer", "d_model"))
    chart = alt.Chart(df).mark_rect().encode(
        x=alt.X("layer:O", title="Layer (0 = embeddings)", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("dim:O", title="Dimension", sort="ascending"),
        color=alt.Color("share:Q", title="Share of seeds in top-k", scale=alt.Scale(domain=[0, 1], scheme="greys")),
        tooltip=["optimizer", "layer", "dim", alt.Tooltip("share:Q", format=".2f"), alt.Tooltip("rank:Q", format=".1f")],
    ).properties(width=120, height=alt.Step(10)).facet(column=alt.Column("panel:N", title=None))
    n = max(1, df.get_column("panel").n_unique())
    caption = caption or ("Cell: the share of seeds in which the dimension is in that layer's top-k by max |x| "
                          "(residual stream, stored basis, final step).")
    return titled(chart.resolve_scale(y="independent"), "Which dimensions are the outliers, layer by layer",
                  [], caption, figure_width(n, 120) + 40)


def ablation_chart(table: pl.DataFrame, caption: str | None = None) -> alt.TopLevelMixin:
    """Delta by rank for zero and mean ablation against the null band, one panel per optimiser
    and ablation (the band: min to max of the random draws over seeds, its median dashed);
    titled, with ``caption`` (default: what the marks are) inside the image."""
    df = table.with_columns(x0=pl.col("rank").min().over("optimizer") - 0.5,
                            x1=pl.col("rank").max().over("optimizer") + 0.5)
    names = sorted(df.get_column("optimizer").unique().to_list())
    base = alt.Chart()
    band = base.mark_rect(color="#bbbbbb", opacity=0.6).encode(
        x=alt.X("min(x0):Q"), x2="max(x1):Q", y=alt.Y("min(null_lo):Q"), y2="max(null_hi):Q")
    median = base.mark_rule(color="#555555", strokeDash=[3, 3]).encode(
        x=alt.X("min(x0):Q"), x2="max(x1):Q", y=alt.Y("median(null_median):Q"))
    points = base.mark_point(filled=True, size=40, opacity=0.8).encode(
        x=alt.X("rank:Q", title="Candidate rank", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("delta:Q", title="Δ val loss (nats/token)"),
        color=alt.Color("optimizer:N", scale=optimizer_scale(names), legend=None),
        tooltip=["optimizer", "seed", "rank", "dim", alt.Tooltip("delta:Q", format=".4f"), alt.Tooltip("p:Q", format=".3f")],
    )
    chart = alt.layer(band, median, points, data=df).properties(width=160, height=140).facet(
        column=alt.Column("optimizer:N", title=None),
        row=alt.Row("ablation:N", title=None, sort=["zero", "mean"],
                    header=alt.Header(labelExpr="datum.value + ' ablation'")))
    caption = caption or ("Val-loss change when a top residual dimension is set to zero or to its mean at every "
                          "layer, by candidate rank (points: seeds); grey band: the same ablation of random "
                          "dimensions (min to max), dashed: its median. Each panel has its own y scale.")
    return titled(chart.resolve_scale(y="independent"), "What the outlier dimensions do: ablations against "
                  "random dimensions", [], caption, figure_width(len(names), 160) + 60)


_TOKEN_COLUMNS = {
    "optimizer": "optimiser", "rank": "rank", "dim": "dim", "zero": "Δ zero (p)", "mean": "Δ mean",
    "max_median": "max/median", "pos0_share": "pos 0", "delimiter_share": "delim.", "freq_corr": "r(freq)",
    "top_tokens": "largest on", "loss_tokens": "loss rises on",
}


def token_chart(table: pl.DataFrame, caption: str | None = None) -> alt.TopLevelMixin:
    """The token-attribution table drawn as text (one row per top dimension), titled, with
    ``caption`` (default: what the columns are) inside the image."""
    df = table.with_row_index("row").select(
        "row", "optimizer", pl.col("rank").cast(pl.String), pl.col("dim").cast(pl.String),
        zero=pl.format("{} ({})", pl.col("zero_delta").round(4), pl.col("zero_p").round(3)),
        mean=pl.col("mean_delta").round(4).cast(pl.String),
        max_median=pl.col("max_median").round(1).cast(pl.String),
        pos0_share=pl.col("pos0_share").round(2).cast(pl.String),
        delimiter_share=pl.col("delimiter_share").round(2).cast(pl.String),
        freq_corr=pl.col("freq_corr").round(2).cast(pl.String),
        top_tokens="top_tokens", loss_tokens="loss_tokens",
    ).fill_null("")
    long = df.unpivot(index="row", variable_name="column", value_name="text").with_columns(
        column=pl.col("column").replace_strict(_TOKEN_COLUMNS))
    order = list(_TOKEN_COLUMNS.values())
    chart = alt.Chart(long).mark_text(align="left", dx=-40, fontSize=10).encode(
        x=alt.X("column:N", sort=order, title=None, axis=alt.Axis(orient="top", labelAngle=0, domain=False, ticks=False)),
        y=alt.Y("row:O", title=None, axis=None),
        text="text:N",
    ).properties(width=alt.Step(104), height=alt.Step(16), padding={"right": 40})
    caption = caption or ("The top dimensions per optimiser: Δ val loss when zeroed (p against random dimensions) "
                          "and when set to its mean; max/median, position-0 and delimiter shares, correlation with "
                          "token frequency, where it is largest and whose loss rises when it is zeroed.")
    return titled(chart, "What the outlier dimensions are", [], caption, 104 * len(order))


SECTION = Section("dims", lambda ctx: add(ctx.results, ctx.done, ctx.built, ctx.notes))
"""Reads the dims table of the done trials (every config, not only the best-lr points)."""
