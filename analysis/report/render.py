"""The report's content -> bytes: one table model (markdown, TeX, HTML), the charts through
vl-convert, and ``index.html`` from one ``string.Template``.

Nothing here computes a number; ``content.build`` does. The CSV files are the data frames
themselves (every column), not these tables (the readable subset).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections.abc import Sequence
from string import Template
from typing import TYPE_CHECKING, Any

import polars as pl

from analysis.charts import AXIS_TITLES, format_count
from analysis.fits import MIN_BOOTSTRAP_UNITS
from analysis.load import config_label
from analysis.power_law import n_label
from analysis.report.table import Table, latex_escape
from analysis.vega_workers import VECTOR, VegaWorkers, render_spec

if TYPE_CHECKING:
    from analysis.report.section import ReportContent

__all__ = [
    "Table",
    "best_lr_table",
    "comparisons_table",
    "family_comparisons_table",
    "family_levels_table",
    "fits_latex",
    "fits_markdown",
    "fits_table",
    "index_html",
    "levels_table",
    "render_charts",
]


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
    return str(v)


# ---------------------------------------------------------------- the report's tables

INTERVALS = (
    "Exponent intervals come from between-seed variation (seeds are the replicates): a "
    "t-interval over per-seed fits; with one seed, the fit's own OLS t-interval (labelled)."
)


COMPARISONS = (
    "Two-sided p-values from Welch's t over per-seed exponents (2+ seeds a side), else from "
    f"independent bootstraps ({MIN_BOOTSTRAP_UNITS}+ points a side); with fewer replicates there "
    "is no test: p is — and the Method column says why. p (Holm): adjusted with every other "
    "secondary test of the report (optimiser pairs, family contrasts of slope and level) as one "
    "Holm family."
)


def _n_label(r: dict[str, Any]) -> str:
    return n_label(r["n"], r["n_x"], r.get("n_seeds"))


def fits_table(df: pl.DataFrame) -> Table:
    """The defined fits (undefined ones are listed in one note instead)."""
    rows = [
        [
            r["fit"],
            r.get("config") or "",
            f"{r['exponent']:.3f} (no CI)" if _missing(r["exponent_low"]) or _missing(r["exponent_high"])
            else f"{r['exponent']:.3f} [{r['exponent_low']:.3f}, {r['exponent_high']:.3f}]",
            r.get("interval") or "",
            f"{r['coefficient']:.3g}",
            f"{r['r2']:.3f}",
            _n_label(r),
        ]
        for r in df.iter_rows(named=True)
        if r.get("exponent") is not None
    ]
    return Table(["Fit", "Config", "Exponent [CI]", "Interval", "Coefficient", "R²", "n (sizes × seeds)"], rows)


def comparisons_table(c: pl.DataFrame) -> Table:
    """exponent(b) − exponent(a) between optimisers at the same norm and rotation."""
    strata = [s for s in c.columns if s in ("norm", "rotation_label")]
    rows = [
        [r["fit"], *[fmt(r[s]) for s in strata], r["a"], r["b"], _difference(r), _p(r["p_value"]), _p_holm(r),
         f"{r['n_a']}; {r['n_b']}", r.get("method") or ""]  # fmt: skip
        for r in c.iter_rows(named=True)
    ]
    head = ["Fit", *[s.removesuffix("_label") for s in strata], "a", "b", "Difference [CI]", "p", "p (Holm)",
            "n (a; b)", "Method"]  # fmt: skip
    return Table(head, rows)


FAMILY_COMPARISONS = (
    "The optimiser is the unit of a family claim: each optimiser's exponent is its mean over seeds "
    "after removing seed effects (seeds are shared across optimisers, so they pair), a family's "
    "exponent the mean of its optimisers' (the family as exactly the optimisers listed); the interval "
    "and p come from a Welch-Satterthwaite t whose variance is each family's between-optimiser "
    "variance / its optimiser count. A family with one optimiser has no between-optimiser variance "
    "and cannot carry a family claim: no interval. The declared primary contrast (Role: primary) "
    "keeps its raw p; every other p is Holm-adjusted (p (Holm))."
)


def family_comparisons_table(c: pl.DataFrame) -> Table:
    """exponent(family b) − exponent(family a) at the same norm and rotation."""
    strata = [s for s in c.columns if s in ("norm", "rotation_label")]
    rows = [
        [r["fit"], *[fmt(r[s]) for s in strata], f"{r['family_a']} ({r['optimizers_a']})",
         f"{r['family_b']} ({r['optimizers_b']})", _difference(r), _p(r["p_value"]), _p_holm(r),
         r.get("role") or "", r.get("method") or ""]  # fmt: skip
        for r in c.iter_rows(named=True)
    ]
    head = ["Fit", *[s.removesuffix("_label") for s in strata], "Family a", "Family b", "Difference [CI]", "p",
            "p (Holm)", "Role", "Method"]  # fmt: skip
    return Table(head, rows)


LEVELS = (
    "The quantities the power laws are fitted to, at each size: the seed mean, its t-interval "
    "over seeds and the number of seeds (each optimiser at its best lr at that size)."
)
FAMILY_LEVELS = (
    "At each size, the same contrast of levels: each optimiser's seed mean after removing seed "
    "effects, a family's level the mean of its optimisers', a Welch-Satterthwaite t over the "
    "between-optimiser variances (a one-optimiser family: no interval). The primary contrast is "
    "read at the largest size; every other p is Holm-adjusted (p (Holm))."
)


def levels_table(levels: pl.DataFrame) -> Table:
    """One row per fit and config, one column per size: ``mean [low, high] (n)``."""
    sizes = sorted(levels.get_column("size").unique().to_list())
    cells: dict[tuple[str, str], dict[Any, str]] = {}
    for r in levels.iter_rows(named=True):
        if r["n_seeds"] >= 2 and not (_missing(r["ci_low"]) or _missing(r["ci_high"])):
            text = f"{r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] ({r['n_seeds']})"
        else:
            text = f"{r['mean']:.3f} ({r['n_seeds']} seed{'s' if r['n_seeds'] != 1 else ''})"
        cells.setdefault((r["fit"], r["config"]), {})[r["size"]] = text
    rows = [[fit, config, *(by_size.get(size, "—") for size in sizes)] for (fit, config), by_size in cells.items()]
    return Table(["Fit", "Config", *(format_count(size) for size in sizes)], rows)


def family_levels_table(c: pl.DataFrame) -> Table:
    """level(family b) − level(family a) at each size, same norm and rotation."""
    strata = [s for s in c.columns if s in ("norm", "rotation_label")]
    rows = [
        [r["fit"], *[fmt(r[s]) for s in strata], format_count(r["size"]), f"{r['family_a']} ({r['optimizers_a']})",
         f"{r['family_b']} ({r['optimizers_b']})", _difference(r), _p(r["p_value"]), _p_holm(r),
         r.get("role") or "", r.get("method") or ""]  # fmt: skip
        for r in c.iter_rows(named=True)
    ]
    head = ["Fit", *[s.removesuffix("_label") for s in strata], "Size", "Family a", "Family b", "Difference [CI]", "p",
            "p (Holm)", "Role", "Method"]  # fmt: skip
    return Table(head, rows)


def _missing(v: float | None) -> bool:
    return v is None or math.isnan(v)


def _p(v: float | None) -> str:
    return "—" if _missing(v) else f"{v:.3g}"


def _p_holm(r: dict[str, Any]) -> str:
    """The Holm-adjusted p, ``raw`` on the primary row (it keeps its raw p)."""
    if r.get("role") == "primary":
        return "(primary: raw p)"
    return _p(r.get("p_holm"))


def _difference(r: dict[str, Any]) -> str:
    """``+0.246 [+0.178, +0.313]``, or the difference alone where there is no interval."""
    if _missing(r["difference_low"]) or _missing(r["difference_high"]):
        return f"{r['difference']:+.3f} (no CI)"
    return f"{r['difference']:+.3f} [{r['difference_low']:+.3f}, {r['difference_high']:+.3f}]"


def best_lr_table(best: pl.DataFrame, x: str) -> Table:
    rows = [
        [r.get("optimizer") or "", r.get("norm") or "", r.get("rotation_label") or "",
         format_count(r.get(x)), f"{r['lr']:g}",
         " ".join(f"{v:g}" for v in (r.get("lrs") or [])),
         f"{r['mean']:.4g}" + (f" [{r['ci_low']:.4g}, {r['ci_high']:.4g}]" if r.get("ci_low") is not None else ""),
         str(r["n"]), _runner_up(r), r.get("flag") or ""]  # fmt: skip
        for r in best.iter_rows(named=True)
    ]
    return Table(["Optimizer", "Norm", "Rotation", x, "Best lr", "Ladder", "Val loss [CI]", "Seeds",
                  "Runner-up (+loss, shared seeds)", "Flag"], rows)


def _runner_up(r: dict) -> str:
    """The runner-up lr and how much worse it ends on the seeds it shares with the best."""
    if r.get("runner_up_lr") is None:
        return ""
    if r.get("runner_up_margin") is None:
        return f"{r['runner_up_lr']:g} (no shared seed)"
    k = r.get("shared_seeds") or 0
    return f"{r['runner_up_lr']:g} ({r['runner_up_margin']:+.3f}, {k} seed{'s' * (k != 1)})"


def checks_table(summary: pl.DataFrame) -> Table:
    rows = [
        [r["check"], r["norm"], r["dtype"], f"{r['mean_abs']:.3g}", f"{r['max_abs']:.3g}", str(r["n"])]
        for r in summary.iter_rows(named=True)
    ]
    return Table(["Check", "Norm", "dtype", "mean |Δ|", "max |Δ|", "trials"], rows)


def failures_table(failures: pl.DataFrame, x: str) -> Table:
    rows = []
    for r in failures.iter_rows(named=True):
        err = (r.get("error") or "").strip().splitlines()
        config = " · ".join(str(r[c]) for c in ("optimizer", "norm", "rotation") if r.get(c) is not None)
        seed = "" if r.get("seed") is None else str(r["seed"])
        rows.append([r["trial_id"], r["status"], config, fmt(r.get(x)), seed, err[0] if err else ""])
    return Table(["Trial", "Status", "Config", x, "Seed", "Error"], rows)


def fits_markdown(
    fits: pl.DataFrame,
    comparisons: pl.DataFrame,
    confidence: float,
    families: pl.DataFrame | None = None,
    levels: pl.DataFrame | None = None,
    family_levels: pl.DataFrame | None = None,
) -> str:
    lines = [
        "# Power-law fits",
        "",
        f"y − offset = coefficient · x^exponent, least squares in log-log space; "
        f"{confidence:.0%} CIs. {INTERVALS}",
        "",
        *fits_table(fits).markdown(),
    ]
    if comparisons.height:
        lines += ["", "# Exponent differences (b − a)", "", COMPARISONS, "", *comparisons_table(comparisons).markdown()]
    if families is not None and families.height:
        lines += ["", "# Family differences (b − a)", "", FAMILY_COMPARISONS, "",
                  *family_comparisons_table(families).markdown()]  # fmt: skip
    if levels is not None and levels.height:
        lines += ["", f"# Levels at each size (seed mean [{confidence:.0%} CI] (seeds))", "", LEVELS, "",
                  *levels_table(levels).markdown()]  # fmt: skip
    if family_levels is not None and family_levels.height:
        lines += ["", "# Family differences in level at each size (b − a)", "", FAMILY_LEVELS, "",
                  *family_levels_table(family_levels).markdown()]  # fmt: skip
    return "\n".join(lines) + "\n"


def fits_latex(fits: pl.DataFrame, confidence: float) -> str:
    lines = [
        "% Power-law fits: y - offset = coefficient * x^exponent (log-log least squares);",
        f"% {confidence:.0%} CIs. {INTERVALS} Needs \\usepackage{{booktabs}}.",
        *fits_table(fits).latex(),
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- charts


def vl_version() -> str | None:
    """The Vega-Lite version Altair writes, where vl-convert has it (else its default)."""
    import altair as alt
    import vl_convert as vlc

    v = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return v if v in vlc.get_vegalite_versions() else None


def render_charts(charts: dict[str, Any], formats: Sequence[str], png_scale: float,
                  workers: VegaWorkers | None = None) -> dict[str, dict[str, bytes]]:
    """``{name: {format: bytes}}`` for every chart in ``formats`` plus svg (inlined in the
    index). svg/png/pdf from ``workers`` (charts it was not given yet are submitted now), or
    rendered in this process when there are none; html and json from the chart here."""
    bad = [f for f in formats if f not in (*VECTOR, "html", "json")]
    if bad:
        raise ValueError(f"unknown format(s) {bad}")
    if workers is None:
        vl = vl_version()
        files = {name: render_spec(chart.to_dict(validate=False), formats, png_scale, vl)
                 for name, chart in charts.items()}  # fmt: skip
    else:
        for name in charts.keys() - workers.specs.keys():
            workers.submit(name, charts[name])
        files = workers.collect()
    for name, chart in charts.items():
        if "html" in formats:
            files[name]["html"] = str(chart.to_html(inline=True)).encode()
        if "json" in formats:
            files[name]["json"] = json.dumps(chart.to_dict(validate=False), indent=1).encode()
    return {name: files[name] for name in charts}


# ---------------------------------------------------------------- index.html

CSS = """
body{font-family:Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-weight:normal}h2{font-weight:normal;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
figure{margin:1.5em 0}figcaption{font-size:.9em;color:#444;max-width:700px}
figcaption a{margin-right:.5em}table{border-collapse:collapse;font-size:.85em;margin:1em 0}
td,th{border-bottom:1px solid #e3e3e3;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f6f6f6}.notes li{margin:.2em 0}.muted{color:#666}code{font-size:.95em}
"""

PAGE = Template("""\
<!doctype html><html><head><meta charset='utf-8'>
<title>$name: sweep report</title><style>$css</style></head><body>
<h1>Sweep report: $name</h1>
<p class='muted'>$path · generated $generated</p>
<h2>Summary</h2><ul>
$summary
</ul>
$body
</body></html>""")


def index_html(content: ReportContent, svgs: dict[str, str], formats: Sequence[str], confidence: float) -> str:
    """The one-page report: summary, notes, figures (SVG inlined), the fits, the sections' tables
    with a title (``ctx.table``, in their order), checks, failures."""
    e = html.escape
    c, x = content, content.x
    summary = [f"<li>{c.n_runs} trials: {c.n_done} done, {c.n_failed} failed, {c.n_diverged} diverged.</li>"]
    done = c.done
    if done.height:
        labelled = done.with_columns(config_label(["rotation"]).alias("rotation")) if "rotation_label" in done.columns else done
        for col, name in (("optimizer", "optimizers"), ("norm", "norms"), ("rotation", "rotations")):
            if col in labelled.columns:
                vals = ", ".join(str(v) for v in labelled.get_column(col).unique().sort().to_list())
                summary.append(f"<li>{name}: {e(vals)}</li>")
        summary.append(
            f"<li>model sizes, {e(AXIS_TITLES.get(x, x).lower())}: "
            f"{e(', '.join(format_count(s) for s in c.sizes))}</li>"
        )
        if "seed" in done.columns:
            summary.append(f"<li>seeds: {done.get_column('seed').n_unique()}</li>")

    body: list[str] = []
    if c.notes:
        body += ["<h2>Notes</h2><ul class='notes'>", *(f"<li>{e(n)}</li>" for n in c.notes), "</ul>"]
    if c.charts:
        body.append("<h2>Figures</h2>")
    for name, caption in c.captions.items():
        links = " ".join(f"<a href='{e(name)}.{f}'>{f}</a>" for f in formats)
        body.append(
            f"<figure id='{e(name)}'>{svgs[name]}<figcaption><b>{e(name)}</b>: {e(caption)} "
            f"<span class='muted'>{links}</span></figcaption></figure>"
        )
    body.append("<h2>Power-law fits</h2>")
    if c.fits.height:
        body.append(
            f"<p>y − offset = coefficient · x<sup>exponent</sup> with x = {e(x)}, least squares "
            f"in log-log space over trials; {confidence:.0%} CIs. {INTERVALS} "
            "Undefined fits are not listed (see the notes). Also in <a href='fits.csv'>fits.csv</a>, <a href='fits.md'>fits.md</a>, "
            "<a href='fits.tex'>fits.tex</a>.</p>"
        )
        body.append(fits_table(c.fits).html())
    else:
        body.append("<p>No fits: see the notes above.</p>")
    for t in c.tables.values():  # the sections' tables, in the order they added them
        if t.title and t.frame.height:
            also = f" Also in <a href='{t.name}.csv'>{t.name}.csv</a>." if t.link else ""
            body.append(f"<h2>{t.title}</h2><p>{e(t.caption)}{also}</p>")
            if t.shown is not None:
                body.append(t.shown(t.frame).html())
    body.append("<h2>Invariance checks</h2>")
    if c.check_summary.height:
        body.append(
            "<p>Loss change after rotating the residual basis by a random orthogonal matrix "
            "(|Δ loss|, nats).</p>"
        )
        body.append(checks_table(c.check_summary).html())
    else:
        body.append("<p>No invariance checks recorded.</p>")
    if c.failures.height:
        body += [f"<h2>Excluded trials ({c.failures.height})</h2>", failures_table(c.failures, x).html()]
    return PAGE.substitute(
        name=e(c.name),
        path=e(c.path),
        generated=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        css=CSS,
        summary="\n".join(summary),
        body="\n".join(body),
    )
