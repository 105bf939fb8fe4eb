"""The report's content from a sweep's results: what finished, one pass over the metrics the
sections read, the best-lr selection, then each section of ``SECTIONS`` in turn (its charts,
captions, notes and tables). Computes, never renders or writes (``render``, the package's
``write_report``).

A new section is one module with a ``Section`` (``analysis.report.section``) and one entry in
``SECTIONS``, where it goes in the report."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import polars as pl

from analysis import charts, queries, selection
from analysis.load import Results
from analysis.multiplicity import DEFAULT_PRIMARY, PrimaryContrast
from analysis.report import bases, checks, dims, kurtosis, lr, optimum, privilege, quant, render, sae, scaling, sinks, slopes
from analysis.report.fits import DEFAULT_FITS, FitSpec
from analysis.report.quant import floor_note as _quant_floor_note  # noqa: F401  (its old name, for tests)
from analysis.report.section import Charts, Context, Options, ReportContent, Section, metrics_read
from analysis.report.slopes import COUNT_FIT_NOTE

__all__ = ["COUNT_FIT_NOTE", "SECTIONS", "ReportContent", "build"]

BEST_LR_WORDS = (
    "Per optimiser, size, norm and rotation (the config without its lr), the lr with the lowest seed-mean final val "
    "loss; the runner-up lr and how much worse it ends on the seeds the two share (seeds are paired across lrs: the "
    "same init and data order; one shared seed is a choice resting on that seed); flags: an optimum at the edge of "
    "the ladder (extend it), a tie with the runner-up (paired where they share 2+ seeds), a single lr (untuned)."
)


def _best_lr_table(ctx: Context) -> None:
    """The best-lr choices (``_best_lr`` computes them before any section reads them) as best_lr.csv."""
    c = ctx.content
    if c.best_lr.height:
        ctx.table("best_lr", c.best_lr_csv, BEST_LR_WORDS, title="Best learning rates",
                  shown=lambda _: render.best_lr_table(c.best_lr, ctx.x))


BEST_LR_SECTION = Section("best_lr", _best_lr_table)
"""Listed after the per-trial test, as the page always had it."""

SECTIONS: list[Section] = [
    kurtosis.SECTION,  # residual-stream kurtosis: by layer, over training, at matched loss, against size
    bases.SECTION,  # stored, random and computation bases; kurtosis against rotation group size
    quant.SECTION,  # quantisation penalty against kurtosis
    lr.SECTION,  # the best lr against size
    optimum.SECTION,  # the level at each ladder's fitted loss-optimal lr, its slope across widths (issue 45)
    scaling.SECTION,  # the power-law and count fits, their charts and tables
    privilege.SECTION,  # the per-trial rank test and the top-1 share (issue 32)
    BEST_LR_SECTION,  # the best-lr table
    sinks.SECTION,  # attention sinks (issue 36)
    dims.SECTION,  # what the outlier dimensions are (issue 20)
    sae.SECTION,  # the SAE probe (issue 21)
    slopes.SECTION,  # the fits' summary: Holm adjustment, the slopes chart, notes
    checks.SECTION,  # the invariance checks
]
"""The report's sections, in display order (their charts and notes appear in this order)."""


def build(
    results: Results,
    *,
    x: str = "params_non_embedding",
    fit_specs: Sequence[FitSpec] = DEFAULT_FITS,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    onset_threshold: float = 3.5,
    primary: PrimaryContrast | None = DEFAULT_PRIMARY,
    say: Callable[[str], None] = lambda _msg: None,
    on_chart: Callable[[str, Any], None] = lambda _name, _chart: None,
    sections: Sequence[Section] | None = None,
) -> ReportContent:
    """Compute the report's content from ``results`` (see ``report.write_report``): each of
    ``sections`` (default ``SECTIONS``) in turn, those that need finished trials only where
    some finished. ``on_chart(name, chart)`` is called as each chart is ready (to start
    rendering it)."""
    sections = SECTIONS if sections is None else sections
    options = Options(x=x, fit_specs=fit_specs, n_boot=n_boot, seed=seed, confidence=confidence,
                      onset_threshold=onset_threshold, primary=primary)  # fmt: skip
    c = ReportContent(name=results.name, path=results.path, x=x)
    ctx = _context(results, options, c, Charts(on_chart), say, metrics_read(sections, options))
    for section in sections:
        if c.n_done or not section.needs_done:
            section.add(ctx)
    c.failures = ctx.runs.filter(pl.col("status") != "done")
    c.done = ctx.done if c.n_done else pl.DataFrame()
    c.x, c.sizes = ctx.x, ctx.sizes
    c.charts = {name: chart for name, (chart, _) in ctx.built.items()}
    c.captions = {name: caption for name, (_, caption) in ctx.built.items()}
    return c


def _context(
    results: Results, options: Options, c: ReportContent, built: Charts, say: Callable[[str], None], needed: list[str]
) -> Context:
    """What every section is handed: the runs counted (into ``c``, with notes on what is
    excluded and what cannot be fitted), the metrics the sections read kept in memory, and
    the best-lr views where some trial finished."""
    # ---- runs: what finished, what did not (ids derived once, see analysis.identity)
    runs = queries.runs_table(results.runs.collect(), status=None).collect()
    results = dataclasses.replace(results, runs=runs.lazy())
    status = runs.get_column("status")
    c.n_runs = runs.height
    c.n_done = int((status == "done").sum())
    c.n_failed = int((status == "failed").sum())
    c.n_diverged = int((status == "diverged").sum())
    done = runs.filter(pl.col("status") == "done")
    say(
        f"{c.n_runs} trials: {c.n_done} done, {c.n_failed} failed, "
        f"{c.n_diverged} diverged (failed and diverged are excluded)"
    )
    if c.n_failed or c.n_diverged:
        c.notes.append(
            f"{c.n_failed} failed and {c.n_diverged} diverged trials are excluded "
            "from every chart and fit (listed at the end)."
        )
    x = options.x
    if x not in done.columns or done.get_column(x).null_count() == done.height:
        fallback = "params" if "params" in done.columns else x
        if fallback != x:
            c.notes.append(f"column {x} is empty; model size is {fallback} instead.")
            x = fallback
    sizes = sorted(v for v in done.get_column(x).unique().to_list() if v is not None) if done.height else []
    facet = "norm" if done.height and done.get_column("norm").n_unique() > 1 else None
    # ---- one pass over the metrics: keep (in memory) only the metrics the sections read, so
    # their queries do not each rescan every Parquet file
    say("scanning metrics")
    used = results.metrics.filter(pl.col("metric").is_in(needed)).collect() if c.n_done else None
    history = results  # every eval step: the over-training chart and the onsets
    if used is not None:
        history = dataclasses.replace(results, metrics=used.lazy())
        # Every other view reads each series at its final step (queries' default): keep those
        # rows only (~1/steps of them), the same rows at_step picks per metric, site and basis
        last = pl.col("step") == pl.col("step").max().over("trial_id", "metric", "site", "basis")
        results = dataclasses.replace(results, metrics=used.filter(last).lazy())
    have = set(used.select("site", "basis", "metric").unique().iter_rows()) if used is not None else set()
    if c.n_done == 0:
        c.notes.append("No trial has finished: nothing to chart or fit.")
    elif len(sizes) < 2:
        c.notes.append(
            f"Only one model size ({charts.format_count(sizes[0]) if sizes else '?'} "
            f"{charts.AXIS_TITLES.get(x, x).lower()}): "
            "power-law fits need at least two, so no fits were made."
        )
    ctx = Context(options=options, content=c, built=built, say=say, runs=runs, done=done, results=results,
                  history=history, x=x, sizes=sizes, facet=facet, have=have)  # fmt: skip
    if c.n_done:
        _best_lr(ctx)
    return ctx


def _best_lr(ctx: Context) -> None:
    """The best lr per optimiser, size, norm and rotation (``ctx.content.best_lr``), the views
    of the results at those points that the main charts and fits show, and a note on the
    choices at the edge of their ladder or tied."""
    c = ctx.content
    c.best_lr = selection.best_lr(ctx.results, confidence=ctx.confidence)
    ctx.main = selection.best_lr_results(ctx.results, c.best_lr)
    ctx.main_history = selection.best_lr_results(ctx.history, c.best_lr)
    ctx.tuned = bool(c.best_lr.height) and int(c.best_lr.get_column("n_lrs").max()) > 1
    ctx.shown = (
        "best-lr points (per optimiser, size, norm and rotation, the lr with the lowest "
        "seed-mean final val loss; see the best-lr table)"
        if ctx.tuned else "every config (each was run at one lr: untuned)"
    )  # fmt: skip
    # a single lr beside other configs' ladders reads as tuned unless it is named
    flagged = c.best_lr.filter(pl.col("edge").is_not_null() | pl.col("tie") | (pl.col("untuned") & ctx.tuned))
    if flagged.height:
        size = ctx.x if ctx.x in flagged.columns else "d_model"
        name = ["optimizer", *(k for k in ("norm", "rotation_label")
                               if k in c.best_lr.columns and c.best_lr.get_column(k).n_unique() > 1)]
        which = [f"{' · '.join(str(r[k]) for k in name)} at {charts.format_count(r[size])}"
                 f"{'' if size == ctx.x else ' d_model'} ({r['flag']}, lr {r['lr']:g})"
                 for r in flagged.sort("optimizer", size).iter_rows(named=True)]
        c.notes.append(
            f"{flagged.height} of {c.best_lr.height} best-lr choices are flagged (an optimum at the edge of the lr "
            f"ladder, a tie, or one lr beside other configs' ladders). Every chart, fit and contrast through an "
            f"edge or a single lr reads a bound or an untuned point, not an optimum (fit labels name them), and "
            f"through a tie one of two lrs the losses do not tell apart: {'; '.join(which)}. `sweep next` writes "
            f"the trials that settle edges, single lrs and ties whose runner-up has fewer seeds than the best."
        )
