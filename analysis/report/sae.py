"""The report's SAE section (issue 21): one chart of `sweep probe sae`'s table, or one note.

``SECTION`` is its entry in the report's section list; computes, never renders or writes."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

import altair as alt
import polars as pl

from analysis.load import Results
from analysis.report.section import Section
from analysis.sae import sae_summary

__all__ = ["SECTION", "add_sae_section", "sae_chart"]

_TITLES = {
    "decoder_kurtosis_excess": "decoder kurtosis − null",
    "decoder_max_share": "largest coordinate's share",
    "fve": "variance explained",
    "dead_fraction": "dead latents (fraction)",
    "loss_recovered": "loss recovered",
    "agreement": "raw-vs-rotated agreement",
}


def sae_chart(summary: pl.DataFrame) -> alt.FacetChart:
    """Seed means (bars: t-intervals where there are seeds) per model optimiser, one row per
    metric, one column per layer depth; colour = the SAE's optimiser, shape = the basis it saw."""
    df = summary.with_columns(
        title=pl.col("metric").replace(_TITLES),
        series=pl.format("{} SAE, {} basis", pl.col("sae_optimizer"), pl.col("basis")),
        low=pl.col("mean") - pl.col("ci_half").fill_null(0.0),
        high=pl.col("mean") + pl.col("ci_half").fill_null(0.0),
    ).select("optimizer", "depth", "title", "series", "sae_optimizer", "basis", "mean", "low", "high", "n")
    base = alt.Chart(alt.Data(values=df.to_dicts())).encode(
        x=alt.X("optimizer:N", title="model's optimiser"),
        xOffset=alt.XOffset("series:N"),
        color=alt.Color("sae_optimizer:N", title="SAE optimiser"),
    )
    points = base.mark_point(filled=True, size=60).encode(
        y=alt.Y("mean:Q", title=None, scale=alt.Scale(zero=False)),
        shape=alt.Shape("basis:N", title="basis the SAE saw"),
        tooltip=["optimizer:N", "depth:N", "series:N", alt.Tooltip("mean:Q", format=".3f"), "n:Q"],
    )
    bars = base.mark_rule().encode(y="low:Q", y2="high:Q")
    order = [t for t in _TITLES.values() if t in set(df["title"])]
    return (points + bars).properties(width=180, height=110).facet(
        row=alt.Row("title:N", title=None, sort=order, header=alt.Header(labelAngle=0, labelAlign="left")),
        column=alt.Column("depth:N", title="layer", sort=["middle", "last"]),
    ).resolve_scale(y="independent")


def add_sae_section(results: Results, built: MutableMapping[str, tuple[Any, str]], notes: list[str],
                    say: Callable[[str], None] = lambda _m: None) -> None:
    """Add the `sae` chart to `built` (name -> (chart, caption)), or one note when the sweep has
    no SAE rows."""
    summary = sae_summary(results)
    if summary.height == 0:
        notes.append("No SAE probe rows (sae/ is empty): run `sweep probe sae RESULTS/SWEEP` for that section.")
        return
    say("SAE probe")
    seeds = int(summary["n"].max())
    built["sae"] = (
        sae_chart(summary),
        "TopK SAEs on the residual stream (sweep probe sae), trained on the stored basis and on a fixed "
        "random one, by Adam (per-coordinate) and by SGD with momentum (rotation-equivariant: its two "
        "bases agree by construction, so it isolates the data's alignment from Adam's). Decoder kurtosis "
        "is measured in the basis the SAE saw, minus the random-direction null 3(d-1)/(d+1); "
        + (f"seed means with t-intervals (up to {seeds} seeds)." if seeds > 1 else "one seed."),
    )


SECTION = Section("sae", lambda ctx: add_sae_section(ctx.results, ctx.built, ctx.notes, ctx.say), needs_done=False)
"""Reads the sae table; says so in a note even where no trial finished."""
