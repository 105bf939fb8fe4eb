"""analysis.counts: the outlier fraction's power law as a quasi-Poisson GLM, zeros included."""

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
    assert fit.exponent_ci[0] > 0.2  # resolves a real trend
    assert fit.n_x == 5 and fit.n_excluded == 5 and fit.n_seeds == 5
    assert fit.interval == "quasi-Poisson GLM, t(23)"
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
    """Gamma-Poisson counts: the Pearson dispersion widens the interval to near its nominal coverage."""
    hits = 0
    for k in range(60):
        fit = _fit(_planted(b=0.6, f0=0.02, rng_seed=k, overdispersion=0.3))
        hits += fit.exponent_ci[0] < 0.6 < fit.exponent_ci[1]
        assert fit.dispersion == fit.dispersion  # estimated
    assert hits >= 52  # >= ~87% of 60 at a nominal 95%


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
