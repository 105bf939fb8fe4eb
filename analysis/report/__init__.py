"""One call from a sweep folder to paper-ready figures and fit tables.

    write_report("results/scaling")            # -> results/scaling/report/index.html

load -> ``content.build`` (best lr, queries, power-law fits, charts) ->
``render`` (tables, chart files, index page) -> written here as ``<chart>.<fmt>``
for each format (svg / png / pdf through vl-convert, html self-contained, json = the
Vega-Lite spec), a fits table (``fits.csv``, ``fits.md``, ``fits.tex``), slope comparisons
between optimisers (``comparisons.csv``) and between optimiser families
(``family_comparisons.csv``), the fitted quantities at each size with their seed intervals
(``levels.csv``) and the families' differences in them (``family_levels.csv``; family
contrasts take the optimisers as the units, seeds paired; one declared primary contrast keeps
its raw p, every other p in the three comparison tables is Holm-adjusted in ``p_holm``),
``best_lr.csv``, the fitted best lr against size (``lr_fit.csv``, where lr ladders ran at 2+
sizes), the level at each ladder's fitted loss-optimal lr and its slope across widths
(``optimum.csv``, ``optimum_slopes.csv``, ``optimum_families.csv``, ``twins.csv``), ``onset.csv`` and ``index.html``: one self-contained page with every chart inlined
as SVG, the tables, the invariance checks and the failed trials.

Failed and diverged trials are excluded and counted. A sweep with one model size gets its
charts but no fits (the index says why); a missing table (no checks, no curves) skips only
what needs it.

The package: ``content`` computes (``build``: what finished, the best lr, then each section
of ``content.SECTIONS`` in turn; ``section`` says what a section is and is handed), one module
per section (``kurtosis``, ``bases``, ``quant``, ``lr``, ``optimum``, ``scaling``, ``privilege``, ``sinks``,
``dims``, ``sae``, ``slopes``, ``checks``), ``fits`` holds the fit specs, ``render`` turns the
content into bytes; this module writes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

from analysis.load import Results, load
from analysis.multiplicity import DEFAULT_PRIMARY, PrimaryContrast, parse_primary
from analysis.report import privilege, render
from analysis.report.content import COUNT_FIT_NOTE, build
from analysis.report.fits import DEFAULT_FITS, FitSpec
from analysis.report.section import ReportContent
from analysis.vega_workers import VegaWorkers
from resultstore import uri as storage

__all__ = ["DEFAULT_FITS", "FitSpec", "ReportResult", "write_report"]

Format = Literal["svg", "png", "pdf", "html", "json"]
FORMATS = ("svg", "png", "pdf", "html", "json")


@dataclass
class ReportResult:
    """What ``write_report`` wrote (``files``; ``charts``: each chart's files by name), and what
    it found: ``content``, whose fields also read through (``rep.notes`` is
    ``rep.content.notes``; ``rep.charts`` is the files, ``rep.content.charts`` the Altair charts)."""

    out: str
    index: str
    content: ReportContent
    files: list[str] = field(default_factory=list)
    charts: dict[str, list[str]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "content":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.content, name)


def write_report(
    path: str | os.PathLike[str] | Results,
    out: str | os.PathLike[str] | None = None,
    formats: Sequence[Format] = ("svg", "png"),
    *,
    x: str = "params_non_embedding",
    fit_specs: Sequence[FitSpec] = DEFAULT_FITS,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    png_scale: float = 2.0,
    onset_threshold: float = 3.5,
    primary: PrimaryContrast | str | None = DEFAULT_PRIMARY,
    on_progress: Callable[[str], None] | None = None,
) -> ReportResult:
    """Load the sweep at ``path``, fit, chart, and write everything to ``out``
    (default ``<sweep folder>/report``; local or ``s3://`` / ``gs://``).

    ``formats``: any of svg, png, pdf, html, json (``png_scale`` x the 72-dpi size; 2 gives
    ~144 dpi at one paper column). The main charts and fits show the best-lr points
    (``selection.best_lr``); ``onset_threshold`` is the kurtosis whose first crossing is marked.
    ``primary``: the one contrast declared before the run (``multiplicity.PrimaryContrast``, or
    its text ``FAMILY[:AGAINST+AGAINST...][@FIT]``, or ``"none"``); default ``per_coordinate``
    minus every other family pooled, in the first fit: its slope and its level at the largest
    size keep their raw p, every other comparison's p is Holm-adjusted (``p_holm``).
    ``on_progress(msg)`` is called at each stage.
    Returns a ``ReportResult`` listing the files, the fits and notes (what was skipped)."""
    primary = parse_primary(primary)
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"unknown format(s) {bad}; choose from {', '.join(FORMATS)}")
    say = on_progress or (lambda _msg: None)
    results = path if isinstance(path, Results) else None
    if results is None:
        say(f"loading {os.fspath(path)}")  # type: ignore[arg-type]
        results = load(path)  # type: ignore[arg-type]
    out_dir = os.fspath(out) if out is not None else f"{results.path}/report"
    writer = _Writer(out_dir)
    # Started now, the render processes warm up while the numbers are computed, then draw each
    # chart while the next is computed (vl-convert holds the GIL: threads would not overlap)
    with VegaWorkers(formats, png_scale, render.vl_version()) as workers:
        c = build(
            results, x=x, fit_specs=fit_specs, n_boot=n_boot, seed=seed, confidence=confidence,
            onset_threshold=onset_threshold, primary=primary, say=say, on_chart=workers.submit,
        )  # fmt: skip
        say(f"rendering {len(c.charts)} charts ({', '.join(formats)}) on {max(1, len(workers.procs))} processes")
        rendered = render.render_charts(c.charts, formats, png_scale, workers)
    rep = ReportResult(out=out_dir, index=writer.uri("index.html"), content=c)

    for name, files in rendered.items():
        rep.charts[name] = [writer.write(f"{name}.{fmt}", files[fmt]) for fmt in formats]
        rep.files += rep.charts[name]
    for t in c.tables.values():  # every table a section added (ctx.table), as <name>.csv
        if t.frame.height or t.keep_empty:
            rep.files.append(writer.write(f"{t.name}.csv", t.frame.write_csv().encode()))
    if c.privilege.height:  # issue 32: the per-trial test
        rep.files.append(writer.write("privilege.md", privilege.markdown(c.privilege, c.x).encode()))
    if len(c.sizes) >= 2 and c.n_done:
        say("writing fits.csv, fits.md, fits.tex")
        md = render.fits_markdown(c.fits, c.comparisons, confidence, c.family_comparisons, c.levels, c.family_levels)
        if COUNT_FIT_NOTE in c.notes:
            md += "\n" + COUNT_FIT_NOTE + "\n"
        md += lr_fit_markdown(c.lr_fit, confidence)
        rep.files.append(writer.write("fits.md", md.encode()))
        rep.files.append(writer.write("fits.tex", render.fits_latex(c.fits, confidence).encode()))
    say("writing index.html")
    svgs = {name: files["svg"].decode() for name, files in rendered.items()}
    page = render.index_html(c, svgs, formats, confidence)
    rep.files.append(writer.write("index.html", page.encode()))
    say(f"report written to {rep.index}")
    return rep


def lr_fit_markdown(lr_fit: pl.DataFrame, confidence: float) -> str:
    """The lr*(N) fits as a fits.md section ("" when there are none)."""
    if lr_fit.height == 0:
        return ""
    lines = [
        "", "# Best lr against size", "",
        f"lr*(N) = lr0 · (N / N0)^b, least squares of log lr* over the best-lr points; {confidence:.0%} "
        "t-interval of b over sizes. A spec takes lr: lr0 and lr_scaling: {reference_params: N0, exponent: b} "
        "(lr_fit.csv).", "",
        "| Config | N0 | lr0 | b [CI] | sizes | Note |", "| --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for r in lr_fit.iter_rows(named=True):
        ci = "" if r["exponent_lo"] is None else f" [{r['exponent_lo']:.3f}, {r['exponent_hi']:.3f}]"
        lines.append(
            f"| {r['config'] or r['optimizer']} | {r['reference_params']:,.0f} | {r['lr_at_reference']:.3g} | "
            f"{r['exponent']:.3f}{ci} | {r['n_sizes']} | {(r['note'] or '').replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


class _Writer:
    """Writes bytes under a local folder or an ``s3://`` / ``gs://`` prefix."""

    def __init__(self, out: str) -> None:
        self.out = out.rstrip("/")
        self.fs, self.root = storage.filesystem(out)
        s = storage.scheme(out)
        self.prefix = f"{s}://" if s else ""
        self.fs.create_dir(self.root, recursive=True)

    def uri(self, name: str) -> str:
        return f"{self.prefix}{self.root}/{name}"

    def write(self, name: str, data: bytes) -> str:
        if self.prefix:  # object stores: a single PUT is already atomic (and has no rename)
            with self.fs.open_output_stream(f"{self.root}/{name}") as f:
                f.write(data)
            return self.uri(name)
        tmp = f"{self.root}/.{name}.tmp"  # local: write aside, then rename into place
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, f"{self.root}/{name}")
        return self.uri(name)
