"""The report's section on the second suspect, attention sinks (issue 36): the sink measures by
layer, the outlier measure against the sink per config, and how closely they track per trial.

The probe's rows (study/sinks.py defines them): site ``attn``, basis ``heads``, blocks 1..L:
``first_mass`` (mean attention mass on position 0), ``delimiter_mass`` (on delimiter tokens),
``sink_heads`` (the fraction of heads whose top key is a sink for most of their queries),
``null_mass`` (on no key of the sequence); basis ``uniform``, layer -1: what uniform causal
attention reads on the same tokens.

- ``sinks_by_layer``: the measures per block for the largest model, each config at its best lr.
- ``sinks_vs_kurtosis``: kurtosis / null of the residual stream (stored basis, mean over blocks)
  against the mass on position 0 (mean over blocks), one point per config, shape = attention.
- A note: Spearman's rank correlation across done trials of each mass with kurtosis / null, with
  the trial count (a description of this sweep, not a test: trials of one config share it).

Stores written before the probe recorded these rows get one note and nothing else. Computes,
never writes: ``add`` puts the charts into ``built`` and the notes into ``notes``.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import polars as pl

from analysis import queries, selection
from analysis.charts.sinks import sinks_by_layer, sinks_vs_outliers
from analysis.load import Results
from analysis.report.section import Section
from resultstore.vocabulary import Basis, Metric, Sink, Site

__all__ = ["BASIS", "MEASURES", "METRICS", "NO_SINK_NOTE", "SECTION", "SITE", "UNIFORM", "add", "profile", "tracking_note",
           "uniform_level", "versus_table"]

SITE, BASIS, UNIFORM = Site.ATTN, Basis.HEADS, Basis.UNIFORM
MEASURES = (Sink.FIRST_MASS, Sink.DELIMITER_MASS, Sink.SINK_HEADS, Sink.NULL_MASS)
"""The probe's sink rows (vocabulary.SINK_METRICS), in panel order."""
METRICS = MEASURES
"""The metrics this section reads beside kurtosis (the report keeps only the metrics its sections read)."""

NO_SINK_NOTE = ("No attention-sink rows (site attn: the probe records them from issue 36 on): the attention-sink "
                "section is skipped.")


def uniform_level(results: Results, measure: str) -> float | None:
    """What uniform causal attention reads for ``measure`` on the eval tokens: the mean over done
    trials of the layer -1, basis ``uniform`` row at each trial's final step; None where absent."""
    rows = queries.per_trial(results, measure, SITE, UNIFORM, layers=[-1]).select("value").collect()
    return float(rows.get_column("value").mean()) if rows.height else None


def profile(results: Results, confidence: float = 0.95) -> pl.DataFrame:
    """Every sink measure by block (``queries.layer_profile`` per measure, stacked), with
    ``measure`` and ``uniform`` (the reference, where it has one) columns."""
    frames = []
    for measure in MEASURES:
        rows = queries.layer_profile(results, measure, SITE, BASIS, confidence=confidence).collect()
        if rows.height:
            frames.append(rows.filter(pl.col("layer") >= 1).with_columns(
                measure=pl.lit(measure), uniform=pl.lit(uniform_level(results, measure), pl.Float64)))
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def versus_table(results: Results, measure: str = Sink.FIRST_MASS, confidence: float = 0.95) -> pl.DataFrame:
    """Per config: kurtosis / null of the residual stream (stored basis, mean over blocks) as
    ``mean``, against ``measure`` (mean over blocks) as ``x`` (``selection.versus``)."""
    sink = queries.scale_table(results, measure, SITE, BASIS, confidence=confidence)
    kurt = queries.scale_table(results, Metric.KURTOSIS, Site.RESID, Basis.STORED, confidence=confidence, over_null=True)
    return selection.versus(sink, kurt).collect()


def tracking_note(results: Results) -> str:
    """Spearman's rank correlation across done trials (final step, mean over blocks) of the mass
    on position 0 and on delimiters with kurtosis / null of the residual stream."""
    kurt = queries.per_trial(results, Metric.KURTOSIS, Site.RESID, Basis.STORED, over_null=True).select("trial_id", kurt="value")
    parts, n = [], 0
    for measure, words in ((Sink.FIRST_MASS, "the first position"), (Sink.DELIMITER_MASS, "delimiters")):
        sink = queries.per_trial(results, measure, SITE, BASIS).select("trial_id", sink="value")
        both = sink.join(kurt, on="trial_id").drop_nulls().collect()
        if both.height >= 3:
            n = max(n, both.height)
            rho = both.select(pl.corr("sink", "kurt", method="spearman")).item()
            parts.append(f"mass on {words} ρ = {rho:.2f}" if rho == rho else f"mass on {words}: constant, no ρ")
    if not parts:
        return ""
    return (f"Does the sink track the outliers? Spearman's rank correlation across {n} done trials (final "
            f"step, means over blocks) with kurtosis / null of the residual stream: {'; '.join(parts)}. A "
            "description of this sweep, not a test (the seeds of one config are not independent configs).")


def add(results: Results, done: pl.DataFrame, built: MutableMapping[str, tuple[Any, str]], notes: list[str], *,
        confidence: float = 0.95) -> None:
    """Add the section's two charts to ``built`` (name -> (chart, caption)) and its note to
    ``notes``, or one note for a store without sink rows. ``results``: the report's best-lr view
    at the final step."""
    if done.height == 0:  # nothing finished: the report already says so
        return
    table = profile(results, confidence)
    if table.height == 0:
        notes.append(NO_SINK_NOTE)
        return
    uniform = uniform_level(results, Sink.FIRST_MASS)
    built["sinks_by_layer"] = (
        sinks_by_layer(table, confidence=confidence),
        "Attention sinks by block at the final step, largest model, each config at its best lr: mass on the first "
        "position and on delimiters (mean over queries and heads), the fraction of heads whose top key is a sink, "
        f"the mass on no key; seed means with {confidence:.0%} t-intervals. Dashed: uniform causal attention on the "
        "same tokens.",
    )
    versus = versus_table(results, Sink.FIRST_MASS, confidence)
    if versus.height:
        built["sinks_vs_kurtosis"] = (
            sinks_vs_outliers(versus, uniform=uniform, confidence=confidence),
            "Kurtosis / null of the residual stream (stored basis, mean over blocks) against the attention mass on "
            f"the first position (mean over blocks), one point per config at its best lr, seed means with "
            f"{confidence:.0%} t-intervals both ways; shape = attention variant. Dashed: 1 (no privileged basis) "
            "and uniform causal attention.",
        )
    note = tracking_note(results)
    if note:
        notes.append(note)


SECTION = Section("sinks", lambda ctx: add(ctx.main, ctx.done, ctx.built, ctx.notes, confidence=ctx.confidence),
                  metrics=METRICS)
"""At the report's best-lr view, final step."""
