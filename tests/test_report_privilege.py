"""analysis.report.privilege (issue 32): the per-trial rank test counted per config, and the
width-honest top-1 share charted with its null; and the synthetic store's rows they read
(tests/synthetic_store.py with basis_test=True)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from analysis import queries, selection  # noqa: E402
from analysis.load import Results, load  # noqa: E402
from analysis.null import kurtosis_null, top_share_null  # noqa: E402
from analysis.report import privilege  # noqa: E402
from synthetic_store import CONTROL_SD, Synthetic, SyntheticStore  # noqa: E402

KEYS = ["trial_id", "step", "layer", "site", "basis", "metric"]
STORE = (Synthetic(seed=11).trials(sizes=(32, 64), optimizers=("adam", "sgd"), rotations=("none", "shared"), seeds=(0, 1, 2))
         .rows(steps=(0, 50, 100), quant=False))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    return replace(STORE, name="tested").rows(basis_test=True).write(tmp_path_factory.mktemp("r"))


@pytest.fixture(scope="module")
def old_store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    return replace(STORE, name="old").write(tmp_path_factory.mktemp("r"))


def _final(r: Results) -> pl.DataFrame:
    runs = r.runs.collect().select("trial_id", "optimizer", "rotation", "d_model", "config_id")
    return r.metrics.filter(pl.col("step") == 100).collect().join(runs, on="trial_id")


def _main(r: Results) -> tuple[Results, pl.DataFrame]:
    """What content.build hands a section: the best-lr view, and the done runs."""
    return selection.best_lr_results(r, selection.best_lr(r)), queries.runs_table(r.runs.collect()).collect()


# ---------------------------------------------------------------- the synthetic store's new rows


def test_the_basis_test_rows_add_to_an_older_store_and_change_none_of_its_rows(store, old_store) -> None:
    new, old = load(store.path).metrics.collect(), load(old_store.path).metrics.collect()
    assert new.unique(KEYS).height == new.height > old.height
    both = old.join(new, on=KEYS, how="left", suffix="_new")
    assert both.get_column("value_new").null_count() == 0
    assert (both.get_column("value") == both.get_column("value_new")).all()
    added = new.join(old, on=KEYS, how="anti")
    assert set(added.get_column("metric")) == {"kurtosis", "top1_share", "top4_share", "kurtosis_sd", "kurtosis_median",
                                               "kurtosis_rank_p", "top1_share_rank_p"}  # fmt: skip
    assert set(added.filter(pl.col("metric") == "kurtosis").select("site", "basis").unique().iter_rows()) == {
        ("attn_in", "random"), ("mlp_in", "random")}
    ranks = added.filter(pl.col("metric").str.ends_with("_rank_p"))
    assert set(ranks.select("site", "basis").unique().iter_rows()) == {
        ("resid", "random"), ("attn_in", "random"), ("mlp_in", "random")}
    assert ranks.filter(pl.col("site") == "resid").get_column("layer").min() == 0  # resid: layers 0..L
    assert ranks.filter(pl.col("site") != "resid").get_column("layer").min() == 1


def test_random_bases_read_the_nulls_and_the_planted_share_is_width_free(store) -> None:
    m = _final(load(store.path))
    rnd = m.filter(pl.col("basis") == "random")
    for k in (1, 4):
        got = rnd.filter(pl.col("metric") == f"top{k}_share").with_columns(
            null=pl.col("d_model").map_elements(lambda d, k=k: top_share_null(d, k), return_dtype=pl.Float64))
        assert got.height and ((got["value"] / got["null"] - 1).abs() < 1e-3).all()
    kur = rnd.filter(pl.col("metric") == "kurtosis")
    assert ((kur["value"] - kur["d_model"].map_elements(kurtosis_null, return_dtype=pl.Float64)).abs() < 1e-3).all()
    assert (rnd.filter(pl.col("metric") == "kurtosis_sd")["value"] - CONTROL_SD).abs().max() < 1e-3
    # adam, unrotated, residual stream: the share the store says, the same f at both widths
    blocks = m.filter((pl.col("optimizer") == "adam") & (pl.col("rotation") == "none") & (pl.col("site") == "resid")
                      & (pl.col("basis") == "stored") & (pl.col("layer") >= 1))  # fmt: skip
    for d, p in zip((32, 64), store.params_non_embedding, strict=True):
        share = blocks.filter((pl.col("metric") == "top1_share") & (pl.col("d_model") == d))["value"].mean()
        assert share == pytest.approx(store.expected_top1_share("adam", p, d), rel=0.15)
    kurt = blocks.filter(pl.col("metric") == "kurtosis").group_by("d_model").agg(pl.col("value").mean()).sort("d_model")
    assert kurt["value"][1] - kurtosis_null(64) > 1.5 * (kurt["value"][0] - kurtosis_null(32))  # kurtosis grows


def test_the_rank_p_is_one_in_33_where_the_excess_is_clear_and_uniform_where_there_is_none(store) -> None:
    m = load(store.path).metrics.filter(pl.col("metric").str.ends_with("_rank_p")).collect()
    runs = load(store.path).runs.collect().select("trial_id", "optimizer", "rotation")
    m = m.join(runs, on="trial_id")
    assert set((m["value"] * 33).round(6).unique().to_list()) <= set(float(j) for j in range(1, 34))
    clear = m.filter((pl.col("step") == 100) & (pl.col("optimizer") == "adam") & (pl.col("site") != "resid"))
    assert clear.height and (clear["value"] == 1 / 33).all()
    none = m.filter((pl.col("optimizer") == "sgd") | (pl.col("step") == 0))
    assert none.height > 500
    assert none["value"].mean() == pytest.approx(17 / 33, abs=0.03)  # uniform on {1..33}/33: mean 17/33
    assert (none["value"] <= 1 / 33 + 1e-9).mean() == pytest.approx(1 / 33, abs=0.02)


# ---------------------------------------------------------------- the per-trial test


def test_the_per_trial_test_counts_privileged_cells_per_config_site_and_measure(store) -> None:
    r = load(store.path)
    table = privilege.test_table(r)
    # an independent count from the raw rows: blocks 1..L at the last step, p below 1.5/33
    m = r.metrics.filter(pl.col("metric").str.ends_with("_rank_p") & (pl.col("layer") >= 1)).collect()
    m = m.filter(pl.col("step") == pl.col("step").max().over("trial_id"))
    runs = r.runs.collect().select("trial_id", "config_id")
    per_trial = m.join(runs, on="trial_id").group_by("config_id", "site", "metric", "trial_id").agg(
        cells=pl.len(), hits=(pl.col("value") < 1.5 / 33).sum())
    raw = per_trial.group_by("config_id", "site", "metric").agg(
        pl.col("cells").sum(), pl.col("hits").sum(), every=(pl.col("hits") == pl.col("cells")).sum())
    raw = raw.with_columns(measure=pl.col("metric").str.replace("_rank_p", ""))
    got = table.join(raw, on=["config_id", "site", "measure"], how="full", coalesce=True)
    assert got.height == table.height == 2 * 2 * 2 * 3 * 2  # sizes x optimisers x rotations x sites x measures
    assert (got["cells"] == got["cells_right"]).all() and (got["privileged_cells"] == got["hits"]).all()
    assert (got["trials_every_block"] == got["every"]).all()
    assert (table["trials"] == 3).all() and (table["blocks"] == 4).all() and (table["cells"] == 12).all()
    assert (table["expected_cells"] == table["cells"] / 33).all() and (table["trials_bound"] == 3 / 33).all()
    assert set(table.select("site", "basis").unique().iter_rows()) == {
        ("resid", "stored"), ("attn_in", "computation"), ("mlp_in", "computation")}
    # what the planted store says: adam's computation basis is privileged in every block of every
    # trial; the rotated residual stream and SGD are not
    adam = table.filter(pl.col("optimizer") == "adam")
    assert (adam.filter(pl.col("site") != "resid")["trials_every_block"] == 3).all()
    assert (adam.filter((pl.col("site") == "resid") & (pl.col("rotation_label") == "shared"))["trials_every_block"] == 0).all()
    sgd = table.filter(pl.col("optimizer") == "sgd")
    assert sgd["trials_every_block"].sum() == 0 and sgd["privileged_cells"].sum() < 0.1 * sgd["cells"].sum()
    assert adam.filter(pl.col("rotation_label") == "none")["config"].str.starts_with("adam · layernorm · none").all()


def test_the_table_reads_as_counts_beside_the_null(store) -> None:
    header, rows = privilege.cells(privilege.test_table(load(store.path)))
    assert header[5] == "Cells at p ≤ 1/33" and header[6] == "Null expects" and len(rows[0]) == len(header)
    first = dict(zip(header, rows[0], strict=True))
    assert first["Config"].startswith("adam · layernorm · none") and first["Size"].endswith("(d 32)")
    assert first["Site"] == "residual stream (stored basis)" and first["Measure"] == "kurtosis"
    assert first["Cells at p ≤ 1/33"] == "12 / 12" and first["Null expects"] == "0.4"
    assert first["Trials privileged in every block"] == "3 / 3 (null: ≤ 0.09)"
    assert "1/33" in privilege.WORDS and "not independent" in privilege.WORDS and "32" in privilege.WORDS


# ---------------------------------------------------------------- the section


def _spec(chart: Any) -> dict[str, Any]:
    return chart.to_dict(validate=False)


def test_the_section_charts_the_top1_share_with_its_null_and_says_which_measure_trends(store) -> None:
    main, done = _main(load(store.path))
    built: dict[str, tuple[Any, str]] = {}
    notes: list[str] = []
    table = privilege.add(main, done, built, notes)
    assert table.height == 48 and list(built) == ["top1_share_vs_null"]
    chart, caption = built["top1_share_vs_null"]
    assert "top-1 share" in caption and "kurtosis" in caption and "null" in caption and "every width" in caption
    spec = _spec(chart)
    rows = next(iter(spec["datasets"].values()))
    nulls = {(r["panel"], r["d_model"]): r["null_ref"] for r in rows if r.get("kind") == "null"}
    assert nulls == {(p, d): pytest.approx(top_share_null(d)) for p in ("Residual stream (stored basis)", "MLP input (computation basis)")
                     for d in (32, 64)}  # fmt: skip
    assert [r["null_label"] for r in rows if r.get("null_label")] == ["top-1 null (random basis)"] * 2  # once a panel
    sub = " ".join(spec["title"]["subtitle"])
    assert "fixed share f" in sub and "kurtosis" in sub and "null" in sub  # the caption inside the image
    assert spec["facet"]["column"]["sort"] == ["Residual stream (stored basis)", "MLP input (computation basis)"]
    [note] = notes
    assert note.startswith("Which measure a width trend is in") and "adam · layernorm · none" in note
    assert "kurtosis / null" in note and "top-1 share" in note and "not width alone" in note


def test_an_old_store_gets_one_note_and_nothing_else(old_store) -> None:
    main, done = _main(load(old_store.path))
    built: dict[str, tuple[Any, str]] = {}
    notes: list[str] = []
    assert privilege.add(main, done, built, notes).height == 0
    assert built == {} and notes == [privilege.NO_TEST_NOTE]
    assert privilege.test_table(main).height == 0


def test_one_size_gets_the_table_and_no_chart(tmp_path: Path) -> None:
    one = (Synthetic("one").trials(sizes=(32,), optimizers=("adam",), seeds=(0,))
           .rows(steps=(0, 10), quant=False, basis_test=True)
           .write(tmp_path))  # fmt: skip
    main, done = _main(load(one.path))
    built: dict[str, tuple[Any, str]] = {}
    notes: list[str] = []
    table = privilege.add(main, done, built, notes)
    assert table.height == 6 and built == {} and notes == []
    assert json.loads(table.write_json())  # plain columns: what privilege.csv holds


def test_the_markdown_holds_the_words_and_every_row(store) -> None:
    table = privilege.test_table(load(store.path))
    md = privilege.markdown(table).splitlines()
    assert md[0] == f"# {privilege.TITLE}" and md[2] == privilege.WORDS
    assert md[4].startswith("| Config | Size |") and md[5].startswith("|---|")
    assert len(md) == 6 + table.height and md[6].count(" | ") == 7
