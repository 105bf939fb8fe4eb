"""analysis.group_size: the sharing study's slope against k per seed, and its linearity test."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy import stats

from analysis.group_size import compare_group_size_slopes, group_size_slope, group_size_slopes

K = np.array([1, 2, 3, 6])


def _trials(rng: np.random.Generator, seeds: int = 3, slope: float = 0.14, seed_sd: float = 0.05,
            noise: float = 0.02, curve=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """One value per (seed, k): each seed's own slope (slope + N(0, seed_sd)) times k, or
    ``curve(k)``, plus noise."""
    k, y, s = [], [], []
    for seed in range(seeds):
        b = slope + rng.normal(0, seed_sd)
        for kk in K:
            k.append(kk)
            y.append((curve(kk) if curve else b * kk) + rng.normal(0, noise))
            s.append(seed)
    return np.array(k), np.array(y), np.array(s)


def test_the_slope_is_the_mean_of_the_seeds_slopes_with_a_t_over_seeds() -> None:
    k, y, s = _trials(np.random.default_rng(1))
    g = group_size_slope(k, y, s)
    by_seed = np.array([np.polyfit(k[s == i], y[s == i], 1)[0] for i in range(3)])
    half = stats.t.ppf(0.975, 2) * by_seed.std(ddof=1) / np.sqrt(3)
    assert g.slope == pytest.approx(by_seed.mean(), rel=1e-12)
    assert g.slope_ci == pytest.approx((by_seed.mean() - half, by_seed.mean() + half), rel=1e-9)
    assert g.p_value == pytest.approx(stats.ttest_1samp(by_seed, 0).pvalue, rel=1e-9)
    assert (g.n_seeds, g.n, g.group_sizes) == (3, 12, (1, 2, 3, 6))
    assert list(g.seed_slopes) == [0, 1, 2]


def test_the_interval_covers_where_pooled_ols_does_not() -> None:
    """Seeds whose slopes differ (sd 0.05 around 0.14) and small trial noise, 3 seeds x 4 k, 400
    studies: the t over the seeds' slopes covers the mean slope 92-98% of the time; pooled OLS
    over the 12 trials (each trial a replicate) covers about 80%."""
    rng = np.random.default_rng(20261203)
    ours = pooled = 0
    for _ in range(400):
        k, y, s = _trials(rng)
        g = group_size_slope(k, y, s)
        ours += g.slope_ci[0] <= 0.14 <= g.slope_ci[1]
        fit = stats.linregress(k, y)
        half = stats.t.ppf(0.975, k.size - 2) * fit.stderr
        pooled += fit.slope - half <= 0.14 <= fit.slope + half
    assert 0.92 <= ours / 400 <= 0.98, ours
    assert pooled / 400 < 0.85, pooled


def test_lack_of_fit_is_the_seed_blocked_f_test() -> None:
    """The F-test of value ~ seed + k against value ~ seed + C(k), as statsmodels' anova_lm
    computes it."""
    import pandas as pd
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    k, y, s = _trials(np.random.default_rng(2), curve=lambda kk: 0.5 * math.sqrt(kk), noise=0.05)
    g = group_size_slope(k, y, s)
    df = pd.DataFrame({"k": k, "y": y, "seed": s})
    linear = smf.ols("y ~ C(seed) + k", df).fit()
    factor = smf.ols("y ~ C(seed) + C(k)", df).fit()
    table = anova_lm(linear, factor)
    assert g.lack_of_fit_df == (2, 6)
    assert g.lack_of_fit_f == pytest.approx(table["F"][1], rel=1e-9)
    assert g.lack_of_fit_p == pytest.approx(table["Pr(>F)"][1], rel=1e-9)


def test_linear_in_k_is_never_said_from_a_failure_to_reject() -> None:
    rng = np.random.default_rng(3)
    curved = group_size_slope(*_trials(rng, curve=lambda kk: 0.5 * math.sqrt(kk), noise=0.01))
    assert curved.lack_of_fit_p < 0.01 and curved.linearity.startswith("departs from a line in k")
    straight = group_size_slope(*_trials(rng))
    assert straight.lack_of_fit_p > 0.05
    assert straight.linearity.startswith("no departure from a line in k detected")
    assert "not a demonstration of linearity" in straight.linearity
    k, y, s = _trials(rng)
    two = group_size_slope(k[k <= 2], y[k <= 2], s[k <= 2])
    assert two.linearity.startswith("linearity in k not tested (2 group sizes")
    for g in (curved, straight, two):
        assert "linear in k" not in g.linearity.replace("linearity in k", "")


def test_a_paired_difference_of_slopes() -> None:
    """Ends rotated against ends unrotated: b - a paired by seed is scipy's paired t."""
    rng = np.random.default_rng(4)
    a = group_size_slope(*_trials(rng, slope=0.14))
    b = group_size_slope(*_trials(rng, slope=0.25))
    d = compare_group_size_slopes(a, b)
    sa, sb = np.array(list(a.seed_slopes.values())), np.array(list(b.seed_slopes.values()))
    test = stats.ttest_rel(sb, sa)
    assert d.difference == pytest.approx((sb - sa).mean(), rel=1e-12)
    assert d.p_value == pytest.approx(test.pvalue, rel=1e-9)
    ci = test.confidence_interval(0.95)
    assert d.difference_ci == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert d.method == "paired t over 3 seeds (df 2)"


def test_slopes_per_group_of_a_frame() -> None:
    rng = np.random.default_rng(5)
    frames = []
    for ends in ("ends rotated", "ends unrotated"):
        k, y, s = _trials(rng)
        frames.append(pl.DataFrame({"k": k, "excess": y, "seed": s, "ends": ends}))
    frames.append(pl.DataFrame({"k": [1, 1], "excess": [0.1, 0.2], "seed": [0, 1], "ends": "one k"}))
    out = group_size_slopes(pl.concat(frames), "k", "excess", by=["ends"])
    assert set(out) == {("ends rotated",), ("ends unrotated",), ("one k",)}
    assert out[("one k",)] == "1 group size(s): a slope needs two"
    assert 0.05 < out[("ends rotated",)].slope < 0.25
