"""analysis.queries on a hand-computable store: seed aggregation, CIs, final steps, SQL."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
from scipy import stats
from analysis_fixtures import store, twins  # noqa: F401  (fixtures)

from analysis import queries as q
from analysis import selection as sel
from analysis.power_law import t_critical
from analysis.load import METRICS_SCHEMA, RUNS_SCHEMA, load
from analysis.query_base import prepare_runs

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
    with pytest.raises(q.QueryError, match="no config_id column"):
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
    for statement in ("DROP TABLE runs", "  delete from metrics", "CREATE TABLE x AS SELECT * FROM runs",
                      "TRUNCATE TABLE curves"):  # fmt: skip
        with pytest.raises(q.QueryError, match="read-only views of the store"):
            q.sql(hand, statement)
    assert q.sql(hand, "SELECT count(*) AS n FROM runs").item() == 4  # nothing dropped


def test_synthetic_store_queries_are_consistent(store) -> None:  # noqa: F811
    """On the fixture store: sgd reads the exact null 3(d-1)/(d+1) everywhere, and so does the
    random-basis control; adam's block-mean excess over the control matches the model."""
    r = load(store.path)
    tab = q.scale_table(r, "kurtosis").collect()
    assert tab.height == 6 and set(tab.get_column("n").to_list()) == {3}
    sgd = tab.filter(pl.col("optimizer") == "sgd")
    control = [3 * (d - 1) / (d + 1) for d in sgd.get_column("d_model")]
    assert sgd.get_column("mean").to_list() == pytest.approx(control, abs=1e-2)
    assert min(control) < 2.9  # below 3 at small width: why excess is measured against the null
    excess = q.scale_table(r, "kurtosis", control=q.CONTROL).collect()
    adam = excess.filter(pl.col("optimizer") == "adam").sort("params_non_embedding")
    for p, m in zip(adam.get_column("params_non_embedding"), adam.get_column("mean"), strict=True):
        assert m == pytest.approx(store.expected_excess("adam", p), rel=0.2)
    sgd_excess = excess.filter(pl.col("optimizer") == "sgd").get_column("mean").to_list()
    assert sgd_excess == pytest.approx([0.0] * 3, abs=2e-3)


# ---------------------------------------------------------------- one config identity


def test_configs_differing_in_one_hyper_parameter_are_never_averaged(twins: Path) -> None:  # noqa: F811
    r = load(twins)
    tab = q.scale_table(r, "kurtosis").collect()
    assert tab.height == 8  # 4 configs x 2 sizes, never pooled
    assert set(tab.get_column("n").to_list()) == {2}  # the two seeds of each
    small = tab.filter(pl.col("d_model") == 32).get_column("mean")
    assert sorted(round(m, 6) for m in small) == [3.05, 5.05, 7.05, 11.05]  # never in between
    assert set(tab.get_column("momentum").drop_nulls()) == {0.9, 0.5}  # labels ride along
    assert set(tab.get_column("rotation_label")) == {"none", "groups[[0,1],[2,3]]", "groups[[0,2],[1,3]]"}
    loss = q.loss_table(r).collect()
    assert loss.height == 8 and set(loss.get_column("n").to_list()) == {2}
    # the lines across sizes: one per config, each with both sizes
    lines = q.per_trial(r, "kurtosis").collect().group_by("line_id").agg(pl.col("d_model").n_unique())
    assert lines.height == 4 and set(lines.get_column("d_model").to_list()) == {2}


def test_ids_recomputed_from_config_json_match_the_study(twins: Path) -> None:  # noqa: F811
    from analysis.identity import with_ids

    runs = load(twins).runs.collect()
    again = with_ids(runs.with_columns(config_id=pl.lit(None, pl.String))).collect()
    assert again.get_column("config_id").to_list() == runs.get_column("config_id").to_list()
    # tuning_id drops only the lr: configs that differ in momentum keep separate ladders
    assert again.group_by("tuning_id").agg(pl.col("momentum").n_unique()).get_column("momentum").max() == 1


# ---------------------------------------------------------------- best lr, onset, quantisation


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory):
    from synthetic_store import Synthetic

    return (Synthetic("ladder", seed=4)
            .trials(sizes=(32, 64), seeds=(0, 1, 2), lrs={"adam": [1e-3, 3e-3, 1e-2], "sgd": [0.1, 0.3]})
            .planted(best_lrs={"adam": 3e-3, "sgd": 0.3})
            .rows(steps=(0, 25, 50, 75, 100))
            .write(tmp_path_factory.mktemp("r")))  # fmt: skip


def test_best_lr_picks_the_lowest_seed_mean_loss_and_flags_edges(ladder) -> None:
    r = load(ladder.path)
    best = sel.best_lr(r)
    assert best.height == 4  # 2 optimisers x 2 sizes
    adam = best.filter(pl.col("optimizer") == "adam")
    assert adam.get_column("lr").to_list() == [3e-3, 3e-3]
    assert adam.get_column("edge").to_list() == [None, None]
    runs = prepare_runs(r.runs).collect()
    for row in adam.iter_rows(named=True):  # a tie is a paired t-test on the 3 seeds both have
        def losses(lr: float) -> list[float]:
            at = runs.filter(pl.col("tuning_id") == row["tuning_id"], pl.col("lr") == lr).sort("seed")
            return at.get_column("final_val_loss").to_list()

        runner_up, best_lr = losses(row["runner_up_lr"]), losses(row["lr"])
        assert row["shared_seeds"] == 3
        assert row["tie"] == (stats.ttest_rel(runner_up, best_lr).pvalue >= 0.05), row
    assert adam.get_column("n_lrs").to_list() == [3, 3]
    sgd = best.filter(pl.col("optimizer") == "sgd")
    assert sgd.get_column("lr").to_list() == [0.3, 0.3]
    assert sgd.get_column("edge").to_list() == ["high", "high"]  # the ladder is too short
    assert all("largest lr" in f for f in sgd.get_column("flag"))
    # every chosen loss is the minimum seed mean over its ladder
    losses = q.loss_table(r).collect()
    for row in best.iter_rows(named=True):
        rivals = losses.filter(pl.col("tuning_id") == row["tuning_id"]).get_column("mean")
        assert row["mean"] == pytest.approx(rivals.min())
    # the best-lr view holds only those configs
    main = sel.best_lr_results(r, best)
    assert set(q.scale_table(main, "kurtosis").collect().get_column("config_id")) == set(best.get_column("config_id"))


def test_best_lr_tests_a_tie_paired_on_the_seeds_the_lrs_share(tmp_path: Path) -> None:
    """Seeds are paired across lrs (same init and data order): a runner-up 0.02 worse on every
    seed is decided even where seeds differ by 0.5, and a runner-up that swaps sign by seed is a
    tie; with one shared seed the margin is that seed's, the rule unpaired."""
    from synthetic_store import Synthetic

    store = (Synthetic("pairs").trials(sizes=(32,), seeds=(0, 1, 2), optimizers=("adam",), lrs={"adam": [1e-3, 3e-3, 1e-2]})
             .rows(steps=(0, 10))
             .write(tmp_path))  # fmt: skip
    runs = load(store.path).runs.collect()

    def with_losses(offsets: dict[float, list[float]]) -> pl.DataFrame:
        base = {0: 1.0, 1: 1.5, 2: 2.0}  # a seed spread that dwarfs the lr effect
        loss = [base[s] + offsets[lr][s] for lr, s in zip(runs["lr"], runs["seed"])]
        return runs.with_columns(final_val_loss=pl.Series(loss))

    steady = sel.best_lr(with_losses({3e-3: [0, 0, 0], 1e-3: [0.020, 0.021, 0.019], 1e-2: [0.5] * 3})).row(0, named=True)
    assert steady["lr"] == 3e-3 and steady["runner_up_lr"] == 1e-3
    assert steady["shared_seeds"] == 3 and steady["runner_up_margin"] == pytest.approx(0.02)
    assert not steady["tie"]  # unpaired (sem 0.29 a side) it would be one
    swapping = sel.best_lr(with_losses({3e-3: [0, 0, 0], 1e-3: [0.10, -0.08, 0.01], 1e-2: [0.5] * 3})).row(0, named=True)
    assert swapping["lr"] == 3e-3 and swapping["tie"] and swapping["runner_up_margin"] == pytest.approx(0.01)
    one_seed = with_losses({3e-3: [0, 0, 0], 1e-3: [0.005, 0, 0], 1e-2: [0.5] * 3})
    one_seed = one_seed.filter((pl.col("lr") != 1e-3) | (pl.col("seed") == 0))
    b = sel.best_lr(one_seed).row(0, named=True)  # 1e-3's one seed (1.005) is below 3e-3's 3-seed mean (1.5)
    assert b["lr"] == 1e-3 and b["runner_up_lr"] == 3e-3 and b["shared_seeds"] == 1
    assert b["runner_up_margin"] == pytest.approx(-0.005) and b["tie"]  # on seed 0, 3e-3 is lower: flagged
    one_seed = one_seed.with_columns(final_val_loss=pl.when(pl.col("lr") == 1e-3).then(0.9)
                                     .otherwise(pl.col("final_val_loss")))
    b = sel.best_lr(one_seed).row(0, named=True)
    assert b["lr"] == 1e-3 and b["runner_up_margin"] == pytest.approx(0.1) and not b["tie"]


def test_best_lr_flags_untuned_ties_and_skips_diverged_lrs(tmp_path: Path) -> None:
    from synthetic_store import Synthetic

    one = Synthetic("one").trials(sizes=(32, 64), seeds=(0,)).rows(steps=(0, 10)).write(tmp_path)
    best = sel.best_lr(load(one.path))
    assert best.get_column("untuned").all() and set(best.get_column("flag")) == {"untuned (one lr)"}
    # a flat loss (no lr penalty): the runner-up cannot be told apart
    flat = (Synthetic("flat").trials(sizes=(32,), seeds=(0, 1, 2), optimizers=("adam",), lrs={"adam": [1e-3, 3e-3]})
            .planted(lr_penalty=0.0, noise=0.5)
            .rows(steps=(0, 10))
            .write(tmp_path))  # fmt: skip
    assert sel.best_lr(load(flat.path)).get_column("tie").to_list() == [True]
    # the lowest lr's first trial diverges: that lr is never chosen, though the loss says so
    low = (Synthetic("div").trials(sizes=(32,), seeds=(0, 1), optimizers=("adam",), lrs={"adam": [3e-3, 1e-2]}, diverged=1)
           .planted(best_lrs={"adam": 3e-3})
           .rows(steps=(0, 10))
           .write(tmp_path))  # fmt: skip
    b = sel.best_lr(load(low.path)).row(0, named=True)
    assert b["lr"] == 1e-2 and b["n_lrs"] == 2 and b["edge"] == "high"
    # with one lr, a diverged seed does not drop the config: it is chosen, and flagged
    one_div = (Synthetic("div1").trials(sizes=(32,), seeds=(0, 1), optimizers=("adam",), diverged=1)
               .rows(steps=(0, 10))
               .write(tmp_path))  # fmt: skip
    b = sel.best_lr(load(one_div.path)).row(0, named=True)
    assert b["n"] == 1 and b["diverged"] == 1 and "diverged" in b["flag"]


def test_onset_is_the_first_eval_above_threshold(ladder) -> None:
    r = sel.best_lr_results(load(ladder.path))
    on = sel.onset(r, threshold=3.5).collect()
    sgd = on.filter(pl.col("optimizer") == "sgd")
    assert sgd.get_column("n").to_list() == [0, 0] and sgd.get_column("n_never").to_list() == [3, 3]
    assert sgd.get_column("mean").null_count() == 2
    adam = on.filter(pl.col("optimizer") == "adam").sort("d_model")
    assert adam.get_column("n_never").to_list() == [0, 0]
    # larger models grow outliers sooner (in steps); tokens of the first crossing are evals
    steps = adam.get_column("step_mean").to_list()
    assert steps[1] <= steps[0] and all(25 <= s <= 100 for s in steps)  # eval steps, mean over seeds
    never = sel.onset(r, threshold=1e9).collect()
    assert set(never.get_column("n_never").to_list()) == {3}


def test_quant_penalty_pairs_the_penalty_with_kurtosis(ladder) -> None:
    r = sel.best_lr_results(load(ladder.path))
    w8 = sel.quant_penalty(r, "w8a8").collect()
    w4 = sel.quant_penalty(r, "w4a4").collect()
    assert w8.height == w4.height == 4 and set(w8.get_column("n").to_list()) == {3}
    assert (w4.get_column("mean") > w8.get_column("mean")).all()
    adam = w8.filter(pl.col("optimizer") == "adam").get_column("mean").min()
    assert adam > w8.filter(pl.col("optimizer") == "sgd").get_column("mean").max()
    assert w8.get_column("x").min() > 2.5  # x: the seed-mean kurtosis of the same config


def test_over_null_reads_one_without_a_privileged_basis(store) -> None:  # noqa: F811
    """kurtosis / 3(d-1)/(d+1): 1 for sgd at every width (and for the random-basis control),
    (null + excess) / null for adam."""
    from analysis.null import kurtosis_null

    r = load(store.path)
    per = q.per_trial(r, "kurtosis", over_null=True).collect()
    sgd = per.filter(pl.col("optimizer") == "sgd")
    assert sgd.get_column("value").to_list() == pytest.approx([1.0] * sgd.height, abs=1e-3)
    control = q.per_trial(r, "kurtosis", "resid", "random", over_null=True).collect()
    assert control.get_column("value").to_list() == pytest.approx([1.0] * control.height, abs=1e-3)
    raw = q.per_trial(r, "kurtosis").collect().select("trial_id", raw="value", d="d_model")
    joined = per.join(raw, on="trial_id")
    want = [v / kurtosis_null(d) for v, d in zip(joined["raw"], joined["d"], strict=True)]
    assert joined.get_column("value").to_list() == pytest.approx(want, rel=1e-12)
    table = q.scale_table(r, "kurtosis", over_null=True).collect()
    assert table.filter(pl.col("optimizer") == "sgd").get_column("mean").to_list() == pytest.approx([1.0] * 3, abs=1e-3)
    with pytest.raises(q.QueryError, match="over_null needs the runs column d_model"):
        q.per_trial(r.metrics, "kurtosis", over_null=True).collect()


def test_group_size_table_reads_group_sizes_and_ends(tmp_path) -> None:
    """partial(k) -> k, shared -> n_layers; the ends in bases of their own, in the group's basis
    (-groupends, and shared) or unrotated (-noemb); none and independent left out; values are the
    computation-basis kurtosis over the exact null per site."""
    from synthetic_store import Synthetic

    from analysis import selection
    from analysis.null import kurtosis_null

    rots = ["none", "independent", "shared", ("partial", 1), ("partial", 2), ("partial", 2, False), ("partial", 2, "group")]
    s = (Synthetic("sharing").trials(sizes=(64,), n_layers=4, optimizers=("adam",), seeds=(0, 1), rotations=rots)
         .planted(sharing=True)
         .rows(steps=(0, 10), quant=False)
         .write(tmp_path))  # fmt: skip
    r = load(s.path)
    t = selection.group_size_table(r).collect()
    got = {(row["rotation_label"], row["site"]): (row["group_size_x"], row["ends"]) for row in t.iter_rows(named=True)}
    assert set(got) == {(lab, site) for lab in ("shared", "partial(1)", "partial(2)", "partial(2)-noemb",
                                                "partial(2)-groupends") for site in ("attn_in", "mlp_in")}  # fmt: skip
    assert got[("shared", "mlp_in")] == (4, "ends in the group's basis")  # shared is k = n_layers with them
    assert got[("partial(2)-groupends", "mlp_in")] == (2, "ends in the group's basis")
    assert got[("partial(2)", "attn_in")] == (2, "ends in bases of their own")
    assert got[("partial(2)-noemb", "mlp_in")] == (2, "ends unrotated")
    raw = q.scale_table(r, "kurtosis", "mlp_in", "computation").collect()
    for row in t.filter(pl.col("site") == "mlp_in").iter_rows(named=True):
        want = raw.filter(pl.col("config_id") == row["config_id"]).get_column("mean")[0] / kurtosis_null(64)
        assert row["mean"] == pytest.approx(want, rel=1e-12) and row["n"] == 2
    by_k = t.filter((pl.col("site") == "mlp_in") & (pl.col("ends") == "ends in bases of their own")).sort("group_size_x")
    assert by_k.get_column("mean").is_sorted()  # the planted build-up with group size

    base = selection.unrotated_table(r).collect()  # the reference: rotation none, same sites and summary
    assert base.get_column("rotation_label").to_list() == ["none", "none"]
    assert base.get_column("site").to_list() == ["attn_in", "mlp_in"]
    for row in base.iter_rows(named=True):
        raw = q.scale_table(r, "kurtosis", row["site"], "computation").collect()
        want = raw.filter(pl.col("config_id") == row["config_id"]).get_column("mean")[0] / kurtosis_null(64)
        assert row["mean"] == pytest.approx(want, rel=1e-12) and row["n"] == 2


def test_stores_with_the_averaged_control_read_the_same(store) -> None:  # noqa: F811
    """Stores written after the probe averages the control over Haar bases carry a row metric
    kurtosis_sd (basis random: the sd across bases) beside kurtosis: no kurtosis view changes."""
    import dataclasses

    r = load(store.path)
    ctrl = r.metrics.filter((pl.col("metric") == "kurtosis") & (pl.col("basis") == "random")).collect()
    with_sd = dataclasses.replace(r, metrics=pl.concat([r.metrics, ctrl.with_columns(metric=pl.lit("kurtosis_sd"),
                                                                                     value=pl.lit(0.15)).lazy()]))  # fmt: skip
    assert with_sd.metrics.filter(pl.col("metric") == "kurtosis_sd").collect().height == ctrl.height > 0
    for view in (
        lambda x: q.basis_comparison(x),
        lambda x: q.scale_table(x, "kurtosis", over_null=True),
        lambda x: q.scale_table(x, "kurtosis", control=q.CONTROL),
    ):
        from polars.testing import assert_frame_equal

        a, b = view(r).collect(), view(with_sd).collect()
        keys = [c for c in ("config_id", "layer", "site", "basis") if c in a.columns]
        assert a.height > 0
        assert_frame_equal(a.sort(keys), b.sort(keys), check_exact=False, rel_tol=1e-12)


def test_quant_penalty_carries_the_eval_batch_floor(store, tmp_path: Path) -> None:
    # issue 16 item 6: a penalty is read against its floor, 2 x its standard error over the eval
    # sequences (mean over seeds); a store that predates the metric has a null floor
    import shutil

    from analysis.report.content import _quant_floor_note

    before = sel.quant_penalty(load(store.path), "w8a8").collect()
    assert before.get_column("floor").null_count() == before.height
    assert "no eval-batch floor recorded" in _quant_floor_note("w8a8", before)

    copy = tmp_path / "toy"
    shutil.copytree(store.path, copy)
    quant = load(copy).metrics.filter(metric="quant_loss_delta").collect()
    se = quant.with_columns(metric=pl.lit("quant_loss_delta_se"),
                            value=0.001 * (1 + pl.col("trial_id").rank("dense").cast(pl.Float64) % 3))
    se.write_parquet(copy / "metrics" / "zz_se.000000000-999999999.parquet")
    after = sel.quant_penalty(load(copy), "w8a8").collect()
    expected = (se.join(load(copy).runs.select("trial_id", "config_id").collect(), on="trial_id")
                .filter(basis="w8a8").group_by("config_id").agg(floor=2 * pl.col("value").mean()))
    got = after.select("config_id", "floor").join(expected, on="config_id", suffix="_expected")
    assert got.height == after.height > 0
    assert (got["floor"] - got["floor_expected"]).abs().max() < 1e-12
    note = _quant_floor_note("w8a8", after)
    within = after.filter(pl.col("mean").abs() <= pl.col("floor")).height
    assert f"{within} of {after.height} configs" in note, note
