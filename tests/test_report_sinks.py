"""analysis.report.sinks (issue 36): the sink measures by layer with uniform attention's level,
the outlier measure against the sink per config, the tracking note; and the synthetic store's
attention axis and sink rows they read (tests/synthetic_store.py with attentions=, sinks=True)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from analysis import queries, selection  # noqa: E402
from analysis.load import Results, load  # noqa: E402
from analysis.query_base import prepare_runs  # noqa: E402
from analysis.report import sinks  # noqa: E402
from synthetic_store import SINK_SHARE, Synthetic, SyntheticStore, UNIFORM_FIRST  # noqa: E402

KEYS = ["trial_id", "step", "layer", "site", "basis", "metric"]
STORE = Synthetic(seed=5).trials(sizes=(64,), optimizers=("adam", "sgd"), seeds=(0, 1, 2)).rows(steps=(0, 50, 100), quant=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    return (replace(STORE, name="attention").trials(attentions=("softmax", "gated", "clipped")).rows(sinks=True)
            .write(tmp_path_factory.mktemp("r")))


@pytest.fixture(scope="module")
def old_store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    return replace(STORE, name="old").write(tmp_path_factory.mktemp("r"))


def _main(r: Results) -> tuple[Results, pl.DataFrame]:
    """What content.build hands a section: the best-lr view, and the done runs."""
    return selection.best_lr_results(r, selection.best_lr(r)), queries.runs_table(r.runs.collect()).collect()


# ---------------------------------------------------------------- the synthetic store's new rows


def test_the_sink_rows_add_to_an_older_store_and_change_none_of_its_rows(tmp_path, old_store) -> None:
    new = replace(STORE, name="softmax_only").rows(sinks=True).write(tmp_path)
    a, b = load(new.path).metrics.collect(), load(old_store.path).metrics.collect()
    both = b.join(a, on=KEYS, how="left", suffix="_new")
    assert both.get_column("value_new").null_count() == 0 and (both["value"] == both["value_new"]).all()
    added = a.join(b, on=KEYS, how="anti")
    assert set(added.select("site", "basis").unique().iter_rows()) == {("attn", "heads"), ("attn", "uniform")}
    assert set(added.get_column("metric")) == set(sinks.MEASURES)


def test_an_old_store_reads_softmax_where_the_attention_column_is_absent(old_store) -> None:
    raw = load(old_store.path).runs.collect()
    assert raw.get_column("attention").null_count() == raw.height  # inserted by the reader: null
    assert set(prepare_runs(raw).collect().get_column("attention")) == {"softmax"}


# ---------------------------------------------------------------- the section's numbers


def test_the_profile_is_the_planted_sink_by_block_with_uniform_attentions_level(store) -> None:
    main, _ = _main(load(store.path))
    table = sinks.profile(main)
    assert set(table.get_column("measure")) == set(sinks.MEASURES)
    first = table.filter(pl.col("measure") == "first_mass")
    for r in first.iter_rows(named=True):
        s = SINK_SHARE[r["attention"]] * (0.2 + 0.6 * r["layer"] / 4)
        assert r["mean"] == pytest.approx(UNIFORM_FIRST + (1 - UNIFORM_FIRST) * s)
    assert first.get_column("uniform").to_list() == pytest.approx([UNIFORM_FIRST] * first.height)
    assert table.filter(pl.col("measure") == "sink_heads").get_column("uniform").null_count() > 0  # no reference
    assert sinks.uniform_level(main, "delimiter_mass") == pytest.approx(0.25)


def test_versus_puts_each_configs_sink_against_its_kurtosis_over_the_null(store) -> None:
    main, _ = _main(load(store.path))
    table = sinks.versus_table(main)
    assert table.height == 2 * 3  # optimiser x attention, one size
    mean_w = (0.2 + 0.6 * 2.5 / 4)  # the mean over blocks 1..4 of 0.2 + 0.6 l/4
    for r in table.iter_rows(named=True):
        assert r["x"] == pytest.approx(UNIFORM_FIRST + (1 - UNIFORM_FIRST) * SINK_SHARE[r["attention"]] * mean_w)
    sgd = table.filter(pl.col("optimizer") == "sgd").get_column("mean")
    assert ((sgd - 1).abs() < 0.01).all()  # no excess: at the null
    adam = dict(table.filter(pl.col("optimizer") == "adam").select("attention", "mean").iter_rows())
    assert adam["softmax"] > adam["clipped"] > adam["gated"] > 1  # the planted excess follows the sink


def test_the_note_finds_the_sink_tracking_the_excess_where_only_the_attention_varies(tmp_path) -> None:
    s = (replace(STORE, name="adam_only").trials(attentions=tuple(SINK_SHARE), optimizers=("adam",)).rows(sinks=True)
         .write(tmp_path))
    main, _ = _main(load(s.path))
    note = sinks.tracking_note(main)
    rho = [float(part.split("ρ = ")[1][:4]) for part in note.split("; ") if "ρ = " in part]
    assert len(rho) == 2 and all(r > 0.8 for r in rho), note
    assert "across 15 done trials" in note  # five attentions x three seeds


def test_add_draws_two_charts_or_says_why_not(store, old_store) -> None:
    main, done = _main(load(store.path))
    built: dict = {}
    notes: list[str] = []
    sinks.add(main, done, built, notes)
    assert list(built) == ["sinks_by_layer", "sinks_vs_kurtosis"]
    assert any(n.startswith("Does the sink track the outliers?") for n in notes)
    main, done = _main(load(old_store.path))
    built, notes = {}, []
    sinks.add(main, done, built, notes)
    assert built == {} and notes == [sinks.NO_SINK_NOTE]


def test_the_report_writes_the_sink_figures(store, tmp_path) -> None:
    from analysis.report import write_report

    rep = write_report(store.path, tmp_path / "rep", formats=("svg",), n_boot=20)
    names = {Path(f).name for f in rep.files}
    assert {"sinks_by_layer.svg", "sinks_vs_kurtosis.svg"} <= names
    assert any("Does the sink track the outliers?" in n for n in rep.notes)


def test_the_section_reads_the_rows_the_probe_writes() -> None:
    """analysis may not import study (the layering): its names for the probe's rows are its own,
    and must be the probe's."""
    from analysis.charts.sinks import MEASURE_TITLES
    from study import sinks as probe

    assert set(sinks.MEASURES) == set(probe.METRICS) == set(MEASURE_TITLES)
    assert (sinks.SITE, sinks.BASIS, sinks.UNIFORM) == (probe.SITE, probe.BASIS, probe.UNIFORM)
