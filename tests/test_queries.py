"""analysis.queries on a hand-computable store: seed aggregation, CIs, final steps, SQL."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
from analysis_fixtures import store  # noqa: F401  (fixture)

from analysis import queries as q
from analysis._stats import t_critical
from analysis.load import METRICS_SCHEMA, RUNS_SCHEMA, load

T1 = 12.706204736  # t(0.975, 1 dof)


def _run(trial: str, optimizer: str, seed: int, status: str = "done", **kw) -> dict:
    row = {c: None for c in RUNS_SCHEMA}
    row.update(
        trial_id=trial, sweep="hand", status=status, optimizer=optimizer, norm="layernorm",
        rotation="none", lr=0.001, seed=seed, d_model=8, n_layers=2, n_heads=1, d_mlp=32,
        params=1000, params_non_embedding=800, final_val_loss=kw.pop("loss", 3.0),
    )  # fmt: skip
    row.update(kw)
    return row


@pytest.fixture(scope="module")
def hand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """adam seeds 0,1 (done) and 2 (failed, with garbage metrics), sgd seed 0.
    resid/stored kurtosis at step 10 (final), layers 0..2:
        t1 (adam s0): 3, 4, 6      t2 (adam s1): 3, 6, 10     t4 (sgd): 3, 3, 3
    every layer reads 3 at step 0; t3 (failed) reads 100 everywhere."""
    sweep = tmp_path_factory.mktemp("r") / "hand"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "metrics").mkdir()
    runs = [
        _run("t1", "adam", 0, loss=3.0),
        _run("t2", "adam", 1, loss=3.4),
        _run("t3", "adam", 2, status="failed", error="boom"),
        _run("t4", "sgd", 0, loss=3.2),
    ]
    pl.DataFrame(runs, schema=RUNS_SCHEMA).write_parquet(sweep / "runs" / "part.parquet")
    final = {"t1": [3.0, 4.0, 6.0], "t2": [3.0, 6.0, 10.0], "t3": [100.0] * 3, "t4": [3.0] * 3}
    rows = []
    for trial, values in final.items():
        for layer, v in enumerate(values):
            for step, value in ((0, 3.0), (10, v)):
                rows.append((trial, step, step * 100, layer, "resid", "stored", "kurtosis", value))
                rows.append((trial, step, step * 100, layer, "resid", "random", "kurtosis", 3.0))
                if layer:
                    rows.append(
                        (trial, step, step * 100, layer, "mlp_in", "computation", "kurtosis", value + 1)
                    )
    # t2 has one extra, later eval of another metric only: final step is per metric selection
    rows.append(("t2", 20, 2000, 1, "resid", "stored", "max_abs", 7.0))
    pl.DataFrame(rows, schema=METRICS_SCHEMA, orient="row").write_parquet(
        sweep / "metrics" / "part.parquet"
    )
    return sweep


def _row(frame: pl.DataFrame, **eq) -> dict:
    sel = frame.filter(*[pl.col(k) == v for k, v in eq.items()])
    assert sel.height == 1, sel
    return sel.row(0, named=True)


def test_t_critical_matches_tables() -> None:
    for dof, want in ((1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042)):
        assert t_critical(dof) == pytest.approx(want, abs=1e-3)
    assert t_critical(4, 0.99) == pytest.approx(4.604, abs=1e-3)
    assert math.isnan(t_critical(0))


def test_layer_profile_aggregates_seeds_at_final_step(hand: Path) -> None:
    prof = q.layer_profile(load(hand), "kurtosis").collect()
    assert isinstance(q.layer_profile(load(hand), "kurtosis"), pl.LazyFrame)
    r = _row(prof, optimizer="adam", layer=1)
    assert r["n"] == 2  # the failed seed is excluded
    assert r["mean"] == pytest.approx(5.0)
    assert r["std"] == pytest.approx(math.sqrt(2))
    assert r["ci_low"] == pytest.approx(5.0 - T1)
    assert r["ci_high"] == pytest.approx(5.0 + T1)
    assert r["step"] == 10 and r["depth"] == pytest.approx(0.5)
    assert _row(prof, optimizer="adam", layer=2)["mean"] == pytest.approx(8.0)
    sgd = _row(prof, optimizer="sgd", layer=2)
    assert sgd["n"] == 1 and sgd["mean"] == 3.0 and sgd["ci_low"] is None
    assert prof.height == 6  # 2 configs x 3 layers


def test_layer_profile_at_a_given_step(hand: Path) -> None:
    prof = q.layer_profile(load(hand), "kurtosis", step=0).collect()
    assert prof.get_column("mean").to_list() == [3.0] * 6
    assert prof.get_column("std").to_list()[0] == 0.0


def test_scale_table_mean_and_max_over_blocks(hand: Path) -> None:
    r = load(hand)
    mean = _row(q.scale_table(r, "kurtosis").collect(), optimizer="adam")
    # blocks 1..2 (embeddings excluded): t1 -> 5, t2 -> 8
    assert mean["mean"] == pytest.approx(6.5)
    assert mean["std"] == pytest.approx(math.sqrt(4.5))
    assert mean["n"] == 2 and mean["params"] == 1000 and mean["params_non_embedding"] == 800
    mx = _row(q.scale_table(r, "kurtosis", layer_agg="max").collect(), optimizer="adam")
    assert mx["mean"] == pytest.approx(8.0)  # (6 + 10) / 2
    every = _row(q.scale_table(r, "kurtosis", layers="all").collect(), optimizer="adam")
    assert every["mean"] == pytest.approx(((3 + 4 + 6) / 3 + (3 + 6 + 10) / 3) / 2)
    only2 = _row(q.scale_table(r, "kurtosis", layers=[2]).collect(), optimizer="adam")
    assert only2["mean"] == pytest.approx(8.0)
    comp = _row(q.scale_table(r, "kurtosis", "mlp_in", "computation").collect(), optimizer="adam")
    assert comp["mean"] == pytest.approx(7.5)
    with pytest.raises(ValueError, match="layers"):
        q.scale_table(r, "kurtosis", layers="odd")


def test_final_step_is_per_selection(hand: Path) -> None:
    """t2's later max_abs eval does not hide its kurtosis at step 10."""
    per = q.per_trial(load(hand), "kurtosis").collect()
    assert sorted(per.get_column("trial_id").to_list()) == ["t1", "t2", "t4"]
    assert set(per.get_column("step").to_list()) == {10}


def test_metric_over_training(hand: Path) -> None:
    over = q.metric_over_training(load(hand), "kurtosis").collect()
    adam = over.filter(pl.col("optimizer") == "adam").sort("step")
    assert adam.get_column("step").to_list() == [0, 10]
    assert adam.get_column("tokens").to_list() == [0.0, 1000.0]
    assert adam.get_column("mean").to_list() == pytest.approx([3.0, 6.5])


def test_basis_comparison_long_format(hand: Path) -> None:
    bc = q.basis_comparison(load(hand)).collect()
    adam1 = bc.filter((pl.col("optimizer") == "adam") & (pl.col("layer") == 1))
    by_series = dict(zip(adam1.get_column("series"), adam1.get_column("mean"), strict=True))
    assert by_series == pytest.approx(
        {
            "residual, stored basis": 5.0,
            "residual, random basis": 3.0,
            "MLP input, computation basis": 6.0,
        }
    )


def test_loss_table(hand: Path) -> None:
    lt = q.loss_table(load(hand)).collect()
    assert _row(lt, optimizer="adam")["mean"] == pytest.approx(3.2)
    assert _row(lt, optimizer="sgd")["n"] == 1


def test_queries_accept_prejoined_frames(hand: Path) -> None:
    r = load(hand)
    joined = r.metrics.join(r.done_runs(), on="trial_id")
    a = q.scale_table(joined, "kurtosis").collect()
    b = q.scale_table(r, "kurtosis").collect()
    assert a.select("optimizer", "mean").equals(b.select("optimizer", "mean"))
    c = q.scale_table(r.metrics, "kurtosis", runs=r.runs).collect()
    assert c.select("optimizer", "mean").equals(b.select("optimizer", "mean"))
    with pytest.raises(q.QueryError, match="no config columns"):
        q.scale_table(r.metrics, "kurtosis").collect()
    custom = q.scale_table(r, "kurtosis", by=["optimizer"]).collect()
    assert custom.columns[:2] == ["optimizer", "mean"]
    with pytest.raises(q.QueryError, match="unknown columns"):
        q.scale_table(r, "kurtosis", by=["nope"])


def test_sql(hand: Path) -> None:
    df = q.sql(load(hand), "SELECT optimizer, count(*) AS n FROM done_runs GROUP BY optimizer ORDER BY optimizer")
    assert df.rows() == [("adam", 2), ("sgd", 1)]
    joined = q.sql(
        hand,  # a path works too
        """SELECT r.optimizer, avg(m.value) AS k FROM metrics m JOIN runs r ON m.trial_id = r.trial_id
           WHERE r.status = 'done' AND m.metric = 'kurtosis' AND m.site = 'resid'
             AND m.basis = 'stored' AND m.step = 10 AND m.layer > 0
           GROUP BY r.optimizer ORDER BY r.optimizer""",
    )
    assert joined.get_column("k").to_list() == pytest.approx([6.5, 3.0])
    assert q.sql(hand, "SELECT count(*) AS n FROM checks").item() == 0  # missing table: empty


def test_sql_errors_name_tables_and_columns(hand: Path) -> None:
    with pytest.raises(q.QueryError) as info:
        q.sql(load(hand), "SELECT nope FROM runs")
    msg = str(info.value)
    assert msg.startswith("query failed:")
    assert "metrics: trial_id, step" in msg
    assert "Resolved plan" not in msg
    with pytest.raises(ValueError):
        q.sql(load(hand), "SELEKT nonsense")


def test_synthetic_store_queries_are_consistent(store) -> None:  # noqa: F811
    """On the fixture store: sgd reads ~3 everywhere, adam's block mean matches the model."""
    r = load(store.path)
    tab = q.scale_table(r, "kurtosis").collect()
    assert tab.height == 6 and set(tab.get_column("n").to_list()) == {3}
    sgd = tab.filter(pl.col("optimizer") == "sgd").get_column("mean").to_list()
    assert sgd == pytest.approx([3.0] * 3, abs=1e-2)
    adam = tab.filter(pl.col("optimizer") == "adam").sort("params_non_embedding")
    for p, m in zip(adam.get_column("params_non_embedding"), adam.get_column("mean"), strict=True):
        assert m - 3 == pytest.approx(store.expected_excess("adam", p), rel=0.2)
