"""The report's computation-basis section: kurtosis by layer in the stored, random and
computation bases, and (for a sweep over rotation group sizes) kurtosis against the number of
blocks that share one basis."""

from __future__ import annotations

import polars as pl

from analysis import charts, queries, selection
from analysis.report.section import Context, Section, varies
from resultstore.vocabulary import Metric

__all__ = ["SECTION"]


def add(ctx: Context) -> None:
    """The basis comparison where the attention or MLP input was read in its computation basis;
    the group-size chart where partial or shared rotations ran at two or more group sizes."""
    confidence, shown = ctx.confidence, ctx.shown
    kurtosis_sites = {(site, basis) for site, basis, metric in ctx.have if metric == Metric.KURTOSIS}
    if kurtosis_sites & set(selection.COMPUTATION_SITES):
        ctx.say("basis comparison")
        bc = queries.basis_comparison(ctx.main, Metric.KURTOSIS, confidence=confidence).collect()
        ctx.chart(
            "basis_comparison",
            charts.basis_comparison(bc),
            "Kurtosis by layer in the residual stream's stored basis, random bases (the "
            "measured control: one basis in older stores, the mean over Haar bases in newer), "
            "and the attention / MLP inputs in their computation basis (largest model); "
            f"{shown}. Dashed: the exact null 3(d−1)/(d+1).",
        )
    comp_sites = tuple(s for s in selection.COMPUTATION_SITES if (*s, Metric.KURTOSIS) in ctx.have)
    rotated = ctx.done.filter(pl.col("rotation").is_in(["partial", "shared"]))
    if not (comp_sites and varies(rotated, "rotation_label")):
        return
    gt = selection.group_size_table(ctx.main, sites=comp_sites, confidence=confidence).collect()
    if gt.get_column("group_size_x").n_unique() < 2:
        return
    ctx.say("kurtosis against group size")
    none = selection.unrotated_table(ctx.main, sites=comp_sites, confidence=confidence).collect()
    ctx.chart(
        "kurtosis_vs_group_size",
        charts.kurtosis_vs_group_size(gt, baseline=none),
        "Kurtosis of the attention / MLP inputs in their computation basis over the exact null "
        "3(d−1)/(d+1) (mean over blocks) against the number of consecutive blocks that share one "
        "basis (partial(k); shared = every block), one panel per place of the ends (in bases of their own, in "
        "the group's basis, or unrotated); "
        f"largest model; {shown}; seed means with {confidence:.0%} t-intervals. Dotted over a "
        "faint band: the same model trained without rotation, where the sweep has it.",
    )


SECTION = Section("bases", add, metrics=(Metric.KURTOSIS,))
