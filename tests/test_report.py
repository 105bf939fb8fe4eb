"""analysis.report.write_report: every file, graceful with one size, failures, no checks."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

import pytest
from analysis_fixtures import messy_store, single_size_store, store, twins  # noqa: F401  (fixtures)

from analysis.report import DEFAULT_FITS, FitSpec, ReportResult, write_report

CHARTS = {
    "kurtosis_by_layer",
    "kurtosis_over_training",
    "basis_comparison",
    "kurtosis_resid_over_null_vs_params",
    "kurtosis_mlp_in_over_null_vs_params",
    "outlier_dims_rel_attn_in_fraction_vs_params",
    "outlier_dims_rel_attn_in_fraction_by_layer",
    "outlier_dims_rel_mlp_in_fraction_vs_params",
    "outlier_dims_rel_mlp_in_fraction_by_layer",
    "final_val_loss_vs_params",
    "kurtosis_vs_loss",
    "kurtosis_by_family",
    "quant_w8a8_vs_kurtosis",
    "quant_w4a4_vs_kurtosis",
    "slopes",
}


@pytest.fixture(scope="module")
def report(store, tmp_path_factory) -> tuple[ReportResult, list[str]]:  # noqa: F811
    messages: list[str] = []
    out = tmp_path_factory.mktemp("report")
    rep = write_report(store.path, out, formats=("svg", "png"), n_boot=200, on_progress=messages.append)
    return rep, messages


def test_writes_every_chart_table_and_index(report, store) -> None:  # noqa: F811
    rep, _ = report
    out = Path(rep.out)
    names = {p.name for p in out.iterdir()}
    for chart in CHARTS:
        assert {f"{chart}.svg", f"{chart}.png"} <= names, chart
    assert {"fits.csv", "fits.md", "fits.tex", "comparisons.csv", "family_comparisons.csv", "index.html",
            "best_lr.csv", "onset.csv", "levels.csv", "family_levels.csv"} <= names  # fmt: skip
    assert set(rep.charts) == CHARTS
    assert all(Path(f).exists() for f in rep.files)
    assert not any(n.startswith(".") for n in names)  # no temp files left behind
    assert rep.index == str(out / "index.html")
    assert (rep.n_runs, rep.n_done, rep.n_failed, rep.n_diverged) == (store.n_trials, store.n_trials, 0, 0)


RESID_OVER_NULL = "kurtosis / null 3(d−1)/(d+1), residual stream"


def test_fits_table_holds_the_known_exponent(report, store) -> None:  # noqa: F811
    """kurtosis / null has a slope with its interval for every config, SGD's (no privileged
    basis: slope 0) included; adam's matches the planted excess read against the exact null."""
    import numpy as np

    from analysis.null import kurtosis_null

    rep, _ = report
    fits = pl.read_csv(Path(rep.out) / "fits.csv")
    resid = fits.filter(pl.col("fit").str.starts_with(RESID_OVER_NULL))
    assert sorted(resid.get_column("optimizer")) == ["adam", "sgd"]
    adam = resid.filter(pl.col("optimizer") == "adam").row(0, named=True)
    sgd = resid.filter(pl.col("optimizer") == "sgd").row(0, named=True)
    assert adam["interval"] == "between-seed t (3 seeds)" and (adam["n_x"], adam["n_seeds"]) == (3, 3)
    sizes = np.array(store.params_non_embedding, dtype=float)
    null = np.array([kurtosis_null(d) for d in (32, 64, 128)])
    ratio = (null + np.array([store.expected_excess("adam", p) for p in sizes])) / null
    planted = np.polyfit(np.log(sizes), np.log(ratio), 1)[0]
    assert adam["exponent_low"] < planted < adam["exponent_high"]
    assert adam["exponent_low"] > 0.1
    assert sgd["exponent_low"] <= sgd["exponent"] <= sgd["exponent_high"] and abs(sgd["exponent"]) < 1e-3
    assert fits.filter(pl.col("fit").str.starts_with("kurtosis / null")).height == 4  # resid and MLP input
    # the outlier fraction: adam's fitted through the structural zeros at d 32, sgd's undefined (no outliers)
    frac = fits.filter(pl.col("fit").str.starts_with("outlier fraction"))
    assert frac.get_column("optimizer").to_list() == ["adam", "adam"]
    row = frac.row(0, named=True)
    assert row["interval"] == "binomial GLM, seed-clustered SE, t(2)" and row["exponent_low"] < row["exponent_high"]
    assert row["n_x"] == 2 and "d_model ≤ 36 left out" in row["note"]
    skipped = [n for n in rep.notes if "fits are undefined" in n]
    assert len(skipped) == 1 and skipped[0].count("sgd · layernorm · none") == 2 and "every count 0" in skipped[0]
    assert "kurtosis /" not in skipped[0]  # every kurtosis fit is defined
    assert "binomial GLMs of the outlier counts" in (Path(rep.out) / "fits.md").read_text()
    comparisons = pl.read_csv(Path(rep.out) / "comparisons.csv")
    raw = comparisons.filter(pl.col("fit").str.starts_with(RESID_OVER_NULL)).row(0, named=True)
    assert raw["a"].startswith("sgd") and raw["b"].startswith("adam")
    assert raw["difference_low"] > 0 and raw["p_value"] < 0.05
    assert raw["method"].startswith("Welch t over seeds")


FAMILY_OPTIMIZERS = ("adam", "lion", "sgd", "rotated_adam")
"""Two per-coordinate optimisers against two basis-free ones (rotation_equivariant: sgd;
fixed_random_basis: rotated_adam), so every side of the primary contrast has two units."""


def _family_store(tmp_path: Path, name: str):
    from synthetic_store import Synthetic

    return (Synthetic(name, seed=3).trials(optimizers=FAMILY_OPTIMIZERS)
            .planted(exponents={"lion": 0.6, "rotated_adam": None})
            .rows(steps=(0, 10), quant=False)
            .write(tmp_path))  # fmt: skip


def test_family_differences_take_the_optimisers_as_the_unit(tmp_path: Path) -> None:
    """adam and lion (per coordinate) against sgd and rotated_adam (basis-free), 3 seeds: the
    declared primary row (per_coordinate minus the other families pooled) is the difference of the
    means of each optimiser's mean per-seed exponent, with a Welch interval over the two families'
    between-optimiser variances, by hand from the stored rows; the pairs with a one-optimiser
    family have no interval; in fits.md, index.html and family_comparisons.csv."""
    import numpy as np
    from scipy import stats

    from analysis import queries
    from analysis.load import load

    s = _family_store(tmp_path, "fam")
    specs = (FitSpec("kurtosis", over_null=True, chart=False),)
    rep = write_report(s.path, tmp_path / "rep", formats=("svg",), fit_specs=specs, n_boot=20)
    fam = rep.family_comparisons
    assert fam.height == 4  # the primary contrast and the three pairs of families
    row = fam.filter(pl.col("role") == "primary").row(0, named=True)
    assert (row["family_a"], row["optimizers_a"]) == ("rotation_equivariant + fixed_random_basis", "sgd + rotated_adam")
    assert (row["family_b"], row["optimizers_b"]) == ("per_coordinate", "adam + lion")
    per = queries.per_trial(load(s.path), "kurtosis", over_null=True).collect()

    def mean_slope(opt: str) -> float:
        mine = per.filter(pl.col("optimizer") == opt)
        return float(np.mean([np.polyfit(np.log(g["params_non_embedding"].to_numpy()), np.log(g["value"].to_numpy()), 1)[0]
                              for _, g in mine.group_by("seed")]))  # fmt: skip

    a, b = np.array([mean_slope("sgd"), mean_slope("rotated_adam")]), np.array([mean_slope("adam"), mean_slope("lion")])
    want = b.mean() - a.mean()
    va, vb = a.var(ddof=1) / 2, b.var(ddof=1) / 2
    dof = (va + vb) ** 2 / (va**2 + vb**2)
    half = stats.t.ppf(0.975, dof) * np.sqrt(va + vb)
    assert row["difference"] == pytest.approx(want, rel=1e-9)
    assert (row["difference_low"], row["difference_high"]) == pytest.approx((want - half, want + half), rel=1e-6)
    assert row["method"].startswith("optimisers as the unit: Welch-Satterthwaite t over 2 vs 2 optimiser means")
    assert row["p_holm"] == row["p_value"]  # the primary keeps its raw p
    pairs = fam.filter(pl.col("role") == "secondary")
    assert sorted(pairs.get_column("family_a").to_list()) == ["per_coordinate", "rotation_equivariant",
                                                              "rotation_equivariant"]
    assert pairs.get_column("p_value").is_nan().all()  # each pair has a one-optimiser family
    assert pairs.get_column("method").str.contains("has 1 optimiser").all()
    md = (Path(rep.out) / "fits.md").read_text()
    assert "# Family differences (b − a)" in md and "per_coordinate (adam + lion)" in md and "(primary: raw p)" in md
    assert "Family differences" in (Path(rep.out) / "index.html").read_text()
    csv = pl.read_csv(Path(rep.out) / "family_comparisons.csv")
    assert csv.filter(pl.col("role") == "primary").get_column("difference").to_list() == pytest.approx([want], rel=1e-9)
    assert any(n.startswith("Primary contrast, declared before the run: per_coordinate minus every other family pooled")
               for n in rep.notes)  # fmt: skip


def test_levels_at_each_size_and_the_families_differences_in_them(tmp_path: Path) -> None:
    """What the slopes are fitted to, with intervals: each line's seed mean and t-interval at each
    size, and at each size per_coordinate (adam + lion) minus the basis-free families pooled (sgd +
    rotated_adam), the optimisers as the units, by hand from the stored rows; primary at the
    largest size only; in levels.csv, family_levels.csv, fits.md and index.html."""
    import numpy as np
    from scipy import stats

    from analysis import queries
    from analysis.load import load

    s = _family_store(tmp_path, "lev")
    specs = (FitSpec("kurtosis", over_null=True, chart=False),)
    rep = write_report(s.path, tmp_path / "rep", formats=("svg",), fit_specs=specs, n_boot=20)
    per = queries.per_trial(load(s.path), "kurtosis", over_null=True).collect()
    sizes = sorted(per.get_column("params_non_embedding").unique().to_list())
    assert rep.levels.height == 4 * len(sizes) and rep.family_levels.height == 4 * len(sizes)
    for size in sizes:
        at = per.filter(pl.col("params_non_embedding") == size)
        seeds = {o: at.filter(pl.col("optimizer") == o).get_column("value").to_numpy() for o in FAMILY_OPTIMIZERS}
        adam = rep.levels.filter(pl.col("size") == size, pl.col("optimizer") == "adam").row(0, named=True)
        half = stats.t.ppf(0.975, len(seeds["adam"]) - 1) * seeds["adam"].std(ddof=1) / np.sqrt(len(seeds["adam"]))
        assert adam["n_seeds"] == 3 and adam["mean"] == pytest.approx(seeds["adam"].mean(), rel=1e-12)
        assert (adam["ci_low"], adam["ci_high"]) == pytest.approx((adam["mean"] - half, adam["mean"] + half), rel=1e-9)
        row = rep.family_levels.filter(pl.col("size") == size, pl.col("family_b") == "per_coordinate",
                                       pl.col("family_a").str.contains(" + ", literal=True)).row(0, named=True)  # fmt: skip
        assert row["role"] == ("primary" if size == sizes[-1] else "secondary")
        a = np.array([seeds["sgd"].mean(), seeds["rotated_adam"].mean()])
        b = np.array([seeds["adam"].mean(), seeds["lion"].mean()])
        va, vb = a.var(ddof=1) / 2, b.var(ddof=1) / 2
        dof = (va + vb) ** 2 / (va**2 + vb**2)
        half = stats.t.ppf(0.975, dof) * np.sqrt(va + vb)
        want = b.mean() - a.mean()
        assert row["difference"] == pytest.approx(want, rel=1e-9)
        assert (row["difference_low"], row["difference_high"]) == pytest.approx((want - half, want + half), rel=1e-6)
    out = Path(rep.out)
    assert pl.read_csv(out / "levels.csv").height == rep.levels.height
    assert pl.read_csv(out / "family_levels.csv").get_column("difference").to_list() == pytest.approx(
        rep.family_levels.get_column("difference").to_list(), rel=1e-9)
    md = (out / "fits.md").read_text()
    assert "# Levels at each size" in md and "# Family differences in level at each size (b − a)" in md
    page = (out / "index.html").read_text()
    assert "<h2>Levels at each size</h2>" in page and "<h2>Family differences in level</h2>" in page


def test_a_family_difference_carried_by_one_optimiser_is_not_a_family_effect(tmp_path: Path) -> None:
    """adam alone grows outliers; lion and adafactor (its family) and sgd, rotated_adam and soap
    read the null; 5 seeds, tiny noise. The primary contrast (per_coordinate minus the rest
    pooled) is not a family effect in slope or in level at the largest size (p > 0.05), though
    adam against sgd is decided; every secondary p carries its Holm adjustment over all three
    tables together."""
    import numpy as np
    from statsmodels.stats.multitest import multipletests
    from synthetic_store import Synthetic

    optimizers = ("adam", "lion", "adafactor", "sgd", "rotated_adam", "soap")
    s = (Synthetic("one", seed=5).trials(optimizers=optimizers, seeds=(0, 1, 2, 3, 4))
         .planted(noise=0.01, layer_noise=0.002, exponents={"adam": 0.5, **{o: None for o in optimizers[1:]}})
         .rows(steps=(0, 10), quant=False)
         .write(tmp_path))  # fmt: skip
    specs = (FitSpec("kurtosis", over_null=True, chart=False),)
    rep = write_report(s.path, tmp_path / "rep", formats=("svg",), fit_specs=specs, n_boot=20)
    slope = rep.family_comparisons.filter(pl.col("role") == "primary").row(0, named=True)
    level = rep.family_levels.filter(pl.col("role") == "primary").row(0, named=True)
    for row in (slope, level):
        assert row["optimizers_b"] == "adafactor + adam + lion" and row["difference"] > 0
        assert row["p_value"] > 0.05, row
        assert row["method"].startswith("optimisers as the unit: Welch-Satterthwaite t over 3 vs 3 optimiser means")
    pair = rep.comparisons.filter(pl.col("a").str.starts_with("sgd"), pl.col("b").str.starts_with("adam")).row(0, named=True)
    assert pair["p_value"] < 1e-4 and pair["p_holm"] < 0.05  # the one optimiser's effect is real
    tables = (rep.comparisons, rep.family_comparisons, rep.family_levels)
    secondary = pl.concat([t.filter(pl.col("role") != "primary") if "role" in t.columns else t for t in tables],
                          how="diagonal_relaxed").filter(pl.col("p_value").is_not_nan())  # fmt: skip
    want = multipletests(secondary.get_column("p_value").to_numpy(), method="holm")[1]
    assert secondary.get_column("p_holm").to_numpy() == pytest.approx(want, rel=1e-12)
    assert np.all(want >= secondary.get_column("p_value").to_numpy())


def test_the_primary_contrast_is_a_report_option(tmp_path: Path) -> None:
    """``primary``: another family against named ones, in a named fit, or none at all (every
    test then Holm-adjusted)."""
    s = _family_store(tmp_path, "opt")
    specs = (FitSpec("kurtosis", over_null=True, chart=False), FitSpec("kurtosis", "mlp_in", "computation",
                                                                     over_null=True, chart=False))  # fmt: skip
    rep = write_report(s.path, tmp_path / "a", formats=("svg",), fit_specs=specs, n_boot=20,
                       primary="per_coordinate:fixed_random_basis@kurtosis_mlp_in_over_null")  # fmt: skip
    primary = rep.family_comparisons.filter(pl.col("role") == "primary")
    assert primary.height == 1 and primary.row(0, named=True)["fit"].startswith("kurtosis / null 3(d−1)/(d+1), MLP input")
    assert primary.row(0, named=True)["family_a"] == "fixed_random_basis"
    assert rep.family_levels.filter(pl.col("role") == "primary").height == 1
    _the_note_counts_the_other_p_values(rep)
    from synthetic_store import Synthetic

    one_each = (Synthetic().trials(sizes=(32, 64), seeds=(0, 1), optimizers=("adam", "sgd"))
                .write(tmp_path / "one"))  # no p
    untested = write_report(one_each.path, tmp_path / "d", formats=("svg",), fit_specs=specs, n_boot=20)
    assert "here with no p-value" in _the_note_counts_the_other_p_values(untested)
    none = write_report(s.path, tmp_path / "b", formats=("svg",), fit_specs=specs, n_boot=20, primary="none")
    assert (none.family_comparisons.get_column("role") == "secondary").all()
    assert any(n.startswith("No primary contrast declared") for n in none.notes)
    missing = write_report(s.path, tmp_path / "c", formats=("svg",), fit_specs=specs, n_boot=20, primary="per_coordinate@nope")
    assert any("not among the report's fits" in n for n in missing.notes)


def _the_note_counts_the_other_p_values(rep: ReportResult) -> str:
    """The declared primary's note: 'The other N p-values' is every tested comparison but the
    primary's (a primary row with no p-value, e.g. one optimiser per family, is not subtracted)."""
    note = next(n for n in rep.notes if n.startswith("Primary contrast, declared"))
    tables = (rep.comparisons, rep.family_comparisons, rep.family_levels)
    tested = [t.filter(pl.col("p_value").is_not_nan()) for t in tables if "p_value" in t.columns]
    others = sum(t.height for t in tested) - sum(t.filter(pl.col("role") == "primary").height for t in tested
                                                 if "role" in t.columns)  # fmt: skip
    assert f"The other {others} p-values" in note, (others, note)
    return note


def test_the_top1_share_is_fitted_where_recorded_and_skipped_quietly_where_not(report, tmp_path: Path) -> None:  # noqa: F811
    """The default fits include the width-honest top-1 energy share (a plain power law of the
    share at resid and mlp_in): a store that records it gets the fit and its chart; a store
    written before the metric existed gets neither, and no note about it."""
    from synthetic_store import SITE_METRICS, Synthetic

    old, _ = report
    assert not any("top1_share" in n for n in old.notes)
    assert not old.fits.get_column("fit").str.starts_with("top1_share").any()
    s = (Synthetic("share", seed=4).rows(metrics=(*SITE_METRICS, "top1_share"), steps=(0, 10), quant=False)
         .write(tmp_path))
    rep = write_report(s.path, tmp_path / "rep", formats=("svg",), n_boot=20)
    share = rep.fits.filter(pl.col("fit").str.starts_with("top1_share"))
    assert sorted(share.get_column("fit").unique().to_list()) == [
        "top1_share, MLP input (mean over blocks)", "top1_share, residual stream (mean over blocks)"]
    assert share.get_column("optimizer").unique().to_list() == ["adam"]  # sgd reads 0 here: no power law
    assert {"top1_share_resid_vs_params", "top1_share_mlp_in_vs_params"} <= set(rep.charts)


def test_a_fit_through_two_points_says_it_has_no_interval(tmp_path: Path) -> None:
    """One seed at two sizes: an exact line, no interval; the tables say "(no CI)", not [nan, nan]."""
    from synthetic_store import Synthetic

    two = (Synthetic("two", seed=2).trials(sizes=(32, 64), seeds=(0,))
           .rows(steps=(0, 10), quant=False)
           .write(tmp_path))
    rep = write_report(two.path, tmp_path / "rep", formats=("svg",), fit_specs=(FitSpec("kurtosis", over_null=True, chart=False),),
                       n_boot=20)  # fmt: skip
    assert rep.fits.height == 2 and rep.fits.get_column("exponent_low").is_nan().all()
    md = (Path(rep.out) / "fits.md").read_text()
    assert md.count("(no CI)") >= 2 and "nan" not in md.split("# Exponent differences")[0]


def test_control_excess_keeps_fits_that_offset_3_loses(tmp_path: Path) -> None:
    """At small width the no-privilege kurtosis reads 3(d-1)/(d+1) < 3: a small excess measured
    against 3 goes negative (undefined fit); against the control, and over the null, it is defined."""
    from synthetic_store import Synthetic

    small = (Synthetic("small", seed=1).trials(sizes=(16, 24, 32), optimizers=("adam",))
             .planted(amplitude=0.1, exponents={"adam": 0.3})
             .rows(steps=(0, 10))
             .write(tmp_path))  # fmt: skip
    specs = (FitSpec("kurtosis", offset=3.0, chart=False), FitSpec("kurtosis", control=True, chart=False),
             FitSpec("kurtosis", over_null=True, chart=False))  # fmt: skip
    rep = write_report(small.path, tmp_path / "rep", formats=("svg",), fit_specs=specs, n_boot=20)
    assert rep.fits.get_column("fit").to_list() == [
        "kurtosis − control, residual stream (mean over blocks)",
        "kurtosis / null 3(d−1)/(d+1), residual stream (mean over blocks)",
    ]
    assert rep.skipped.get_column("fit").to_list() == ["kurtosis − 3, residual stream (mean over blocks)"]
    fit = rep.fits.row(0, named=True)
    assert fit["exponent_low"] < 0.3 < fit["exponent_high"]  # the excess's own exponent


def test_one_seed_at_three_sizes_prints_no_p_value(tmp_path: Path) -> None:
    """Issue 23 item 3: the bootstrap over three points printed p = 0.0025 for every pair."""
    from synthetic_store import Synthetic

    one = Synthetic("one", seed=1).trials(seeds=(0,)).rows(steps=(0, 10)).write(tmp_path)
    specs = (FitSpec("kurtosis", chart=False),)
    rep = write_report(one.path, tmp_path / "rep", formats=("svg",), fit_specs=specs, n_boot=800)
    row = rep.comparisons.row(0, named=True)
    assert rep.comparisons.height == 1 and row["p_value"] != row["p_value"]  # NaN: no test
    assert row["method"].startswith("no p-value: 1 seed, 3 points vs 1 seed, 3 points")
    md = (Path(rep.out) / "fits.md").read_text()
    table = md.split("# Exponent differences")[1]
    assert "| — |" in table and "(no CI)" in table and "no p-value: 1 seed" in table
    assert "0.0025" not in table


def test_main_charts_show_best_lr_points_and_say_so(tmp_path: Path) -> None:
    from synthetic_store import Synthetic

    ladder = (Synthetic("ladder", seed=3).trials(sizes=(32, 64), seeds=(0, 1), lrs={"adam": [1e-3, 3e-3, 1e-2], "sgd": [0.1, 0.3]})
              .rows(steps=(0, 50, 100))
              .write(tmp_path))  # fmt: skip
    rep = write_report(ladder.path, tmp_path / "rep", formats=("svg",), n_boot=20)
    assert "best-lr points" in rep.captions["kurtosis_resid_over_null_vs_params"]
    assert "best lr" in rep.captions["kurtosis_vs_loss"]
    best = pl.read_csv(tmp_path / "rep" / "best_lr.csv")
    assert best.height == 4 and set(best.filter(pl.col("optimizer") == "sgd").get_column("edge")) == {"high"}
    # fits run over the best-lr points only: 2 sizes x 2 seeds per line, one lr each
    raw = rep.fits.filter(pl.col("fit").str.starts_with(RESID_OVER_NULL))
    assert raw.height == 2 and set(raw.get_column("n").to_list()) == {4}
    assert any("lr=0.003" in c for c in raw.get_column("config"))
    sgd_label = raw.filter(pl.col("optimizer") == "sgd").get_column("config").item()  # a bound, named in the fit
    assert sgd_label.endswith("lr=0.3 (not tuned at d_model 32: best at the largest lr tried; "
                              "d_model 64: best at the largest lr tried)"), sgd_label
    assert "not tuned" not in raw.filter(pl.col("optimizer") == "adam").get_column("config").item()
    index = (tmp_path / "rep" / "index.html").read_text()
    assert "Best learning rates" in index and "edge: largest lr tried" in index
    assert "Runner-up (+loss, shared seeds)" in index and "2 seeds)" in index  # 2 seeds at every lr here
    assert {"runner_up_margin", "shared_seeds"} <= set(best.columns) and set(best["shared_seeds"]) == {2}
    flagged = [n for n in rep.notes if "best-lr choices are flagged" in n]  # each bound named where it is read
    assert len(flagged) == 1 and flagged[0].startswith("3 of 4 "), rep.notes  # sgd at both sizes, one adam tie
    assert len(re.findall(r"sgd at [\d.]+k? \(edge: largest lr tried[^)]*, lr 0\.3\)", flagged[0])) == 2, flagged
    assert len(re.findall(r"adam at [\d.]+k? \([^)]*tie with", flagged[0])) == 1, flagged
    # the best lr against size: lr_fit.csv with the columns a spec's lr_scaling takes
    lr_fit = pl.read_csv(tmp_path / "rep" / "lr_fit.csv")
    assert lr_fit.get_column("optimizer").to_list() == ["adam", "sgd"]
    assert {"reference_params", "lr_at_reference", "exponent", "exponent_lo", "exponent_hi", "n_sizes", "note"} <= set(lr_fit.columns)
    adam = lr_fit.row(0, named=True)
    assert adam["exponent"] == pytest.approx(0.0, abs=1e-9) and adam["lr_at_reference"] == pytest.approx(3e-3)
    assert adam["n_sizes"] == 2 and "2 sizes: no interval" in adam["note"]
    assert "edge of ladder" in lr_fit.row(1, named=True)["note"]  # sgd's best is its largest lr
    assert "# Best lr against size" in (tmp_path / "rep" / "fits.md").read_text()
    assert "lr_vs_params" in rep.charts and any("lr_fit.csv" in n for n in rep.notes)
    assert re.search(r"adam [^:]*: b = -?0\.00, lr0 = 0\.003 at N0 = [\d,]+ \(2 sizes: no interval\)", rep.captions["lr_vs_params"])


def test_one_lr_beside_ladders_is_flagged_where_it_is_read(tmp_path: Path) -> None:
    """Issue 33: a width or optimiser run at one lr in a store of ladders read as tuned in the fits."""
    from synthetic_store import Synthetic

    mixed = (Synthetic("mixed", seed=3).trials(sizes=(32, 64), seeds=(0,), lrs={"adam": [1e-3, 3e-3, 1e-2]})
             .rows(steps=(0, 100))
             .write(tmp_path))  # fmt: skip
    specs = (FitSpec("kurtosis", chart=False),)
    rep = write_report(mixed.path, tmp_path / "rep", formats=("svg",), fit_specs=specs, n_boot=20)
    flagged = [n for n in rep.notes if "best-lr choices are flagged" in n]
    assert len(flagged) == 1 and len(re.findall(r"sgd at [\d.]+k? \(untuned \(one lr\)", flagged[0])) == 2, rep.notes
    sgd = rep.fits.filter(pl.col("optimizer") == "sgd").get_column("config").item()
    assert sgd.endswith("(not tuned at d_model 32: one lr; d_model 64: one lr)"), sgd


def test_report_never_pools_configs_that_differ_in_one_hyper_parameter(twins, tmp_path: Path) -> None:  # noqa: F811
    rep = write_report(twins, tmp_path / "rep", formats=("svg",), n_boot=20,
                       fit_specs=(FitSpec("kurtosis"), FitSpec("kurtosis", control=True, chart=False)))  # fmt: skip
    raw = rep.fits.filter(pl.col("fit").str.starts_with("kurtosis, residual"))
    assert raw.height == 4  # momentum 0.9 / 0.5, groups [[0,1],[2,3]] / [[0,2],[1,3]]
    assert set(raw.get_column("n").to_list()) == {4}  # 2 sizes x 2 seeds each
    configs = " | ".join(raw.get_column("config"))
    assert "momentum=0.5" in configs and "momentum=0.9" in configs and "None" not in configs
    assert "groups[[0,1],[2,3]]" in configs and "groups[[0,2],[1,3]]" in configs
    assert "4 (2 sizes × 2 seeds)" in (tmp_path / "rep" / "fits.md").read_text()


def test_markdown_latex_and_index(report) -> None:
    rep, _ = report
    out = Path(rep.out)
    md = (out / "fits.md").read_text()
    assert md.startswith("# Power-law fits") and "| Fit | Config | Exponent [CI]" in md
    assert "adam · layernorm · none" in md and "| Interval |" in md and "(3 sizes × 3 seeds)" in md
    tex = (out / "fits.tex").read_text()
    assert r"\begin{tabular}" in tex and r"\bottomrule" in tex
    assert "final\\_val\\_loss" in tex and "kurtosis_" not in tex  # escaped
    assert "×" not in tex and r"$\times$" in tex
    index = (out / "index.html").read_text()
    assert index.count("<svg") == len(CHARTS)  # charts inlined: the page stands alone
    assert "Power-law fits" in index and "<table>" in index
    assert "rotate_residual_basis" in index  # invariance checks summarised
    assert "href='kurtosis_by_layer.png'" in index


def test_progress_is_reported(report) -> None:
    _, messages = report
    assert messages[0].startswith("18 trials") or messages[0].startswith("loading")
    assert any(m.startswith(f"rendering {len(CHARTS)} charts") for m in messages)
    assert messages[-1].startswith("report written to")


def test_failed_trials_and_missing_checks(messy_store, tmp_path: Path) -> None:  # noqa: F811
    rep = write_report(
        messy_store.path,
        tmp_path / "r",
        formats=("svg",),
        n_boot=50,
        fit_specs=(FitSpec("kurtosis", offset=3.0),),
    )
    assert (rep.n_failed, rep.n_diverged) == (1, 1)
    assert rep.n_done == messy_store.n_done
    assert any("1 failed and 1 diverged" in n for n in rep.notes)
    assert any("No invariance checks" in n for n in rep.notes)
    index = (tmp_path / "r" / "index.html").read_text()
    assert "Excluded trials (2)" in index and "CUDA out of memory" in index
    assert "No invariance checks recorded" in index
    # failed trials never reach a fit
    assert rep.fits.get_column("n").drop_nulls().max() <= 3 * 3


def test_single_size_skips_fits_gracefully(single_size_store, tmp_path: Path) -> None:  # noqa: F811
    rep = write_report(single_size_store.path, formats=("png",), n_boot=50)
    out = Path(single_size_store.path) / "report"  # the default output folder
    assert rep.out == str(out)
    assert any("Only one model size" in n for n in rep.notes)
    assert rep.fits.height == 0
    names = {p.name for p in out.iterdir()}
    assert "fits.csv" not in names and "kurtosis_resid_over_null_vs_params.png" in names
    assert "Only one model size" in (out / "index.html").read_text()


def test_html_pdf_and_json_formats(store, tmp_path: Path) -> None:  # noqa: F811
    spec = (FitSpec("final_val_loss", site=None),)
    rep = write_report(store.path, tmp_path, formats=("html", "pdf", "json"), fit_specs=spec, n_boot=20)
    html = (tmp_path / "final_val_loss_vs_params.html").read_text()
    assert "<html" in html and "vega" in html.lower()
    assert (tmp_path / "final_val_loss_vs_params.pdf").read_bytes().startswith(b"%PDF")
    assert '"$schema"' in (tmp_path / "kurtosis_by_layer.json").read_text()
    assert len(rep.charts["kurtosis_by_layer"]) == 3


def test_bad_format_is_a_value_error(store) -> None:  # noqa: F811
    with pytest.raises(ValueError, match="unknown format"):
        write_report(store.path, formats=("gif",))


def test_default_fit_specs_are_named() -> None:
    assert [s.name for s in DEFAULT_FITS] == [
        "kurtosis_resid_over_null",
        "kurtosis_mlp_in_over_null",
        "top1_share_resid",
        "top1_share_mlp_in",
        "outlier_dims_rel_attn_in_fraction",
        "outlier_dims_rel_mlp_in_fraction",
        "final_val_loss",
    ]
    charted = [s.name for s in DEFAULT_FITS if s.chart]
    assert len(charted) == len(set(charted))  # one chart file each
    assert DEFAULT_FITS[0].label.startswith(RESID_OVER_NULL)
    assert not any(s.control for s in DEFAULT_FITS)  # the control's excess is undefined for null configs


def test_fits_do_not_depend_on_the_order_rows_are_read_in(store) -> None:  # noqa: F811
    """The bootstrap resamples rows by position: the report fixes their order first, so
    the same store gives the same fits however Parquet files and group_by order the rows."""
    import dataclasses

    from polars.testing import assert_frame_equal

    from analysis.load import load
    from analysis.report.content import build

    results = load(store.path)
    shuffled = dataclasses.replace(
        results,
        runs=results.runs.collect().sample(fraction=1.0, shuffle=True, seed=1).lazy(),
        metrics=results.metrics.collect().sample(fraction=1.0, shuffle=True, seed=2).lazy(),
    )
    a, b = build(results, n_boot=200).fits, build(shuffled, n_boot=200).fits
    assert a.height > 0
    assert_frame_equal(a, b, check_exact=False, rel_tol=1e-9)


def test_sharing_sweep_gets_the_group_size_chart(tmp_path: Path) -> None:
    """A sweep over rotation group sizes (ends rotated and not) gets kurtosis against group size."""
    from synthetic_store import Synthetic

    rots = ["none", ("partial", 1), ("partial", 2), ("partial", 1, False), ("partial", 2, False)]
    s = (Synthetic("sharing").trials(sizes=(64,), n_layers=2, optimizers=("adam",), seeds=(0, 1), rotations=rots)
         .planted(sharing=True)
         .rows(steps=(0, 10), quant=False)
         .write(tmp_path))  # fmt: skip
    rep = write_report(s.path, tmp_path / "rep", formats=("svg",), n_boot=20)
    assert "kurtosis_vs_group_size" in rep.charts
    assert "share one basis" in rep.captions["kurtosis_vs_group_size"]
    assert "kurtosis_by_family" not in rep.charts and "kurtosis_vs_params" not in rep.charts  # one size


def test_one_family_still_gets_raw_kurtosis_against_size_with_its_null(tmp_path: Path) -> None:
    from synthetic_store import Synthetic

    s = (Synthetic("adam").trials(sizes=(32, 64), optimizers=("adam",), seeds=(0,))
         .rows(steps=(0, 10), quant=False)
         .write(tmp_path))
    rep = write_report(s.path, tmp_path / "rep", formats=("svg",), n_boot=20)
    assert "kurtosis_vs_params" in rep.charts and "kurtosis_by_family" not in rep.charts
    svg = (tmp_path / "rep" / "kurtosis_vs_params.svg").read_text()
    assert "null 3(d−1)/(d+1)" in svg


def test_the_quantisation_note_reads_the_eval_batch_floor_where_it_was_recorded(tmp_path) -> None:
    """Was: the report's metric pass kept quant_loss_delta only, so every store read 'no eval-batch
    floor recorded' though trials since study.quant writes quant_loss_delta_se beside it."""
    from synthetic_store import Synthetic

    s = (Synthetic("floor").trials(sizes=(32, 64), seeds=(0, 1))
         .rows(steps=(0, 10), quant_se=True)
         .write(tmp_path))
    rep = write_report(s.path, tmp_path / "out", formats=("svg",), n_boot=50)
    notes = [n for n in rep.notes if n.startswith(("W8A8", "W4A4"))]
    assert len(notes) == 2 and all("eval-batch floor (2 SE" in n for n in notes), notes
