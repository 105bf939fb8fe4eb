"""analysis.counts: the outlier fraction's power law as a binomial GLM, zeros included, seeds as
the replicates of its interval."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from analysis.counts import count_fit_curves, count_fits_table, fit_count_power_law, fit_counts_each

WIDTHS = np.array([32, 48, 64, 96, 128, 192])


def _planted(b: float, f0: float, seeds: int = 3, rng_seed: int = 0, overdispersion: float = 0.0) -> pl.DataFrame:
    """Counts of outlier coordinates summed over 4 blocks: Poisson (or gamma-Poisson) around
    4 d f0 (N / N_64)^b, structurally 0 at d <= 36; many zeros at the small widths."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for d in WIDTHS:
        n = 12 * 4 * d * d
        for s in range(seeds):
            mu = 4 * d * f0 * (n / (12 * 4 * 64 * 64)) ** b
            if overdispersion:
                mu = mu * rng.gamma(1 / overdispersion, overdispersion)
            rows.append({"d_model": int(d), "params": n, "seed": s, "exposure": 4.0 * d,
                         "count": 0 if d <= 36 else int(rng.poisson(mu))})  # fmt: skip
    return pl.DataFrame(rows)


def _fit(df: pl.DataFrame, **kw):
    return fit_count_power_law(df["params"], df["count"], df["exposure"], d_model=df["d_model"], seeds=df["seed"], **kw)


def test_recovers_a_planted_slope_through_zeros() -> None:
    df = _planted(b=0.8, f0=0.002, seeds=5)
    assert (df["count"] == 0).sum() >= 8  # zeros at the small widths, not only the structural ones
    fit = _fit(df)
    assert fit.exponent_ci[0] < 0.8 < fit.exponent_ci[1]
    assert fit.exponent_ci[0] > 0.1  # resolves a real trend (t(4) over 5 seed clusters)
    assert fit.n_x == 5 and fit.n_excluded == 5 and fit.n_seeds == 5
    assert fit.interval == "binomial GLM, seed-clustered SE, t(4)"
    frac = fit.predict([12 * 4 * 64 * 64])[0]
    assert frac == pytest.approx(0.002, rel=0.5)


def test_structural_zeros_are_left_out() -> None:
    """d <= 36 cannot have an outlier (max|x_j| <= sqrt(d) RMS): its zeros must not steepen the slope."""
    df = _planted(b=0.5, f0=0.01)
    with_d = _fit(df)
    kept = df.filter(pl.col("d_model") > 36)
    without = fit_count_power_law(kept["params"], kept["count"], kept["exposure"])
    assert with_d.exponent == pytest.approx(without.exponent, abs=1e-9)
    naive = fit_count_power_law(df["params"], df["count"].to_numpy() + 0, df["exposure"])  # zeros kept
    assert naive.exponent > with_d.exponent + 0.05


def test_intervals_cover_under_overdispersion() -> None:
    """Gamma-Poisson counts (trial-level noise): the seed-clustered interval covers near its
    nominal rate."""
    hits = 0
    for k in range(60):
        fit = _fit(_planted(b=0.6, f0=0.02, rng_seed=k, overdispersion=0.3))
        hits += fit.exponent_ci[0] < 0.6 < fit.exponent_ci[1]
        assert fit.dispersion > 1  # estimated: more than binomial
    assert hits >= 52  # >= ~87% of 60 at a nominal 95%


def _binomial(b: float, f0: float, seeds: int, rng: np.random.Generator, seed_slope_sd: float = 0.0) -> pl.DataFrame:
    """Outlier counts out of 4 d coordinates (4 blocks), binomial with fraction
    f0 (N / N_64)^(b + u_seed), u_seed ~ N(0, seed_slope_sd): each seed's fraction grows at its own
    rate (a seed effect) around the planted b; structurally 0 at d <= 36."""
    rows = []
    for s in range(seeds):
        slope = b + rng.normal(0.0, seed_slope_sd)
        for d in WIDTHS:
            n = 12 * 4 * d * d
            p = min(0.5, f0 * (n / (12 * 4 * 64 * 64)) ** slope)
            count = 0 if d <= 36 else int(rng.binomial(4 * d, p))
            rows.append({"d_model": int(d), "params": n, "seed": s, "exposure": 4.0 * d, "count": count})
    return pl.DataFrame(rows)


def test_recovers_a_planted_binomial_slope() -> None:
    """Binomial counts with a known slope (8 seeds): the fit recovers slope and fraction, its
    interval covers the truth in >= 90% of 60 draws, and the counts read binomial (dispersion ~1)."""
    hits, slopes = 0, []
    for k in range(60):
        fit = _fit(_binomial(0.7, 0.01, 8, np.random.default_rng(k)))
        hits += fit.exponent_ci[0] < 0.7 < fit.exponent_ci[1]
        slopes.append(fit.exponent)
        assert fit.interval == "binomial GLM, seed-clustered SE, t(7)" and 0.5 < fit.dispersion < 2.0
    assert hits >= 54 and np.mean(slopes) == pytest.approx(0.7, abs=0.03)
    assert fit.predict([12 * 4 * 64 * 64])[0] == pytest.approx(0.01, rel=0.2)


def test_a_seed_effect_widens_the_interval() -> None:
    """Each seed's fraction growing at its own rate (sd 0.4 around 0.7, 3 seeds): the interval
    takes the seeds as replicates, so it is about twice as wide as without the seed effect and
    still covers the planted mean slope in >= 70 of 80 draws (73 here; with the seeds pooled as
    independent rows, dispersion-scaled, 65)."""
    widths = {0.0: [], 0.4: []}
    hits = 0
    for k in range(80):
        for sd in widths:
            fit = _fit(_binomial(0.7, 0.05, 3, np.random.default_rng(k), seed_slope_sd=sd))
            widths[sd].append(fit.exponent_ci[1] - fit.exponent_ci[0])
            if sd:
                hits += fit.exponent_ci[0] < 0.7 < fit.exponent_ci[1]
    assert np.median(widths[0.4]) > 1.8 * np.median(widths[0.0])
    assert hits >= 70, hits


def test_one_seed_falls_back_to_the_dispersion_scaled_binomial() -> None:
    df = _binomial(0.7, 0.01, 1, np.random.default_rng(1))
    fit = _fit(df)
    assert fit.interval == "binomial GLM, Pearson-scaled SE, t(3) (one seed)"
    assert fit.exponent_ci[0] < fit.exponent < fit.exponent_ci[1]
    with pytest.raises(ValueError, match="above their exposure"):
        _fit(df.with_columns(count=pl.col("exposure") + 1))


@pytest.mark.parametrize(
    ("counts", "why"),
    [([0] * 15, "every count 0"), ([0] * 12 + [3, 4, 5], "one size only")],
)
def test_undefined_slopes_say_why(counts: list[int], why: str) -> None:
    df = _planted(b=0.5, f0=0.01).with_columns(count=pl.Series(counts + [0] * 3))
    with pytest.raises(ValueError, match=why):
        _fit(df)


def test_table_and_curves_per_group() -> None:
    df = pl.concat([
        _planted(b=0.8, f0=0.002).with_columns(line=pl.lit("adam")),
        _planted(b=0.0, f0=0.0).with_columns(line=pl.lit("sgd")),
    ])  # fmt: skip
    fitted = fit_counts_each(df, "params", "count", "exposure", ["line"])
    table = count_fits_table(fitted, ["line"])
    assert table.get_column("line").to_list() == ["adam", "sgd"]
    adam, sgd = table.row(0, named=True), table.row(1, named=True)
    assert adam["exponent_low"] < 0.8 < adam["exponent_high"] and "d_model ≤ 36" in adam["note"]
    assert sgd["exponent"] is None and "every count 0" in sgd["note"]
    curves = count_fit_curves(fitted, ["line"], x="params")
    assert set(curves.get_column("line")) == {"adam"}
    assert (curves["fit_low"] <= curves["fit"]).all() and (curves["fit"] <= curves["fit_high"]).all()
