"""The report's learning-rate section: where lr ladders ran, the final val loss against lr for
each (is the best an optimum or a bound?); at two or more sizes, the best lr against size with
each config's fitted lr*(N) = lr0 (N/N0)^b (lr_fit.csv)."""

from __future__ import annotations

from typing import Any

import polars as pl

from analysis import charts, queries
from analysis.charts.ladders import lr_ladders
from analysis.load import Role, runs_columns
from analysis.lr_fit import fit_lr_scaling, lr_fit_curves
from analysis.report.section import Context, Section

__all__ = ["SECTION"]


def add(ctx: Context) -> None:
    """The lr ladders' chart; the fitted lr*(N) (the lr_fit table), and its chart."""
    if not ctx.tuned:
        return
    best = ctx.content.best_lr
    ctx.say("lr ladders")
    ctx.chart("lr_ladders", lr_ladders(queries.loss_table(ctx.results, confidence=ctx.confidence), best,
                                       _diverged(ctx.runs), confidence=ctx.confidence),
              "Final validation loss against learning rate for every lr ladder (the config without its seed "
              "and lr), one panel per model size: filled circles are optima inside their ladder, filled squares "
              "bests at an edge (extend the ladder: `sweep next`), crosses lrs where every seed diverged.")
    # against non-embedding parameters whatever the charts' x: the N of a spec's lr_scaling
    lr_x = "params_non_embedding" if "params_non_embedding" in best.columns else ctx.x
    lr_fit = fit_lr_scaling(best, lr_x, confidence=ctx.confidence)
    if not lr_fit.height:
        return
    ctx.table("lr_fit", lr_fit)
    ctx.say("fitting the best lr against size")
    ctx.chart(
        "lr_vs_params",
        _lr_chart(best, lr_fit, lr_x),
        "Best lr per size (hollow: at the edge of its ladder, a bound) with the fitted "
        "lr*(N) = lr0 (N/N0)^b per config (lr_fit.csv, with the exponent's "
        f"{ctx.confidence:.0%} t-interval over sizes): " + _lr_fit_words(lr_fit) + ".",
    )


def _diverged(runs: pl.DataFrame) -> pl.DataFrame:
    """Configs whose every seed diverged, with their ladder, lr, size and axes."""
    from analysis.query_base import prepare_runs

    if "status" not in runs.columns:
        return pl.DataFrame()
    runs = prepare_runs(runs).collect()
    gone = runs.group_by("config_id").agg(all_diverged=(pl.col("status") == "diverged").all())
    every = ("config_id", "tuning_id", "lr", "params_non_embedding", "params", "d_model",
             *runs_columns(Role.AXIS, Role.LABEL))  # the axes and what describes them (resultstore.schema roles)
    keep = [c for c in every if c in runs.columns]
    return (runs.join(gone.filter("all_diverged"), on="config_id", how="semi").select(keep)
            .unique("config_id", keep="first"))


def _lr_fit_words(lr_fit: pl.DataFrame) -> str:
    """Each fitted lr*(N) in words, for the chart's caption."""
    parts = []
    for r in lr_fit.iter_rows(named=True):
        ci = "" if r["exponent_lo"] is None else f" [{r['exponent_lo']:.2f}, {r['exponent_hi']:.2f}]"
        note = f" ({r['note']})" if r["note"] else ""
        parts.append(f"{r['config'] or r['optimizer']}: b = {r['exponent']:.2f}{ci}, "
                     f"lr0 = {r['lr_at_reference']:.3g} at N0 = {r['reference_params']:,.0f}{note}")  # fmt: skip
    return "; ".join(parts)


def _lr_chart(best: pl.DataFrame, lr_fit: pl.DataFrame, x: str) -> Any:
    """Best lr against size, log-log, with each config's fitted lr*(N)."""
    import altair as alt

    pts = best.join(lr_fit.select("tuned_line_id", "config"), on="tuned_line_id", how="inner").with_columns(
        at_edge=pl.col("edge").is_not_null()
    ).select(x, "lr", "optimizer", "config", "at_edge", "flag")
    cur = lr_fit_curves(lr_fit, best, x).join(lr_fit.select("tuned_line_id", "config"), on="tuned_line_id")
    color = alt.Color("optimizer:N", scale=charts.optimizer_scale(pts.get_column("optimizer").to_list()),
                      title="Optimizer", legend=charts.COLOR_LEGEND)  # fmt: skip
    x_enc = alt.X(f"{x}:Q", title=charts.AXIS_TITLES.get(x, x), scale=alt.Scale(type="log", nice=False, padding=10))
    y_scale = alt.Scale(type="log", nice=False, padding=10)
    y_enc = alt.Y("lr:Q", title="Best learning rate", scale=y_scale)
    line = alt.Chart(cur).mark_line(strokeWidth=1.4).encode(
        x=x_enc, y=alt.Y("fit:Q", scale=y_scale), color=color, detail="config:N"
    )
    points = alt.Chart(pts).mark_point(size=40, strokeWidth=1.5).encode(
        x=x_enc, y=y_enc, color=color, fill=alt.condition("datum.at_edge", alt.value("white"), color),
        tooltip=[x, "lr", "config", "flag"],
    )  # fmt: skip
    chart = alt.layer(line, points).properties(width=charts.WIDTH, height=charts.HEIGHT, title="Best lr against size")
    return charts.apply_theme(chart)


SECTION = Section("lr", add)
