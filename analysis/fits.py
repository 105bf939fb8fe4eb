"""Power-law fits over frames: one per group (``fit_each``, ``fit_groups``), as a table,
as curves to draw, and the comparison of two groups' exponents. The model and its intervals
are in ``analysis.power_law``; family contrasts (the optimiser as the unit) in
``analysis.families``, re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import polars as pl

from analysis.families import FamilyComparison, compare_families, compare_family_values
from analysis.power_law import _EMPTY
from analysis.power_law import ExponentComparison, PowerLawFit, fit_power_law

__all__ = [
    "ExponentComparison",
    "FamilyComparison",
    "PowerLawFit",
    "compare_exponents",
    "compare_families",
    "compare_family_values",
    "fit_curves",
    "fit_each",
    "fit_groups",
    "fit_power_law",
    "fits_table",
]

MIN_BOOTSTRAP_UNITS = 5
"""A bootstrap comparison needs this many resampling units (points or groups) a side. At 3
points there are 10 distinct resamples and the bootstrap p sits at its floor: 14% of
equal-slope pairs read p < 0.01 in a simulation (3 sizes, 150 pairs); at 4 to 12 points
2-9% read p < 0.05."""


def fit_each(
    df: pl.DataFrame | pl.LazyFrame,
    x: str,
    y: str,
    by: Sequence[str] = (),
    *,
    offset: float = 0.0,
    n_boot: int = 1000,
    seed: int = 0,
    groups: str | None = None,
    seeds: str | None = None,
    confidence: float = 0.95,
) -> dict[tuple[Hashable, ...], PowerLawFit | str]:
    """Fit each group of ``df`` (grouped by ``by``): ``{key tuple: PowerLawFit}``, or the
    reason (a string) where the group cannot be fitted. Rows with a null x or y are dropped.
    ``groups`` names a column whose values are resampled whole by the bootstrap; ``seeds``
    the seed column behind the between-seed exponent interval (e.g. ``"seed"``)."""
    frame = df.lazy().collect() if isinstance(df, pl.LazyFrame) else df
    named = [c for c in (groups, seeds) if c]
    missing = [c for c in (x, y, *by, *named) if c not in frame.columns]
    if missing:
        raise ValueError(f"columns {missing} not in the frame (columns: {frame.columns})")
    frame = frame.filter(pl.col(x).is_not_null() & pl.col(y).is_not_null())
    parts = (
        frame.partition_by(list(by), as_dict=True, maintain_order=True)
        if by
        else {(): frame}
    )
    out: dict[tuple[Hashable, ...], PowerLawFit | str] = {}
    for key in sorted(parts, key=_sort_key):
        part = parts[key]
        try:
            out[key] = fit_power_law(
                part.get_column(x).to_numpy(),
                part.get_column(y).to_numpy(),
                offset=offset,
                n_boot=n_boot,
                seed=seed,
                groups=part.get_column(groups).to_numpy() if groups else None,
                seeds=part.get_column(seeds).to_numpy() if seeds else None,
                confidence=confidence,
            )
        except ValueError as e:
            out[key] = str(e)
    return out


def fits_table(
    fits: dict[tuple[Hashable, ...], PowerLawFit | str], by: Sequence[str] = ()
) -> pl.DataFrame:
    """One row per fit from ``fit_each``: the ``by`` columns, exponent with its CI
    (``exponent_low``/``exponent_high``, made as ``interval`` says), its OLS standard error
    and t interval (``exponent_t_low``/``exponent_t_high``), coefficient with its bootstrap
    CI, r2, n, n_x (sizes), n_seeds, offset, and ``note`` (why a group was not fitted)."""
    rows = []
    for key, fit in fits.items():
        row: dict[str, Any] = dict(zip(by, key, strict=True))
        if isinstance(fit, PowerLawFit):
            row.update(
                exponent=fit.exponent,
                exponent_low=fit.exponent_ci[0],
                exponent_high=fit.exponent_ci[1],
                exponent_se=fit.exponent_se,
                exponent_t_low=fit.exponent_ci_t[0],
                exponent_t_high=fit.exponent_ci_t[1],
                coefficient=fit.coefficient,
                coefficient_low=fit.coefficient_ci[0],
                coefficient_high=fit.coefficient_ci[1],
                r2=fit.r2,
                n=fit.n,
                n_x=fit.n_x,
                n_seeds=fit.n_seeds,
                interval=fit.interval,
                offset=fit.offset,
                note=None,
            )
        else:
            row["note"] = fit
        rows.append(row)
    schema: dict[str, Any] = {
        "exponent": pl.Float64,
        "exponent_low": pl.Float64,
        "exponent_high": pl.Float64,
        "exponent_se": pl.Float64,
        "exponent_t_low": pl.Float64,
        "exponent_t_high": pl.Float64,
        "coefficient": pl.Float64,
        "coefficient_low": pl.Float64,
        "coefficient_high": pl.Float64,
        "r2": pl.Float64,
        "n": pl.Int64,
        "n_x": pl.Int64,
        "n_seeds": pl.Int64,
        "interval": pl.String,
        "offset": pl.Float64,
        "note": pl.String,
    }
    return typed_frame(rows, by, schema)


def typed_frame(rows: list[dict[str, Any]], by: Sequence[str], schema: dict[str, Any]) -> pl.DataFrame:
    """``rows`` as a frame with the ``by`` columns (strings when empty), then exactly the columns
    of ``schema`` in its order and types (a column no row has is all null)."""
    if not rows:
        return pl.DataFrame(schema={**{b: pl.String for b in by}, **schema})
    table = pl.from_dicts(rows, infer_schema_length=None)
    table = table.with_columns(
        [pl.col(c).cast(t) if c in table.columns else pl.lit(None, t).alias(c) for c, t in schema.items()]
    )
    return table.select(*by, *schema)


def fit_groups(
    df: pl.DataFrame | pl.LazyFrame,
    x: str,
    y: str,
    by: Sequence[str] = (),
    *,
    offset: float = 0.0,
    n_boot: int = 1000,
    seed: int = 0,
    groups: str | None = None,
    seeds: str | None = None,
    confidence: float = 0.95,
) -> pl.DataFrame:
    """``fits_table(fit_each(...))``: one row per group of ``by``, never raising for a group
    that cannot be fitted (its ``note`` says why, e.g. a single model size)."""
    fits = fit_each(
        df, x, y, by, offset=offset, n_boot=n_boot, seed=seed, groups=groups, seeds=seeds,
        confidence=confidence,
    )
    return fits_table(fits, by)


def fit_curves(
    fits: dict[tuple[Hashable, ...], PowerLawFit | str],
    by: Sequence[str] = (),
    *,
    x: str = "x",
    n_points: int = 50,
    fit_type: type = PowerLawFit,
) -> pl.DataFrame:
    """The fitted curves with pointwise bootstrap bands, for charts: for each fitted group,
    ``n_points`` log-spaced x values over the data's range, with columns ``by``, ``x``,
    ``fit``, ``fit_low``, ``fit_high``. ``fit_type``: the fits drawn (any with ``x_range``,
    ``predict`` and ``predict_interval``, e.g. ``counts.CountFit``); other values are skipped."""
    frames = []
    for key, fit in fits.items():
        if not isinstance(fit, fit_type):
            continue
        grid = np.geomspace(fit.x_range[0], fit.x_range[1], n_points)
        lo, hi = fit.predict_interval(grid)
        frame = pl.DataFrame({x: grid, "fit": fit.predict(grid), "fit_low": lo, "fit_high": hi})
        frames.append(frame.with_columns(pl.lit(v).alias(b) for b, v in zip(by, key, strict=True)))
    if not frames:
        return pl.DataFrame(
            schema={**{b: pl.String for b in by}, x: pl.Float64, "fit": pl.Float64,
                    "fit_low": pl.Float64, "fit_high": pl.Float64}  # fmt: skip
        )
    return pl.concat(frames, how="diagonal_relaxed").select(*by, x, "fit", "fit_low", "fit_high")


def compare_exponents(
    df: pl.DataFrame | pl.LazyFrame,
    x: str,
    y: str,
    group_col: str,
    a: Any,
    b: Any,
    *,
    offset: float = 0.0,
    n_boot: int = 1000,
    seed: int = 0,
    groups: str | None = None,
    seeds: str | None = None,
    confidence: float = 0.95,
    memo: dict[tuple[Any, int], PowerLawFit | ValueError] | None = None,
) -> ExponentComparison:
    """Does the exponent of rows with ``group_col == b`` differ from that of ``group_col == a``?

    E.g. ``compare_exponents(per_trial_df, "params_non_embedding", "value", "optimizer",
    "sgd", "adam", offset=3)``. Filter ``df`` to one norm / rotation first. Raises
    ``ValueError`` (from ``fit_power_law``) when either side cannot be fitted. ``memo``, a dict
    the caller keeps across calls on the same frame and settings, reuses each side's fit (the
    same numbers: side a always draws the first bootstrap stream, b the second)."""
    frame = df.lazy().collect() if isinstance(df, pl.LazyFrame) else df
    streams = np.random.SeedSequence(seed).spawn(2)
    memo = {} if memo is None else memo
    fits = []
    for side, (label, ss) in enumerate(zip((a, b), streams, strict=True)):
        if (label, side) not in memo:
            part = frame.filter((pl.col(group_col) == label) & pl.col(x).is_not_null() & pl.col(y).is_not_null())
            try:
                if part.height == 0:
                    raise ValueError(f"no rows with {group_col} == {label!r}")
                memo[label, side] = fit_power_law(
                    part.get_column(x).to_numpy(),
                    part.get_column(y).to_numpy(),
                    offset=offset,
                    n_boot=n_boot,
                    seed=np.random.default_rng(ss),
                    groups=part.get_column(groups).to_numpy() if groups else None,
                    seeds=part.get_column(seeds).to_numpy() if seeds else None,
                    confidence=confidence,
                )
            except ValueError as e:
                memo[label, side] = e if part.height == 0 else ValueError(f"{group_col} == {label!r}: {e}")
        fit = memo[label, side]
        if isinstance(fit, ValueError):
            raise fit
        fits.append(fit)
    fa, fb = fits
    if fa.seed_exponents.size >= 2 and fb.seed_exponents.size >= 2:
        return _welch(str(a), str(b), fa, fb, confidence)
    units_a, units_b = fa.n_groups or fa.n, fb.n_groups or fb.n
    what = "groups" if groups else "points"
    ci, p, d = (math.nan, math.nan), math.nan, _EMPTY
    if min(units_a, units_b) < MIN_BOOTSTRAP_UNITS:
        method = (
            f"no p-value: {_replicates(fa)} vs {_replicates(fb)}; needs 2+ seeds a side "
            f"(Welch t) or {MIN_BOOTSTRAP_UNITS}+ {what} a side (bootstrap)"
        )
    elif fa.boot_exponent.size == 0 or fb.boot_exponent.size == 0:
        method = "no p-value: no bootstrap resamples (n_boot = 0)"
    else:
        method = f"bootstrap over {what} ({units_a}; {units_b})"
        d = fb.boot_exponent - fa.boot_exponent
        d = d[np.isfinite(d)]
        if d.size:
            q = [(1 - confidence) / 2, (1 + confidence) / 2]
            ci = tuple(float(v) for v in np.quantile(d, q))
            below = (np.count_nonzero(d <= 0) + 1) / (d.size + 1)
            above = (np.count_nonzero(d >= 0) + 1) / (d.size + 1)
            p = min(1.0, 2.0 * min(below, above))
    return ExponentComparison(
        a=str(a),
        b=str(b),
        fit_a=fa,
        fit_b=fb,
        difference=fb.exponent - fa.exponent,
        difference_ci=ci,  # type: ignore[arg-type]
        p_value=p,
        confidence=confidence,
        n_boot=int(d.size),
        method=method,
    )


# ---------------------------------------------------------------- internals


def _welch(a: str, b: str, fa: PowerLawFit, fb: PowerLawFit, confidence: float) -> ExponentComparison:
    """Welch's t on the two sets of per-seed exponents (seeds are the replicates), by
    ``scipy.stats.ttest_ind(equal_var=False)``: the difference of their means, its interval
    and p."""
    from scipy import stats

    sa, sb = fa.seed_exponents, fb.seed_exponents
    d = float(sb.mean() - sa.mean())
    if np.ptp(sa) == 0 and np.ptp(sb) == 0:  # no spread on either side: nothing to test
        df, ci, p = float(sa.size + sb.size - 2), (d, d), 0.0 if d else 1.0
    else:
        test = stats.ttest_ind(sb, sa, equal_var=False)
        df = float(test.df)
        interval = test.confidence_interval(confidence)
        ci, p = (float(interval.low), float(interval.high)), float(test.pvalue)
    return ExponentComparison(
        a=a, b=b, fit_a=fa, fit_b=fb, difference=d, difference_ci=ci,
        p_value=p, confidence=confidence, method=f"Welch t over seeds (df {df:.1f})",
    )  # fmt: skip


def _replicates(fit: PowerLawFit) -> str:
    """``"1 seed, 3 points"``: what a side has to test with."""
    units = f"{fit.n_groups} groups" if fit.n_groups is not None else f"{fit.n} points"
    if fit.n_seeds is None:
        return units
    return f"{fit.n_seeds} seed{'s' if fit.n_seeds != 1 else ''}, {units}"


def _sort_key(key: tuple[Hashable, ...]) -> tuple[Any, ...]:
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in key)
