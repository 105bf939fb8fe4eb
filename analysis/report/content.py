"""The report's content from a sweep's results: best-lr selection, the charts (Altair
objects and captions), the power-law fits and comparisons, and the tables. Computes, never
renders or writes (``render``, the package's ``write_report``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analysis import charts, counts, fits, queries, selection
from analysis.report import dims, privilege, sae, sinks
from analysis.labels import SITE_NAMES
from analysis.load import Results
from analysis.lr_fit import fit_lr_scaling, lr_fit_curves
from analysis.null import NULL_LABEL
from analysis.query_base import group_keys, summarise
from analysis.multiplicity import DEFAULT_PRIMARY, PrimaryContrast
from analysis.report.fits import (
    DEFAULT_FITS, FitSpec, adjust_comparisons, compare_family_lines, compare_lines, level_rows, primary_fit,
)  # fmt: skip

__all__ = ["ReportContent", "build"]


@dataclass
class ReportContent:
    """Everything the report shows, computed; ``charts[name]`` is an Altair chart with its
    caption in ``captions[name]`` (in display order)."""

    name: str
    path: str
    x: str
    sizes: list[Any] = field(default_factory=list)
    n_runs: int = 0
    n_done: int = 0
    n_failed: int = 0
    n_diverged: int = 0
    done: pl.DataFrame = field(default_factory=pl.DataFrame)
    failures: pl.DataFrame = field(default_factory=pl.DataFrame)
    charts: dict[str, Any] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)
    fits: pl.DataFrame = field(default_factory=pl.DataFrame)
    skipped: pl.DataFrame = field(default_factory=pl.DataFrame)
    comparisons: pl.DataFrame = field(default_factory=pl.DataFrame)
    family_comparisons: pl.DataFrame = field(default_factory=pl.DataFrame)
    levels: pl.DataFrame = field(default_factory=pl.DataFrame)
    family_levels: pl.DataFrame = field(default_factory=pl.DataFrame)
    privilege: pl.DataFrame = field(default_factory=pl.DataFrame)
    best_lr: pl.DataFrame = field(default_factory=pl.DataFrame)
    lr_fit: pl.DataFrame = field(default_factory=pl.DataFrame)
    onsets: pl.DataFrame | None = None
    check_summary: pl.DataFrame = field(default_factory=pl.DataFrame)
    notes: list[str] = field(default_factory=list)

    @property
    def best_lr_csv(self) -> pl.DataFrame:
        """``best_lr`` as written to best_lr.csv (the ladder joined into one string)."""
        keep = [c for c in _BEST_COLUMNS if c in self.best_lr.columns]
        return self.best_lr.select(keep).with_columns(pl.col("lrs").cast(pl.List(pl.String)).list.join(" "))


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
) -> ReportContent:
    """Compute the report's content from ``results`` (see ``report.write_report``).
    ``on_chart(name, chart)`` is called as each chart is ready (to start rendering it)."""
    first = primary_fit(fit_specs, primary)  # the fit the primary contrast is read in
    c = ReportContent(name=results.name, path=results.path, x=x)
    built = _Built(on_chart)  # name -> (chart, caption)
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
    if x not in done.columns or done.get_column(x).null_count() == done.height:
        fallback = "params" if "params" in done.columns else x
        if fallback != x:
            c.notes.append(f"column {x} is empty; model size is {fallback} instead.")
            x = fallback
    sizes = sorted(v for v in done.get_column(x).unique().to_list() if v is not None) if done.height else []
    facet = "norm" if done.height and done.get_column("norm").n_unique() > 1 else None
    line = "tuned_line_id"  # one config across sizes, at each size's best lr

    # ---- one pass over the metrics: keep (in memory) only the metrics the report uses, so
    # the dozen queries below do not each rescan every Parquet file
    say("scanning metrics")
    needed = sorted({"kurtosis", "quant_loss_delta", *privilege.METRICS, *sinks.METRICS,
                     *(s.metric for s in fit_specs if s.site is not None)})
    used = results.metrics.filter(pl.col("metric").is_in(needed)).collect() if c.n_done else None
    history = results  # every eval step: the over-training chart and the onsets
    if used is not None:
        history = dataclasses.replace(results, metrics=used.lazy())
        # Every other view reads each series at its final step (queries' default): keep those
        # rows only (~1/steps of them), the same rows at_step picks per metric, site and basis
        last = pl.col("step") == pl.col("step").max().over("trial_id", "metric", "site", "basis")
        results = dataclasses.replace(results, metrics=used.filter(last).lazy())
    have = set(used.select("site", "basis", "metric").unique().iter_rows()) if used is not None else set()

    fit_tables: list[pl.DataFrame] = []
    comparison_rows: list[dict[str, Any]] = []
    family_rows: list[dict[str, Any]] = []
    level_tables: list[dict[str, Any]] = []
    family_level_rows: list[dict[str, Any]] = []
    if c.n_done == 0:
        c.notes.append("No trial has finished: nothing to chart or fit.")
    elif len(sizes) < 2:
        c.notes.append(
            f"Only one model size ({charts.format_count(sizes[0]) if sizes else '?'} "
            f"{charts.AXIS_TITLES.get(x, x).lower()}): "
            "power-law fits need at least two, so no fits were made."
        )

    if c.n_done:
        # ---- best lr: the main charts and fits show one lr per optimiser, size, norm, rotation
        c.best_lr = selection.best_lr(results, confidence=confidence)
        main = selection.best_lr_results(results, c.best_lr)
        main_history = selection.best_lr_results(history, c.best_lr)
        tuned = bool(c.best_lr.height) and int(c.best_lr.get_column("n_lrs").max()) > 1
        shown = (
            "best-lr points (per optimiser, size, norm and rotation, the lr with the lowest "
            "seed-mean final val loss; see the best-lr table)"
            if tuned else "every config (each was run at one lr: untuned)"
        )  # fmt: skip
        flagged = c.best_lr.filter(pl.col("edge").is_not_null() | pl.col("tie"))
        if flagged.height:
            c.notes.append(
                f"{flagged.height} of {c.best_lr.height} best-lr choices are flagged (an "
                "optimum at the edge of the lr ladder, or a tie): see the best-lr table."
            )
        # ---- layer profile and training dynamics
        if ("resid", "stored", "kurtosis") in have:
            say("kurtosis by layer")
            prof = queries.layer_profile(main, "kurtosis", confidence=confidence).collect()
            built["kurtosis_by_layer"] = (
                charts.kurtosis_by_layer(prof, facet=facet),
                "Residual-stream kurtosis by layer at the end of training (largest model), "
                f"mean over seeds with {confidence:.0%} t-intervals; {shown}. Dashed: the exact null "
                "3(d−1)/(d+1) at the model's width (what any activations read in a Haar-random basis).",
            )
            say("kurtosis over training")
            over = queries.metric_over_training(main_history, "kurtosis", confidence=confidence).collect()
            onsets = selection.onset(main_history, threshold=onset_threshold, confidence=confidence).collect()
            built["kurtosis_over_training"] = (
                charts.metric_over_training(
                    over, facet=facet, size=None, threshold=onset_threshold, onsets=onsets,
                    title="Residual-stream kurtosis over training",
                ),
                "Residual-stream kurtosis (mean over blocks) against training tokens, one row per "
                f"model size; {shown}. Diamonds: mean tokens of the first eval at which kurtosis exceeds "
                f"{onset_threshold:g} (dotted), with {confidence:.0%} t-intervals over the seeds that "
                "crossed (onset.csv also counts seeds that never did).",
            )
            c.onsets = onsets.select(pl.exclude("tuning_id", "line_id", "tuned_line_id"))
            if "final_val_loss" in done.columns:
                say("kurtosis at matched loss")
                every = selection.versus(
                    queries.loss_table(results, confidence=confidence),
                    queries.scale_table(results, "kurtosis", confidence=confidence),
                ).collect()
                built["kurtosis_vs_loss"] = (
                    charts.kurtosis_vs_loss(every, facet=facet, best=c.best_lr),
                    "Matched-loss view: residual-stream kurtosis (mean over blocks) against final "
                    "validation loss, one point per config at each lr ladder's best lr (faint: its "
                    "other lrs that finished; every size; marker "
                    f"size = model size), {confidence:.0%} t-intervals over seeds both ways. "
                    "Compare optimisers at the same loss, not the same step.",
                )
            if _varies(done, "optimizer_family"):
                say("kurtosis by optimiser family")
                fam = queries.scale_table(main, "kurtosis", confidence=confidence).collect()
                built["kurtosis_by_family"] = (
                    charts.metric_vs_params(fam, None, x=x, facet="optimizer_family", connect=True,
                                            title="Residual stream, by optimiser family"),
                    "Residual-stream kurtosis (mean over blocks) against model size, one line per "
                    f"optimiser, one panel per optimiser family; {shown}; seed means with "
                    f"{confidence:.0%} t-intervals. Dashed: the exact null 3(d−1)/(d+1) of each size.",
                )  # fmt: skip
            elif len(sizes) >= 2:  # one family: the raw kurtosis against size, beside its null
                say("kurtosis against size")
                raw = queries.scale_table(main, "kurtosis", confidence=confidence).collect()
                built["kurtosis_vs_params"] = (
                    charts.metric_vs_params(raw, None, x=x, facet=facet, connect=True, title="Residual stream"),
                    "Residual-stream kurtosis (mean over blocks) against model size, one line per config; "
                    f"{shown}; seed means with {confidence:.0%} t-intervals. Dashed: the exact null "
                    "3(d−1)/(d+1) of each size (it rises with d: raw kurtosis drifts up with width even "
                    "without a privileged basis, which is why the fits use kurtosis / null).",
                )  # fmt: skip
        else:
            c.notes.append("No residual-stream kurtosis recorded: layer and training charts skipped.")
        if any(s in {("attn_in", "computation"), ("mlp_in", "computation")} for s in {(a, b) for a, b, m in have if m == "kurtosis"}):
            say("basis comparison")
            bc = queries.basis_comparison(main, "kurtosis", confidence=confidence).collect()
            built["basis_comparison"] = (
                charts.basis_comparison(bc),
                "Kurtosis by layer in the residual stream's stored basis, random bases (the "
                "measured control: one basis in older stores, the mean over Haar bases in newer), "
                "and the attention / MLP inputs in their computation basis (largest model); "
                f"{shown}. Dashed: the exact null 3(d−1)/(d+1).",
            )
        comp_sites = tuple(s for s in selection.COMPUTATION_SITES if (*s, "kurtosis") in have)
        if comp_sites and _varies(done.filter(pl.col("rotation").is_in(["partial", "shared"])), "rotation_label"):
            gt = selection.group_size_table(main, sites=comp_sites, confidence=confidence).collect()
            if gt.get_column("group_size_x").n_unique() >= 2:
                say("kurtosis against group size")
                none = selection.unrotated_table(main, sites=comp_sites, confidence=confidence).collect()
                built["kurtosis_vs_group_size"] = (
                    charts.kurtosis_vs_group_size(gt, baseline=none),
                    "Kurtosis of the attention / MLP inputs in their computation basis over the exact null "
                    "3(d−1)/(d+1) (mean over blocks) against the number of consecutive blocks that share one "
                    "basis (partial(k); shared = every block), ends rotated or not (embeddings: false); "
                    f"largest model; {shown}; seed means with {confidence:.0%} t-intervals. Dotted over a "
                    "faint band: the same model trained without rotation, where the sweep has it.",
                )
        quant = sorted(b for s_, b, m in have if m == "quant_loss_delta" and s_ == "model")
        if not quant:
            c.notes.append("No quantisation penalty recorded (metric quant_loss_delta): chart skipped.")
        for qb in quant:
            say(f"{qb} penalty against kurtosis")
            qt = selection.quant_penalty(main, qb, confidence=confidence).collect()
            c.notes.append(_quant_floor_note(qb, qt))
            built[f"quant_{qb}_vs_kurtosis"] = (
                charts.quant_penalty(qt, facet=facet),
                f"{qb.upper()} quantisation penalty (quantised minus float val loss at the final "
                "step) against residual-stream kurtosis (mean over blocks), one point per config "
                f"(marker size = model size); {shown}; {confidence:.0%} t-intervals over seeds.",
            )

        # ---- the best lr against size (where ladders were run at 2+ sizes)
        if tuned:
            # against non-embedding parameters whatever the charts' x: the N of a spec's lr_scaling
            lr_x = "params_non_embedding" if "params_non_embedding" in c.best_lr.columns else x
            c.lr_fit = fit_lr_scaling(c.best_lr, lr_x, confidence=confidence)
            if c.lr_fit.height:
                say("fitting the best lr against size")
                built["lr_vs_params"] = (
                    _lr_chart(c.best_lr, c.lr_fit, lr_x),
                    "Best lr per size (hollow: at the edge of its ladder, a bound) with the fitted "
                    "lr*(N) = lr0 (N/N0)^b per config (lr_fit.csv, with the exponent's "
                    f"{confidence:.0%} t-interval over sizes): " + _lr_fit_words(c.lr_fit) + ".",
                )

        # ---- scaling fits
        skipped: list[dict[str, Any]] = []
        for spec in fit_specs:
            if spec.count:
                if (spec.site, spec.basis, spec.metric) not in have:
                    c.notes.append(f"no {spec.metric} at {spec.site}/{spec.basis}: {spec.label} skipped.")
                    continue
                say(f"fitting {spec.label}")
                ft, skip, drawn = _count_fit(main, spec, x, line, facet, confidence, shown, len(sizes) >= 2)
                fit_tables.append(ft)
                skipped += skip
                for name, chart_and_caption in drawn.items():
                    built[name] = chart_and_caption
                continue
            if spec.site is None:
                if spec.metric not in done.columns:
                    c.notes.append(f"runs have no column {spec.metric}: {spec.label} skipped.")
                    continue
                per = queries.runs_table(main).with_columns(value=pl.col(spec.metric)).collect()
                table = queries.loss_table(main, spec.metric, confidence=confidence).collect()
            else:
                if spec.metric not in {m for _, _, m in have}:
                    continue  # a store written before the metric existed: nothing to say
                if (spec.site, spec.basis, spec.metric) not in have:
                    c.notes.append(f"no {spec.metric} at {spec.site}/{spec.basis}: {spec.label} skipped.")
                    continue
                control = queries.CONTROL if spec.control else None
                if control and (*control, spec.metric) not in have:
                    c.notes.append(f"no {spec.metric} control at {'/'.join(control)}: {spec.label} skipped.")
                    continue
                per = queries.per_trial(
                    main, spec.metric, spec.site, spec.basis or "", spec.layer_agg, control=control,
                    over_null=spec.over_null,
                ).collect()
                table = None
            # a fixed row order: the bootstrap resamples by position (group_by order is not fixed)
            per = per.filter(pl.col("value").is_finite()).sort(line, x, "seed", "trial_id")
            levels, family_levels = level_rows(per, x, line, spec, confidence, primary, spec is first)
            level_tables += levels
            family_level_rows += family_levels
            fitted: dict[Any, Any] = {}
            if len(sizes) >= 2:
                say(f"fitting {spec.label}")
                fitted = fits.fit_each(
                    per, x, "value", [line], offset=spec.offset, n_boot=n_boot, seed=seed,
                    seeds="seed", confidence=confidence,
                )  # fmt: skip
                ft = fits.fits_table(fitted, [line]).join(selection.line_labels(per, line), on=line, how="left")
                ft = ft.select(pl.lit(spec.label).alias("fit"), pl.all())
                ft = ft.sort([c for c in ("optimizer", "norm", "rotation_label", "config") if c in ft.columns])
                fit_tables.append(ft.filter(pl.col("exponent").is_not_null()))
                skipped += ft.filter(pl.col("exponent").is_null()).select("fit", "config", "note").to_dicts()
                comparison_rows += compare_lines(per, x, line, spec, n_boot, seed, confidence, fitted)
                family_rows += compare_family_lines(per, line, spec, confidence, fitted, primary, spec is first)
            if not spec.chart:
                continue
            curves = None
            if fitted:
                curves = fits.fit_curves(fitted, [line], x=x).join(
                    per.group_by(line).agg(pl.col(c).first() for c in queries.carried(per.columns, [line, x, "lr"])),
                    on=line, how="left",
                )  # fmt: skip
            if spec.site is None:
                chart = charts.loss_vs_params(table, curves, column=spec.metric, x=x, facet=facet)
                caption = "Final validation loss against model size, log-log"
            else:
                table = queries.scale_table(
                    main, spec.metric, spec.site, spec.basis or "", spec.layer_agg,
                    confidence=confidence, control=queries.CONTROL if spec.control else None,
                    over_null=spec.over_null,
                ).collect()  # fmt: skip
                ratio = {"reference": 1.0, "reference_text": NULL_LABEL,
                         "y_title": charts.METRIC_TITLES["kurtosis_over_null"]} if spec.over_null else {}  # fmt: skip
                chart = charts.metric_vs_params(
                    table, curves, metric=spec.metric, x=x, facet=facet,
                    title=_site_title(spec.site, spec.basis), **ratio,
                )  # fmt: skip
                caption = f"{spec.label[:1].upper()}{spec.label[1:]} against model size (log x)"
                if spec.over_null:
                    caption += " (1 = no privileged basis; the fitted exponent is the slope of log(kurtosis / null))"
            fitted_note = (
                f"; lines: power-law fits of y − {spec.offset:g} with {confidence:.0%} bootstrap bands"
                if fitted and spec.offset
                else "; lines: power-law fits with bootstrap bands"
                if fitted
                else ""
            )
            built[f"{spec.name}_vs_params"] = (
                chart,
                f"{caption}; {shown}: seed means with {confidence:.0%} t-intervals{fitted_note}.",
            )
        if skipped:
            c.skipped = pl.from_dicts(skipped)
            c.notes.append(
                f"{len(skipped)} fits are undefined and not listed: "
                + "; ".join(f"{r['fit']}: {r['config']} ({_why(r['note'])})" for r in skipped)
                + "."
            )

    if c.n_done:  # issue 32: the per-trial rank test (a table) and the top-1 share with its null; issue 36: sinks
        c.privilege = privilege.add(main, done, built, c.notes, x=x, facet=facet, confidence=confidence)
        sinks.add(main, done, built, c.notes, confidence=confidence)
    dims.add(results, done, built, c.notes)  # what the outlier dimensions are (issue 20)

    sae.add_sae_section(results, built, c.notes, say)  # issue 21's section: a chart, or one note
    # ---- tables
    c.fits = (
        pl.concat(fit_tables, how="diagonal_relaxed")
        if fit_tables
        else pl.DataFrame(schema={"fit": pl.String})
    )
    c.comparisons = pl.from_dicts(comparison_rows) if comparison_rows else pl.DataFrame()
    c.family_comparisons = pl.from_dicts(family_rows) if family_rows else pl.DataFrame()
    c.levels = pl.from_dicts(level_tables) if level_tables else pl.DataFrame()
    c.family_levels = pl.from_dicts(family_level_rows) if family_level_rows else pl.DataFrame()
    if c.comparisons.height or c.family_comparisons.height or c.family_levels.height:
        c.comparisons, c.family_comparisons, c.family_levels, note = adjust_comparisons(
            c.comparisons, c.family_comparisons, c.family_levels, primary, fit_specs)
        c.notes.append(note)
    if c.fits.height and c.fits.get_column("fit").str.starts_with("outlier fraction").any():
        c.notes.append(COUNT_FIT_NOTE)
    if c.fits.height and {"optimizer", "config", "exponent_low"} <= set(c.fits.columns):
        built["slopes"] = (
            charts.slopes(c.fits),
            f"Each config's fitted exponent with its {confidence:.0%} interval (the fits table), one panel "
            "per fit: kurtosis / null (0 = no growth over the null), outlier fraction, loss.",
        )
    if c.lr_fit.height:
        c.notes.append(
            f"lr*(N) fitted for {c.lr_fit.height} config(s) from their best-lr points (lr_fit.csv: "
            "a spec's optimizer entry takes lr = lr_at_reference with lr_scaling: {reference_params, exponent})."
        )

    # ---- checks and failures
    checks = results.checks.collect()
    if checks.height == 0:
        c.notes.append("No invariance checks recorded (checks/ is empty or missing).")
    c.check_summary = _check_summary(checks, done)
    c.failures = runs.filter(pl.col("status") != "done")
    c.done = done if c.n_done else pl.DataFrame()
    c.x, c.sizes = x, sizes
    c.charts = {name: chart for name, (chart, _) in built.items()}
    c.captions = {name: caption for name, (_, caption) in built.items()}
    return c


def _quant_floor_note(scheme: str, qt: pl.DataFrame) -> str:
    """How the quantisation penalties compare with this eval batch's floor (2 SE of each penalty
    over the eval sequences), or why that cannot be said."""
    floors = qt.get_column("floor").drop_nulls() if "floor" in qt.columns else pl.Series([], dtype=pl.Float64)
    if floors.len() == 0:
        return (f"{scheme.upper()}: no eval-batch floor recorded (metric quant_loss_delta_se, written from "
                "this version on): penalty differences smaller than a few thousandths of a nat may be noise.")
    within = qt.filter(pl.col("floor").is_not_null() & (pl.col("mean").abs() <= pl.col("floor"))).height
    return (f"{scheme.upper()}: eval-batch floor (2 SE of the penalty over the eval sequences) "
            f"{floors.min():.4f}-{floors.max():.4f} nats; {within} of {floors.len()} configs' penalties lie "
            "within it of 0, and differences between penalties smaller than it are this batch's noise.")


COUNT_FIT_NOTE = (
    "Outlier-fraction fits are binomial GLMs of the outlier counts out of d_model × blocks coordinates "
    "(log link, log size as regressor), not log-log least squares: zero counts are data. Seeds are the "
    "replicates: standard errors cluster-robust by seed, t interval with seeds − 1 dof (one seed: "
    "Pearson-scaled, n − 2 dof). " + counts.STRUCTURAL_NOTE + "."
)


def _lr_fit_words(lr_fit: pl.DataFrame) -> str:
    """Each fitted lr*(N) in words, for the chart's caption."""
    parts = []
    for r in lr_fit.iter_rows(named=True):
        ci = "" if r["exponent_lo"] is None else f" [{r['exponent_lo']:.2f}, {r['exponent_hi']:.2f}]"
        note = f" ({r['note']})" if r["note"] else ""
        parts.append(f"{r['config'] or r['optimizer']}: b = {r['exponent']:.2f}{ci}, "
                     f"lr0 = {r['lr_at_reference']:.3g} at N0 = {r['reference_params']:,.0f}{note}")  # fmt: skip
    return "; ".join(parts)


def _count_fit(
    main: Results, spec: FitSpec, x: str, line: str, facet: str | None, confidence: float, shown: str, fit: bool
) -> tuple[pl.DataFrame, list[dict[str, Any]], dict[str, tuple[Any, str]]]:
    """The outlier-fraction fit of one count spec (``analysis.counts``): its fits-table rows,
    the configs it could not fit, and its charts (by size with the fit, by layer per size)."""
    per = queries.per_trial(main, spec.metric, spec.site or "", spec.basis or "", "sum").collect()
    per = per.filter(pl.col("value").is_finite()).with_columns(
        exposure=(pl.col("d_model") * pl.col("n_layers")).cast(pl.Float64)
    ).with_columns(fraction=pl.col("value") / pl.col("exposure")).sort(line, x, "seed", "trial_id")
    table_rows = pl.DataFrame(schema={"fit": pl.String})
    skipped: list[dict[str, Any]] = []
    curves = None
    if fit:
        fitted = counts.fit_counts_each(per, x, "value", "exposure", [line], confidence=confidence)
        ft = counts.count_fits_table(fitted, [line]).join(selection.line_labels(per, line), on=line, how="left")
        ft = ft.select(pl.lit(spec.label).alias("fit"), pl.all())
        ft = ft.sort([c for c in ("optimizer", "norm", "rotation_label", "config") if c in ft.columns])
        table_rows = ft.filter(pl.col("exponent").is_not_null())
        skipped = ft.filter(pl.col("exponent").is_null()).select("fit", "config", "note").to_dicts()
        curves = counts.count_fit_curves(fitted, [line], x=x).join(
            per.group_by(line).agg(pl.col(c).first() for c in queries.carried(per.columns, [line, x, "lr"])),
            on=line, how="left",
        )  # fmt: skip
    keys, carry = group_keys(per.lazy(), None)
    table = summarise(per.lazy(), keys, "fraction", confidence=confidence, carry=carry).collect()
    where = _site_title(spec.site, spec.basis)
    drawn = {
        f"{spec.name}_vs_params": (
            charts.metric_vs_params(table, curves, metric="outlier_fraction", x=x, facet=facet, title=where),
            f"Outlier fraction ({spec.metric}: coordinates beyond 6× the token's RMS on any eval token, "
            f"summed over blocks, / (d_model × blocks)), {where}, against model size; {shown}: seed means with "
            f"{confidence:.0%} t-intervals"
            + (f"; lines: binomial GLM fits with {confidence:.0%} bands (seed-clustered)" if curves is not None and curves.height else "")
            + f". {counts.STRUCTURAL_NOTE}.",
        )
    }
    prof = queries.layer_profile(main, spec.metric, spec.site or "", spec.basis or "", confidence=confidence).collect()
    if prof.height:
        scaled = [c for c in ("mean", "std", "sem", "ci_low", "ci_high") if c in prof.columns]
        prof = prof.with_columns(pl.col(c) / pl.col("d_model") for c in scaled)
        drawn[f"{spec.name}_by_layer"] = (
            charts.kurtosis_by_layer(prof, metric="outlier_fraction", size=None, facet=facet,
                                     title=f"Outlier fraction by layer, {where}"),
            f"Outlier fraction ({spec.metric} / d_model) by layer, {where}, one row per model size; {shown}; "
            f"seed means with {confidence:.0%} t-intervals. {counts.STRUCTURAL_NOTE}.",
        )  # fmt: skip
    return table_rows, skipped, drawn


def _lr_chart(best: pl.DataFrame, lr_fit: pl.DataFrame, x: str) -> Any:
    """Best lr against size, log-log, with each config's fitted lr*(N)."""
    import altair as alt

    pts = best.join(lr_fit.select("tuned_line_id", "config"), on="tuned_line_id", how="inner").with_columns(
        at_edge=pl.col("edge").is_not_null()
    ).select(x, "lr", "optimizer", "config", "at_edge", "flag")
    cur = lr_fit_curves(lr_fit, best, x).join(lr_fit.select("tuned_line_id", "config"), on="tuned_line_id")
    color = alt.Color("optimizer:N", scale=charts.optimizer_scale(pts.get_column("optimizer").to_list()),
                      title="Optimizer", legend=charts.COLOR_LEGEND)  # fmt: skip
    x_enc = alt.X(f"{x}:Q", title=charts.AXIS_TITLES.get(x, x), scale=alt.Scale(type="log", nice=False, padding=10))
    y_scale = alt.Scale(type="log", nice=False, padding=10)
    y_enc = alt.Y("lr:Q", title="Best learning rate", scale=y_scale)
    line = alt.Chart(cur).mark_line(strokeWidth=1.4).encode(
        x=x_enc, y=alt.Y("fit:Q", scale=y_scale), color=color, detail="config:N"
    )
    points = alt.Chart(pts).mark_point(size=40, strokeWidth=1.5).encode(
        x=x_enc, y=y_enc, color=color, fill=alt.condition("datum.at_edge", alt.value("white"), color),
        tooltip=[x, "lr", "config", "flag"],
    )  # fmt: skip
    chart = alt.layer(line, points).properties(width=charts.WIDTH, height=charts.HEIGHT, title="Best lr against size")
    return charts.apply_theme(chart)


class _Built(dict):
    """The charts built so far, name -> (chart, caption); tells ``on_chart`` of each."""

    def __init__(self, on_chart: Callable[[str, Any], None]) -> None:
        super().__init__()
        self.on_chart = on_chart

    def __setitem__(self, name: str, chart_and_caption: tuple[Any, str]) -> None:
        super().__setitem__(name, chart_and_caption)
        self.on_chart(name, chart_and_caption[0])


_BEST_COLUMNS = (
    "optimizer", "norm", "rotation_label", "d_model", "n_layers", "params_non_embedding", "lr",
    "mean", "ci_low", "ci_high", "n", "lrs", "n_lrs", "edge", "tie", "runner_up_lr", "diverged",
    "flag", "config_id", "tuning_id",
)  # fmt: skip


def _why(note: str | None) -> str:
    """A skipped fit's reason in a few words."""
    note = note or ""
    if "<= 0" in note:
        return "no excess: " + note.split(":")[0]
    return note.split(";")[0]


def _varies(df: pl.DataFrame, col: str) -> bool:
    return col in df.columns and df.get_column(col).drop_nulls().n_unique() > 1


def _site_title(site: str, basis: str | None) -> str:
    """E.g. ``Residual stream (stored basis)``, ``MLP input (computation basis)``."""
    name = SITE_NAMES.get((site, basis or ""), site).split(",")[0]
    return f"{name[:1].upper()}{name[1:]} ({basis} basis)" if basis else name




def _check_summary(checks: pl.DataFrame, done: pl.DataFrame) -> pl.DataFrame:
    if checks.height == 0:
        return checks
    keys = [c for c in ("norm", "rotation", "optimizer") if c in done.columns]
    joined = checks.join(done.select("trial_id", *keys), on="trial_id", how="inner")
    order = {"float64": 0, "float32": 1, "bfloat16": 2}
    return (
        joined.group_by("check", "norm", "dtype")
        .agg(
            mean_abs=pl.col("value").abs().mean(),
            max_abs=pl.col("value").abs().max(),
            n=pl.len(),
        )
        .with_columns(_o=pl.col("dtype").replace_strict(order, default=9, return_dtype=pl.Int64))
        .sort("check", "norm", "_o")
        .drop("_o")
    )
