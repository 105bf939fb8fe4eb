"""analysis.charts.ladders: final val loss against lr per ladder, one panel per size, the best of
each ladder marked (a square where it is at the edge), crosses where every seed diverged; and
the report's lr section drawing it."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import chart_rows
from analysis import queries, selection
from analysis.charts.ladders import lr_ladders
from analysis.load import load
from synthetic_store import Synthetic

LRS = {"adam": [1e-3, 3e-3, 1e-2], "sgd": [0.03, 0.1, 0.3], "lion": [3e-4]}


@pytest.fixture(scope="module")
def ladders(tmp_path_factory: pytest.TempPathFactory):
    truth = (Synthetic().trials(sizes=(32, 64), seeds=(0, 1, 2), optimizers=("adam", "sgd", "lion"), lrs=LRS)
             .planted(best_lrs={"adam": 3e-3, "sgd": 1.0, "lion": 3e-4})
             .rows(steps=(0, 10, 20), curves=False)
             .write(tmp_path_factory.mktemp("ladders")))
    results = load(truth.path)
    return results, queries.loss_table(results).collect(), selection.best_lr(results)


def test_each_ladder_marks_its_best_and_an_edge_best_differently(ladders) -> None:
    _, table, best = ladders
    rows = [r for r in chart_rows(lr_ladders(table, best)) if r["kind"] == "point"]
    assert {r["optimizer"] for r in rows} == {"adam", "sgd"}  # lion's one-lr ladder has no shape to show
    marks = {(r["optimizer"], r["facet"], r["lr_x"]): r["mark"] for r in rows}
    for facet in {r["facet"] for r in rows}:
        assert marks[("adam", facet, 3e-3)] == "best" and marks[("adam", facet, 1e-3)] == "other"
        assert marks[("sgd", facet, 0.3)] == "best, at an edge"  # planted best 1.0: beyond the ladder
    chosen = sorted((r["optimizer"], r["facet"]) for r in rows if r["mark"].startswith("best"))
    assert chosen == sorted(set(chosen)) and len(chosen) == best.filter(pl.col("n_lrs") > 1).height  # one per ladder


def test_one_panel_per_size_smallest_first_and_an_lr_axis_in_plain_decimals(ladders) -> None:
    _, table, best = ladders
    spec = lr_ladders(table, best).to_dict(validate=False)
    assert spec["facet"]["column"]["sort"] == sorted({r["facet"] for r in chart_rows(lr_ladders(table, best))},
                                                     key=lambda s: float(s.split("k")[0]))
    axis = spec["spec"]["layer"][0]["encoding"]["x"]["axis"]
    assert axis["format"] == "~g" and 0.001 in axis["values"] and 0.1 in axis["values"]
    assert "Filled circle: the ladder's best lr" in " ".join(spec["title"]["subtitle"])


def test_a_config_whose_every_seed_diverged_is_a_cross_at_the_top(ladders) -> None:
    _, table, best = ladders
    adam = table.filter((pl.col("optimizer") == "adam") & (pl.col("lr") == 1e-2)).head(1)
    gone = adam.select("tuning_id", "optimizer", "params_non_embedding", "d_model", "norm", "rotation",
                       lr=pl.lit(3e-2))
    rows = chart_rows(lr_ladders(table, best, gone))
    cross = [r for r in rows if r["kind"] == "diverged"]
    assert len(cross) == 1 and cross[0]["lr_x"] == 3e-2 and cross[0]["mark"] == "diverged"
    assert cross[0]["y_cross"] == pytest.approx(max(r["ci_high"] for r in rows if r["kind"] == "point"))
    assert "every seed diverged there" in " ".join(lr_ladders(table, best, gone).to_dict(validate=False)["title"]["subtitle"])


def test_an_lr_far_above_its_ladder_s_best_is_a_triangle_at_best_plus_y_span(ladders) -> None:
    """Before: d_model 128 Adam's lr 0.03 (2.646 against a best of 1.428) stretched the y axis so
    the 0.01-nat differences near every optimum were invisible."""
    _, table, best = ladders
    bad = (pl.col("optimizer") == "adam") & (pl.col("lr") == 1e-2)
    worse = table.with_columns(**{c: pl.when(bad).then(pl.col(c) + 5.0).otherwise(pl.col(c)) for c in ("mean", "ci_low", "ci_high")})
    rows = [r for r in chart_rows(lr_ladders(worse, best)) if r["kind"] == "point"]
    for r in rows:
        ladder_best = min(x["loss"] for x in rows if x["optimizer"] == r["optimizer"] and x["facet"] == r["facet"])
        if r["optimizer"] == "adam" and r["lr_x"] == 1e-2:
            assert r["mark"] == "above" and r["mean"] == pytest.approx(ladder_best + 0.5) and r["loss"] > ladder_best + 5
            assert r["ci_high"] == pytest.approx(ladder_best + 0.5)
        else:  # the synthetic ladders have far points of their own (sgd's planted best lies beyond its ladder)
            assert (r["mark"] == "above") == (r["loss"] > ladder_best + 0.5)
            assert r["mean"] == pytest.approx(min(r["loss"], ladder_best + 0.5))
    spec = lr_ladders(worse, best).to_dict(validate=False)
    assert "hollow triangle: a loss more than 0.5 nats above its ladder's best, drawn at that level with its value" in " ".join(
        spec["title"]["subtitle"])
    labels = [lay for lay in spec["spec"]["layer"] if lay["mark"]["type"] == "text"]
    assert labels and labels[0]["encoding"]["text"]["field"] == "loss"  # the true value, printed at the triangle
    uncapped = [r for r in chart_rows(lr_ladders(worse, best, y_span=None)) if r["kind"] == "point"]
    assert all(r["mark"] != "above" and r["mean"] == r["loss"] for r in uncapped)
    assert "triangle" not in " ".join(lr_ladders(table, best, y_span=10.0).to_dict(validate=False)["title"]["subtitle"])


def test_the_report_draws_the_ladders_only_where_a_ladder_has_two_lrs(tmp_path) -> None:
    from analysis.report.content import build

    laddered = (Synthetic().trials(sizes=(32,), seeds=(0,), optimizers=("adam",), lrs={"adam": [1e-3, 3e-3]})
                .rows(steps=(0, 10, 20), curves=False)
                .write(tmp_path / "a"))
    assert "lr_ladders" in build(load(laddered.path)).charts
    single = (Synthetic().trials(sizes=(32,), seeds=(0,), optimizers=("adam",))
              .rows(steps=(0, 10, 20), curves=False)
              .write(tmp_path / "b"))
    assert "lr_ladders" not in build(load(single.path)).charts
