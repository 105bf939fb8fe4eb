"""Named lazy queries over a sweep: layer profiles, scale tables, training curves.

Every query takes a ``Results`` (from ``analysis.load``) or a metrics-like frame that already
carries the run columns it groups by (pass ``runs=`` to have them joined), and returns a
``pl.LazyFrame``. Only trials whose run has ``status == "done"`` count: failed and diverged
trials, and metric rows of trials with no run row yet, are left out by an inner join.

Seeds are replicates. A config is the trial's science config without its seed: the runs
column ``config_id``. Every aggregate groups by ``config_id`` (overridable with ``by=``) and
carries the label and size columns along (``LABEL_COLUMNS``, ``SIZE_COLUMNS`` and the other
ids of ``analysis.identity``: functions of config_id, so carrying them never splits or merges a
config). Aggregates over seeds are ``mean``, ``std`` (sample, ddof=1), ``n`` (non-null values) and
a two-sided t-based confidence interval ``ci_low``/``ci_high`` = mean -/+ t(n-1) * std/sqrt(n)
(Student t, ``confidence`` = 0.95 by default; null when n < 2). NaN/inf values are dropped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import polars as pl

from analysis.labels import BASIS_SERIES
from analysis.null import null_expr
from analysis.load import TABLES, Results, load
from analysis.query_base import (
    CONTROL, LayerAgg, Layers, QueryError, Source, at_step, carried, config_keys, group_keys, inputs,
    join_runs, minus_control, pick_metric, prepare_runs, summarise,
)  # fmt: skip
from resultstore.vocabulary import Basis, Metric, Site

__all__ = [
    "CONTROL",
    "QueryError",
    "basis_comparison",
    "carried",
    "config_keys",
    "layer_profile",
    "loss_table",
    "metric_over_training",
    "per_trial",
    "runs_table",
    "scale_table",
    "sql",
    "summarise",
]


def per_trial(
    results: Source,
    metric: str,
    site: str = Site.RESID,
    basis: str = Basis.STORED,
    layer_agg: LayerAgg = "mean",
    *,
    step: int | None = None,
    layers: Layers = "blocks",
    runs: pl.LazyFrame | None = None,
    control: tuple[str, str] | None = None,
    over_null: bool = False,
) -> pl.LazyFrame:
    """One row per done trial: its run columns plus ``value``, the metric at the trial's
    final step (or ``step``) aggregated over ``layers`` with ``layer_agg``.

    ``layers="blocks"`` drops layer 0 (the embeddings) and keeps blocks 1..L (and the
    model-level layer -1); ``"all"`` keeps every layer; a list keeps those layers.
    ``control=(site, basis)`` (e.g. ``CONTROL``) subtracts that series' value at the same
    trial, step and layer before aggregating (layers without a control value drop out).
    ``over_null=True`` divides the value by the exact null 3(d-1)/(d+1) at the trial's
    d_model (``analysis.null``): 1 without a privileged basis, at every width."""
    metrics, runs = inputs(results, "metrics", runs)
    m = pick_metric(metrics, metric, site, basis, layers)
    if control is not None:
        m = minus_control(m, metrics, metric, control)
    m = at_step(m, step)
    agg = getattr(pl.col("value"), layer_agg)()
    per = m.group_by("trial_id").agg(
        value=agg, step=pl.col("step").first(), tokens=pl.col("tokens").first()
    )
    per = join_runs(per, runs)
    if over_null:
        if "d_model" not in per.collect_schema().names():
            raise QueryError("over_null needs the runs column d_model: pass a Results, or runs=")
        per = per.with_columns(value=pl.col("value") / null_expr("d_model"))
    return per


def layer_profile(
    results: Source,
    metric: str,
    site: str = Site.RESID,
    basis: str = Basis.STORED,
    step: int | None = None,
    *,
    by: Sequence[str] | None = None,
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """The metric per layer, at each trial's final step (or exactly ``step``), aggregated
    over seeds: one row per config and layer with mean, std, n, sem and a t-based CI.

    Also ``depth`` = layer / n_layers (0 = embeddings, 1 = last block) to compare models of
    different depth, and ``step`` / ``tokens`` (the largest over the seeds)."""
    metrics, runs = inputs(results, "metrics", runs)
    m = at_step(pick_metric(metrics, metric, site, basis, "all"), step)
    m = join_runs(m, runs)
    keys, carry = group_keys(m, by)
    extra = [pl.col("step").max(), pl.col("tokens").max()]
    out = summarise(m, [*keys, "layer"], confidence=confidence, extra=extra, carry=carry)
    if "n_layers" in [*keys, *carry]:
        out = out.with_columns(depth=pl.col("layer") / pl.col("n_layers"))
    return out


def scale_table(
    results: Source,
    metric: str,
    site: str = Site.RESID,
    basis: str = Basis.STORED,
    layer_agg: LayerAgg = "mean",
    *,
    step: int | None = None,
    layers: Layers = "blocks",
    by: Sequence[str] | None = None,
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
    control: tuple[str, str] | None = None,
    over_null: bool = False,
) -> pl.LazyFrame:
    """One row per config (a config has one model size): the metric aggregated over layers
    (``layer_agg`` of ``layers``, see ``per_trial``, ``control`` and ``over_null`` too) within each trial, then
    over seeds (mean, std, n, t-based CI), with the size and label columns carried along."""
    per = per_trial(
        results, metric, site, basis, layer_agg, step=step, layers=layers, runs=runs,
        control=control, over_null=over_null,
    )  # fmt: skip
    keys, carry = group_keys(per, by)
    return summarise(per, keys, confidence=confidence, carry=carry)


def loss_table(
    results: Source,
    column: str = "final_val_loss",
    *,
    by: Sequence[str] | None = None,
    confidence: float = 0.95,
) -> pl.LazyFrame:
    """A run column (final loss, throughput, ...) aggregated over seeds per config and size."""
    if isinstance(results, Results):
        runs = results.done_runs()
    else:
        runs = results.lazy()
        if "status" in runs.collect_schema():
            runs = runs.filter(pl.col("status") == "done")
    runs = prepare_runs(runs)
    keys, carry = group_keys(runs, by)
    return summarise(runs, keys, column, confidence=confidence, carry=carry)


def metric_over_training(
    results: Source,
    metric: str,
    site: str = Site.RESID,
    basis: str = Basis.STORED,
    layer_agg: LayerAgg = "mean",
    *,
    layers: Layers = "blocks",
    by: Sequence[str] | None = None,
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """The metric (aggregated over ``layers`` with ``layer_agg``) at every eval step,
    aggregated over seeds: one row per config and step, with ``tokens`` (mean over seeds)
    for the x axis."""
    metrics, runs = inputs(results, "metrics", runs)
    m = pick_metric(metrics, metric, site, basis, layers)
    agg = getattr(pl.col("value"), layer_agg)()
    per = m.group_by("trial_id", "step").agg(value=agg, tokens=pl.col("tokens").first())
    per = join_runs(per, runs)
    keys, carry = group_keys(per, by)
    return summarise(
        per, [*keys, "step"], confidence=confidence, extra=[pl.col("tokens").mean()], carry=carry
    )


def basis_comparison(
    results: Source,
    metric: str = Metric.KURTOSIS,
    step: int | None = None,
    *,
    by: Sequence[str] | None = None,
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """The metric per layer in each basis: the residual stream in its stored basis and in a
    random basis (the measured control, whose expectation is the exact null 3(d-1)/(d+1)), and the attention / MLP inputs in their computation basis.
    Long format: one row per config, layer and (site, basis), named in ``series``."""
    metrics, runs = inputs(results, "metrics", runs)
    wanted = pl.lit(False)
    for site, basis in BASIS_SERIES:
        wanted = wanted | ((pl.col("site") == site) & (pl.col("basis") == basis))
    m = at_step(metrics.filter((pl.col("metric") == metric) & wanted), step)
    m = join_runs(m, runs)
    keys, carry = group_keys(m, by)
    out = summarise(m, [*keys, "layer", "site", "basis"], confidence=confidence, carry=carry)
    series = pl.concat_str(pl.col("site"), pl.col("basis"), separator="/").replace_strict(
        {f"{s}/{b}": name for (s, b), name in BASIS_SERIES.items()}, return_dtype=pl.String
    )
    return out.with_columns(series=series)


def runs_table(results: Source, status: str | None = "done") -> pl.LazyFrame:
    """The runs with their ids (``analysis.identity``) and stored rotation labels: those
    with ``status`` (every run with ``status=None``)."""
    runs = results.runs if isinstance(results, Results) else results.lazy()
    if status is not None and "status" in runs.collect_schema():
        runs = runs.filter(pl.col("status") == status)
    return prepare_runs(runs)


# the statements Polars SQL runs that change its context (it refuses INSERT, UPDATE, ALTER itself)
_CHANGES = {"CREATE", "DELETE", "DROP", "TRUNCATE"}


def sql(results: Results | str | os.PathLike[str], query: str) -> pl.DataFrame:
    """Run a Polars SQL ``query`` over the tables ``runs``, ``metrics``, ``curves``,
    ``checks`` (and ``done_runs``, the runs with status done). ``results`` is a ``Results``
    or a path to load. Errors (bad SQL, unknown table or column) raise ``QueryError``
    naming the tables and their columns; a statement that would change a table (DROP, CREATE,
    DELETE, ...) raises ``QueryError``: the tables are read-only views of the store."""
    verb = query.lstrip(" \t\r\n(").split(None, 1)[0].upper() if query.strip(" \t\r\n(") else ""
    if verb in _CHANGES:
        raise QueryError(
            f"query failed: {verb} changes nothing here: the tables are read-only views of the store; "
            "read them with SELECT (or WITH ... SELECT)"
        )
    if not isinstance(results, Results):
        results = load(results)
    frames = {**results.tables(), "done_runs": results.done_runs()}
    try:
        with pl.SQLContext(frames, eager=False) as ctx:
            return ctx.execute(query).collect()
    except (pl.exceptions.PolarsError, pl.exceptions.SQLInterfaceError) as e:
        cols = "\n".join(
            f"  {name}: {', '.join(frame.collect_schema().names())}"
            for name, frame in frames.items()
            if name in TABLES
        )
        reason = str(e).split("\n\nResolved plan", 1)[0].strip()
        raise QueryError(f"query failed: {reason}\ntables and columns:\n{cols}") from e
