"""The level at the fitted loss-optimal lr (analysis.optimum): the parabola's vertex, the measure
read there, the flags, the seed resampling and the seed bootstrap's coverage of a slope across
widths, and the charts drawn from the levels. The tables and contrasts: tests/test_width_trend.py."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis.optimum import EDGE, Ladder, fit_ladder, fit_slope, interpolate_at, read_at, vertex


def _ladder(x: np.ndarray, loss: np.ndarray, log_m: np.ndarray | None = None) -> Ladder:
    """A ladder of one seed per lr."""
    log_m = np.zeros_like(loss) if log_m is None else log_m
    return Ladder(x=x, loss=[np.array([v]) for v in loss], measures={"kurtosis": [np.array([v]) for v in log_m]},
                  seeds=[np.array([0])] * x.size)  # fmt: skip


def test_a_parabolas_vertex_is_recovered_on_an_uneven_grid() -> None:
    """Loss = c + k (x - x0)² on a ladder of uneven steps: x* = x0 in float64, whichever three
    points bracket the best, and x* lies between the best's neighbours."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        x = np.sort(rng.uniform(-4, -1, size=6))
        x0 = rng.uniform(x[1], x[-2])
        k, c = rng.uniform(0.05, 2), rng.uniform(1, 3)
        x_star, i, code = vertex(x, c + k * (x - x0) ** 2)
        if code[0] == 0:
            assert x_star[0] == pytest.approx(x0, abs=1e-11)
            assert x[i[0] - 1] < x_star[0] < x[i[0] + 1]
    o = fit_ladder(_ladder(np.log10([1e-3, 3e-3, 1e-2, 3e-2]), 2 + 0.3 * (np.log10([1e-3, 3e-3, 1e-2, 3e-2]) + 2.2) ** 2))
    assert o.flag == "" and math.log10(o.lr_star) == pytest.approx(-2.2, abs=1e-12) and o.best_lr == 1e-2


def test_a_measure_linear_in_log_lr_is_read_exactly_at_lr_star() -> None:
    """log measure = a + g log10 lr: the line over the three points reads a + g x* exactly, and the
    level is that, not any grid point's value."""
    x = np.log10([1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    loss = 2 + 0.4 * (x + 3.3) ** 2
    log_m = 0.7 - 0.45 * x
    o = fit_ladder(_ladder(x, loss, log_m), n_boot=50)
    x_star = math.log10(o.lr_star)
    assert x_star == pytest.approx(-3.3, abs=1e-12)
    assert o.levels["kurtosis"][0] == pytest.approx(0.7 - 0.45 * x_star, abs=1e-12)
    assert all(o.levels["kurtosis"][0] != pytest.approx(v) for v in log_m)
    # one seed everywhere: every replicate would be the data, so there is no interval
    assert math.isnan(o.levels["kurtosis"][1]) and math.isnan(o.levels["kurtosis"][2])
    # the line, not the interpolating quadratic: a curved log measure is read off the chord's fit
    curved = (x + 3.0) ** 2
    bent = read_at(x, curved, np.array([2]), np.array([-3.3]))
    assert bent[0] == pytest.approx(np.polyval(np.polyfit(x[1:4], curved[1:4], 1), -3.3), abs=1e-12)


def test_the_interpolated_reading_stays_between_the_rungs_where_the_line_overshoots() -> None:
    """A ladder that bends at its best (the measure flat up to it, steep above: what Adam's kurtosis
    does) with lr* just above the best: the line through the three points reads above both rungs
    around lr*; the interpolated reading lies between them. Both read a measure linear in log lr
    exactly, and the interpolated one reads each rung's own value at that rung."""
    x = np.log10([1e-3, 3e-3, 1e-2, 3e-2])
    loss = 2 + 0.4 * (x + 2.62) ** 2  # lr* = 10^-2.62 = 2.4e-3, below the best 3e-3
    bent = np.log([0.92, 0.93, 3.13, 2.18])  # the fixed-batch arm's d 128 Adam, seed means
    line, interp = (fit_ladder(_ladder(x, loss, bent), n_boot=0, reading=r) for r in ("line", "interpolated"))
    assert line.lr_star == interp.lr_star and line.best_lr == pytest.approx(3e-3)
    k = np.searchsorted(x, math.log10(line.lr_star)) - 1
    lo, hi = sorted(bent[k:k + 2])
    assert line.levels["kurtosis"][0] > hi + 0.05  # the overshoot
    assert lo <= interp.levels["kurtosis"][0] <= hi
    rng = np.random.default_rng(3)
    for _ in range(100):
        m = rng.normal(size=(4, x.size))
        xs = rng.uniform(x[0], x[-1], size=4)
        got = interpolate_at(x, m, np.zeros(4, int), xs)
        k = np.clip(np.searchsorted(x, xs) - 1, 0, x.size - 2)
        rows = np.arange(4)
        assert (got >= np.minimum(m[rows, k], m[rows, k + 1]) - 1e-12).all()
        assert (got <= np.maximum(m[rows, k], m[rows, k + 1]) + 1e-12).all()
    assert interpolate_at(x, bent, np.array([1]), np.array([x[2]]))[0] == pytest.approx(bent[2], abs=1e-12)
    lin = 0.7 - 0.45 * x
    at = np.array([-2.3])
    assert interpolate_at(x, lin, np.array([2]), at)[0] == pytest.approx(read_at(x, lin, np.array([2]), at)[0], abs=1e-12)
    assert math.isnan(interpolate_at(x, lin, np.array([2]), np.array([math.nan]))[0])


def test_a_best_at_the_edge_is_flagged_not_extrapolated() -> None:
    x = np.log10([1e-3, 3e-3, 1e-2])
    for loss in (np.array([1.0, 1.2, 1.5]), np.array([1.5, 1.2, 1.0])):
        two_seeds = Ladder(x=x, loss=[np.array([v, v + 0.01]) for v in loss],
                           measures={"kurtosis": [np.zeros(2)] * 3}, seeds=[np.array([0, 1])] * 3)
        o = fit_ladder(two_seeds, n_boot=20)
        assert o.flag == EDGE and math.isnan(o.lr_star) and math.isnan(o.levels["kurtosis"][0])
        assert o.boot_inside == 0.0
    flat = fit_ladder(_ladder(x, np.array([1.0, 1.0, 1.0])), n_boot=20)  # the argmin is the first: an edge
    assert flat.flag == EDGE
    # through the first-lowest point and its neighbours the parabola always opens upward; a NaN
    # loss gives no curvature: flagged, not read
    rng = np.random.default_rng(2)
    _, i, code = vertex(np.log10([1e-3, 3e-3, 1e-2, 3e-2, 0.1]), rng.integers(0, 3, size=(500, 5)).astype(float))
    assert set(code[(i > 0) & (i < 4)]) == {0}
    _, _, code = vertex(np.log10([1e-3, 3e-3, 1e-2, 3e-2]), np.array([[2.0, 1.0, math.nan, 1.5]]))
    assert code[0] == 2
    assert fit_ladder(_ladder(x[:2], np.array([1.0, 2.0])), n_boot=5).flag == "few lrs"


def test_a_ladder_of_one_seed_has_an_optimum_but_no_interval_and_no_verdict() -> None:
    """One seed at every lr: every bootstrap replicate would be the data, a zero-width interval that
    "decides" anything. The level is read; its interval, and any slope's through it, are NaN."""
    x = np.log10([1e-3, 3e-3, 1e-2, 3e-2])
    loss, log_m = np.array([1.5, 1.2, 1.25, 1.6]), np.array([0.0, 0.4, 0.9, 1.2])
    one = fit_ladder(_ladder(x, loss, log_m), n_boot=50)
    assert not one.replicable and one.flag == "" and math.isfinite(one.lr_star)
    assert math.isfinite(one.levels["kurtosis"][0]) and all(math.isnan(v) for v in one.levels["kurtosis"][1:])
    assert all(math.isnan(v) for v in one.lr_star_ci) and math.isnan(one.boot_inside)
    two = fit_ladder(Ladder(x=x, loss=[np.array([v, v + 0.02]) for v in loss],
                            measures={"kurtosis": [np.array([v, v + 0.1]) for v in log_m]},
                            seeds=[np.array([0, 1])] * 4), n_boot=50)  # fmt: skip
    assert two.replicable and two.levels["kurtosis"][1] < two.levels["kurtosis"][2]
    log_n = np.log([1e5, 4e5])
    s = fit_slope(log_n, np.array([one.levels["kurtosis"][0]] * 2), [one.boot["kurtosis"]] * 2)
    assert math.isnan(s.ci[0]) and math.isnan(s.ci[1])


def _simulate(rng: np.random.Generator, slope: float, n_seeds: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Three widths: the loss a parabola in log lr whose vertex falls with width, log measure = level(N)
    + 0.5 (x - x*) with level(N) = slope log N, seed noise on both; returns log N, the fitted levels and
    each width's bootstrap replicates."""
    log_n = np.log([1e5, 4e5, 1.6e6])
    levels, boots = [], []
    for k, ln in enumerate(log_n):
        x0 = -2.5 - 0.3 * k
        x = x0 + np.array([-1.0, -0.5, 0.0, 0.5, 1.0]) + rng.uniform(-0.2, 0.2)
        loss = [2 + 0.3 * (v - x0) ** 2 + 0.01 * rng.standard_normal(n_seeds) for v in x]
        meas = [slope * ln + 0.5 * (v - x0) + 0.05 * rng.standard_normal(n_seeds) for v in x]
        lad = Ladder(x=x, loss=loss, measures={"kurtosis": meas}, seeds=[np.arange(n_seeds)] * 5)
        o = fit_ladder(lad, n_boot=300, rng=rng, confidence=0.9)
        levels.append(o.levels["kurtosis"][0])
        boots.append(o.boot["kurtosis"])
    return log_n, np.array(levels), boots


def test_the_bootstrap_interval_covers_the_true_slope_at_about_its_rate() -> None:
    """90% percentile intervals of the slope across widths, 120 simulated surfaces with seed noise
    (4 seeds per lr): the truth is covered at about the nominal rate (a seed bootstrap of 4 seeds
    under-covers a little: its variance is (n-1)/n of the sampling variance)."""
    rng = np.random.default_rng(7)
    hits = []
    for _ in range(120):
        log_n, levels, boots = _simulate(rng, 0.2, 4)
        s = fit_slope(log_n, levels, boots, confidence=0.9)
        hits.append(s.ci[0] <= 0.2 <= s.ci[1])
    assert 0.75 <= np.mean(hits) <= 0.97


def test_a_slope_is_least_squares_over_the_widths_with_an_optimum() -> None:
    log_n = np.log([1e5, 4e5, 1.6e6])
    boots = [np.array([0.1, 0.2, math.nan]), np.array([0.3, 0.5, 0.4]), np.array([0.5, 0.6, 0.7])]
    s = fit_slope(log_n, np.array([0.1, 0.3, 0.5]), boots, confidence=0.9)
    assert s.slope == pytest.approx(np.polyfit(log_n, [0.1, 0.3, 0.5], 1)[0], abs=1e-12)
    assert s.boot_kept == pytest.approx(2 / 3) and s.n_widths == 3
    edge = fit_slope(log_n, np.array([0.1, math.nan, 0.5]), boots)
    assert edge.n_widths == 2 and edge.slope == pytest.approx(0.4 / (log_n[2] - log_n[0]), abs=1e-12)


def test_seed_resampling_weights_each_trial_by_its_seeds_draws() -> None:
    """``Ladder.seed_resampled``: a cell's replicate is its trials weighted by how often each
    one's seed was drawn; a cell none of whose seeds was drawn keeps its plain mean."""
    lad = Ladder(x=np.log10([1e-3, 3e-3]), loss=[np.array([1.0, 2.0, 4.0]), np.array([5.0])],
                 measures={"kurtosis": [np.array([0.0, 3.0, 6.0]), np.array([7.0])]},
                 seeds=[np.array([0, 1, 2]), np.array([0])])  # fmt: skip
    counts = np.array([[3, 0, 0], [0, 2, 1], [1, 1, 1]])
    loss, meas = lad.seed_resampled(counts, np.array([0, 1, 2]))
    assert np.allclose(loss[:, 0], [1.0, (2 * 2 + 4) / 3, 7 / 3]) and np.allclose(loss[:, 1], [5.0, 5.0, 5.0])
    assert np.allclose(meas["kurtosis"][:, 0], [0.0, 4.0, 3.0]) and np.allclose(meas["kurtosis"][:, 1], 7.0)


def test_the_ladder_chart_gives_sp_and_mup_their_own_panels() -> None:
    """A store with both parametrizations draws one panel per (optimiser, parametrization): the
    lines of two parameterisations are never drawn as one."""
    from analysis.charts.optimum import ladder_cells, level_along_ladder

    trials = pl.DataFrame({
        "optimizer": ["adam"] * 12, "optimizer_family": ["per_coordinate"] * 12,
        "parametrization": ["sp"] * 6 + ["mup"] * 6, "d_model": ([64] * 3 + [128] * 3) * 2,
        "lr": [1e-3, 3e-3, 1e-2] * 4, "log_kurtosis": np.linspace(0, 1, 12),
    })  # fmt: skip
    levels = pl.DataFrame({
        "optimizer": ["adam"] * 4, "parametrization": ["sp", "sp", "mup", "mup"], "d_model": [64, 128] * 2,
        "flag": [""] * 4, "lr_star": [3e-3] * 4, "lr_star_low": [2e-3] * 4, "lr_star_high": [4e-3] * 4,
        "kurtosis_over_null": [1.5] * 4, "kurtosis_over_null_low": [1.4] * 4, "kurtosis_over_null_high": [1.6] * 4,
        "tokens_per_param": [10.0] * 4,
    })  # fmt: skip
    cells = ladder_cells(trials)
    assert cells.height == 12
    spec = level_along_ladder(cells, levels).to_dict()
    panels = {row["panel"] for row in next(iter(spec["datasets"].values()))}
    assert panels == {"adam · sp (per coordinate)", "adam · mup (per coordinate)"}
    # the lr axis labels the ladder's rungs (1 and 3 x 10^k), not two ticks a decade and more apart
    axes = [layer["encoding"]["x"]["axis"] for layer in spec["spec"]["layer"]
            if layer.get("encoding", {}).get("x", {}).get("field") == "lr"]
    assert axes and all(a["values"] == [1e-3, 3e-3, 1e-2] and a["format"] == "~g" for a in axes)
    # the interpolated reading, where the table has it, as a hollow diamond beside the line's filled one
    def hollow(spec: dict) -> list[dict]:
        return [la for la in spec["spec"]["layer"] if isinstance(la["mark"], dict)
                and la["mark"].get("shape") == "diamond" and la["mark"].get("filled") is False]
    assert hollow(spec) == []
    with_check = levels.with_columns(kurtosis_over_null_interpolated=pl.Series([1.2, 1.3, 1.2, 1.3]))
    drawn = level_along_ladder(cells, with_check).to_dict()
    assert [la["encoding"]["y"]["field"] for la in hollow(drawn)] == ["ratio_interpolated"]
    rows = next(iter(drawn["datasets"].values()))
    assert sorted(r["ratio_interpolated"] for r in rows if r.get("ratio_interpolated") is not None) == [1.2, 1.2, 1.3, 1.3]


def test_the_optimum_chart_draws_each_level_beside_the_random_basis_null() -> None:
    """``level_at_optimum``: per measure and parametrization, a point per ladder with an optimum (an
    edge-flagged one left out), marked "one seed" where it has no interval; the null it is drawn
    beside is 1 for kurtosis / null and ``top_share_null(d)`` for the raw share."""
    from analysis.charts.optimum import level_at_optimum
    from analysis.null import top_share_null

    levels = pl.DataFrame({
        "optimizer": ["adam"] * 4 + ["rotated_adam"] * 2, "optimizer_family": ["per_coordinate"] * 4 + ["x"] * 2,
        "parametrization": ["sp", "sp", "mup", "mup", "sp", "sp"], "d_model": [64, 128, 64, 128, 64, 128],
        "params_non_embedding": [48 * 64**2, 48 * 128**2] * 3, "flag": ["", "", "", "edge", "", ""],
        "kurtosis_over_null": [1.0, 2.5, 1.0, math.nan, 1.0, 1.0],
        "kurtosis_over_null_low": [0.9, 2.2, math.nan, math.nan, 0.95, 0.97],
        "kurtosis_over_null_high": [1.1, 2.9, math.nan, math.nan, 1.05, 1.03],
        "top1_share_raw": [0.11, 0.16, 0.11, math.nan, 0.108, 0.064],
        "top1_share_raw_low": [0.10, 0.15, math.nan, math.nan, 0.10, 0.06],
        "top1_share_raw_high": [0.12, 0.17, math.nan, math.nan, 0.11, 0.07],
    })  # fmt: skip
    spec = level_at_optimum(levels).to_dict()
    rows = [r for data in spec["datasets"].values() for r in data]
    points = [r for r in rows if r["kind"] == "level"]
    assert len(points) == 2 * 5  # two measures, five ladders with an optimum (muP adam's d 128 is an edge)
    assert {r["seeds"] for r in points if r["par"] == "muP"} == {"one seed"}
    assert {r["seeds"] for r in points if r["par"] == "SP"} == {"3+ seeds"}
    nulls = {(r["measure"], r["par"], r["d_model"]): r["value"] for r in rows if r["kind"] == "null"}
    assert nulls[("Kurtosis / null", "SP", 128)] == 1.0
    assert nulls[("Top-1 share (raw)", "SP", 128)] == pytest.approx(top_share_null(128))
    assert nulls[("Top-1 share (raw)", "muP", 64)] == pytest.approx(top_share_null(64))
    assert level_at_optimum(levels.head(0)) is None
