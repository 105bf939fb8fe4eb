"""The report as a list of sections (analysis.report.content.SECTIONS): a new section is one
module (here, one Section) and one entry in the list, and appears in the report where the entry
is; each section gets the metrics it declares; a section that needs finished trials is skipped
where none finished; ReportResult holds the content."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl
import pytest
from synthetic_store import Synthetic, SyntheticStore

from analysis.load import load
from analysis.report import content, scaling, write_report
from analysis.report.section import Context, ReportContent, Section
from analysis.report.table import Table


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    return (Synthetic("small", seed=4).trials(sizes=(32, 64), seeds=(0, 1))
            .rows(steps=(0, 10), quant=False)
            .write(tmp_path_factory.mktemp("r")))  # fmt: skip


def _extra(ctx: Context) -> None:
    """A section as a new module would write it: one chart, its caption, one note."""
    frame = pl.DataFrame({"size": ctx.sizes, "n": [1] * len(ctx.sizes)})
    ctx.chart("extra", alt.Chart(frame).mark_point().encode(x="size:Q", y="n:Q"), "An extra section's chart.")
    ctx.note("The extra section was here.")


EXTRA = Section("extra", _extra)


def test_a_new_section_is_one_entry_in_the_list(small, tmp_path: Path, monkeypatch) -> None:
    """Added to content.SECTIONS (the list build loops over), the section's chart is written,
    listed and shown in index.html with its caption, after the charts of the entries before it,
    and its note follows theirs."""
    before = write_report(small.path, tmp_path / "before", formats=("svg",), n_boot=20)
    assert "extra" not in before.charts
    monkeypatch.setattr(content, "SECTIONS", [*content.SECTIONS, EXTRA])
    rep = write_report(small.path, tmp_path / "rep", formats=("svg",), n_boot=20)
    assert list(rep.charts) == [*before.charts, "extra"]
    assert Path(rep.charts["extra"][0]).name == "extra.svg" and (tmp_path / "rep" / "extra.svg").stat().st_size > 100
    assert rep.notes == [*before.notes, "The extra section was here."]
    index = (tmp_path / "rep" / "index.html").read_text()
    assert "<figure id='extra'>" in index and "An extra section&#x27;s chart." in index
    assert index.index("<figure id='slopes'>") < index.index("<figure id='extra'>")


def test_the_list_order_is_the_report_order(small, monkeypatch) -> None:
    """The extra entry placed first: its chart comes first; the list's names are unique."""
    monkeypatch.setattr(content, "SECTIONS", [EXTRA, *content.SECTIONS])
    c = content.build(load(small.path), n_boot=20)
    assert list(c.charts)[0] == "extra" and c.captions["extra"] == "An extra section's chart."
    names = [s.name for s in content.SECTIONS]
    assert len(names) == len(set(names))


def test_each_section_reads_the_metrics_it_declares(small) -> None:
    """The report keeps only the metrics its sections declare: a section list that declares
    kurtosis alone sees kurtosis rows alone."""
    seen: list[set] = []
    spy = Section("spy", lambda ctx: seen.append({m for _, _, m in ctx.have}), metrics=("kurtosis",))
    content.build(load(small.path), n_boot=20, sections=[spy])
    assert seen == [{"kurtosis"}]
    every = {m for m in load(small.path).metrics.select("metric").unique().collect().get_column("metric")}
    assert every > {"kurtosis"}  # the store has more; the spy was given only what it declared


def test_sections_that_need_finished_trials_are_skipped_where_none_finished(tmp_path: Path) -> None:
    s = (Synthetic("none").trials(sizes=(32,), optimizers=("adam",), seeds=(0, 1), failed=2)
         .rows(checks=False)
         .write(tmp_path))
    ran: list[str] = []
    needs = Section("needs", lambda ctx: ran.append("needs"))
    always = Section("always", lambda ctx: ran.append("always"), needs_done=False)
    c = content.build(load(s.path), n_boot=20, sections=[needs, always])
    assert ran == ["always"] and c.n_done == 0
    assert "No trial has finished: nothing to chart or fit." in c.notes


def test_the_result_holds_the_content(small, tmp_path: Path) -> None:
    """ReportResult keeps the content (no copies): its fields read through, but for ``charts``
    (the files written per chart)."""
    rep = write_report(small.path, tmp_path / "rep", formats=("svg",), n_boot=20)
    assert isinstance(rep.content, ReportContent)
    assert rep.notes is rep.content.notes and rep.fits is rep.content.fits and rep.n_done == rep.content.n_done
    assert set(rep.charts) == set(rep.content.charts) and all(isinstance(v, list) for v in rep.charts.values())


def _extra_table(ctx: Context) -> None:
    """A section as a new module would add a table: one call, nothing else to edit."""
    frame = pl.DataFrame({"size": ctx.sizes, "trials": [ctx.done.filter(pl.col(ctx.x) == s).height for s in ctx.sizes]})
    ctx.table("extra_sizes", frame, "Each size & its done trials.", title="Extra sizes",
              shown=lambda f: Table(["Size", "Trials"], [[str(a), str(b)] for a, b in f.iter_rows()]))
    ctx.table("extra_empty", frame.head(0), "No rows: no CSV, not listed.", title="Extra empty")
    ctx.table("extra_quiet", frame)  # no title: written, not listed


def test_a_section_adds_a_table_in_one_place(small, tmp_path: Path, monkeypatch) -> None:
    """ctx.table in a section placed after the scaling section: its CSV (every column) is
    written and listed, and index.html shows it, caption escaped and linked, after the scaling
    section's tables and before the best-lr table that comes later in the list; a table without
    rows is neither written nor listed, one without a title is written but not listed."""
    at = content.SECTIONS.index(scaling.SECTION) + 1
    monkeypatch.setattr(content, "SECTIONS", [*content.SECTIONS[:at], Section("extra", _extra_table),
                                              *content.SECTIONS[at:]])
    rep = write_report(small.path, tmp_path / "rep", formats=("svg",), n_boot=20)
    out = tmp_path / "rep"
    sizes = sorted(load(small.path).runs.collect().get_column("params_non_embedding").unique())
    assert (out / "extra_sizes.csv").read_text() == "size,trials\n" + "".join(f"{s},4\n" for s in sizes)
    assert (out / "extra_quiet.csv").read_bytes() == (out / "extra_sizes.csv").read_bytes()
    assert not (out / "extra_empty.csv").exists() and str(out / "extra_sizes.csv") in rep.files
    index = (out / "index.html").read_text()
    listing = ("<h2>Extra sizes</h2><p>Each size &amp; its done trials. Also in <a href='extra_sizes.csv'>"
               "extra_sizes.csv</a>.</p>\n<table><thead><tr><th>Size</th><th>Trials</th></tr></thead>")
    assert listing in index and "Extra empty" not in index and "extra_quiet" not in index
    assert index.index("<h2>Levels at each size</h2>") < index.index(listing) < index.index("<h2>Best learning rates")
    names = list(rep.content.tables)
    assert names.index("family_levels") < names.index("extra_sizes") < names.index("best_lr")
