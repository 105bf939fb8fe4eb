"""One power-law fit with its seed-based confidence interval (``fits`` fits frames of them).

The model is ``y - offset = coefficient * x ** exponent``, fitted by ordinary least squares
of ``log(y - offset)`` on ``log(x)`` (``scipy.stats.linregress``).

The exponent's interval (``exponent_ci``, described in ``interval``): seeds are the unit of
replication. With ``seeds`` given and at least two seeds that each span two sizes, it is the
one-sample t-interval over the per-seed slopes: their mean +- t(k-1) * sd / sqrt(k) for k
seeds (t from ``scipy.stats.t``). It is centred on the mean of the per-seed slopes, which
equals the pooled slope when every seed has the same sizes and differs when a trial failed
(a simulation test checks 95% coverage at 3 and 5 sizes x 3 seeds). With one seed it falls
back to the fit's own OLS t-interval (n - 2 dof), labelled so; without ``seeds`` it is a
percentile bootstrap (``scipy.stats.bootstrap``) over points (or whole ``groups``), which
undercovers at a few points (about 87% for a nominal 95% at 3 sizes x 3 points).
The fitted-curve bands of ``predict_interval`` are always the percentile bootstrap.
Resamples whose points all share one x value cannot be fitted and are skipped.

Points with ``x <= 0`` or ``y - offset <= 0`` have no logarithm: ``fit_power_law`` rejects
them with a ``ValueError`` naming how many there are (it never drops data silently);
``fit_groups`` records that message in the group's ``note`` instead of raising. Nulls in a
frame (e.g. failed trials) are dropped by the frame-level functions before fitting.

scipy is imported inside the functions that use it, so importing the package (and the
``sweep`` CLI) stays fast.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl

__all__ = [
    "ExponentComparison",
    "PowerLawFit",
    "between_seed_halfwidth",
    "fit_power_law",
    "n_label",
    "seed_exponents",
    "t_critical",
]

SeedLike = int | np.random.Generator | np.random.SeedSequence | None
_EMPTY = np.empty(0)


def n_label(n: int, n_x: int, n_seeds: int | None) -> str:
    """A fit's n in words: ``"9 (3 sizes × 3 seeds)"``, or ``"4 (2 sizes, up to 3 seeds a
    size)"`` when not every size has every seed (one width's best lr seeded, another's not yet)."""
    if n_seeds is None:
        return f"{n} ({n_x} sizes)"
    if n == n_x * n_seeds:
        return f"{n} ({n_x} sizes × {n_seeds} seed{'s' if n_seeds != 1 else ''})"
    return f"{n} ({n_x} sizes, up to {n_seeds} seeds a size)"


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
    seed_labels: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    """The seed of each of ``seed_exponents`` (same order): what pairs lines by seed."""

    @property
    def n_label(self) -> str:
        """``"9 (3 sizes × 3 seeds)"``: every quoted slope shows its n."""
        return n_label(self.n, self.n_x, self.n_seeds)

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
    exponents; ``difference`` is then the difference of their means (the pooled slopes'
    difference when every seed has the same sizes). Otherwise the two fits are bootstrapped
    independently (they are independent trials);
    ``p_value = min(1, 2 * min(P*(d <= 0), P*(d >= 0)))`` over the bootstrap differences d,
    each proportion computed as (count + 1) / (resamples + 1), so p < 1 - confidence exactly
    when 0 lies outside the CI, and p is never below 2 / (resamples + 1). The bootstrap needs
    ``fits.MIN_BOOTSTRAP_UNITS`` points (or groups) a side: with fewer (e.g. one seed at three
    sizes) there is no test, ``p_value`` and ``difference_ci`` are NaN and ``method`` says
    why (``"no p-value: ..."``)."""

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
    """``Welch t over seeds (df ...)``, ``bootstrap over points (n_a; n_b)`` / ``... groups``,
    or ``no p-value: <why>``."""

    def __str__(self) -> str:
        lo, hi = self.difference_ci
        head = f"exponent({self.b}) - exponent({self.a}) = {self.difference:+.3f}"
        if math.isnan(self.p_value):
            return f"{head} ({self.method})"
        return f"{head} [{lo:+.3f}, {hi:+.3f}] ({self.confidence:.0%} CI), p = {self.p_value:.3g} ({self.method})"


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
    xa, ya, n_x = _fit_points(x, y, offset, confidence)
    n = xa.size
    lx, ly = np.log(xa), np.log(ya - offset)
    a, b, r2, se, ci_t = _log_log_ols(lx, ly, confidence)

    n_groups, units = None, np.arange(n)
    if groups is not None:
        units = _label_index(groups, n, "groups")
        n_groups = int(units.max()) + 1
    boot_b, boot_a = _bootstrap(lx, ly, units, n_boot, seed)
    ok = np.isfinite(boot_b)
    q = [(1 - confidence) / 2, (1 + confidence) / 2]
    if ok.any():
        b_ci = tuple(float(v) for v in np.quantile(boot_b[ok], q))
        a_ci = tuple(float(math.exp(v)) for v in np.quantile(boot_a[ok], q))
    else:
        b_ci = a_ci = (math.nan, math.nan)
    interval = "bootstrap over groups" if n_groups is not None else "bootstrap over points"

    n_seeds, seed_b, seed_labels = None, _EMPTY, ()
    if seeds is not None:
        idx = _label_index(seeds, n, "seeds")
        names = np.unique(np.asarray(seeds))
        n_seeds = int(idx.max()) + 1
        seed_b = seed_exponents(lx, ly, idx)
        seed_labels = tuple(v.item() if hasattr(v, "item") else v for v in names[np.isfinite(seed_b)])
        seed_b = seed_b[np.isfinite(seed_b)]
        if seed_b.size >= 2:
            b_ci, interval = _seed_interval(seed_b, confidence), f"between-seed t ({seed_b.size} seeds)"
        else:
            b_ci, interval = ci_t, "OLS t (one seed)"
    return PowerLawFit(
        coefficient=math.exp(a), exponent=b, exponent_ci=b_ci, coefficient_ci=a_ci,  # type: ignore[arg-type]
        r2=r2, n=n, offset=float(offset), confidence=confidence, n_boot=int(ok.sum()), n_x=int(n_x),
        n_groups=n_groups, x_range=(float(xa.min()), float(xa.max())), exponent_se=se, exponent_ci_t=ci_t,
        boot_exponent=boot_b, boot_log_coefficient=boot_a, interval=interval, n_seeds=n_seeds,
        seed_exponents=seed_b, seed_labels=seed_labels,
    )


def _fit_points(x: Any, y: Any, offset: float, confidence: float) -> tuple[np.ndarray, np.ndarray, int]:
    """(x, y, distinct x values) as float vectors, or ValueError naming what no power law can fit."""
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
    return xa, ya, n_x


def _log_log_ols(lx: np.ndarray, ly: np.ndarray, confidence: float) -> tuple[float, float, float, float, tuple]:
    """(intercept, slope, r2, slope's standard error, its OLS t-interval) of ly on lx; the last two
    NaN with two points."""
    from scipy import stats

    line = stats.linregress(lx, ly)
    b, a = float(line.slope), float(line.intercept)
    resid = ly - (a + b * lx)
    ss_res, ss_tot = float(resid @ resid), float(((ly - ly.mean()) ** 2).sum())
    tiny = 1e-24 * max(1.0, float(ly @ ly))  # below this, y is constant up to rounding
    if ss_tot > tiny:
        r2 = float(line.rvalue) ** 2
    else:
        r2 = 1.0 if ss_res <= tiny else math.nan
    if lx.size > 2:
        se = float(line.stderr)
        return a, b, r2, se, _t_interval(b, se, lx.size - 2, confidence)
    return a, b, r2, math.nan, (math.nan, math.nan)


def _label_index(labels: Any, n: int, name: str) -> np.ndarray:
    """Each point's label as an index 0..k-1; ValueError unless there is one label per point."""
    values = np.asarray(labels)
    if values.shape != (n,):
        raise ValueError(f"{name} must hold one label per point ({n}), got {values.shape}")
    return np.unique(values, return_inverse=True)[1]


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


@lru_cache(maxsize=4096)
def t_critical(df: float, confidence: float = 0.95) -> float:
    """The two-sided critical value of Student's t: P(|T| <= t) = confidence. NaN for df < 1."""
    if not df >= 1 or not 0.0 < confidence < 1.0:
        return math.nan
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, df))


def between_seed_halfwidth(b_seeds: np.ndarray, confidence: float = 0.95) -> np.ndarray:
    """Half-width t(k-1) * sd / sqrt(k) of the t-interval over the last axis (k seeds)."""
    k = b_seeds.shape[-1]
    return t_critical(float(k - 1), confidence) * b_seeds.std(axis=-1, ddof=1) / math.sqrt(k)


def _vector(v: Any, name: str) -> np.ndarray:
    if isinstance(v, pl.Series):
        v = v.cast(pl.Float64).to_numpy()
    arr = np.asarray(v, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _t_interval(centre: float, se: float, df: int, confidence: float) -> tuple[float, float]:
    half = t_critical(float(df), confidence) * se
    return centre - half, centre + half


def _seed_interval(seed_b: np.ndarray, confidence: float) -> tuple[float, float]:
    """The t-interval over per-seed slopes, centred on their mean (not the pooled slope)."""
    centre, half = float(seed_b.mean()), float(between_seed_halfwidth(seed_b, confidence))
    return centre - half, centre + half


def _bootstrap(lx: np.ndarray, ly: np.ndarray, units: np.ndarray, n_boot: int, seed: SeedLike):
    """``n_boot`` bootstrap (slope, intercept) pairs resampling whole ``units`` (one label
    0..m-1 per point: the points themselves, or groups) by ``scipy.stats.bootstrap``; NaN
    where a resample's points share one x value. Empty arrays when there is nothing to draw."""
    m = int(units.max()) + 1
    if n_boot <= 0 or m < 2:
        return _EMPTY, _EMPTY
    from scipy import stats

    def statistic(drawn: np.ndarray, axis: int = -1) -> np.ndarray:
        drawn = np.moveaxis(drawn, axis, -1)
        rows = drawn.reshape(-1, m)
        offsets = (np.arange(rows.shape[0]) * m)[:, None]
        counts = np.bincount((rows + offsets).ravel(), minlength=rows.size).reshape(rows.shape)
        b, a = _ols(lx, ly, counts[:, units].astype(float))
        return np.stack([b, a]).reshape(2, *drawn.shape[:-1])

    # scipy >= 1.15 names the generator ``rng``; ``random_state`` before (and deprecated after)
    name = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    generator = {name: np.random.default_rng(seed)}
    with warnings.catch_warnings():  # degenerate (NaN) resamples are expected and skipped
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap(
            (np.arange(m),), statistic, n_resamples=n_boot, vectorized=True, method="percentile", **generator,
        )  # fmt: skip
    return res.bootstrap_distribution[0], res.bootstrap_distribution[1]


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
