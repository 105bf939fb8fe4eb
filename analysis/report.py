"""One call from a sweep folder to paper-ready figures and fit tables.

    write_report("results/scaling")            # -> results/scaling/report/index.html

load -> queries -> power-law fits -> charts, written as ``<chart>.<fmt>`` for each format
(svg / png / pdf through vl-convert, html self-contained, json = the Vega-Lite spec), a
fits table (``fits.csv``, ``fits.md``, ``fits.tex``), slope comparisons
(``comparisons.csv``), and ``index.html``: one self-contained page with every chart
inlined as SVG, the tables, the invariance checks and the failed trials.

Failed and diverged trials are excluded and counted. A sweep with one model size gets its
charts but no fits (the index says why); a missing table (no checks, no curves) skips only
what needs it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

from analysis import charts, fits, queries, storage
from analysis.load import Results, config_label, load

__all__ = ["DEFAULT_FITS", "FitSpec", "ReportResult", "write_report"]

Format = Literal["svg", "png", "pdf", "html", "json"]
FORMATS = ("svg", "png", "pdf", "html", "json")


@dataclass(frozen=True)
class FitSpec:
    """One power law to fit against model size, per config: a metric (aggregated over
    blocks with ``layer_agg``, then per trial) or, with ``site=None``, a runs column.
    ``offset`` is subtracted before fitting (3 = excess kurtosis over the Gaussian)."""

    metric: str
    site: str | None = "resid"
    basis: str | None = "stored"
    layer_agg: queries.LayerAgg = "mean"
    offset: float = 0.0
    chart: bool = True
    control: bool = False
    """Fit the excess over the no-privilege control (``queries.CONTROL``: the residual stream
    in a random basis, same trial, layer and step) instead of the raw value."""

    @property
    def name(self) -> str:
        """A file-name-safe identifier, e.g. ``kurtosis_resid_stored``."""
        if self.site is None:
            return self.metric
        parts = [self.metric, self.site]
        if self.basis not in ("stored", "computation", "neuron"):
            parts.append(str(self.basis))
        if self.layer_agg != "mean":
            parts.append(self.layer_agg)
        if self.control:
            parts.append("excess")
        return "_".join(parts)

    @property
    def label(self) -> str:
        """A readable description for tables, e.g. ``kurtosis − 3, residual stream (mean over blocks)``."""
        what = self.metric if self.offset == 0 else f"{self.metric} − {self.offset:g}"
        what = f"{self.metric} − control" if self.control else what
        if self.site is None:
            return what
        where = charts.SITE_NAMES.get((self.site, self.basis or ""), f"{self.site}/{self.basis}")
        return f"{what}, {where} ({self.layer_agg} over blocks)"


DEFAULT_FITS: tuple[FitSpec, ...] = (
    FitSpec("kurtosis", "resid", "stored", control=True, chart=False),
    FitSpec("kurtosis", "mlp_in", "computation", control=True, chart=False),
    FitSpec("kurtosis", "resid", "stored", offset=0.0),
    FitSpec("kurtosis", "mlp_in", "computation", offset=0.0),
    FitSpec("final_val_loss", site=None),
)
"""Excess kurtosis over the control (stored basis minus the random basis at the same layer
and step: 0 without a privileged basis at every width, where the random basis reads
3d/(d+2), not 3) of the residual stream and of the MLP input in its computation basis, in the
tables (undefined, and listed as skipped, where a config has no excess); raw kurtosis, fitted
and charted: every config has one, ~0 exponent without outliers, so slopes can be compared
with SGD's; and the final validation loss."""


@dataclass
class ReportResult:
    """What ``write_report`` wrote, and what it found."""

    out: str
    index: str
    files: list[str] = field(default_factory=list)
    charts: dict[str, list[str]] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)
    fits: pl.DataFrame = field(default_factory=pl.DataFrame)
    skipped: pl.DataFrame = field(default_factory=pl.DataFrame)
    comparisons: pl.DataFrame = field(default_factory=pl.DataFrame)
    best_lr: pl.DataFrame = field(default_factory=pl.DataFrame)
    notes: list[str] = field(default_factory=list)
    n_runs: int = 0
    n_done: int = 0
    n_failed: int = 0
    n_diverged: int = 0


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
    on_progress: Callable[[str], None] | None = None,
) -> ReportResult:
    """Load the sweep at ``path``, fit, chart, and write everything to ``out``
    (default ``<sweep folder>/report``; local or ``s3://`` / ``gs://``).

    ``formats``: any of svg, png, pdf, html, json (``png_scale`` x the 72-dpi size; 2 gives
    ~144 dpi at one paper column). The main charts and fits show the best-lr points
    (``queries.best_lr``); ``onset_threshold`` is the kurtosis whose first crossing is marked. ``on_progress(msg)`` is called at each stage.
    Returns a ``ReportResult`` listing the files, the fits and notes (what was skipped)."""
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
    rep = ReportResult(out=out_dir, index=writer.uri("index.html"))

    # ---- runs: what finished, what did not (ids derived once, see analysis.identity)
    runs = queries.runs_table(results.runs.collect(), status=None).collect()
    results = dataclasses.replace(results, runs=runs.lazy())
    status = runs.get_column("status")
    rep.n_runs = runs.height
    rep.n_done = int((status == "done").sum())
    rep.n_failed = int((status == "failed").sum())
    rep.n_diverged = int((status == "diverged").sum())
    done = runs.filter(pl.col("status") == "done")
    say(
        f"{rep.n_runs} trials: {rep.n_done} done, {rep.n_failed} failed, "
        f"{rep.n_diverged} diverged (failed and diverged are excluded)"
    )
    if rep.n_failed or rep.n_diverged:
        rep.notes.append(
            f"{rep.n_failed} failed and {rep.n_diverged} diverged trials are excluded "
            "from every chart and fit (listed at the end)."
        )
    if x not in done.columns or done.get_column(x).null_count() == done.height:
        fallback = "params" if "params" in done.columns else x
        if fallback != x:
            rep.notes.append(f"column {x} is empty; model size is {fallback} instead.")
            x = fallback
    sizes = sorted(v for v in done.get_column(x).unique().to_list() if v is not None) if done.height else []
    facet = "norm" if done.height and done.get_column("norm").n_unique() > 1 else None
    line = "tuned_line_id"  # one config across sizes, at each size's best lr

    # ---- one pass over the metrics: keep (in memory) only the metrics the report uses, so
    # the dozen queries below do not each rescan every Parquet file
    say("scanning metrics")
    needed = sorted({"kurtosis", "quant_loss_delta", *(s.metric for s in fit_specs if s.site is not None)})
    used = results.metrics.filter(pl.col("metric").is_in(needed)).collect() if rep.n_done else None
    if used is not None:
        results = dataclasses.replace(results, metrics=used.lazy())
    have = set(used.select("site", "basis", "metric").unique().iter_rows()) if used is not None else set()

    built: dict[str, tuple[Any, str]] = {}  # name -> (chart, caption)
    fit_tables: list[pl.DataFrame] = []
    comparison_rows: list[dict[str, Any]] = []
    if rep.n_done == 0:
        rep.notes.append("No trial has finished: nothing to chart or fit.")
    elif len(sizes) < 2:
        rep.notes.append(
            f"Only one model size ({charts.format_count(sizes[0]) if sizes else '?'} "
            f"{charts.AXIS_TITLES.get(x, x).lower()}): "
            "power-law fits need at least two, so no fits were made."
        )

    if rep.n_done:
        # ---- best lr: the main charts and fits show one lr per optimiser, size, norm, rotation
        rep.best_lr = queries.best_lr(results, confidence=confidence)
        main = queries.best_lr_results(results, rep.best_lr)
        tuned = bool(rep.best_lr.height) and int(rep.best_lr.get_column("n_lrs").max()) > 1
        shown = (
            "best-lr points (per optimiser, size, norm and rotation, the lr with the lowest "
            "seed-mean final val loss; see the best-lr table)"
            if tuned else "every config (each was run at one lr: untuned)"
        )  # fmt: skip
        flagged = rep.best_lr.filter(pl.col("edge").is_not_null() | pl.col("tie"))
        if flagged.height:
            rep.notes.append(
                f"{flagged.height} of {rep.best_lr.height} best-lr choices are flagged (an "
                "optimum at the edge of the lr ladder, or a tie): see the best-lr table."
            )
        # ---- layer profile and training dynamics
        if ("resid", "stored", "kurtosis") in have:
            say("kurtosis by layer")
            prof = queries.layer_profile(main, "kurtosis", confidence=confidence).collect()
            built["kurtosis_by_layer"] = (
                charts.kurtosis_by_layer(prof, facet=facet),
                "Residual-stream kurtosis by layer at the end of training (largest model), "
                f"mean over seeds with {confidence:.0%} t-intervals; {shown}. Dashed: Gaussian (3).",
            )
            say("kurtosis over training")
            over = queries.metric_over_training(main, "kurtosis", confidence=confidence).collect()
            onsets = queries.onset(main, threshold=onset_threshold, confidence=confidence).collect()
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
            rep.files.append(writer.write("onset.csv", onsets.select(
                pl.exclude("tuning_id", "line_id", "tuned_line_id")).write_csv().encode()))
            if "final_val_loss" in done.columns:
                say("kurtosis at matched loss")
                every = queries.versus(
                    queries.loss_table(results, confidence=confidence),
                    queries.scale_table(results, "kurtosis", confidence=confidence),
                ).collect()
                built["kurtosis_vs_loss"] = (
                    charts.kurtosis_vs_loss(every, facet=facet),
                    "Matched-loss view: residual-stream kurtosis (mean over blocks) against final "
                    "validation loss, one point per config (every lr tried, every size; marker "
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
                    f"{confidence:.0%} t-intervals.",
                )  # fmt: skip
        else:
            rep.notes.append("No residual-stream kurtosis recorded: layer and training charts skipped.")
        if any(s in {("attn_in", "computation"), ("mlp_in", "computation")} for s in {(a, b) for a, b, m in have if m == "kurtosis"}):
            say("basis comparison")
            bc = queries.basis_comparison(main, "kurtosis", confidence=confidence).collect()
            built["basis_comparison"] = (
                charts.basis_comparison(bc),
                "Kurtosis by layer in the residual stream's stored basis, a random basis "
                "(control, 3d/(d+2)), and the attention / MLP inputs in their computation basis "
                f"(largest model); {shown}.",
            )
        quant = sorted(b for s_, b, m in have if m == "quant_loss_delta" and s_ == "model")
        if not quant:
            rep.notes.append("No quantisation penalty recorded (metric quant_loss_delta): chart skipped.")
        for qb in quant:
            say(f"{qb} penalty against kurtosis")
            qt = queries.quant_penalty(main, qb, confidence=confidence).collect()
            built[f"quant_{qb}_vs_kurtosis"] = (
                charts.quant_penalty(qt, facet=facet),
                f"{qb.upper()} quantisation penalty (quantised minus float val loss at the final "
                "step) against residual-stream kurtosis (mean over blocks), one point per config "
                f"(marker size = model size); {shown}; {confidence:.0%} t-intervals over seeds.",
            )

        # ---- scaling fits
        skipped: list[dict[str, Any]] = []
        for spec in fit_specs:
            if spec.site is None:
                if spec.metric not in done.columns:
                    rep.notes.append(f"runs have no column {spec.metric}: {spec.label} skipped.")
                    continue
                per = queries.runs_table(main).with_columns(value=pl.col(spec.metric)).collect()
                table = queries.loss_table(main, spec.metric, confidence=confidence).collect()
            else:
                if (spec.site, spec.basis, spec.metric) not in have:
                    rep.notes.append(f"no {spec.metric} at {spec.site}/{spec.basis}: {spec.label} skipped.")
                    continue
                control = queries.CONTROL if spec.control else None
                if control and (*control, spec.metric) not in have:
                    rep.notes.append(f"no {spec.metric} control at {'/'.join(control)}: {spec.label} skipped.")
                    continue
                per = queries.per_trial(
                    main, spec.metric, spec.site, spec.basis or "", spec.layer_agg, control=control
                ).collect()
                table = None
            per = per.filter(pl.col("value").is_finite())
            fitted: dict[Any, Any] = {}
            if len(sizes) >= 2:
                say(f"fitting {spec.label}")
                fitted = fits.fit_each(
                    per, x, "value", [line], offset=spec.offset, n_boot=n_boot, seed=seed,
                    seeds="seed", confidence=confidence,
                )  # fmt: skip
                ft = fits.fits_table(fitted, [line]).join(queries.line_labels(per, line), on=line, how="left")
                ft = ft.select(pl.lit(spec.label).alias("fit"), pl.all())
                ft = ft.sort([c for c in ("optimizer", "norm", "rotation_label", "config") if c in ft.columns])
                fit_tables.append(ft.filter(pl.col("exponent").is_not_null()))
                skipped += ft.filter(pl.col("exponent").is_null()).select("fit", "config", "note").to_dicts()
                comparison_rows += _compare(per, x, line, spec, n_boot, seed, confidence, fitted)
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
                    confidence=confidence,
                ).collect()  # fmt: skip
                chart = charts.metric_vs_params(
                    table, curves, metric=spec.metric, x=x, facet=facet,
                    title=_site_title(spec.site, spec.basis),
                )  # fmt: skip
                caption = f"{spec.label[:1].upper()}{spec.label[1:]} against model size (log x)"
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
            rep.skipped = pl.from_dicts(skipped)
            rep.notes.append(
                f"{len(skipped)} fits are undefined and not listed: "
                + "; ".join(f"{r['fit']}: {r['config']} ({_why(r['note'])})" for r in skipped)
                + "."
            )

    # ---- write charts
    svgs: dict[str, str] = {}  # inlined in index.html
    for name, (chart, caption) in built.items():
        say(f"writing {name} ({', '.join(formats)})")
        rep.captions[name] = caption
        spec = chart.to_dict()
        rendered = {fmt: _render(chart, spec, fmt, png_scale) for fmt in dict.fromkeys(["svg", *formats])}
        svgs[name] = rendered["svg"].decode()
        rep.charts[name] = [writer.write(f"{name}.{fmt}", rendered[fmt]) for fmt in formats]
        rep.files += rep.charts[name]

    # ---- tables
    rep.fits = (
        pl.concat(fit_tables, how="diagonal_relaxed")
        if fit_tables
        else pl.DataFrame(schema={"fit": pl.String})
    )
    rep.comparisons = pl.from_dicts(comparison_rows) if comparison_rows else pl.DataFrame()
    if rep.best_lr.height:
        keep = [c for c in _BEST_COLUMNS if c in rep.best_lr.columns]
        best_csv = rep.best_lr.select(keep).with_columns(pl.col("lrs").cast(pl.List(pl.String)).list.join(" "))
        rep.files.append(writer.write("best_lr.csv", best_csv.write_csv().encode()))
    if len(sizes) >= 2 and rep.n_done:
        say("writing fits.csv, fits.md, fits.tex")
        rep.files.append(writer.write("fits.csv", rep.fits.write_csv().encode()))
        rep.files.append(writer.write("fits.md", _fits_markdown(rep.fits, rep.comparisons, confidence).encode()))
        rep.files.append(writer.write("fits.tex", _fits_latex(rep.fits, confidence).encode()))
        if rep.comparisons.height:
            rep.files.append(writer.write("comparisons.csv", rep.comparisons.write_csv().encode()))

    # ---- checks and failures
    checks = results.checks.collect()
    if checks.height == 0:
        rep.notes.append("No invariance checks recorded (checks/ is empty or missing).")
    check_summary = _check_summary(checks, done)
    failures = runs.filter(pl.col("status") != "done")

    say("writing index.html")
    page = _index_html(results, rep, built, svgs, check_summary, failures, sizes, x, formats, confidence)
    rep.files.append(writer.write("index.html", page.encode()))
    say(f"report written to {rep.index}")
    return rep


# ---------------------------------------------------------------- internals


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


def _vl_version() -> str | None:
    import altair as alt
    import vl_convert as vlc

    v = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return v if v in vlc.get_vegalite_versions() else None


def _render(chart: Any, spec: dict[str, Any], fmt: str, png_scale: float) -> bytes:
    import vl_convert as vlc

    if fmt == "html":
        return str(chart.to_html(inline=True)).encode()
    if fmt == "json":
        import json

        return json.dumps(spec, indent=1).encode()
    v = _vl_version()
    if fmt == "svg":
        return str(vlc.vegalite_to_svg(spec, vl_version=v)).encode()
    if fmt == "png":
        return bytes(vlc.vegalite_to_png(spec, vl_version=v, scale=png_scale))
    if fmt == "pdf":
        return bytes(vlc.vegalite_to_pdf(spec, vl_version=v))
    raise ValueError(f"unknown format {fmt}")


def _compare(
    per: pl.DataFrame,
    x: str,
    line: str,
    spec: FitSpec,
    n_boot: int,
    seed: int,
    confidence: float,
    fitted: dict[Any, Any],
) -> list[dict[str, Any]]:
    """Every pair of fitted lines of different optimisers within one stratum (same norm and
    rotation): exponent(b) - exponent(a), a the reference optimiser (sgd, else the first in
    ``charts.OPTIMIZER_COLORS`` order). Welch t over per-seed exponents where both have
    2+ seeds, else independent bootstraps."""
    if "optimizer" not in per.columns:
        return []
    strata = [c for c in ("norm", "rotation_label") if c in per.columns]
    labels = queries.line_labels(per, line)
    ok = {k[0] for k, v in fitted.items() if isinstance(v, fits.PowerLawFit)}
    info = per.group_by(line).agg(pl.col(c).first() for c in ["optimizer", *strata]).filter(pl.col(line).is_in(list(ok)))
    info = info.join(labels.select(line, "config"), on=line, how="left")
    order = list(dict.fromkeys(["sgd", *charts.OPTIMIZER_COLORS]))
    rank = {o: i for i, o in enumerate(order)}
    rows = []
    for key, group in (info.partition_by(strata, as_dict=True) if strata else {(): info}).items():
        lines = sorted(group.iter_rows(named=True), key=lambda r: (rank.get(r["optimizer"], 99), r["config"]))
        for i, ra in enumerate(lines):
            for rb in lines[i + 1 :]:
                if ra["optimizer"] == rb["optimizer"]:
                    continue
                try:
                    c = fits.compare_exponents(
                        per, x, "value", line, ra[line], rb[line], offset=spec.offset, n_boot=n_boot,
                        seed=seed, seeds="seed", confidence=confidence,
                    )  # fmt: skip
                except ValueError:
                    continue
                rows.append({
                    "fit": spec.label, **dict(zip(strata, key, strict=True)),
                    "a": ra["config"], "b": rb["config"],
                    "exponent_a": c.fit_a.exponent, "exponent_b": c.fit_b.exponent,
                    "n_a": c.fit_a.n_label, "n_b": c.fit_b.n_label,
                    "difference": c.difference, "difference_low": c.difference_ci[0],
                    "difference_high": c.difference_ci[1], "p_value": c.p_value, "method": c.method,
                })  # fmt: skip
    return rows


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
    name = charts.SITE_NAMES.get((site, basis or ""), site).split(",")[0]
    return f"{name[:1].upper()}{name[1:]} ({basis} basis)" if basis else name


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
    return str(v)


def _fit_rows(df: pl.DataFrame) -> list[list[str]]:
    rows = []
    for r in df.iter_rows(named=True):
        if r.get("exponent") is None:
            continue  # undefined fits are listed in one note instead
        rows.append(
            [
                r["fit"],
                r.get("config") or "",
                f"{r['exponent']:.3f} [{r['exponent_low']:.3f}, {r['exponent_high']:.3f}]",
                r.get("interval") or "",
                f"{r['coefficient']:.3g}",
                f"{r['r2']:.3f}",
                _n_label(r),
            ]
        )
    return rows


def _n_label(r: dict[str, Any]) -> str:
    seeds = f" × {r['n_seeds']} seeds" if r.get("n_seeds") is not None else ""
    return f"{r['n']} ({r['n_x']} sizes{seeds})"


_INTERVALS = (
    "Exponent intervals come from between-seed variation (seeds are the replicates): a "
    "t-interval over per-seed fits; with one seed, the fit's own OLS t-interval (labelled)."
)
_FIT_HEADER = ["Fit", "Config", "Exponent [CI]", "Interval", "Coefficient", "R²", "n (sizes × seeds)"]


def _fits_markdown(df: pl.DataFrame, comparisons: pl.DataFrame, confidence: float) -> str:
    lines = [
        "# Power-law fits",
        "",
        f"y − offset = coefficient · x^exponent, least squares in log-log space; "
        f"{confidence:.0%} CIs. {_INTERVALS}",
        "",
        "| " + " | ".join(_FIT_HEADER) + " |",
        "|" + "|".join("---" for _ in _FIT_HEADER) + "|",
    ]
    for row in _fit_rows(df):
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |")
    if comparisons.height:
        lines += ["", "# Exponent differences (b − a)", ""]
        strata = [c for c in comparisons.columns if c in ("norm", "rotation_label")]
        head = ["Fit", *[s.removesuffix("_label") for s in strata], "a", "b", "Difference [CI]", "p", "n (a; b)"]
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for r in comparisons.iter_rows(named=True):
            cells = [r["fit"], *[_fmt(r[s]) for s in strata], r["a"], r["b"],
                     f"{r['difference']:+.3f} [{r['difference_low']:+.3f}, {r['difference_high']:+.3f}]",
                     f"{r['p_value']:.3g}", f"{r['n_a']}; {r['n_b']}"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _latex_escape(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                 ("#", r"\#"), ("$", r"\$"), ("{", r"\{"), ("}", r"\}"), ("·", r"$\cdot$"),
                 ("−", "$-$"), ("—", "---"), ("²", "$^2$"), ("≤", r"$\le$"), ("×", r"$\times$"), ("~", r"\textasciitilde{}")):  # fmt: skip
        s = s.replace(a, b) if a != "\\" else s.replace(a, "\x00")
    return s.replace("\x00", r"\textbackslash{}")


def _fits_latex(df: pl.DataFrame, confidence: float) -> str:
    lines = [
        "% Power-law fits: y - offset = coefficient * x^exponent (log-log least squares);",
        f"% {confidence:.0%} CIs. {_INTERVALS} Needs \\usepackage{{booktabs}}.",
        r"\begin{tabular}{lllllll}",
        r"\toprule",
        " & ".join(_latex_escape(h) for h in _FIT_HEADER).replace("R$^2$", "$R^2$") + r" \\",
        r"\midrule",
    ]
    for row in _fit_rows(df):
        lines.append(" & ".join(_latex_escape(c) for c in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


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


_CSS = """
body{font-family:Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-weight:normal}h2{font-weight:normal;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
figure{margin:1.5em 0}figcaption{font-size:.9em;color:#444;max-width:700px}
figcaption a{margin-right:.5em}table{border-collapse:collapse;font-size:.85em;margin:1em 0}
td,th{border-bottom:1px solid #e3e3e3;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f6f6f6}.notes li{margin:.2em 0}.muted{color:#666}code{font-size:.95em}
"""


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _index_html(
    results: Results,
    rep: ReportResult,
    built: dict[str, tuple[Any, str]],
    svgs: dict[str, str],
    check_summary: pl.DataFrame,
    failures: pl.DataFrame,
    sizes: list[Any],
    x: str,
    formats: Sequence[str],
    confidence: float,
) -> str:
    e = html.escape
    done = results.done_runs().collect() if rep.n_done else pl.DataFrame()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(results.name)}: sweep report</title><style>{_CSS}</style></head><body>",
        f"<h1>Sweep report: {e(results.name)}</h1>",
        f"<p class='muted'>{e(results.path)} · generated "
        f"{_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}</p>",
        "<h2>Summary</h2><ul>",
        f"<li>{rep.n_runs} trials: {rep.n_done} done, {rep.n_failed} failed, "
        f"{rep.n_diverged} diverged.</li>",
    ]
    if done.height:
        labelled = done.with_columns(config_label(["rotation"]).alias("rotation")) if "rotation_label" in done.columns else done
        for col, name in (("optimizer", "optimizers"), ("norm", "norms"), ("rotation", "rotations")):
            if col in labelled.columns:
                vals = ", ".join(str(v) for v in labelled.get_column(col).unique().sort().to_list())
                parts.append(f"<li>{name}: {e(vals)}</li>")
        parts.append(
            f"<li>model sizes, {e(charts.AXIS_TITLES.get(x, x).lower())}: "
            f"{e(', '.join(charts.format_count(s) for s in sizes))}</li>"
        )
        if "seed" in done.columns:
            parts.append(f"<li>seeds: {done.get_column('seed').n_unique()}</li>")
    parts.append("</ul>")
    if rep.notes:
        parts.append("<h2>Notes</h2><ul class='notes'>")
        parts += [f"<li>{e(n)}</li>" for n in rep.notes]
        parts.append("</ul>")

    if built:
        parts.append("<h2>Figures</h2>")
    for name, (_chart, caption) in built.items():
        links = " ".join(f"<a href='{e(name)}.{f}'>{f}</a>" for f in formats)
        parts.append(
            f"<figure id='{e(name)}'>{svgs[name]}<figcaption><b>{e(name)}</b>: {e(caption)} "
            f"<span class='muted'>{links}</span></figcaption></figure>"
        )

    parts.append("<h2>Power-law fits</h2>")
    if rep.fits.height:
        parts.append(
            f"<p>y − offset = coefficient · x<sup>exponent</sup> with x = {e(x)}, least squares "
            f"in log-log space over trials; {confidence:.0%} CIs. {_INTERVALS} "
            "Undefined fits are not listed (see the notes). Also in <a href='fits.csv'>fits.csv</a>, <a href='fits.md'>fits.md</a>, "
            "<a href='fits.tex'>fits.tex</a>.</p>"
        )
        parts.append(_html_table(_FIT_HEADER, _fit_rows(rep.fits)))
    else:
        parts.append("<p>No fits: see the notes above.</p>")
    if rep.comparisons.height:
        c = rep.comparisons
        strata = [s for s in c.columns if s in ("norm", "rotation_label")]
        rows = [
            [r["fit"], *[_fmt(r[s]) for s in strata], r["a"], r["b"],
             f"{r['difference']:+.3f} [{r['difference_low']:+.3f}, {r['difference_high']:+.3f}]",
             f"{r['p_value']:.3g}", f"{r['n_a']}; {r['n_b']}", r.get("method") or ""]  # fmt: skip
            for r in c.iter_rows(named=True)
        ]
        parts.append(
            "<h2>Exponent differences</h2><p>exponent(b) − exponent(a) between optimisers "
            "at the same norm and rotation; Welch t over per-seed exponents (or independent "
            "bootstraps with one seed), two-sided p-value.</p>"
        )
        head = ["Fit", *[s.removesuffix("_label") for s in strata], "a", "b", "Difference [CI]", "p", "n (a; b)", "Method"]
        parts.append(_html_table(head, rows))

    if rep.best_lr.height:
        parts.append(
            "<h2>Best learning rates</h2><p>Per optimiser, size, norm and rotation (the config "
            "without its lr), the lr with the lowest seed-mean final val loss; flags: an optimum "
            "at the edge of the ladder (extend it), a tie with the runner-up, a single lr "
            "(untuned). Also in <a href='best_lr.csv'>best_lr.csv</a>.</p>"
        )
        rows = [
            [r.get("optimizer") or "", r.get("norm") or "", r.get("rotation_label") or "",
             charts.format_count(r.get(x)), f"{r['lr']:g}",
             " ".join(f"{v:g}" for v in (r.get("lrs") or [])),
             f"{r['mean']:.4g}" + (f" [{r['ci_low']:.4g}, {r['ci_high']:.4g}]" if r.get("ci_low") is not None else ""),
             str(r["n"]), r.get("flag") or ""]  # fmt: skip
            for r in rep.best_lr.iter_rows(named=True)
        ]
        parts.append(_html_table(["Optimizer", "Norm", "Rotation", x, "Best lr", "Ladder",
                                  "Val loss [CI]", "Seeds", "Flag"], rows))  # fmt: skip

    parts.append("<h2>Invariance checks</h2>")
    if check_summary.height:
        parts.append(
            "<p>Loss change after rotating the residual basis by a random orthogonal matrix "
            "(|Δ loss|, nats).</p>"
        )
        rows = [
            [r["check"], r["norm"], r["dtype"], f"{r['mean_abs']:.3g}", f"{r['max_abs']:.3g}", str(r["n"])]
            for r in check_summary.iter_rows(named=True)
        ]
        parts.append(_html_table(["Check", "Norm", "dtype", "mean |Δ|", "max |Δ|", "trials"], rows))
    else:
        parts.append("<p>No invariance checks recorded.</p>")

    if failures.height:
        parts.append(f"<h2>Excluded trials ({failures.height})</h2>")
        rows = []
        for r in failures.iter_rows(named=True):
            err = (r.get("error") or "").strip().splitlines()
            config = " · ".join(str(r[c]) for c in ("optimizer", "norm", "rotation") if r.get(c) is not None)
            seed = "" if r.get("seed") is None else str(r["seed"])
            rows.append([r["trial_id"], r["status"], config, _fmt(r.get(x)), seed, err[0] if err else ""])
        parts.append(_html_table(["Trial", "Status", "Config", x, "Seed", "Error"], rows))
    parts.append("</body></html>")
    return "\n".join(parts)
