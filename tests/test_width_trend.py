"""The trend across widths at the fitted optimum (analysis.width_trend): the verdict rule, the
report's tables on a store, the twin contrast paired by seed, the difference of two arms, and the
width-free raw-share reading beside each share / null slope."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import pytest
from synthetic_store import Synthetic

from analysis import width_trend
from analysis.load import load
from analysis.optimum import EDGE, Ladder, fit_ladder, fit_slope
from analysis.width_trend import decide


def test_decide() -> None:
    assert decide(0.01, 0.3) == "grows" and decide(-0.3, -0.01) == "falls"
    assert decide(-0.017, -0.003) == "falls, by < 0.1" and decide(0.02, 0.08) == "grows, by < 0.1"
    assert decide(-0.05, 0.08) == "no growth" and decide(-0.05, 0.2) == "undecided"
    assert decide(math.nan, 1.0) == "undecided"
    assert decide(0.2, 0.3, one_seed=True) == width_trend.ONE_SEED


def test_a_twin_contrast_through_a_one_seed_ladder_says_so() -> None:
    levels, fitted, ladders = _synthetic_levels({("adam", "sp"): 0.20, ("rotated_adam", "sp"): 0.05})
    tid = levels.filter(pl.col("optimizer") == "rotated_adam").get_column("tuning_id")[0]
    fitted[tid] = dataclasses.replace(fitted[tid], replicable=False)
    (kurtosis,) = width_trend.twin_slopes(levels, fitted, ladders, "params_non_embedding")
    assert kurtosis["decision"] == width_trend.ONE_SEED


@pytest.fixture(scope="module")
def ladder_store(tmp_path_factory: pytest.TempPathFactory):
    """adam: its best lr inside a 5-lr ladder at every width; sgd: its best beyond the ladder."""
    return (Synthetic("opt", seed=3)
            .trials(sizes=(32, 64), seeds=(0, 1, 2), optimizers=("adam", "sgd"),
                    lrs={"adam": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2], "sgd": [0.01, 0.03, 0.1]})
            .planted(best_lrs={"adam": 3e-3, "sgd": 1.0}, lr_penalty=0.5)
            .rows(steps=(0, 10), quant=False, basis_test=True)
            .write(tmp_path_factory.mktemp("opt")))  # fmt: skip


def test_the_tables_on_a_store(ladder_store) -> None:
    """Every ladder a row; sgd's best beyond its ladder is an edge at every width, with no level and no
    slope; adam's lr* lies between its best's neighbours, tokens / param is the runs' tokens over
    non-embedding params (what the slope is against), and the level's ratio is exp of its log."""
    import dataclasses

    from analysis import queries

    res = load(ladder_store.path)
    res = dataclasses.replace(res, runs=queries.runs_table(res.runs.collect(), status=None).collect().lazy())
    trials = width_trend.trials_from(res)
    levels, slopes = width_trend.optimum_tables(trials, n_boot=200)
    assert levels.height == trials.select("tuning_id").n_unique() == 4
    sgd = levels.filter(pl.col("optimizer") == "sgd")
    assert (sgd.get_column("flag") == EDGE).all() and sgd.get_column("kurtosis_over_null").is_nan().all()
    adam = levels.filter(pl.col("optimizer") == "adam")
    assert (adam.get_column("flag") == "").all()
    assert ((adam["lr_star"] > adam["best_lr"] / 3.01) & (adam["lr_star"] < adam["best_lr"] * 3.01)).all()
    runs = res.runs.collect().filter(pl.col("optimizer") == "adam").group_by("d_model").agg(
        tpp=(pl.col("tokens") / pl.col("params_non_embedding")).first())
    got = adam.join(runs, on="d_model")
    assert (got["tokens_per_param"] == got["tpp"]).all()
    assert np.allclose(np.exp(adam["log_kurtosis_over_null"]), adam["kurtosis_over_null"], rtol=1e-12)
    assert set(slopes.get_column("optimizer")) == {"adam", "sgd"}
    assert slopes.filter(pl.col("optimizer") == "sgd").get_column("slope").is_nan().all()
    assert "d 32: " in slopes.get_column("tokens_per_param")[0]


_LRS = np.log10([1e-3, 3e-3, 1e-2, 3e-2])


def _synthetic_levels(slopes: dict[tuple[str, str], float], widths=(64, 128, 256), seed_sd: float = 0.02,
                      shared: dict[int, np.ndarray] | None = None):
    """A levels table, its fitted optima and its ladders: per (optimizer, parametrization, width) a
    4-lr ladder of 3 seeds, its loss a parabola in log lr (vertex 10^-2.3) and its log measure
    slope x log N (N = 48 d²) at every lr plus per-seed offsets (``shared[d]`` where given, the
    same for every optimiser: a seed's effect twins share; else independent of sd ``seed_sd``),
    centred so each lr's seed mean is exactly the level."""
    rng = np.random.default_rng(7)
    rows, fitted, ladders = [], {}, {}
    loss = 2 + 0.3 * (_LRS + 2.3) ** 2
    for (o, par), b in slopes.items():
        for d in widths:
            n = 48 * d * d
            tid, level = f"{o}-{par}-{d}", b * math.log(n)
            offsets = shared[d] if shared is not None else rng.normal(0, seed_sd, size=3)
            offsets = offsets - offsets.mean()
            ladders[tid] = Ladder(x=_LRS, loss=[v + 0.1 * offsets for v in loss],
                                  measures={"kurtosis": [level + offsets for _ in loss]}, seeds=[np.arange(3)] * 4)
            fitted[tid] = fit_ladder(ladders[tid], n_boot=400, rng=rng)
            rows.append({"tuning_id": tid, "optimizer": o, "optimizer_family": "x", "parametrization": par, "d_model": d,
                         "params_non_embedding": n, "tokens_per_param": 10.0, "flag": fitted[tid].flag,
                         "log_kurtosis_over_null": fitted[tid].levels["kurtosis"][0]})  # fmt: skip
    return pl.from_dicts(rows), fitted, ladders


def test_the_twin_contrast_slope_is_the_difference_of_slopes_per_parametrization() -> None:
    """The primary contrast's trend: adam minus rotated_adam, per parametrization (sp and mup are
    separate lines, never pooled): slope(adam) - slope(twin) exactly, its interval around it."""
    levels, fitted, ladders = _synthetic_levels({("adam", "sp"): 0.20, ("rotated_adam", "sp"): 0.05,
                                                 ("adam", "mup"): 0.0, ("rotated_adam", "mup"): 0.05})
    rows = {r["parametrization"]: r for r in width_trend.twin_slopes(levels, fitted, ladders, "params_non_embedding")}
    assert set(rows) == {"sp", "mup"}
    assert rows["sp"]["optimizer"] == "adam − rotated_adam" and rows["sp"]["optimizer_family"] == "twin contrast"
    assert rows["sp"]["slope"] == pytest.approx(0.15, abs=1e-12) and rows["mup"]["slope"] == pytest.approx(-0.05, abs=1e-12)
    for r in rows.values():
        assert r["slope_low"] < r["slope"] < r["slope_high"] and r["slope_high"] - r["slope_low"] < 0.1
    assert rows["sp"]["decision"] == "grows" and rows["mup"]["decision"] == "falls, by < 0.1"
    assert rows["sp"]["n_widths"] == 3


def test_the_twin_contrast_is_paired_by_seed() -> None:
    """Twins whose seeds add the same large offset to both (sd 0.3: the shared init and data order)
    and which differ only by a constant level: paired by seed, every replicate's contrast is that
    constant, so the interval is the point. Differencing each ladder's own independent replicates
    (the unpaired way) leaves the seeds' spread in it, several times wider than the slope."""
    rng = np.random.default_rng(3)
    shared = {d: rng.normal(0, 0.3, size=3) for d in (64, 128, 256)}
    levels, fitted, ladders = _synthetic_levels({("adam", "sp"): 0.20, ("rotated_adam", "sp"): 0.05}, shared=shared)
    (row,) = width_trend.twin_slopes(levels, fitted, ladders, "params_non_embedding")
    assert row["slope"] == pytest.approx(0.15, abs=1e-12)
    assert row["slope_low"] == pytest.approx(0.15, abs=1e-9) and row["slope_high"] == pytest.approx(0.15, abs=1e-9)
    assert row["decision"] == "grows"
    ids = levels.sort("d_model").partition_by("optimizer", as_dict=True)
    a, b = (ids[(o,)].get_column("tuning_id").to_list() for o in ("adam", "rotated_adam"))
    log_n = np.log(ids[("adam",)].get_column("params_non_embedding").cast(pl.Float64).to_numpy())
    diff = ids[("adam",)].get_column("log_kurtosis_over_null").to_numpy() - ids[("rotated_adam",)].get_column(
        "log_kurtosis_over_null").to_numpy()
    unpaired = fit_slope(log_n, diff, [fitted[i].boot["kurtosis"] - fitted[j].boot["kurtosis"] for i, j in zip(a, b)])
    assert unpaired.slope == pytest.approx(0.15, abs=1e-12) and unpaired.ci[1] - unpaired.ci[0] > 0.1


def _arm_trials(slopes: dict[str, float], shared: dict[int, np.ndarray], widths=(64, 128, 256),
                edge: int | None = None) -> pl.DataFrame:
    """A trials frame for one arm: per optimiser and width a 4-lr ladder of 3 seeds, the loss a
    parabola in log lr, the log kurtosis ``slopes[o]`` x log N at every lr plus the seed's offset
    ``shared[d]`` (centred; the same for every optimiser, and for every arm given the same
    ``shared``: a seed's init); at width ``edge`` the loss falls to the ladder's end (no optimum)."""
    rows = []
    for o, b in slopes.items():
        for d in widths:
            n, offsets = 48 * d * d, shared[d] - shared[d].mean()
            for x in _LRS:
                loss = 2 - 0.3 * x if d == edge else 2 + 0.3 * (x + 2.3) ** 2
                for seed, e in enumerate(offsets):
                    rows.append({"tuning_id": f"{o}-{d}", "optimizer": o, "parametrization": "sp", "d_model": d,
                                 "lr": 10**x, "seed": seed, "final_val_loss": loss + 0.1 * e,
                                 "log_kurtosis": b * math.log(n) + e, "params_non_embedding": n})  # fmt: skip
    return pl.from_dicts(rows)


def test_two_arms_differ_by_the_difference_of_their_twin_contrasts_paired_by_seed() -> None:
    """Arm a's contrast grows by 0.25 per log N, arm b's by 0.05, every ladder carrying the same
    large seed offsets (sd 0.3, a seed's init in both arms): the difference is 0.20 exactly, each
    arm's slope is its own, and paired by seed every replicate reads the same, so the interval is
    the point. Swapping the arms flips the sign and the word; an arm against itself reads 0.
    A width where one of the four ladders has no optimum drops out, and with it the row where fewer
    than two widths are left."""
    rng = np.random.default_rng(5)
    shared = {d: rng.normal(0, 0.3, size=3) for d in (64, 128, 256)}
    a = _arm_trials({"adam": 0.30, "rotated_adam": 0.05}, shared)
    b = _arm_trials({"adam": 0.10, "rotated_adam": 0.05}, shared)
    (row,) = width_trend.arm_difference(a, b, n_boot=300).iter_rows(named=True)
    assert row["optimizer"] == "adam − rotated_adam" and row["parametrization"] == "sp" and row["n_widths"] == 3
    assert row["slope_a"] == pytest.approx(0.25, abs=1e-12) and row["slope_b"] == pytest.approx(0.05, abs=1e-12)
    assert row["difference"] == pytest.approx(0.20, abs=1e-12)
    assert row["difference_low"] == pytest.approx(0.20, abs=1e-9) and row["difference_high"] == pytest.approx(0.20, abs=1e-9)
    assert row["decision"] == "larger in a"
    (swapped,) = width_trend.arm_difference(b, a, n_boot=300).iter_rows(named=True)
    assert swapped["difference"] == pytest.approx(-0.20, abs=1e-12) and swapped["decision"] == "larger in b"
    (same,) = width_trend.arm_difference(a, a, n_boot=300).iter_rows(named=True)
    assert same["difference"] == 0 and abs(same["difference_low"]) < 1e-12 and abs(same["difference_high"]) < 1e-12
    assert same["decision"] == "alike (within ±0.1)"
    edged = _arm_trials({"adam": 0.10, "rotated_adam": 0.05}, shared, edge=256)
    (short,) = width_trend.arm_difference(a, edged, n_boot=300).iter_rows(named=True)
    assert short["n_widths"] == 2 and short["difference"] == pytest.approx(0.20, abs=1e-12)
    # two widths, one without an optimum: no slope to read, so no row (not a row of NaN)
    two = {64: shared[64], 128: shared[128]}
    lone = _arm_trials({"adam": 0.10, "rotated_adam": 0.05}, two, widths=(64, 128), edge=128)
    assert width_trend.arm_difference(_arm_trials({"adam": 0.30, "rotated_adam": 0.05}, two, widths=(64, 128)), lone,
                                      n_boot=50).height == 0  # fmt: skip


def test_two_arms_with_their_own_seed_noise_read_undecided_or_alike_not_a_difference() -> None:
    """The same trend in both arms but each with its own seed noise (sd 0.05, not shared): the
    difference's point is off 0 by the noise only and its interval covers 0."""
    rng = np.random.default_rng(9)
    a = _arm_trials({"adam": 0.2, "rotated_adam": 0.05}, {d: rng.normal(0, 0.05, size=3) for d in (64, 128, 256)})
    b = _arm_trials({"adam": 0.2, "rotated_adam": 0.05}, {d: rng.normal(0, 0.05, size=3) for d in (64, 128, 256)})
    (row,) = width_trend.arm_difference(a, b, n_boot=300).iter_rows(named=True)
    assert row["difference_low"] <= 0 <= row["difference_high"] and row["decision"] in ("undecided", "alike (within ±0.1)")


def _share_trials(shares: dict[str, float | None], widths=(64, 128, 256), seed_sd: float = 0.02) -> pl.DataFrame:
    """A trials frame for ``optimum_tables``: per optimiser and width a 4-lr ladder of 3 seeds, the
    loss a parabola in log lr, the top-1 share a fixed ``shares[o]`` of every token at every lr and
    width (None: the random-basis null), times a per-seed factor (centred: each lr's seed mean of
    the log share is exact); kurtosis at its null."""
    from analysis.null import top_share_null

    rng = np.random.default_rng(11)
    rows = []
    for o, f in shares.items():
        for d in widths:
            n = 48 * d * d
            for x in _LRS:
                offsets = rng.normal(0, seed_sd, size=3)
                for seed, e in enumerate(offsets - offsets.mean()):
                    share = (top_share_null(d) if f is None else f) * math.exp(e)
                    rows.append({"tuning_id": f"{o}-{d}", "tuned_line_id": o, "optimizer": o, "optimizer_family": "x",
                                 "parametrization": "sp", "d_model": d, "lr": 10**x, "seed": seed,
                                 "final_val_loss": 2 + 0.3 * (x + 2.3) ** 2 + 0.01 * e, "log_kurtosis": 0.0,
                                 "log_top1_share": math.log(share / top_share_null(d)), "params_non_embedding": n,
                                 "tokens": 10 * n})  # fmt: skip
    return pl.from_dicts(rows)


def test_a_fixed_share_reads_no_growth_in_the_raw_share_and_growth_over_its_null() -> None:
    """A coordinate holding a fixed share (0.2) of every token at every width: its share / null rises
    (the null falls with d), by exactly minus the null's slope, and decides "grows"; its width-free
    row (``RAW_SHARE``) reads 0 and "no growth", and the level's raw share is 0.2 at every width.
    The twin at the null reads 0 in both; the contrast's raw row is adam's raw slope less the twin's."""
    levels, slopes = width_trend.optimum_tables(_share_trials({"adam": 0.2, "rotated_adam": None}), n_boot=300)
    ns = width_trend.null_slope(np.log(48 * np.array([64, 128, 256]) ** 2), np.array([64, 128, 256]))
    assert ns == pytest.approx(np.polyfit(np.log(48 * np.array([64, 128, 256]) ** 2),
                                          np.log([0.108, 0.0636, 0.0367]), 1)[0], abs=0.003)  # fmt: skip
    rows = {(r["optimizer"], r["measure"]): r for r in slopes.iter_rows(named=True)}
    over, raw = rows[("adam", "top-1 share / null")], rows[("adam", width_trend.RAW_SHARE)]
    assert over["slope"] == pytest.approx(-ns, abs=0.02) and over["decision"] == "grows"
    assert raw["slope"] == pytest.approx(over["slope"] + ns, abs=1e-12) and raw["null_slope"] == ns
    assert (raw["slope_low"], raw["slope_high"]) == pytest.approx((over["slope_low"] + ns, over["slope_high"] + ns))
    assert abs(raw["slope"]) < 1e-9 and raw["decision"] == "no growth"
    adam = levels.filter(pl.col("optimizer") == "adam")
    assert np.allclose(adam.get_column("top1_share_raw"), 0.2, rtol=0.03)
    assert (adam["top1_share_raw_low"] < adam["top1_share_raw"]).all() and (adam["top1_share_raw"] < adam["top1_share_raw_high"]).all()
    twin = rows[("rotated_adam", width_trend.RAW_SHARE)]
    assert twin["slope"] == pytest.approx(rows[("rotated_adam", "top-1 share / null")]["slope"] + ns, abs=1e-12)
    assert abs(rows[("rotated_adam", "top-1 share / null")]["slope"]) < 0.02
    contrast = rows[("adam − rotated_adam", width_trend.RAW_SHARE)]
    assert contrast["slope"] == pytest.approx(raw["slope"] - rows[("rotated_adam", "top-1 share / null")]["slope"], abs=1e-9)
    assert contrast["decision"] == "no growth"
    assert ("adam", "kurtosis / null") in rows and ("adam", "kurtosis (raw)") not in rows


def test_a_share_growing_past_a_fixed_one_reads_growth_in_the_raw_share() -> None:
    """Shares of 0.1 / 0.2 / 0.4 at d 64 / 128 / 256 (the share doubles per doubling of d, log N
    slope 1/2): the raw row reads 0.5 and "grows"."""
    frames = [_share_trials({"adam": f}, widths=(d,)) for d, f in ((64, 0.1), (128, 0.2), (256, 0.4))]
    _, slopes = width_trend.optimum_tables(pl.concat(frames), n_boot=300)
    raw = slopes.filter(pl.col("measure") == width_trend.RAW_SHARE).row(0, named=True)
    assert raw["slope"] == pytest.approx(0.5, abs=0.02) and raw["decision"] == "grows"
