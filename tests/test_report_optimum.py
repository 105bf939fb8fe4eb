"""The report's optimum section (analysis.report.optimum): its tables, chart and notes on a store of
lr ladders with a rotated twin; nothing on a store without ladders."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from synthetic_store import Synthetic

from analysis.load import load
from analysis.report import content, optimum, write_report


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory):
    ladder = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
    return (Synthetic("twins", seed=5)
            .trials(sizes=(32, 64), seeds=(0, 1, 2), optimizers=("adam", "rotated_adam", "sgd"),
                    lrs={"adam": ladder, "rotated_adam": ladder, "sgd": [0.1, 0.3, 1.0]})
            .planted(best_lrs={"adam": 3e-3, "rotated_adam": 3e-3, "sgd": 0.3}, lr_penalty=0.5,
                     exponents={"adam": 0.5, "rotated_adam": None, "sgd": None})
            .rows(steps=(0, 10), quant=False, basis_test=True)
            .write(tmp_path_factory.mktemp("t")))  # fmt: skip


def test_the_section_fills_its_tables_chart_and_notes(twins) -> None:
    c = content.build(load(twins.path), n_boot=100, sections=[optimum.SECTION])
    assert c.optimum.height == 6 and set(c.optimum.get_column("flag")) <= {"", "edge"}
    assert {"lr_star", "lr_star_low", "lr_star_high", "kurtosis_over_null", "kurtosis_over_null_low",
            "top1_share_over_null", "tokens_per_param"} <= set(c.optimum.columns)  # fmt: skip
    slopes = c.optimum_slopes
    assert set(slopes.get_column("optimizer")) == {"adam", "rotated_adam", "sgd", "adam − rotated_adam"}
    # the primary contrast's trend: the slope of the twins' difference is the difference of their slopes
    k = slopes.filter(pl.col("measure") == "kurtosis / null")
    one = dict(zip(k.get_column("optimizer"), k.get_column("slope"), strict=True))
    assert one["adam − rotated_adam"] == pytest.approx(one["adam"] - one["rotated_adam"], abs=1e-12)
    assert "tokens_per_param" in c.optimum_slopes.columns
    # beside each slope and level, the interpolated reading: the same rows, the same verdict rule
    assert {"slope_interpolated", "slope_low_interpolated", "decision_interpolated"} <= set(slopes.columns)
    assert {"kurtosis_over_null_interpolated", "top1_share_raw_interpolated"} <= set(c.optimum.columns)
    assert slopes.get_column("slope_interpolated").is_finite().sum() == slopes.get_column("slope").is_finite().sum()
    assert any(n.startswith("Read by interpolation between the two measured rungs") for n in c.notes)
    assert list(c.charts) == ["level_along_ladder", "level_at_optimum"]
    # the twin: adam minus rotated_adam, paired over the 3 seeds at one lr both ran, exact p >= 2/8
    tw = c.twins
    assert tw.height == 2 and set(tw.get_column("twin")) == {"rotated_adam"}
    assert (tw.get_column("n_seeds") == 3).all() and (tw.get_column("p_sign_flip") >= 2 / 8).all()
    assert (tw.get_column("difference") > 0).all()  # the planted excess: adam only
    assert set(slopes.get_column("measure")) == {"kurtosis / null", "top-1 share / null", "top-1 share (raw)"}
    assert {"top1_share_raw", "top1_share_raw_low", "top1_share_raw_high"} <= set(c.optimum.columns)
    assert any(n.startswith("Slopes of log(level / null)") and "(raw) rows are width-free" in n for n in c.notes)
    assert any(n.startswith("The primary contrast, each per-coordinate optimiser minus its rotated twin") for n in c.notes)
    # per_coordinate (adam alone here) against the rest at each width: a permutation over 3 optimisers
    fam = c.optimum_families.filter(pl.col("measure") == "kurtosis / null")
    assert fam.height == 2 and (fam.get_column("p_exact") >= 1 / 3).all()


def test_the_report_writes_the_tables(twins, tmp_path: Path) -> None:
    rep = write_report(twins.path, tmp_path / "rep", formats=("svg",), n_boot=50)
    for name in ("optimum", "optimum_slopes", "optimum_families", "twins"):
        assert (tmp_path / "rep" / f"{name}.csv").stat().st_size > 100
    assert "level_along_ladder" in rep.charts
    fl = rep.family_levels
    assert {"p_exact", "p_exact_holm"} <= set(fl.columns)


def test_no_ladder_no_section(tmp_path: Path) -> None:
    s = (Synthetic("flat", seed=1).trials(sizes=(32, 64), seeds=(0, 1))
         .rows(steps=(0, 10), quant=False)
         .write(tmp_path))
    c = content.build(load(s.path), n_boot=20, sections=[optimum.SECTION])
    assert c.optimum.height == 0 and not c.charts and not c.twins.height


def test_the_slope_note_prints_no_empty_interval() -> None:
    """A one-seed slope has no interval: the note gives the slope and why, never "[+nan, +nan]"."""
    from analysis.width_trend import ONE_SEED

    rows = [{"optimizer": "adam", "parametrization": p, "measure": "kurtosis / null", "slope": 0.74, "slope_low": lo,
             "slope_high": hi, "decision": d, "tokens_per_param": "d 64: 10.0; d 128: 10.0"}
            for p, lo, hi, d in (("sp", float("nan"), float("nan"), ONE_SEED), ("mup", 0.5, 0.9, "grows"))]
    note = optimum.slope_note(pl.from_dicts(rows))
    assert "nan" not in note.lower()
    assert f"adam · sp (kurtosis / null): +0.740 {ONE_SEED}" in note
    assert "adam · mup (kurtosis / null): +0.740 [+0.500, +0.900] grows" in note
