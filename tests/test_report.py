"""analysis.report.write_report: every file, graceful with one size, failures, no checks."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from analysis_fixtures import messy_store, single_size_store, store  # noqa: F401  (fixtures)

from analysis.report import DEFAULT_FITS, FitSpec, ReportResult, write_report

CHARTS = {
    "kurtosis_by_layer",
    "kurtosis_over_training",
    "basis_comparison",
    "kurtosis_resid_vs_params",
    "kurtosis_mlp_in_vs_params",
    "final_val_loss_vs_params",
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
    assert {"fits.csv", "fits.md", "fits.tex", "comparisons.csv", "index.html"} <= names
    assert set(rep.charts) == CHARTS
    assert all(Path(f).exists() for f in rep.files)
    assert not any(n.startswith(".") for n in names)  # no temp files left behind
    assert rep.index == str(out / "index.html")
    assert (rep.n_runs, rep.n_done, rep.n_failed, rep.n_diverged) == (store.n_trials, store.n_trials, 0, 0)


def test_fits_table_holds_the_known_exponent(report) -> None:
    rep, _ = report
    fits = pl.read_csv(Path(rep.out) / "fits.csv")
    adam = fits.filter(
        pl.col("fit").str.starts_with("kurtosis − 3, residual") & (pl.col("optimizer") == "adam")
    ).row(0, named=True)
    assert adam["exponent_low"] < 0.5 < adam["exponent_high"]
    sgd = fits.filter(pl.col("fit").str.starts_with("kurtosis − 3, residual") & (pl.col("optimizer") == "sgd"))
    assert "y - 3 <= 0" in sgd.get_column("note").item()
    comparisons = pl.read_csv(Path(rep.out) / "comparisons.csv")
    raw = comparisons.filter(pl.col("fit").str.starts_with("kurtosis, residual")).row(0, named=True)
    assert (raw["a"], raw["b"]) == ("sgd", "adam")
    assert raw["difference_low"] > 0 and raw["p_value"] < 0.05


def test_markdown_latex_and_index(report) -> None:
    rep, _ = report
    out = Path(rep.out)
    md = (out / "fits.md").read_text()
    assert md.startswith("# Power-law fits") and "| Fit | Config | Exponent [CI]" in md
    assert "adam · layernorm · none" in md
    tex = (out / "fits.tex").read_text()
    assert r"\begin{tabular}" in tex and r"\bottomrule" in tex
    assert "final\\_val\\_loss" in tex and "kurtosis_" not in tex  # escaped
    index = (out / "index.html").read_text()
    assert index.count("<svg") == len(CHARTS)  # charts inlined: the page stands alone
    assert "Power-law fits" in index and "<table>" in index
    assert "rotate_residual_basis" in index  # invariance checks summarised
    assert "href='kurtosis_by_layer.png'" in index


def test_progress_is_reported(report) -> None:
    _, messages = report
    assert messages[0].startswith("18 trials") or messages[0].startswith("loading")
    assert any(m.startswith("writing kurtosis_by_layer") for m in messages)
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
    assert "fits.csv" not in names and "kurtosis_resid_vs_params.png" in names
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
        "kurtosis_resid",
        "kurtosis_mlp_in",
        "kurtosis_resid",
        "kurtosis_mlp_in",
        "final_val_loss",
    ]
    charted = [s.name for s in DEFAULT_FITS if s.chart]
    assert len(charted) == len(set(charted))  # one chart file each
    assert DEFAULT_FITS[0].label.startswith("kurtosis − 3, residual stream")
