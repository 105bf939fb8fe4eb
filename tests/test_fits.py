"""analysis.fits: power-law recovery, bootstrap CIs, grouped fits, slope comparisons."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from analysis_fixtures import EXPONENT, store  # noqa: F401  (fixture)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from analysis import queries
from analysis.fits import (
    PowerLawFit,
    compare_exponents,
    fit_curves,
    fit_each,
    fit_groups,
    fit_power_law,
)
from analysis.fits import _welch
from analysis.load import load
from analysis.power_law import t_critical

SIZES = np.repeat([1e5, 1e6, 1e7], 3)  # 3 sizes x 3 seeds


def _noisy(rng: np.random.Generator, b: float, a: float = 0.02, noise: float = 0.1, offset: float = 3.0) -> np.ndarray:
    return offset + a * SIZES**b * np.exp(noise * rng.standard_normal(SIZES.size))


# ---------------------------------------------------------------- exactness (property tests)


@settings(max_examples=40, deadline=None)
@given(
    coefficient=st.floats(1e-3, 1e3),
    exponent=st.floats(-2.0, 2.0),
    offset=st.sampled_from([0.0, 3.0, -1.0]),
    xs=st.lists(st.floats(1.0, 1e9), min_size=2, max_size=12, unique=True).filter(
        lambda v: max(v) / min(v) > 1.5
    ),
)
def test_noise_free_power_law_is_recovered_exactly(coefficient, exponent, offset, xs) -> None:
    x = np.array(xs)
    power = coefficient * x**exponent
    # y - offset must survive rounding: no catastrophic cancellation against the offset
    assume(power.min() > 1e-5 * abs(offset))
    y = offset + power
    fit = fit_power_law(x, y, offset=offset, n_boot=50, seed=0)
    assert fit.exponent == pytest.approx(exponent, abs=1e-7)
    assert fit.coefficient == pytest.approx(coefficient, rel=1e-6)
    if abs(exponent) > 1e-3:  # a flat line has no variance to explain: r2 is rounding noise
        assert fit.r2 == pytest.approx(1.0, abs=1e-9)
    # every usable resample is the same exact line, so the CI collapses onto the estimate
    lo, hi = fit.exponent_ci
    assert lo == pytest.approx(exponent, abs=1e-6) and hi == pytest.approx(exponent, abs=1e-6)
    assert np.allclose(fit.predict(x), y, rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(1e-3, 1e3), exponent=st.floats(-1.5, 1.5), seed=st.integers(0, 2**16))
def test_rescaling_x_keeps_the_exponent(scale, exponent, seed) -> None:
    rng = np.random.default_rng(seed)
    y = 2.0 * SIZES**exponent * np.exp(0.05 * rng.standard_normal(SIZES.size))
    a = fit_power_law(SIZES, y, n_boot=0)
    b = fit_power_law(SIZES * scale, y, n_boot=0)
    assert b.exponent == pytest.approx(a.exponent, abs=1e-8)
    assert b.coefficient == pytest.approx(a.coefficient * scale**-a.exponent, rel=1e-6)


# ---------------------------------------------------------------- noisy recovery and CIs


def test_recovers_known_exponent_with_a_covering_narrow_ci() -> None:
    rng = np.random.default_rng(7)
    fit = fit_power_law(SIZES, _noisy(rng, 0.5), offset=3.0, n_boot=1000, seed=0)
    lo, hi = fit.exponent_ci
    assert lo < 0.5 < hi
    assert hi - lo < 0.15  # the sizes span two decades: the slope is well pinned
    assert fit.exponent == pytest.approx(0.5, abs=0.05)
    assert fit.coefficient_ci[0] < 0.02 < fit.coefficient_ci[1]
    assert fit.n == 9 and fit.n_x == 3 and fit.offset == 3.0 and fit.n_boot == 1000
    assert fit.exponent_ci_t[0] < 0.5 < fit.exponent_ci_t[1]
    assert "x^0.5" in str(fit) or "x^0.4" in str(fit)


def test_bootstrap_coverage_over_many_datasets() -> None:
    """The percentile bootstrap is close to nominal (it undercovers a little at n = 9, as
    documented); the classical t interval is about nominal."""
    boot = t_int = 0
    trials = 60
    for i in range(trials):
        y = _noisy(np.random.default_rng(1000 + i), 0.5)
        fit = fit_power_law(SIZES, y, offset=3.0, n_boot=300, seed=i)
        boot += fit.exponent_ci[0] <= 0.5 <= fit.exponent_ci[1]
        t_int += fit.exponent_ci_t[0] <= 0.5 <= fit.exponent_ci_t[1]
    assert boot / trials >= 0.75
    assert t_int / trials >= 0.85


def test_group_resampling() -> None:
    rng = np.random.default_rng(3)
    y = _noisy(rng, 0.5)
    seeds = np.tile([0, 1, 2], 3)
    by_seed = fit_power_law(SIZES, y, offset=3.0, groups=seeds, n_boot=500)
    assert by_seed.n_groups == 3
    assert by_seed.exponent == fit_power_law(SIZES, y, offset=3.0, n_boot=0).exponent
    # resampling whole sizes: resamples that draw a single size cannot be fitted and are skipped
    by_size = fit_power_law(SIZES, y, offset=3.0, groups=SIZES, n_boot=500)
    assert by_size.n_groups == 3
    assert 300 < by_size.n_boot < 500
    with pytest.raises(ValueError, match="one label per point"):
        fit_power_law(SIZES, y, groups=[1, 2])


def test_seeded_bootstrap_is_reproducible() -> None:
    y = _noisy(np.random.default_rng(0), 0.3)
    a = fit_power_law(SIZES, y, offset=3, seed=5, n_boot=200)
    b = fit_power_law(SIZES, y, offset=3, seed=5, n_boot=200)
    assert a == b
    assert a.exponent_ci != fit_power_law(SIZES, y, offset=3, seed=6, n_boot=200).exponent_ci


def test_negative_exponent_loss_like_fit() -> None:
    y = 10.0 * SIZES**-0.1 * np.exp(0.01 * np.random.default_rng(2).standard_normal(9))
    fit = fit_power_law(SIZES, y, n_boot=300)
    assert fit.exponent_ci[0] < -0.1 < fit.exponent_ci[1]
    lo, hi = fit.predict_interval([1e5, 1e7])
    mid = fit.predict([1e5, 1e7])
    assert np.all(lo <= mid) and np.all(mid <= hi)


# ---------------------------------------------------------------- rejections


def test_non_positive_points_are_rejected_with_a_count() -> None:
    y = np.full(9, 3.5)
    y[[0, 4]] = 2.9  # y - 3 <= 0 for two points
    with pytest.raises(ValueError, match=r"2 of 9 points have y - 3 <= 0"):
        fit_power_law(SIZES, y, offset=3.0)
    x = SIZES.copy()
    x[0] = 0.0
    with pytest.raises(ValueError, match=r"1 of 9 points have x <= 0"):
        fit_power_law(x, np.full(9, 2.0))
    with pytest.raises(ValueError, match="not finite"):
        fit_power_law(SIZES, np.r_[np.nan, np.ones(8)])


def test_single_size_cannot_be_fitted() -> None:
    with pytest.raises(ValueError, match="at least 2 distinct x"):
        fit_power_law([5.0, 5.0, 5.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="differ in length"):
        fit_power_law([1.0, 2.0], [1.0])


# ---------------------------------------------------------------- frames


def test_fit_groups_on_the_synthetic_store(store) -> None:  # noqa: F811
    per = queries.per_trial(load(store.path), "kurtosis", control=queries.CONTROL).collect()
    table = fit_groups(per, "params_non_embedding", "value", ["optimizer"], n_boot=500)
    assert table.get_column("optimizer").to_list() == ["adam", "sgd"]
    adam = table.row(0, named=True)
    assert adam["exponent_low"] < EXPONENT < adam["exponent_high"]
    assert adam["exponent_high"] - adam["exponent_low"] < 0.2
    assert adam["n"] == 9 and adam["n_x"] == 3 and adam["note"] is None
    sgd = table.row(1, named=True)
    assert sgd["exponent"] is None
    assert "points have y <= 0" in sgd["note"]  # no excess over the control to fit
    # raw kurtosis: sgd has an exponent, and it is small
    raw_per = queries.per_trial(load(store.path), "kurtosis").collect()
    raw = fit_groups(raw_per, "params_non_embedding", "value", ["optimizer"], n_boot=200)
    assert abs(raw.filter(pl.col("optimizer") == "sgd").get_column("exponent").item()) < 0.05
    # resampling whole seeds, and the between-seed interval
    by_seed = fit_groups(per, "params_non_embedding", "value", ["optimizer"], groups="seed", seeds="seed", n_boot=200)
    first = by_seed.row(0, named=True)
    assert first["exponent"] == pytest.approx(adam["exponent"])
    assert first["interval"] == "between-seed t (3 seeds)" and first["n_seeds"] == 3
    assert first["exponent_low"] < EXPONENT < first["exponent_high"]


def test_fit_groups_notes_single_size_groups_and_drops_nulls() -> None:
    df = pl.DataFrame(
        {
            "opt": ["a"] * 9 + ["b"] * 3 + ["a"],
            "x": [*SIZES, 10.0, 10.0, 10.0, None],
            "y": [*(2 * SIZES**0.5), 1.0, 2.0, 3.0, 5.0],
        }
    )
    table = fit_groups(df, "x", "y", ["opt"], n_boot=50)
    a, b = table.rows(named=True)
    assert a["exponent"] == pytest.approx(0.5) and a["n"] == 9  # the null-x row is dropped
    assert b["exponent"] is None and "at least 2 distinct x" in b["note"]
    assert set(table.columns) >= {"exponent_low", "exponent_high", "coefficient", "r2", "note"}
    assert fit_groups(df.filter(pl.col("opt") == "zz"), "x", "y", ["opt"]).height == 0
    with pytest.raises(ValueError, match="not in the frame"):
        fit_groups(df, "x", "nope", ["opt"])
    whole = fit_groups(df.filter(pl.col("opt") == "a").lazy(), "x", "y", n_boot=10)
    assert whole.height == 1


def test_fit_curves_band_brackets_the_fit() -> None:
    rng = np.random.default_rng(1)
    df = pl.DataFrame({"o": ["a"] * 9, "params": SIZES, "y": _noisy(rng, 0.4)})
    fits = fit_each(df, "params", "y", ["o"], offset=3.0, n_boot=200)
    assert isinstance(fits[("a",)], PowerLawFit)
    curves = fit_curves(fits, ["o"], x="params", n_points=20)
    assert curves.columns == ["o", "params", "fit", "fit_low", "fit_high"]
    assert curves.height == 20
    assert curves.get_column("params").min() == pytest.approx(1e5)
    assert (curves["fit_low"] <= curves["fit"] + 1e-12).all()
    assert (curves["fit"] <= curves["fit_high"] + 1e-12).all()
    assert fit_curves({("b",): "not fitted"}, ["o"]).height == 0


# ---------------------------------------------------------------- comparisons


def _two(rng: np.random.Generator, ba: float, bb: float) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "x": np.r_[SIZES, SIZES],
            "y": np.r_[_noisy(rng, ba, a=0.05), _noisy(rng, bb, a=0.02)],
            "optimizer": ["sgd"] * 9 + ["adam"] * 9,
        }
    )


def test_comparison_detects_a_real_slope_difference() -> None:
    df = _two(np.random.default_rng(11), 0.2, 0.5)
    c = compare_exponents(df, "x", "y", "optimizer", "sgd", "adam", offset=3.0, n_boot=1000)
    assert c.a == "sgd" and c.b == "adam"
    assert c.difference == pytest.approx(0.3, abs=0.08)
    assert c.difference_ci[0] > 0
    assert c.p_value < 0.01
    assert c.difference == pytest.approx(c.fit_b.exponent - c.fit_a.exponent)
    assert "p =" in str(c)


def test_comparison_rarely_flags_equal_slopes() -> None:
    flagged = 0
    for i in range(20):
        df = _two(np.random.default_rng(200 + i), 0.5, 0.5)
        c = compare_exponents(df, "x", "y", "optimizer", "sgd", "adam", offset=3.0, n_boot=300, seed=i)
        flagged += c.p_value < 0.05
        assert 0 < c.p_value <= 1
    assert flagged <= 3  # ~5% expected; the bootstrap runs a little liberal at n = 9


def test_comparison_p_value_agrees_with_ci() -> None:
    df = _two(np.random.default_rng(5), 0.45, 0.5)
    c = compare_exponents(df, "x", "y", "optimizer", "sgd", "adam", offset=3.0, n_boot=500)
    outside = not (c.difference_ci[0] <= 0 <= c.difference_ci[1])
    assert outside == (c.p_value < 0.05)


def test_comparison_errors_name_the_group() -> None:
    df = _two(np.random.default_rng(0), 0.5, 0.5)
    with pytest.raises(ValueError, match="no rows with optimizer == 'lion'"):
        compare_exponents(df, "x", "y", "optimizer", "lion", "adam")
    with pytest.raises(ValueError, match="optimizer == 'sgd'.*y - 100 <= 0"):
        compare_exponents(df, "x", "y", "optimizer", "sgd", "adam", offset=100.0)
    assert math.isfinite(compare_exponents(df, "x", "y", "optimizer", "sgd", "adam", n_boot=50).p_value)


# ---------------------------------------------------------------- seed-based intervals


def _simulate(n_sizes: int, n_seeds: int, reps: int, rng: np.random.Generator, b: float = 0.5):
    """Power-law data with realistic noise: y = 3 + 0.02 x^b * exp(seed effect + trial noise),
    heavy-ish (t, 6 dof) per-trial noise of 0.1 and a per-seed offset of 0.05 shared across
    sizes (same data order / init stream). Returns x (n,), seed labels (n,), y (reps, n)."""
    x = np.repeat(np.geomspace(1e5, 1e7, n_sizes), n_seeds)
    seeds = np.tile(np.arange(n_seeds), n_sizes)
    seed_effect = 0.05 * rng.standard_normal((reps, n_seeds))[:, seeds]
    noise = 0.1 * rng.standard_t(6, size=(reps, x.size)) / math.sqrt(6 / 4)
    return x, seeds, 3.0 + 0.02 * x**b * np.exp(seed_effect + noise)


@pytest.mark.parametrize("n_sizes", [3, 5])
def test_between_seed_interval_covers_at_its_nominal_rate(n_sizes: int) -> None:
    """4000 simulated sweeps (vectorised) at n_sizes x 3 seeds: the 95% between-seed
    interval covers the true exponent 90-98% of the time (binomial sd ~0.35% at 4000)."""
    from analysis.power_law import between_seed_halfwidth, seed_exponents

    rng = np.random.default_rng(20261201 + n_sizes)
    x, seeds, y = _simulate(n_sizes, 3, 4000, rng)
    lx, ly = np.log(x), np.log(y - 3.0)
    per_seed = seed_exponents(lx, ly, seeds)  # (reps, 3)
    dx = lx - lx.mean()
    pooled = (ly - ly.mean(axis=1, keepdims=True)) @ dx / (dx @ dx)
    half = between_seed_halfwidth(per_seed, 0.95)
    centre = per_seed.mean(axis=1)  # the interval's centre; the pooled slope when seeds are balanced
    np.testing.assert_allclose(centre, pooled, rtol=1e-9, atol=1e-12)
    coverage = float(np.mean(np.abs(centre - 0.5) <= half))
    assert 0.90 <= coverage <= 0.98, coverage
    # the vectorised core is what fit_power_law quotes, replicate by replicate
    for i in range(3):
        fit = fit_power_law(x, y[i], offset=3.0, seeds=seeds, n_boot=0)
        assert fit.exponent == pytest.approx(pooled[i])
        assert fit.exponent_ci == pytest.approx((centre[i] - half[i], centre[i] + half[i]), rel=1e-9)
        assert fit.interval == "between-seed t (3 seeds)" and fit.n_seeds == 3
        assert fit.n_label == f"{3 * n_sizes} ({n_sizes} sizes × 3 seeds)"


def test_one_seed_falls_back_to_the_ols_t_interval() -> None:
    x, seeds, y = _simulate(4, 1, 1, np.random.default_rng(0))
    fit = fit_power_law(x, y[0], offset=3.0, seeds=seeds, n_boot=50)
    assert fit.interval == "OLS t (one seed)"
    assert fit.exponent_ci == fit.exponent_ci_t
    assert fit.n_label == "4 (4 sizes × 1 seed)"
    assert fit_power_law(x, y[0], offset=3.0, n_boot=50).interval == "bootstrap over points"


def test_n_label_says_when_not_every_size_has_every_seed() -> None:
    """A ladder seeded at one width's best lr and not yet at the next: 3 + 1 points are not
    "2 sizes × 3 seeds"."""
    x, seeds, y = _simulate(2, 3, 1, np.random.default_rng(1))
    keep = (x == x.min()) | (seeds == 0)
    fit = fit_power_law(x[keep], y[0][keep], offset=3.0, seeds=seeds[keep], n_boot=0)
    assert fit.n == 4 and fit.n_label == "4 (2 sizes, up to 3 seeds a size)"


def test_seed_comparison_is_a_welch_test() -> None:
    rng = np.random.default_rng(4)
    x, seeds, ya = _simulate(3, 3, 1, rng, b=0.2)
    _, _, yb = _simulate(3, 3, 1, rng, b=0.6)
    df = pl.DataFrame({"x": np.r_[x, x], "y": np.r_[ya[0], yb[0]], "seed": np.r_[seeds, seeds],
                       "optimizer": ["sgd"] * 9 + ["adam"] * 9})  # fmt: skip
    c = compare_exponents(df, "x", "y", "optimizer", "sgd", "adam", offset=3.0, seeds="seed", n_boot=0)
    assert c.method.startswith("Welch t over seeds")
    assert c.difference_ci[0] > 0 and c.p_value < 0.05
    assert (c.p_value < 0.05) == (not c.difference_ci[0] <= 0 <= c.difference_ci[1])


# family contrasts (the optimiser as the unit): tests/test_families.py

# ---------------------------------------------------------------- scipy vs the hand-written statistics

FROZEN = json.loads((Path(__file__).parent / "stats_frozen.json").read_text())
"""What analysis/_stats.py and the hand-written OLS/Welch gave before scipy replaced them
(with the inputs: each config line of the analysis_fixtures stores)."""


def _new_fit(case: dict[str, Any]) -> tuple[PowerLawFit, dict[str, float]]:
    x, y, seeds = (np.asarray(case[k], dtype=float) for k in ("x", "y", "seeds"))
    fit = fit_power_law(x, y, offset=case["offset"], seeds=seeds, n_boot=0)
    lo, hi = fit.exponent_ci
    return fit, {"exponent": fit.exponent, "coefficient": fit.coefficient, "r2": fit.r2,
                 "exponent_se": fit.exponent_se, "t_low": fit.exponent_ci_t[0], "t_high": fit.exponent_ci_t[1],
                 "seed_half": (hi - lo) / 2, "seed_centre": (lo + hi) / 2}  # fmt: skip


def test_t_quantiles_match_the_hand_written_ones() -> None:
    for df, confidence, want in FROZEN["t_critical"]:
        assert t_critical(float(df), confidence) == pytest.approx(want, rel=1e-9, abs=1e-9), (df, confidence)
    assert math.isnan(t_critical(0.5)) and math.isnan(t_critical(3.0, 1.0))


def test_library_fits_and_t_intervals_match_the_hand_written_ones() -> None:
    """Over the synthetic stores (one clean, one with failed trials and unbalanced seeds):
    point fit, r2, OLS standard error and t interval, between-seed interval, and the Welch
    test between optimisers, scipy against the hand-written code's frozen outputs within 1e-9.
    Where seeds are unbalanced the between-seed centre (and Welch's p) moved on purpose: it is
    the mean of the per-seed slopes now."""
    assert len(FROZEN["fits"]) == 30 and len(FROZEN["welch"]) == 13
    fits, balanced = {}, {}
    for case in FROZEN["fits"]:
        fit, new = _new_fit(case)
        expected = dict(case["expected"])
        balanced[case["name"]] = _balanced(case)
        if not balanced[case["name"]] and fit.seed_exponents.size >= 2:
            # by design (issue 16 item 7): centred on the per-seed mean, not the pooled slope
            assert abs(new["seed_centre"] - expected["seed_centre"]) > 1e-6, case["name"]
            expected["seed_centre"] = fit.seed_exponents.mean()
        for k, want in expected.items():
            assert new[k] == pytest.approx(want, rel=1e-9, abs=1e-9), (case["name"], k)
        fits[case["name"]] = fit
    assert 0 < sum(balanced.values()) < len(balanced)
    checked_p = 0
    for pair in FROZEN["welch"]:
        fa, fb = fits[pair["a"]], fits[pair["b"]]
        c = _welch("sgd", "adam", fa, fb, 0.95)
        want = pair["expected"]
        assert c.method == f"Welch t over seeds (df {want['df']:.1f})"
        half = (c.difference_ci[1] - c.difference_ci[0]) / 2
        assert half == pytest.approx(want["half"], rel=1e-9, abs=1e-9), pair["b"]
        if balanced[pair["a"]] and balanced[pair["b"]]:  # else the centre moved, and p with it
            assert c.p_value == pytest.approx(want["p"], rel=1e-9, abs=1e-12), pair["b"]
            checked_p += 1
    assert checked_p >= 8


def _balanced(case: dict[str, Any]) -> bool:
    """Every seed has the same sizes (then the pooled slope is the mean of the per-seed ones)."""
    sizes: dict[Any, set[float]] = {}
    for x, seed in zip(case["x"], case["seeds"], strict=True):
        sizes.setdefault(seed, set()).add(x)
    return len({frozenset(v) for v in sizes.values()}) == 1


def _without_one_trial(rng: np.random.Generator, b: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """3 sizes x 3 seeds with seed 2's largest trial failed (dropped)."""
    x, seeds, y = _simulate(3, 3, 1, rng, b=b)
    keep = ~((seeds == 2) & (x == x.max()))
    return x[keep], seeds[keep], y[0][keep]


def test_between_seed_interval_is_centred_on_the_mean_of_the_per_seed_slopes() -> None:
    """Issue 16 item 7: with a trial missing the pooled slope is not the mean of the per-seed
    slopes; the between-seed interval (and Welch's difference) is centred on the latter."""
    rng = np.random.default_rng(8)
    x, seeds, y = _without_one_trial(rng, 0.5)
    fit = fit_power_law(x, y, offset=3.0, seeds=seeds, n_boot=0)
    assert fit.seed_exponents.size == 3 and fit.interval == "between-seed t (3 seeds)"
    centre = fit.seed_exponents.mean()
    assert abs(fit.exponent - centre) > 1e-3  # the pooled slope differs here
    lo, hi = fit.exponent_ci
    assert (lo + hi) / 2 == pytest.approx(centre, abs=1e-12)
    xb, seeds_b, yb = _without_one_trial(rng, 0.8)
    df = pl.DataFrame({"x": np.r_[x, xb], "y": np.r_[y, yb], "seed": np.r_[seeds, seeds_b],
                       "optimizer": ["sgd"] * x.size + ["adam"] * xb.size})  # fmt: skip
    c = compare_exponents(df, "x", "y", "optimizer", "sgd", "adam", offset=3.0, seeds="seed", n_boot=0)
    want = c.fit_b.seed_exponents.mean() - centre
    assert c.difference == pytest.approx(want, abs=1e-12)
    assert sum(c.difference_ci) / 2 == pytest.approx(want, abs=1e-12)


def test_no_p_value_from_three_points() -> None:
    """Issue 23 item 3: one seed at three sizes a side has no replicates; the bootstrap over 3
    points sat at its floor (p = 2 / (n_boot + 1)). No p-value and no interval, and ``method``
    says why; from 5 points a side the bootstrap test is back."""
    rng = np.random.default_rng(3)
    x, seeds, ya = _simulate(3, 1, 1, rng, b=0.2)
    _, _, yb = _simulate(3, 1, 1, rng, b=0.6)
    df = pl.DataFrame({"x": np.r_[x, x], "y": np.r_[ya[0], yb[0]], "seed": np.r_[seeds, seeds],
                       "optimizer": ["sgd"] * 3 + ["adam"] * 3})  # fmt: skip
    for kwargs in ({"seeds": "seed"}, {}):
        c = compare_exponents(df, "x", "y", "optimizer", "sgd", "adam", offset=3.0, n_boot=800, **kwargs)
        assert math.isnan(c.p_value) and all(math.isnan(v) for v in c.difference_ci)
        assert c.difference == pytest.approx(c.fit_b.exponent - c.fit_a.exponent)
        assert c.method.startswith("no p-value: ") and "5+ points a side" in c.method
        assert "p =" not in str(c) and "no p-value" in str(c)
    assert "1 seed, 3 points vs 1 seed, 3 points" in compare_exponents(
        df, "x", "y", "optimizer", "sgd", "adam", offset=3.0, seeds="seed", n_boot=100).method
    x5, seeds5, y5 = _simulate(5, 1, 2, rng)
    df5 = pl.DataFrame({"x": np.r_[x5, x5], "y": np.r_[y5[0], y5[1]], "optimizer": ["sgd"] * 5 + ["adam"] * 5})
    c5 = compare_exponents(df5, "x", "y", "optimizer", "sgd", "adam", offset=3.0, n_boot=200)
    assert 0 < c5.p_value <= 1 and c5.method == "bootstrap over points (5; 5)"


def test_scipy_is_imported_only_when_a_fit_needs_it() -> None:
    """``sweep plan`` and the CLI start-up stay fast: importing the CLI and the analysis
    package loads no scipy; the first fit does."""
    import subprocess
    import sys

    code = (
        "import sys, sweep.cli, analysis\n"
        "from analysis import fits, power_law\n"
        "assert not [m for m in sys.modules if m.startswith(('scipy', 'statsmodels'))]\n"
        "fits.fit_power_law([1.0, 2.0, 4.0], [1.0, 2.1, 3.9], n_boot=10)\n"
        "assert 'scipy.stats' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
