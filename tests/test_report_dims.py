"""The report's outlier-dimensions section: drawn from a sweep with the dims table, skipped with
one note where the sweep predates it."""

from __future__ import annotations

import shutil
from pathlib import Path

from analysis.report import write_report
from analysis.report.dims import NO_DIMS_NOTE
from test_analysis_attribution import dims_sweep  # noqa: F401

CHARTS = ("dims_persistence", "dims_ablation", "dims_tokens")


def test_the_report_draws_the_dimensions_section(dims_sweep: Path, tmp_path: Path) -> None:  # noqa: F811
    rep = write_report(dims_sweep, tmp_path / "rep", formats=("svg",), n_boot=20)
    for name in CHARTS:
        assert name in rep.charts and Path(rep.charts[name][0]).stat().st_size > 1000
        assert rep.captions[name]
    assert "adam: d_model 32, lr 0.003, 2 seed(s)" in rep.captions["dims_persistence"]
    titles = {"dims_persistence": "Which dimensions are the outliers", "dims_ablation": "What the outlier dimensions do",
              "dims_tokens": "What the outlier dimensions are"}
    for name, title in titles.items():  # issue 37: titled and captioned inside the image, as in index.html
        svg = Path(rep.charts[name][0]).read_text()
        caption = rep.captions[name].split()
        assert title in svg and " ".join(caption[:4]) in svg and caption[-1] in svg, name
    assert NO_DIMS_NOTE not in rep.notes
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "id='dims_tokens'" in page and "loss rises on" in page


def test_a_sweep_that_predates_the_table_gets_one_note(dims_sweep: Path, tmp_path: Path) -> None:  # noqa: F811
    old = tmp_path / "old"
    shutil.copytree(dims_sweep, old)
    shutil.rmtree(old / "dims")
    rep = write_report(old, tmp_path / "rep", formats=("svg",), n_boot=20)
    assert not set(CHARTS) & set(rep.charts)
    assert rep.notes.count(NO_DIMS_NOTE) == 1
