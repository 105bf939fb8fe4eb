"""The report's summary of the fits, after every figure: the comparison tables' p-values
Holm-adjusted around the declared primary contrast (with a note saying which it was), a note
on how outlier fractions are fitted, every config's exponent with its interval in one chart,
and a note on the fitted lr*(N)."""

from __future__ import annotations

from analysis import charts, counts
from analysis.report.fits import adjust_comparisons
from analysis.report.section import Context, Section

__all__ = ["COUNT_FIT_NOTE", "SECTION"]

COUNT_FIT_NOTE = (
    "Outlier-fraction fits are binomial GLMs of the outlier counts out of d_model × blocks coordinates "
    "(log link, log size as regressor), not log-log least squares: zero counts are data. Seeds are the "
    "replicates: standard errors cluster-robust by seed, t interval with seeds − 1 dof (one seed: "
    "Pearson-scaled, n − 2 dof). " + counts.STRUCTURAL_NOTE + "."
)


def add(ctx: Context) -> None:
    """The adjusted tables (``ctx.retable``), the slopes chart and the notes."""
    c, o = ctx.content, ctx.options
    if c.comparisons.height or c.family_comparisons.height or c.family_levels.height:
        *adjusted, note = adjust_comparisons(c.comparisons, c.family_comparisons, c.family_levels, o.primary,
                                             o.fit_specs)
        for name, frame in zip(("comparisons", "family_comparisons", "family_levels"), adjusted, strict=True):
            ctx.retable(name, frame)
        ctx.note(note)
    if c.fits.height and c.fits.get_column("fit").str.starts_with("outlier fraction").any():
        ctx.note(COUNT_FIT_NOTE)
    if c.fits.height and {"optimizer", "config", "exponent_low"} <= set(c.fits.columns):
        ctx.chart(
            "slopes",
            charts.slopes(c.fits),
            f"Each config's fitted exponent with its {ctx.confidence:.0%} interval (the fits table), one panel "
            "per fit: kurtosis / null (0 = no growth over the null), outlier fraction, loss.",
        )
    if c.lr_fit.height:
        ctx.note(
            f"lr*(N) fitted for {c.lr_fit.height} config(s) from their best-lr points (lr_fit.csv: "
            "a spec's optimizer entry takes lr = lr_at_reference with lr_scaling: {reference_params, exponent})."
        )


SECTION = Section("slopes", add)
