"""The sharing study's slope against group size k (k consecutive blocks share one basis), fitted
per seed with the seeds as replicates, and a test of whether the mean response is linear in k.

``group_size_slope``: per seed, the least-squares slope of the value (e.g. the excess kurtosis
over the null, one value per trial) on k; the slope is their mean, its interval a t over the
seeds' slopes (not pooled OLS over trials, which takes every trial as a replicate and assumes one
spread at every k). Linearity: a lack-of-fit F-test of value ~ seed + k against value ~ seed +
k-as-a-factor; with one trial per (seed, k) its error term is the seed x k interaction, i.e. how
the seeds' k-patterns differ, so the seeds are again the replicates. A non-significant test is
no evidence of linearity: the words (``linearity``) never say "linear in k".
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

__all__ = [
    "GroupSizeSlope", "SlopeDifference", "compare_group_size_slopes", "group_size_slope", "group_size_slopes",
]  # fmt: skip


@dataclass(frozen=True)
class GroupSizeSlope:
    """slope = mean over seeds of b_s, b_s the OLS slope of value on k within seed s;
    slope_ci = slope ± t(S-1) sd(b) / sqrt(S); p_value: one-sample t of b against 0.
    Lack of fit: F = ((RSS_lin - RSS_fac) / (K - 2)) / (RSS_fac / (n - S - K + 1)), RSS_lin of
    value ~ seed + k and RSS_fac of value ~ seed + factor(k) (K distinct k, S seeds, n trials)."""

    slope: float
    slope_ci: tuple[float, float]
    p_value: float
    n_seeds: int
    n: int
    group_sizes: tuple[Any, ...]
    seed_slopes: Mapping[Hashable, float] = field(default_factory=dict)
    lack_of_fit_f: float = math.nan
    lack_of_fit_df: tuple[int, int] = (0, 0)
    lack_of_fit_p: float = math.nan
    confidence: float = 0.95

    @property
    def linearity(self) -> str:
        """What the lack-of-fit test says, in words that never claim linearity from a failure
        to reject it."""
        if len(self.group_sizes) < 3:
            return f"linearity in k not tested ({len(self.group_sizes)} group sizes: a line fits any two)"
        if math.isnan(self.lack_of_fit_p):
            return "linearity in k not tested (no residual degrees of freedom)"
        d1, d2 = self.lack_of_fit_df
        test = f"lack-of-fit F({d1}, {d2}) = {self.lack_of_fit_f:.2f}, p = {self.lack_of_fit_p:.2g}"
        if self.lack_of_fit_p <= 1 - self.confidence:
            return f"departs from a line in k ({test}): the slope is an average over k = {self._ks}, not a rate"
        return f"no departure from a line in k detected ({test}; not a demonstration of linearity)"

    @property
    def _ks(self) -> str:
        return ", ".join(f"{k:g}" if isinstance(k, float) else str(k) for k in self.group_sizes)

    def __str__(self) -> str:
        lo, hi = self.slope_ci
        ci = f"[{lo:+.3f}, {hi:+.3f}]" if not math.isnan(lo) else "(no interval: one seed)"
        return (f"slope {self.slope:+.3f} {ci} per unit k ({self.n_seeds} seeds' slopes, {self.confidence:.0%} t); "
                f"{self.linearity}")  # fmt: skip


@dataclass(frozen=True)
class SlopeDifference:
    """b minus a, paired by seed: mean over the shared seeds of (b_s - a_s), its t(S-1)
    interval and two-sided p."""

    difference: float
    difference_ci: tuple[float, float]
    p_value: float
    n_seeds: int
    method: str


def group_size_slope(k: Any, value: Any, seeds: Any, confidence: float = 0.95) -> GroupSizeSlope:
    """Fit one ``GroupSizeSlope`` from one value per trial with its group size ``k`` and
    ``seeds``. Seeds spanning fewer than two k are left out of the slope (they still enter the
    lack-of-fit test). Raises ValueError with fewer than two distinct k."""
    from scipy import stats

    k, y, s = np.asarray(k, dtype=float), np.asarray(value, dtype=float), np.asarray(seeds)
    ok = np.isfinite(k) & np.isfinite(y)
    k, y, s = k[ok], y[ok], s[ok]
    levels = np.unique(k)
    if levels.size < 2:
        raise ValueError(f"{levels.size} group size(s): a slope needs two")
    slopes: dict[Hashable, float] = {}
    for seed in sorted(set(s.tolist()), key=str):
        mine = s == seed
        if np.unique(k[mine]).size >= 2:
            slopes[seed] = float(np.polyfit(k[mine], y[mine], 1)[0])
    b = np.array(list(slopes.values()))
    mean = float(b.mean()) if b.size else math.nan
    ci, p = (math.nan, math.nan), math.nan
    if b.size >= 2:
        sem = float(b.std(ddof=1)) / math.sqrt(b.size)
        half = float(stats.t.ppf((1 + confidence) / 2, b.size - 1)) * sem
        ci = (mean - half, mean + half)
        p = float(2 * stats.t.sf(abs(mean) / sem, b.size - 1)) if sem > 0 else (0.0 if mean else 1.0)
    f, dfs, p_lof = _lack_of_fit(k, y, s)
    return GroupSizeSlope(
        slope=mean, slope_ci=ci, p_value=p, n_seeds=int(b.size), n=int(y.size),
        group_sizes=tuple(int(v) if float(v).is_integer() else float(v) for v in levels),
        seed_slopes=slopes, lack_of_fit_f=f, lack_of_fit_df=dfs, lack_of_fit_p=p_lof, confidence=confidence,
    )  # fmt: skip


def group_size_slopes(
    frame: pl.DataFrame, k: str, value: str, seed: str = "seed", by: Sequence[str] = (), confidence: float = 0.95
) -> dict[tuple[Hashable, ...], GroupSizeSlope | str]:
    """``group_size_slope`` per group of ``by``: ``{key: GroupSizeSlope}``, or why a group has
    no slope (a string)."""
    parts = frame.partition_by(list(by), as_dict=True, maintain_order=True) if by else {(): frame}
    out: dict[tuple[Hashable, ...], GroupSizeSlope | str] = {}
    for key, part in parts.items():
        try:
            out[key] = group_size_slope(part.get_column(k).to_numpy(), part.get_column(value).to_numpy(),
                                        part.get_column(seed).to_numpy(), confidence)  # fmt: skip
        except ValueError as err:
            out[key] = str(err)
    return out


def compare_group_size_slopes(a: GroupSizeSlope, b: GroupSizeSlope, confidence: float = 0.95) -> SlopeDifference:
    """b's slope minus a's, paired by the seeds both have (the same seed trains both plans from
    the same init and data order): a one-sample t over the per-seed differences."""
    from scipy import stats

    shared = [s for s in a.seed_slopes if s in b.seed_slopes]
    d = np.array([b.seed_slopes[s] - a.seed_slopes[s] for s in shared])
    if d.size < 2:
        mean = float(d.mean()) if d.size else math.nan
        return SlopeDifference(mean, (math.nan, math.nan), math.nan, int(d.size),
                               f"no interval: {d.size} shared seed(s) with a slope on both sides")  # fmt: skip
    mean, sem = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(d.size)
    if sem == 0:
        return SlopeDifference(mean, (mean, mean), 0.0 if mean else 1.0, int(d.size), "no spread over seeds")
    half = float(stats.t.ppf((1 + confidence) / 2, d.size - 1)) * sem
    p = float(2 * stats.t.sf(abs(mean) / sem, d.size - 1))
    return SlopeDifference(mean, (mean - half, mean + half), p, int(d.size),
                           f"paired t over {d.size} seeds (df {d.size - 1})")  # fmt: skip


def _lack_of_fit(k: np.ndarray, y: np.ndarray, s: np.ndarray) -> tuple[float, tuple[int, int], float]:
    """(F, (df1, df2), p) of value ~ seed + k against value ~ seed + factor(k); NaN where
    there are fewer than three k or no residual degrees of freedom."""
    from scipy import stats

    levels = np.unique(k)
    if levels.size < 3:
        return math.nan, (0, 0), math.nan
    seed_idx = np.unique(s.astype(str), return_inverse=True)[1]
    seed_cols = (seed_idx[:, None] == np.arange(seed_idx.max() + 1)[None, :]).astype(float)
    linear = np.column_stack([seed_cols, k])
    factor = np.column_stack([seed_cols, (k[:, None] == levels[None, 1:]).astype(float)])
    rss_lin, rank_lin = _rss(linear, y)
    rss_fac, rank_fac = _rss(factor, y)
    df1, df2 = rank_fac - rank_lin, y.size - rank_fac
    if df1 <= 0 or df2 <= 0:
        return math.nan, (df1, df2), math.nan
    if rss_fac <= 1e-300:
        return math.inf, (df1, df2), 0.0 if rss_lin > 1e-300 else math.nan
    f = ((rss_lin - rss_fac) / df1) / (rss_fac / df2)
    return float(f), (int(df1), int(df2)), float(stats.f.sf(f, df1, df2))


def _rss(design: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    r = y - design @ coef
    return float(r @ r), int(rank)
