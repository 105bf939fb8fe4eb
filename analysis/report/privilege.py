"""The report's section on whether a basis is privileged (issue 32): the per-trial rank test,
counted per config, and the width-honest top-1 energy share charted with its null.

- The per-trial test (``test_table``, written as privilege.csv and drawn as a table): the probe
  ranks the stored basis (at the attention and MLP inputs, the computation basis) among the
  control's 32 Haar-random bases, per trial, block and measure (kurtosis, top-1 share):
  p = (1 + #{random bases whose value >= the stored basis'}) / 33. Per config (one optimiser
  config at one size) and site: the (trial, block) cells at p <= 1/33, out of all, beside the
  null's expectation (cells / 33), and the trials privileged in every block.
- ``top1_share_vs_null``: the top-1 share of the residual stream (stored basis) and of the MLP
  input against model size, with its exact null (``analysis.null.top_share_null``), and a note
  saying, per config, which measure a width trend is in.

Stores written before the probe recorded these metrics get one note and nothing else. Computes,
never writes: ``add`` puts the chart into ``built`` and returns the table (``SECTION``: into the
report's content); ``cells`` gives the table's readable rows (header, rows) to the renderer,
``markdown`` the privilege.md text. Of analysis.report it imports only ``section`` (render imports
this module).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import polars as pl

from analysis import queries, selection
from analysis.charts.privilege import FIXED_SHARE_WORDS, top_share_vs_params
from analysis.charts.style import format_count
from analysis.load import Results
from analysis.null import kurtosis_null, top_share_null
from analysis.query_base import SORT, inputs, join_runs
from analysis.report.section import Context, Section
from analysis.report.table import Table
from resultstore.vocabulary import RANK_P, Basis, Metric, Site

__all__ = [
    "BASES", "METRICS", "NO_TEST_NOTE", "P_PRIVILEGED", "SECTION", "SITES", "TITLE", "WORDS", "add", "cells", "markdown",
    "test_table", "trend_note",
]  # fmt: skip

BASES = 32
"""The control's Haar-random bases (study.metrics.CONTROL_BASES): the rank test's p is in
{1, ..., BASES + 1} / (BASES + 1)."""

P_PRIVILEGED = 1 / (BASES + 1)
"""p = 1/33: the smallest p the rank test gives, the stored basis beating every random one."""

MEASURES = {rank_p: measure for measure, rank_p in RANK_P.items()}
"""The rank-test rows (basis ``random``) and the measure each ranks."""

SITES = {
    Site.RESID: (Basis.STORED, "residual stream (stored basis)"),
    Site.ATTN_IN: (Basis.COMPUTATION, "attention input (computation basis)"),
    Site.MLP_IN: (Basis.COMPUTATION, "MLP input (computation basis)"),
}
"""The tested sites: the basis the test ranks, and its name in the table."""

SHARE_SITES = ((Site.RESID, Basis.STORED, "Residual stream (stored basis)"),
               (Site.MLP_IN, Basis.COMPUTATION, "MLP input (computation basis)"))
"""Where the top-1 share is charted, in panel order."""

METRICS = (Metric.KURTOSIS, Metric.TOP1_SHARE, *MEASURES)
"""The metrics this section reads (``content.build`` keeps only the metrics the report uses)."""

TITLE = "The per-trial test: is the stored basis privileged?"

WORDS = (
    "Per config (one optimiser config at one model size, at its best lr), site and measure: the (trial, "
    "block) cells whose basis is privileged by the exact rank test at the final step, out of all cells. "
    f"The probe reads the same activations in {BASES} fixed Haar-random bases and ranks the stored basis "
    "(at the attention and MLP inputs, the basis their linear maps compute in) among them: "
    f"p = (1 + #{{random bases with a value ≥ the stored basis'}}) / {BASES + 1}. p = 1/{BASES + 1} "
    f"(≈ {P_PRIVILEGED:.3f}), its smallest value, says the stored basis beats all {BASES} random bases. "
    "Without a privileged basis the stored basis and the random ones are exchangeable, so each cell reads "
    f"p ≤ 1/{BASES + 1} with chance 1/{BASES + 1}: the null expects cells / {BASES + 1}. Blocks are not "
    "independent tests (one residual stream runs through them, and every block is read in the same "
    "random bases), so the cell count is not a count of independent findings: the per-trial finding is a "
    f"trial privileged in every block, of which the null allows at most trials / {BASES + 1} whatever the "
    "dependence between blocks. Blocks 1..L (the embeddings are left out)."
)
"""What the table's numbers mean, in words (the report prints it above the table)."""

NO_TEST_NOTE = (
    "No basis-test rows (top-1 share, rank p-values against the random bases: the probe records them "
    "from issue 32 on): the per-trial test and the top-1 share chart are skipped."
)

_HEADER = ["Config", "Size", "Site", "Measure", "Trials", f"Cells at p ≤ 1/{BASES + 1}", "Null expects",
           "Trials privileged in every block"]  # fmt: skip


def test_table(results: Results, x: str = "params_non_embedding", line: str = "tuned_line_id") -> pl.DataFrame:
    """The per-trial test counted per config (``line`` at one size) and site and measure: ``trials``,
    ``blocks`` (per trial), ``cells`` (trial x block), ``privileged_cells`` (p <= 1/33 at the trial's
    final step), ``expected_cells`` (cells / 33), ``trials_every_block`` (privileged in every
    block) and ``trials_bound`` (trials / 33, the most the null allows of those), with the
    ``config`` label (``selection.line_labels``) and the size columns. Empty where the store has
    no rank-test rows."""
    metrics, runs = inputs(results, "metrics", None)
    tested = pl.lit(False)
    for site in SITES:
        tested = tested | (pl.col("site") == site)
    rows = metrics.filter(pl.col("metric").is_in(list(MEASURES)) & (pl.col("basis") == Basis.RANDOM) & tested
                          & (pl.col("layer") >= 1))  # fmt: skip
    rows = rows.filter(pl.col("step") == pl.col("step").max().over("trial_id", "metric", "site"))
    per = rows.group_by("trial_id", "site", "metric").agg(
        blocks=pl.len().cast(pl.Int64),
        privileged=(pl.col("value") <= P_PRIVILEGED * (1 + 1e-6)).sum().cast(pl.Int64),  # float32-stored 1/33
    )
    per = join_runs(per, runs).collect()
    if per.height == 0:
        return pl.DataFrame()
    if line not in per.columns:  # a frame without ids: each config its own line
        line = "config_id"
    keys = [line, "config_id", x, "d_model", "site", "metric"]
    out = per.group_by(keys).agg(
        trials=pl.len().cast(pl.Int64),
        blocks=pl.col("blocks").max(),
        cells=pl.col("blocks").sum().cast(pl.Int64),
        privileged_cells=pl.col("privileged").sum().cast(pl.Int64),
        trials_every_block=(pl.col("privileged") == pl.col("blocks")).sum().cast(pl.Int64),
    )
    out = out.with_columns(
        expected_cells=pl.col("cells") / (BASES + 1),
        trials_bound=pl.col("trials") / (BASES + 1),
        basis=pl.col("site").replace_strict({s: b for s, (b, _) in SITES.items()}),
        measure=pl.col("metric").replace_strict(MEASURES),
    )
    labels = selection.line_labels(per, line)
    out = out.join(labels, on=line, how="left")
    order = {s: i for i, s in enumerate(SITES)}
    sort = [c for c in SORT if c in out.columns and c != "lr"]
    out = out.with_columns(_site=pl.col("site").replace_strict(order, return_dtype=pl.Int64)).sort(
        [*sort, "config", x, "_site", "measure"], nulls_last=True).drop("_site")
    first = ["config", *[c for c in ("optimizer", "optimizer_family", "norm", "rotation_label") if c in out.columns],
             x, "d_model", "site", "basis", "measure", "trials", "blocks", "cells", "privileged_cells", "expected_cells",
             "trials_every_block", "trials_bound"]  # fmt: skip
    return out.select(list(dict.fromkeys([*first, "config_id", line])))


def cells(table: pl.DataFrame, x: str = "params_non_embedding") -> tuple[list[str], list[list[str]]]:
    """The table's readable header and rows (strings): per config, size, site and measure."""
    rows = []
    for r in table.iter_rows(named=True):
        size = f"{format_count(r.get(x))} (d {r['d_model']})" if r.get(x) is not None else f"d {r['d_model']}"
        rows.append([
            r["config"] or "", size, SITES[r["site"]][1], r["measure"].replace("_", " "), str(r["trials"]),
            f"{r['privileged_cells']} / {r['cells']}", f"{r['expected_cells']:.1f}",
            f"{r['trials_every_block']} / {r['trials']} (null: ≤ {r['trials_bound']:.2f})",
        ])  # fmt: skip
    return list(_HEADER), rows


def markdown(table: pl.DataFrame, x: str = "params_non_embedding") -> str:
    """privilege.md: the title, ``WORDS`` and the table (``cells``) in Markdown."""
    header, rows = cells(table, x)

    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |"

    return "\n".join([f"# {TITLE}", "", WORDS, "", line(header), "|" + "|".join("---" for _ in header) + "|",
                      *map(line, rows), ""])  # fmt: skip


def add(
    results: Results,
    done: pl.DataFrame,
    built: MutableMapping[str, tuple[Any, str]],
    notes: list[str],
    *,
    x: str = "params_non_embedding",
    facet: str | None = None,
    confidence: float = 0.95,
) -> pl.DataFrame:
    """Add the top-1 share chart to ``built`` (name -> (chart, caption)) and its trend note to
    ``notes``; return the per-trial test table (``test_table``; empty, with one note, for a store
    without the basis test). ``results``: the report's best-lr view at the final step."""
    if done.height == 0:  # nothing finished: the report already says so
        return pl.DataFrame()
    have = set(results.metrics.filter(pl.col("metric").is_in(list(METRICS))).select("site", "basis", "metric")
               .unique().collect().iter_rows())  # fmt: skip
    shares = [(s, b, name) for s, b, name in SHARE_SITES if (s, b, Metric.TOP1_SHARE) in have]
    if not shares and not any(m in MEASURES for _, _, m in have):
        notes.append(NO_TEST_NOTE)
        return pl.DataFrame()
    table = test_table(results, x) if any(m in MEASURES for _, _, m in have) else pl.DataFrame()
    frames = [queries.scale_table(results, Metric.TOP1_SHARE, s, b, confidence=confidence).collect()
              .with_columns(site_name=pl.lit(name)) for s, b, name in shares]  # fmt: skip
    frame = pl.concat([f for f in frames if f.height], how="diagonal_relaxed") if frames else pl.DataFrame()
    if frame.height and frame.get_column(x).n_unique() >= 2:
        built["top1_share_vs_null"] = (
            top_share_vs_params(frame, x=x, facet=facet, confidence=confidence,
                                panel_order=[name for *_, name in shares]),
            "The width-honest measure: the top-1 share of each token's centred energy (mean over tokens and "
            "blocks, final step) of the residual stream (stored basis) and the MLP input (computation basis) "
            f"against model size, seed means with {confidence:.0%} t-intervals, each config at its best lr; "
            "dashed: the share's exact null at each width (any activations in a Haar-random basis; it falls "
            f"with d). Beside it, kurtosis / null against size. {FIXED_SHARE_WORDS}",
        )  # fmt: skip
        note = trend_note(results, frame, x, confidence)
        if note:
            notes.append(note)
    return table


def trend_note(results: Results, shares: pl.DataFrame, x: str = "params_non_embedding",
               confidence: float = 0.95) -> str:
    """Per config, the residual stream's top-1 share (against its null) and kurtosis / null from
    the smallest to the largest size, and which measure a width trend is in, in words."""
    resid = shares.filter(pl.col("site_name") == SHARE_SITES[0][2])
    if resid.height == 0 or resid.get_column(x).n_unique() < 2:
        return ""
    kurt = queries.scale_table(results, Metric.KURTOSIS, Site.RESID, Basis.STORED, confidence=confidence, over_null=True).collect()
    line = "tuned_line_id" if "tuned_line_id" in resid.columns else "config_id"
    labels = selection.line_labels(resid, line)
    parts = []
    named = dict(labels.select(line, "config").iter_rows())
    for (key,), g in sorted(resid.sort(x).group_by(line), key=lambda kv: str(named.get(kv[0][0]))):
        if g.height < 2:
            continue
        lo, hi = g.row(0, named=True), g.row(-1, named=True)
        label = named.get(key)
        words = (f"{label}: top-1 share {lo['mean']:.3f} → {hi['mean']:.3f} (null {top_share_null(lo['d_model']):.3f} → "
                 f"{top_share_null(hi['d_model']):.3f})")  # fmt: skip
        k = kurt.filter(pl.col("config_id").is_in([lo["config_id"], hi["config_id"]])).sort(x)
        if k.height == 2:
            words += f", kurtosis / null {k.get_column('mean')[0]:.2f} → {k.get_column('mean')[1]:.2f}"
        parts.append(words)
    if not parts:
        return ""
    d = sorted(resid.get_column("d_model").unique().to_list())
    return (
        f"Which measure a width trend is in (residual stream, stored basis, mean over blocks, seed means, d_model "
        f"{d[0]} → {d[-1]}; kurtosis null {kurtosis_null(d[0]):.3f} → {kurtosis_null(d[-1]):.3f}): "
        + "; ".join(parts) + ". Kurtosis grows with width for a coordinate that holds a fixed share f of every "
        "token's energy (about d·f²) while its top-1 share stays f: a rise in kurtosis / null alone is not a "
        "rise in privilege; a rise in the top-1 share (whose null falls with d) is not width alone."
    )


def _add_to_report(ctx: Context) -> None:
    """``add`` at the report's best-lr view; the test table (privilege.csv, listed in index.html)."""
    table = add(ctx.main, ctx.done, ctx.built, ctx.notes, x=ctx.x, facet=ctx.facet, confidence=ctx.confidence)
    ctx.table("privilege", table, WORDS, title=TITLE, shown=lambda frame: Table(*cells(frame, ctx.x)))


SECTION = Section("privilege", _add_to_report, metrics=METRICS)
