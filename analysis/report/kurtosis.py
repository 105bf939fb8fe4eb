"""The report's residual-stream kurtosis section: by layer, over training (with the onsets,
onset.csv), at matched loss, and against size (by optimiser family where there are several),
or one note where the store has no residual-stream kurtosis."""

from __future__ import annotations

import polars as pl

from analysis import charts, queries, selection
from analysis.report.section import Context, Section, varies
from resultstore.vocabulary import Basis, Metric, Site

__all__ = ["SECTION"]


def add(ctx: Context) -> None:
    """The kurtosis charts at the best-lr points; the onsets table (onset.csv)."""
    if (Site.RESID, Basis.STORED, Metric.KURTOSIS) not in ctx.have:
        ctx.note("No residual-stream kurtosis recorded: layer and training charts skipped.")
        return
    confidence, shown, facet = ctx.confidence, ctx.shown, ctx.facet
    threshold = ctx.options.onset_threshold
    ctx.say("kurtosis by layer")
    prof = queries.layer_profile(ctx.main, Metric.KURTOSIS, confidence=confidence).collect()
    ctx.chart(
        "kurtosis_by_layer",
        charts.kurtosis_by_layer(prof, facet=facet),
        "Residual-stream kurtosis by layer at the end of training (largest model), "
        f"mean over seeds with {confidence:.0%} t-intervals; {shown}. Dashed: the exact null "
        "3(d−1)/(d+1) at the model's width (what any activations read in a Haar-random basis).",
    )
    ctx.say("kurtosis over training")
    over = queries.metric_over_training(ctx.main_history, Metric.KURTOSIS, confidence=confidence).collect()
    onsets = selection.onset(ctx.main_history, threshold=threshold, confidence=confidence).collect()
    ctx.chart(
        "kurtosis_over_training",
        charts.metric_over_training(
            over, facet=facet, size=None, threshold=threshold, onsets=onsets,
            title="Residual-stream kurtosis over training",
        ),  # fmt: skip
        "Residual-stream kurtosis (mean over blocks) against training tokens, one row per "
        f"model size; {shown}. Diamonds: mean tokens of the first eval at which kurtosis exceeds "
        f"{threshold:g} (dotted), with {confidence:.0%} t-intervals over the seeds that "
        "crossed (onset.csv also counts seeds that never did).",
    )
    ctx.table("onset", onsets.select(pl.exclude("tuning_id", "line_id", "tuned_line_id")), keep_empty=True)
    if "final_val_loss" in ctx.done.columns:
        ctx.say("kurtosis at matched loss")
        every = selection.versus(
            queries.loss_table(ctx.results, confidence=confidence),
            queries.scale_table(ctx.results, Metric.KURTOSIS, confidence=confidence),
        ).collect()
        ctx.chart(
            "kurtosis_vs_loss",
            charts.kurtosis_vs_loss(every, facet=facet, best=ctx.content.best_lr),
            "Matched-loss view: residual-stream kurtosis (mean over blocks) against final "
            "validation loss, one point per config at each lr ladder's best lr (faint: its "
            "other lrs that finished; every size; marker "
            f"size = model size), {confidence:.0%} t-intervals over seeds both ways. "
            "Compare optimisers at the same loss, not the same step.",
        )
    _against_size(ctx)


def _against_size(ctx: Context) -> None:
    """Kurtosis against size: one panel per optimiser family where there are several, else
    (at two or more sizes) one chart beside its null."""
    confidence, shown, x = ctx.confidence, ctx.shown, ctx.x
    if varies(ctx.done, "optimizer_family"):
        ctx.say("kurtosis by optimiser family")
        fam = queries.scale_table(ctx.main, Metric.KURTOSIS, confidence=confidence).collect()
        ctx.chart(
            "kurtosis_by_family",
            charts.metric_vs_params(fam, None, x=x, facet="optimizer_family", connect=True,
                                    title="Residual stream, by optimiser family"),
            "Residual-stream kurtosis (mean over blocks) against model size, one line per "
            f"optimiser, one panel per optimiser family; {shown}; seed means with "
            f"{confidence:.0%} t-intervals. Dashed: the exact null 3(d−1)/(d+1) of each size.",
        )  # fmt: skip
    elif len(ctx.sizes) >= 2:  # one family: the raw kurtosis against size, beside its null
        ctx.say("kurtosis against size")
        raw = queries.scale_table(ctx.main, Metric.KURTOSIS, confidence=confidence).collect()
        ctx.chart(
            "kurtosis_vs_params",
            charts.metric_vs_params(raw, None, x=x, facet=ctx.facet, connect=True, title="Residual stream"),
            "Residual-stream kurtosis (mean over blocks) against model size, one line per config; "
            f"{shown}; seed means with {confidence:.0%} t-intervals. Dashed: the exact null "
            "3(d−1)/(d+1) of each size (it rises with d: raw kurtosis drifts up with width even "
            "without a privileged basis, which is why the fits use kurtosis / null).",
        )  # fmt: skip


SECTION = Section("kurtosis", add, metrics=(Metric.KURTOSIS,))
