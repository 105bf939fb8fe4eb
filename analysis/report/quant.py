"""The report's quantisation section: each recorded scheme's penalty (quantised minus float
val loss) against residual-stream kurtosis, with a note on this eval batch's noise floor."""

from __future__ import annotations

import polars as pl

from analysis import charts, selection
from analysis.report.section import Context, Section
from resultstore.vocabulary import Metric, Site

__all__ = ["SECTION", "floor_note"]


def add(ctx: Context) -> None:
    """One chart and one floor note per scheme (w8a8, w4a4, ...), or one note where none ran."""
    schemes = sorted(b for site, b, m in ctx.have if m == Metric.QUANT_LOSS_DELTA and site == Site.MODEL)
    if not schemes:
        ctx.note("No quantisation penalty recorded (metric quant_loss_delta): chart skipped.")
    for scheme in schemes:
        ctx.say(f"{scheme} penalty against kurtosis")
        qt = selection.quant_penalty(ctx.main, scheme, confidence=ctx.confidence).collect()
        ctx.note(floor_note(scheme, qt))
        ctx.chart(
            f"quant_{scheme}_vs_kurtosis",
            charts.quant_penalty(qt, facet=ctx.facet),
            f"{scheme.upper()} quantisation penalty (quantised minus float val loss at the final "
            "step) against residual-stream kurtosis (mean over blocks), one point per config "
            f"(marker size = model size); {ctx.shown}; {ctx.confidence:.0%} t-intervals over seeds.",
        )


def floor_note(scheme: str, qt: pl.DataFrame) -> str:
    """How the quantisation penalties compare with this eval batch's floor (2 SE of each penalty
    over the eval sequences), or why that cannot be said."""
    floors = qt.get_column("floor").drop_nulls() if "floor" in qt.columns else pl.Series([], dtype=pl.Float64)
    if floors.len() == 0:
        return (f"{scheme.upper()}: no eval-batch floor recorded (metric quant_loss_delta_se, written from "
                "this version on): penalty differences smaller than a few thousandths of a nat may be noise.")
    within = qt.filter(pl.col("floor").is_not_null() & (pl.col("mean").abs() <= pl.col("floor"))).height
    return (f"{scheme.upper()}: eval-batch floor (2 SE of the penalty over the eval sequences) "
            f"{floors.min():.4f}-{floors.max():.4f} nats; {within} of {floors.len()} configs' penalties lie "
            "within it of 0, and differences between penalties smaller than it are this batch's noise.")


SECTION = Section("quant", add, metrics=(Metric.QUANT_LOSS_DELTA, Metric.QUANT_LOSS_DELTA_SE))
