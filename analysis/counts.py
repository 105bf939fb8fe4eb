"""Outlier counts against scale: a power law of the outlier fraction fitted as a count model
that handles zeros.

The count is ``outlier_dims_rel`` (coordinates beyond 6x the token's RMS on any eval token) at
a normalised layer input, summed over blocks; its trials are d_model x blocks (a count that
cannot exceed them), so the fitted quantity is the fraction of coordinates that are outliers.
Model: binomial GLM with a log link, log E[count / trials] = a + b log(N / N_ref) (so the
fraction is c N^b), fitted by statsmodels. A zero count is an observation, not a hole in a
log-log fit.

Seeds are the replicates, as in the kurtosis fits: with 2+ seeds the standard errors are
cluster-robust by seed (the sandwich over seed clusters, statsmodels' small-sample correction)
and the interval for b is t(seeds - 1); a spread between seeds (a seed whose fraction grows
faster, or trial-level noise) widens it. With one seed (or none given) the binomial standard
errors are scaled by the Pearson dispersion (floored at 1: never narrower than binomial) with a
t(n - 2) interval, labelled so.

Structural zeros: |x_j| <= sqrt(d) RMS, so no coordinate can pass 6 RMS at d <= 36; those
sizes say nothing about scaling and are left out of the fit (``STRUCTURAL_D``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from analysis.fits import fit_curves, typed_frame

__all__ = [
    "STRUCTURAL_D", "STRUCTURAL_NOTE", "CountFit", "count_fit_curves", "count_fits_table", "fit_count_power_law",
    "fit_counts_each",
]  # fmt: skip

STRUCTURAL_D = 36
"""At d_model <= 36 a coordinate cannot exceed 6x its token's RMS (max|x_j| <= sqrt(d) RMS)."""
STRUCTURAL_NOTE = "outlier_dims_rel is structurally 0 at d_model ≤ 36 (max|x_j| ≤ √d·RMS): those sizes are not fitted"


@dataclass(frozen=True)
class CountFit:
    """fraction = coefficient * x ** exponent, fitted as a binomial GLM (log link) of the
    counts out of ``exposure`` trials. ``exponent_ci``: b ± t(df) se, se cluster-robust by seed
    with df = seeds - 1 (2+ seeds), else the dispersion-scaled binomial se with df = n - 2
    (NaN when df = 0); ``interval`` says which."""

    coefficient: float
    exponent: float
    exponent_ci: tuple[float, float]
    exponent_se: float
    r2: float
    """Deviance explained, 1 - deviance / null deviance."""
    n: int
    n_x: int
    n_seeds: int | None
    dispersion: float
    """Pearson chi² / (n - 2) of the binomial fit (1 for binomial counts; more with seed or trial
    effects)."""
    df: int
    confidence: float
    x_ref: float
    x_range: tuple[float, float]
    intercept: float = math.nan
    cov: np.ndarray = field(default_factory=lambda: np.full((2, 2), np.nan), repr=False, compare=False)
    n_excluded: int = 0
    interval: str = ""

    def predict(self, x: Any) -> np.ndarray:
        return np.exp(self._eta(np.asarray(x, dtype=float)))

    def predict_interval(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise t band of the fitted fraction (delta method on the linear predictor)."""
        x = np.asarray(x, dtype=float)
        lx = np.log(x / self.x_ref)
        var = self.cov[0, 0] + 2 * lx * self.cov[0, 1] + lx**2 * self.cov[1, 1]
        t = _t(self.df, self.confidence)
        eta = self._eta(x)
        half = t * np.sqrt(np.maximum(var, 0.0))
        return np.exp(eta - half), np.exp(eta + half)

    def _eta(self, x: np.ndarray) -> np.ndarray:
        return self.intercept + self.exponent * np.log(x / self.x_ref)


def _t(df: int, confidence: float) -> float:
    if df <= 0:
        return math.nan
    from scipy import stats

    return float(stats.t.ppf((1 + confidence) / 2, df))


def fit_count_power_law(
    x: Any,
    counts: Any,
    exposure: Any,
    *,
    d_model: Any = None,
    seeds: Any = None,
    confidence: float = 0.95,
) -> CountFit:
    """Fit fraction = counts / exposure = c * x**b (see the module docstring). Rows with
    ``d_model`` <= 36 are left out (structural zeros). Raises ValueError when the slope is
    undefined: fewer than two sizes, every count 0, outliers at one size only (the slope
    is then unbounded above), or a count above its exposure."""
    import statsmodels.api as sm

    x = np.asarray(x, dtype=float)
    y = np.asarray(counts, dtype=float)
    e = np.asarray(exposure, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & np.isfinite(e) & (x > 0) & (e > 0) & (y >= 0)
    n_excluded = 0
    if d_model is not None:
        structural = np.asarray(d_model, dtype=float) <= STRUCTURAL_D
        n_excluded = int((keep & structural).sum())
        keep &= ~structural
    s = None if seeds is None else np.asarray(seeds)[keep]
    x, y, e = x[keep], y[keep], e[keep]
    if (y > e).any():
        raise ValueError(f"{int((y > e).sum())} count(s) above their exposure (d_model x blocks): not a fraction")
    sizes = np.unique(x)
    if sizes.size < 2:
        raise ValueError(f"{sizes.size} model size(s) with d_model > {STRUCTURAL_D}: need 2")
    if not (y > 0).any():
        raise ValueError("no outliers at any size (every count 0): no slope")
    if np.unique(x[y > 0]).size < 2:
        raise ValueError("outliers at one size only: the slope is unbounded above (no finite fit)")
    x_ref = float(np.exp(np.log(sizes).mean()))
    design = np.column_stack([np.ones_like(x), np.log(x / x_ref)])
    seed_idx = None if s is None else np.unique(s, return_inverse=True)[1]
    n_seeds = None if seed_idx is None else int(seed_idx.max()) + 1
    n = int(y.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the log link's domain warning; failures are reported below
        family = sm.families.Binomial(link=sm.families.links.Log())
        model = sm.GLM(np.column_stack([y, e - y]), design, family=family)
        start = np.array([math.log(max(y.sum(), 0.5) / e.sum()), 0.0])
        try:
            res = model.fit(start_params=start)
        except (ValueError, np.linalg.LinAlgError, FloatingPointError) as err:
            raise ValueError(f"the count GLM did not converge ({err})") from None
        if not res.converged or not np.all(np.isfinite(res.params)):
            raise ValueError("the count GLM did not converge (no finite slope)")
        df_resid = n - 2
        dispersion = float(res.pearson_chi2 / df_resid) if df_resid > 0 else math.nan
        if n_seeds is not None and n_seeds >= 2:
            robust = model.fit(start_params=res.params, cov_type="cluster", cov_kwds={"groups": seed_idx})
            cov, df = np.asarray(robust.cov_params()), n_seeds - 1
            interval = f"binomial GLM, seed-clustered SE, t({df})"
        else:
            scale = max(1.0, dispersion) if df_resid > 0 else math.nan
            cov, df = np.asarray(res.cov_params()) * scale, df_resid
            what = "one seed" if n_seeds == 1 else "no seeds given"
            interval = (f"binomial GLM, Pearson-scaled SE, t({df}) ({what})" if df > 0
                        else f"binomial GLM (no dof: no interval; {what})")  # fmt: skip
    se = float(math.sqrt(cov[1, 1])) if df > 0 else math.nan
    b = float(res.params[1])
    t = _t(df, confidence)
    a = float(res.params[0])
    return CountFit(
        coefficient=math.exp(a - b * math.log(x_ref)), exponent=b, exponent_ci=(b - t * se, b + t * se),
        exponent_se=se, r2=1.0 - float(res.deviance) / float(res.null_deviance) if res.null_deviance > 0 else math.nan,
        n=n, n_x=int(sizes.size), n_seeds=n_seeds, dispersion=dispersion, df=df, confidence=confidence, x_ref=x_ref,
        x_range=(float(sizes.min()), float(sizes.max())), intercept=a, cov=cov, n_excluded=n_excluded,
        interval=interval,
    )  # fmt: skip


def fit_counts_each(
    df: pl.DataFrame,
    x: str,
    count: str,
    exposure: str,
    by: Sequence[str] = (),
    *,
    d_model: str | None = "d_model",
    seeds: str | None = "seed",
    confidence: float = 0.95,
) -> dict[tuple[Hashable, ...], CountFit | str]:
    """``fit_count_power_law`` per group of ``by``: ``{key: CountFit}`` or the reason (a
    string) a group has no slope."""
    parts = df.partition_by(list(by), as_dict=True, maintain_order=True) if by else {(): df}
    out: dict[tuple[Hashable, ...], CountFit | str] = {}
    for key in sorted(parts, key=lambda k: tuple(str(v) for v in k)):
        part = parts[key]
        try:
            out[key] = fit_count_power_law(
                part.get_column(x).to_numpy(), part.get_column(count).to_numpy(),
                part.get_column(exposure).to_numpy(),
                d_model=part.get_column(d_model).to_numpy() if d_model and d_model in part.columns else None,
                seeds=part.get_column(seeds).to_numpy() if seeds and seeds in part.columns else None,
                confidence=confidence,
            )  # fmt: skip
        except ValueError as err:
            out[key] = str(err)
    return out


def count_fits_table(fitted: dict[tuple[Hashable, ...], CountFit | str], by: Sequence[str] = ()) -> pl.DataFrame:
    """One row per group, with the columns of ``fits.fits_table`` (exponent and its interval,
    coefficient, r2 = deviance explained, n, n_x, n_seeds, interval, note) plus ``dispersion``."""
    rows = []
    for key, fit in fitted.items():
        row: dict[str, Any] = dict(zip(by, key, strict=True))
        if isinstance(fit, CountFit):
            row.update(
                exponent=fit.exponent, exponent_low=fit.exponent_ci[0], exponent_high=fit.exponent_ci[1],
                exponent_se=fit.exponent_se, coefficient=fit.coefficient, r2=fit.r2, n=fit.n, n_x=fit.n_x,
                n_seeds=fit.n_seeds, interval=fit.interval, offset=0.0, dispersion=fit.dispersion,
                note=f"{fit.n_excluded} points at d_model ≤ {STRUCTURAL_D} left out" if fit.n_excluded else None,
            )  # fmt: skip
        else:
            row["note"] = fit
        rows.append(row)
    schema: dict[str, Any] = {
        "exponent": pl.Float64, "exponent_low": pl.Float64, "exponent_high": pl.Float64,
        "exponent_se": pl.Float64, "coefficient": pl.Float64, "r2": pl.Float64, "n": pl.Int64,
        "n_x": pl.Int64, "n_seeds": pl.Int64, "interval": pl.String, "offset": pl.Float64,
        "dispersion": pl.Float64, "note": pl.String,
    }  # fmt: skip
    return typed_frame(rows, by, schema)


def count_fit_curves(
    fitted: dict[tuple[Hashable, ...], CountFit | str], by: Sequence[str] = (), *, x: str = "x", n_points: int = 50
) -> pl.DataFrame:
    """The fitted fractions with their pointwise bands over each fit's size range (columns
    ``by``, ``x``, ``fit``, ``fit_low``, ``fit_high``): ``fits.fit_curves`` of the count fits."""
    return fit_curves(fitted, by, x=x, n_points=n_points, fit_type=CountFit)
