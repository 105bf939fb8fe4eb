"""Power-law fits with seed-based confidence intervals, and slope comparisons.

The model is ``y - offset = coefficient * x ** exponent``, fitted by ordinary least squares
of ``log(y - offset)`` on ``log(x)``.

The exponent's interval (``exponent_ci``, described in ``interval``): seeds are the unit of
replication. With ``seeds`` given and at least two seeds that each span two sizes, it is a
t-interval over the per-seed fits: exponent +- t(k-1) * sd(per-seed exponents) / sqrt(k)
for k seeds (exactly the pooled slope's sampling distribution when every seed has the same
sizes and log-noise is Gaussian; a simulation test checks 95% coverage at 3 and 5 sizes x 3
seeds). With one seed it falls back to the fit's own OLS t-interval (n - 2 dof), labelled
so; without ``seeds`` it is a percentile bootstrap over points (or whole ``groups``), which
undercovers at a few points (about 87% for a nominal 95% at 3 sizes x 3 points).
The fitted-curve bands of ``predict_interval`` are always the percentile bootstrap.
Resamples whose points all share one x value cannot be fitted and are skipped.

Points with ``x <= 0`` or ``y - offset <= 0`` have no logarithm: ``fit_power_law`` rejects
them with a ``ValueError`` naming how many there are (it never drops data silently);
``fit_groups`` records that message in the group's ``note`` instead of raising. Nulls in a
frame (e.g. failed trials) are dropped by the frame-level functions before fitting.

numpy only: the bootstrap is one weighted least-squares solve over a (resamples x points)
matrix of multinomial counts.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from analysis._stats import t_critical

__all__ = [
    "ExponentComparison",
    "PowerLawFit",
    "compare_exponents",
    "fit_curves",
    "fit_each",
    "fit_groups",
    "fit_power_law",
    "fits_table",
]

SeedLike = int | np.random.Generator | np.random.SeedSequence | None
_EMPTY = np.empty(0)


@dataclass(frozen=True)
class PowerLawFit:
    """``y - offset = coefficient * x ** exponent``, least squares in log-log space.

    ``exponent_ci`` and ``coefficient_ci`` are percentile-bootstrap intervals at
    ``confidence`` from ``n_boot`` usable resamples (NaN when none were usable);
    ``r2`` is the coefficient of determination of the log-log regression; ``n`` the number
    of points, ``n_x`` of distinct x values, ``n_groups`` of resampling groups (None when
    points were resampled individually)."""

    coefficient: float
    exponent: float
    exponent_ci: tuple[float, float]
    coefficient_ci: tuple[float, float]
    r2: float
    n: int
    offset: float = 0.0
    confidence: float = 0.95
    n_boot: int = 0
    n_x: int = 0
    n_groups: int | None = None
    x_range: tuple[float, float] = (math.nan, math.nan)
    exponent_se: float = math.nan
    """Classical OLS standard error of the exponent (log-log residuals, n - 2 dof)."""
    exponent_ci_t: tuple[float, float] = (math.nan, math.nan)
    """Classical t interval exponent +- t(n-2) * exponent_se, exact if log(y - offset) has
    iid Gaussian noise. With few points (3 sizes x 3 seeds) the percentile bootstrap
    undercovers (about 87% instead of 95% in simulations at n = 9); compare with this."""
    boot_exponent: np.ndarray = field(default_factory=lambda: _EMPTY, repr=False, compare=False)
    """The bootstrap exponents (NaN where a resample could not be fitted)."""
    boot_log_coefficient: np.ndarray = field(default_factory=lambda: _EMPTY, repr=False, compare=False)
    """The bootstrap log-coefficients, paired with ``boot_exponent``."""
    interval: str = "bootstrap over points"
    """How ``exponent_ci`` was made: ``between-seed t (k seeds)``, ``OLS t (one seed)`` or
    ``bootstrap over points`` / ``bootstrap over groups``."""
    n_seeds: int | None = None
    """Distinct seeds among the points (None when ``seeds`` was not given)."""
    seed_exponents: np.ndarray = field(default_factory=lambda: _EMPTY, repr=False, compare=False)
    """The per-seed exponents behind a between-seed interval (seeds spanning 2+ sizes)."""

    @property
    def n_label(self) -> str:
        """``"9 (3 sizes × 3 seeds)"``: every quoted slope shows its n."""
        if self.n_seeds is None:
            return f"{self.n} ({self.n_x} sizes)"
        return f"{self.n} ({self.n_x} sizes × {self.n_seeds} seeds)"

    def predict(self, x: Any) -> np.ndarray:
        """``offset + coefficient * x ** exponent``."""
        return self.offset + self.coefficient * np.asarray(x, dtype=float) ** self.exponent

    def predict_interval(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise percentile-bootstrap band of the fitted curve at ``x`` (low, high)."""
        x = np.asarray(x, dtype=float)
        ok = np.isfinite(self.boot_exponent)
        if not ok.any():
            nan = np.full(x.shape, np.nan)
            return nan, nan
        logy = self.boot_log_coefficient[ok, None] + np.outer(
            self.boot_exponent[ok], np.log(x.ravel())
        )
        q = [(1 - self.confidence) / 2, (1 + self.confidence) / 2]
        lo, hi = np.quantile(logy, q, axis=0)
        return (
            (self.offset + np.exp(lo)).reshape(x.shape),
            (self.offset + np.exp(hi)).reshape(x.shape),
        )

    def __str__(self) -> str:
        lhs = "y" if self.offset == 0 else f"y - {self.offset:g}"
        lo, hi = self.exponent_ci
        return (
            f"{lhs} = {self.coefficient:.4g} * x^{self.exponent:.3f} "
            f"[{lo:.3f}, {hi:.3f}] ({self.confidence:.0%} CI, {self.interval}; "
            f"R²={self.r2:.3f}, n={self.n_label})"
        )


@dataclass(frozen=True)
class ExponentComparison:
    """Exponent of ``b`` minus exponent of ``a``, with a CI and a two-sided p-value for "no
    difference" (``method`` says which).

    With seeds (both fits between-seed): a Welch t-test on the two sets of per-seed
    exponents. Otherwise the two fits are bootstrapped independently (they are independent
    trials);
    ``p_value = min(1, 2 * min(P*(d <= 0), P*(d >= 0)))`` over the bootstrap differences d,
    each proportion computed as (count + 1) / (resamples + 1), so p < 1 - confidence exactly
    when 0 lies outside the CI, and p is never below 2 / (resamples + 1)."""

    a: str
    b: str
    fit_a: PowerLawFit
    fit_b: PowerLawFit
    difference: float
    difference_ci: tuple[float, float]
    p_value: float
    confidence: float = 0.95
    n_boot: int = 0
    method: str = "bootstrap"

    def __str__(self) -> str:
        lo, hi = self.difference_ci
        return (
            f"exponent({self.b}) - exponent({self.a}) = {self.difference:+.3f} "
            f"[{lo:+.3f}, {hi:+.3f}] ({self.confidence:.0%} CI), p = {self.p_value:.3g}"
        )


def fit_power_law(
    x: Any,
    y: Any,
    *,
    offset: float = 0.0,
    n_boot: int = 1000,
    seed: SeedLike = 0,
    groups: Any = None,
    seeds: Any = None,
    confidence: float = 0.95,
) -> PowerLawFit:
    """Fit ``y - offset = coefficient * x ** exponent`` by least squares in log-log space.

    ``seeds`` (one seed label per point) makes ``exponent_ci`` the between-seed t-interval
    (one seed: the OLS t-interval); see the module docstring. The coefficient's CI and the
    curve bands are percentile bootstrap over ``n_boot`` resamples: of the points, or, when
    ``groups`` (one label per point) is given, of whole groups.
    Raises ``ValueError`` when a point is not finite, when x <= 0 or y - offset <= 0 for
    any point (naming how many), or when fewer than two distinct x values remain."""
    xa = _vector(x, "x")
    ya = _vector(y, "y")
    if xa.shape != ya.shape:
        raise ValueError(f"x and y differ in length ({xa.size} vs {ya.size})")
    n = xa.size
    bad = ~(np.isfinite(xa) & np.isfinite(ya))
    if bad.any():
        raise ValueError(f"{int(bad.sum())} of {n} points are not finite (NaN or inf)")
    bad_x, bad_y = xa <= 0, ya - offset <= 0
    if bad_x.any() or bad_y.any():
        parts = []
        if bad_x.any():
            parts.append(f"{int(bad_x.sum())} of {n} points have x <= 0")
        if bad_y.any():
            rhs = "y <= 0" if offset == 0 else f"y - {offset:g} <= 0"
            parts.append(f"{int(bad_y.sum())} of {n} points have {rhs}")
        raise ValueError(
            "; ".join(parts) + ": a power law needs x > 0 and y - offset > 0 "
            "(filter those points or choose another offset)"
        )
    n_x = np.unique(xa).size
    if n_x < 2:
        raise ValueError(
            f"need at least 2 distinct x values to fit a power law; got {n_x} "
            f"(x = {xa[0]:.4g}, {n} points)"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")

    lx, ly = np.log(xa), np.log(ya - offset)
    slope, intercept = _ols(lx, ly, np.ones((1, n)))
    b, a = float(slope[0]), float(intercept[0])
    resid = ly - (a + b * lx)
    ss_res, ss_tot = float(resid @ resid), float(((ly - ly.mean()) ** 2).sum())
    tiny = 1e-24 * max(1.0, float(ly @ ly))  # below this, y is constant up to rounding
    if ss_tot > tiny:
        r2 = 1.0 - ss_res / ss_tot
    else:
        r2 = 1.0 if ss_res <= tiny else math.nan

    if n > 2:
        sxx = float(((lx - lx.mean()) ** 2).sum())
        se = math.sqrt(max(ss_res, 0.0) / (n - 2) / sxx)
        half = t_critical(float(n - 2), confidence) * se
        ci_t = (b - half, b + half)
    else:
        se, ci_t = math.nan, (math.nan, math.nan)

    rng = np.random.default_rng(seed)
    n_groups = None
    if n_boot > 0:
        if groups is None:
            weights = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot)
        else:
            labels = np.asarray(groups)
            if labels.shape != (n,):
                raise ValueError(f"groups must hold one label per point ({n}), got {labels.shape}")
            _, inverse = np.unique(labels, return_inverse=True)
            n_groups = int(inverse.max()) + 1
            drawn = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot)
            weights = drawn[:, inverse]
        boot_b, boot_a = _ols(lx, ly, weights.astype(float))
    else:
        boot_b = boot_a = _EMPTY
    ok = np.isfinite(boot_b)
    q = [(1 - confidence) / 2, (1 + confidence) / 2]
    if ok.any():
        b_ci = tuple(float(v) for v in np.quantile(boot_b[ok], q))
        a_ci = tuple(float(math.exp(v)) for v in np.quantile(boot_a[ok], q))
    else:
        b_ci = a_ci = (math.nan, math.nan)
    interval = "bootstrap over groups" if n_groups is not None else "bootstrap over points"
    n_seeds, seed_b = None, _EMPTY
    if seeds is not None:
        labels = np.asarray(seeds)
        if labels.shape != (n,):
            raise ValueError(f"seeds must hold one label per point ({n}), got {labels.shape}")
        _, idx = np.unique(labels, return_inverse=True)
        n_seeds = int(idx.max()) + 1
        seed_b = seed_exponents(lx, ly, idx)
        seed_b = seed_b[np.isfinite(seed_b)]
        if seed_b.size >= 2:
            half = float(between_seed_halfwidth(seed_b, confidence))
            b_ci, interval = (b - half, b + half), f"between-seed t ({seed_b.size} seeds)"
        else:
            b_ci, interval = ci_t, "OLS t (one seed)"
    return PowerLawFit(
        coefficient=math.exp(a),
        exponent=b,
        exponent_ci=b_ci,  # type: ignore[arg-type]
        coefficient_ci=a_ci,  # type: ignore[arg-type]
        r2=r2,
        n=n,
        offset=float(offset),
        confidence=confidence,
        n_boot=int(ok.sum()),
        n_x=int(n_x),
        n_groups=n_groups,
        x_range=(float(xa.min()), float(xa.max())),
        exponent_se=se,
        exponent_ci_t=ci_t,
        boot_exponent=boot_b,
        boot_log_coefficient=boot_a,
        interval=interval,
        n_seeds=n_seeds,
        seed_exponents=seed_b,
    )


def seed_exponents(lx: np.ndarray, ly: np.ndarray, seed_idx: np.ndarray) -> np.ndarray:
    """Per-seed OLS slopes of ``ly`` on ``lx``, vectorised over leading dims of ``ly``:
    ``ly`` (..., n) with ``seed_idx`` (n,) in 0..k-1 gives (..., k); NaN for a seed whose
    points span fewer than two x values."""
    k = int(seed_idx.max()) + 1
    onehot = (seed_idx[None, :] == np.arange(k)[:, None]).astype(float)  # (k, n)
    cnt = onehot.sum(axis=1)
    mx = (onehot @ lx) / cnt
    dx = lx[None, :] - mx[:, None]  # (k, n)
    sxx = (onehot * dx * dx).sum(axis=1)
    sxy = np.einsum("kn,...n->...k", onehot * dx, ly)
    ok = sxx > 1e-12 * max(float(np.var(lx)), 1e-300)
    return np.where(ok, sxy / np.where(ok, sxx, 1.0), np.nan)


def between_seed_halfwidth(b_seeds: np.ndarray, confidence: float = 0.95) -> np.ndarray:
    """Half-width t(k-1) * sd / sqrt(k) of the t-interval over the last axis (k seeds)."""
    k = b_seeds.shape[-1]
    return t_critical(float(k - 1), confidence) * b_seeds.std(axis=-1, ddof=1) / math.sqrt(k)


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
) -> pl.DataFrame:
    """The fitted curves with pointwise bootstrap bands, for charts: for each fitted group,
    ``n_points`` log-spaced x values over the data's range, with columns ``by``, ``x``,
    ``fit``, ``fit_low``, ``fit_high``."""
    frames = []
    for key, fit in fits.items():
        if not isinstance(fit, PowerLawFit):
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
) -> ExponentComparison:
    """Does the exponent of rows with ``group_col == b`` differ from that of ``group_col == a``?

    E.g. ``compare_exponents(per_trial_df, "params_non_embedding", "value", "optimizer",
    "sgd", "adam", offset=3)``. Filter ``df`` to one norm / rotation first. Raises
    ``ValueError`` (from ``fit_power_law``) when either side cannot be fitted."""
    frame = df.lazy().collect() if isinstance(df, pl.LazyFrame) else df
    streams = np.random.SeedSequence(seed).spawn(2)
    fits = []
    for label, ss in zip((a, b), streams, strict=True):
        part = frame.filter((pl.col(group_col) == label) & pl.col(x).is_not_null() & pl.col(y).is_not_null())
        if part.height == 0:
            raise ValueError(f"no rows with {group_col} == {label!r}")
        try:
            fits.append(
                fit_power_law(
                    part.get_column(x).to_numpy(),
                    part.get_column(y).to_numpy(),
                    offset=offset,
                    n_boot=n_boot,
                    seed=np.random.default_rng(ss),
                    groups=part.get_column(groups).to_numpy() if groups else None,
                    seeds=part.get_column(seeds).to_numpy() if seeds else None,
                    confidence=confidence,
                )
            )
        except ValueError as e:
            raise ValueError(f"{group_col} == {label!r}: {e}") from e
    fa, fb = fits
    if fa.seed_exponents.size >= 2 and fb.seed_exponents.size >= 2:
        return _welch(str(a), str(b), fa, fb, confidence)
    d = fb.boot_exponent - fa.boot_exponent
    d = d[np.isfinite(d)]
    if d.size:
        q = [(1 - confidence) / 2, (1 + confidence) / 2]
        ci = tuple(float(v) for v in np.quantile(d, q))
        below = (np.count_nonzero(d <= 0) + 1) / (d.size + 1)
        above = (np.count_nonzero(d >= 0) + 1) / (d.size + 1)
        p = min(1.0, 2.0 * min(below, above))
    else:
        ci, p = (math.nan, math.nan), math.nan
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
    )


# ---------------------------------------------------------------- internals


def _welch(a: str, b: str, fa: PowerLawFit, fb: PowerLawFit, confidence: float) -> ExponentComparison:
    """Welch's t on the two sets of per-seed exponents (seeds are the replicates)."""
    from analysis._stats import t_sf

    va = fa.seed_exponents.var(ddof=1) / fa.seed_exponents.size
    vb = fb.seed_exponents.var(ddof=1) / fb.seed_exponents.size
    se = math.sqrt(va + vb)
    d = fb.exponent - fa.exponent
    dfa, dfb = fa.seed_exponents.size - 1, fb.seed_exponents.size - 1
    df = (va + vb) ** 2 / (va**2 / dfa + vb**2 / dfb) if se > 0 else float(dfa + dfb)
    half = t_critical(df, confidence) * se
    p = t_sf(abs(d) / se, df) if se > 0 else (0.0 if d else 1.0)
    return ExponentComparison(
        a=a, b=b, fit_a=fa, fit_b=fb, difference=d, difference_ci=(d - half, d + half),
        p_value=float(p), confidence=confidence, method=f"Welch t over seeds (df {df:.1f})",
    )  # fmt: skip


def _vector(v: Any, name: str) -> np.ndarray:
    if isinstance(v, pl.Series):
        v = v.cast(pl.Float64).to_numpy()
    arr = np.asarray(v, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _ols(lx: np.ndarray, ly: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least squares ly ~ a + b lx for each row of weights ``w`` (k, n).
    Returns (b, a); NaN where a row's weighted x has no spread."""
    cx, cy = lx.mean(), ly.mean()
    dx, dy = lx - cx, ly - cy
    sw = w.sum(axis=1)
    mx, my = (w @ dx) / sw, (w @ dy) / sw
    sxx = (w @ (dx * dx)) / sw - mx * mx
    sxy = (w @ (dx * dy)) / sw - mx * my
    spread = max(float(dx @ dx) / dx.size, 1e-300)
    ok = sxx > 1e-9 * spread
    b = np.where(ok, sxy / np.where(ok, sxx, 1.0), np.nan)
    a = (my + cy) - b * (mx + cx)
    return b, a


def _sort_key(key: tuple[Hashable, ...]) -> tuple[Any, ...]:
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in key)
