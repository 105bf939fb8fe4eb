"""Named lazy queries over a sweep: layer profiles, scale tables, training curves.

Every query takes a ``Results`` (from ``analysis.load``) or a metrics-like frame that already
carries the run columns it groups by (pass ``runs=`` to have them joined), and returns a
``pl.LazyFrame``. Only trials whose run has ``status == "done"`` count: failed and diverged
trials, and metric rows of trials with no run row yet, are left out by an inner join.

Seeds are replicates. A config is the grid point without its seed: by default
``CONFIG_COLUMNS`` + ``SIZE_COLUMNS`` (those present), overridable with ``by=``.
Aggregates over seeds are ``mean``, ``std`` (sample, ddof=1), ``n`` (non-null values) and
a two-sided t-based confidence interval ``ci_low``/``ci_high`` = mean -/+ t(n-1) * std/sqrt(n)
(Student t, ``confidence`` = 0.95 by default; null when n < 2). NaN/inf values are dropped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

import polars as pl

from analysis._stats import t_critical
from analysis.load import (
    CONFIG_COLUMNS,
    SCHEMAS,
    SIZE_COLUMNS,
    TABLES,
    Results,
    config_label,
    load,
)

__all__ = [
    "QueryError",
    "basis_comparison",
    "config_keys",
    "layer_profile",
    "loss_table",
    "metric_over_training",
    "per_trial",
    "scale_table",
    "sql",
    "summarise",
]

Source = Results | pl.LazyFrame | pl.DataFrame
LayerAgg = Literal["mean", "max", "min", "median"]
Layers = Literal["blocks", "all"] | Sequence[int]

# (site, basis) pairs compared by basis_comparison, with their legend names.
BASIS_SERIES = {
    ("resid", "stored"): "residual, stored basis",
    ("resid", "random"): "residual, random basis",
    ("attn_in", "computation"): "attention input, computation basis",
    ("mlp_in", "computation"): "MLP input, computation basis",
}


_TABLE_COLUMNS = {t: set(SCHEMAS[t]) for t in TABLES}


class QueryError(ValueError):
    """A query could not run (bad SQL, unknown column, missing run columns)."""


def config_keys(columns: Sequence[str] | pl.Schema) -> list[str]:
    """The default grouping keys (config + model size) present among ``columns``."""
    names = set(columns)
    return [c for c in (*CONFIG_COLUMNS, *SIZE_COLUMNS) if c in names]


def summarise(
    frame: pl.LazyFrame,
    keys: Sequence[str],
    value: str = "value",
    *,
    confidence: float = 0.95,
    extra: Sequence[pl.Expr] = (),
) -> pl.LazyFrame:
    """Group ``frame`` by ``keys`` and aggregate ``value`` over the rest (the seeds):
    mean, std, n, sem, ci_low, ci_high (t-based), plus any ``extra`` aggregations."""
    v = pl.col(value)
    finite = frame.filter(v.is_not_null() & v.is_finite())
    out = finite.group_by(list(keys)).agg(
        mean=v.mean(), std=v.std(), n=v.count().cast(pl.Int64), *extra
    )
    t = pl.col("n").map_batches(
        lambda n: pl.Series([t_critical(float(k - 1), confidence) for k in n], dtype=pl.Float64),
        return_dtype=pl.Float64,
        is_elementwise=True,
    )
    sem = pl.col("std") / pl.col("n").cast(pl.Float64).sqrt()
    out = out.with_columns(sem=sem).with_columns(
        ci_low=pl.col("mean") - t * pl.col("sem"), ci_high=pl.col("mean") + t * pl.col("sem")
    )
    return out.sort(list(keys), nulls_last=True)


def per_trial(
    results: Source,
    metric: str,
    site: str = "resid",
    basis: str = "stored",
    layer_agg: LayerAgg = "mean",
    *,
    step: int | None = None,
    layers: Layers = "blocks",
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """One row per done trial: its run columns plus ``value``, the metric at the trial's
    final step (or ``step``) aggregated over ``layers`` with ``layer_agg``.

    ``layers="blocks"`` drops layer 0 (the embeddings) and keeps blocks 1..L (and the
    model-level layer -1); ``"all"`` keeps every layer; a list keeps those layers."""
    metrics, runs = _inputs(results, "metrics", runs)
    m = _pick(metrics, metric, site, basis, layers)
    m = _at_step(m, step)
    agg = getattr(pl.col("value"), layer_agg)()
    per = m.group_by("trial_id").agg(
        value=agg, step=pl.col("step").first(), tokens=pl.col("tokens").first()
    )
    return _join_runs(per, runs)


def layer_profile(
    results: Source,
    metric: str,
    site: str = "resid",
    basis: str = "stored",
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
    metrics, runs = _inputs(results, "metrics", runs)
    m = _at_step(_pick(metrics, metric, site, basis, "all"), step)
    m = _join_runs(m, runs)
    keys = _keys(m, by)
    extra = [pl.col("step").max(), pl.col("tokens").max()]
    out = summarise(m, [*keys, "layer"], confidence=confidence, extra=extra)
    if "n_layers" in keys:
        out = out.with_columns(depth=pl.col("layer") / pl.col("n_layers"))
    return out


def scale_table(
    results: Source,
    metric: str,
    site: str = "resid",
    basis: str = "stored",
    layer_agg: LayerAgg = "mean",
    *,
    step: int | None = None,
    layers: Layers = "blocks",
    by: Sequence[str] | None = None,
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """One row per config and model size: the metric aggregated over layers (``layer_agg``
    of ``layers``, see ``per_trial``) within each trial, then over seeds (mean, std, n,
    t-based CI). The size columns (params, params_non_embedding, ...) are among the keys."""
    per = per_trial(
        results, metric, site, basis, layer_agg, step=step, layers=layers, runs=runs
    )
    keys = _keys(per, by)
    return summarise(per, keys, confidence=confidence)


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
    keys = _keys(runs, by)
    return summarise(runs, keys, column, confidence=confidence)


def metric_over_training(
    results: Source,
    metric: str,
    site: str = "resid",
    basis: str = "stored",
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
    metrics, runs = _inputs(results, "metrics", runs)
    m = _pick(metrics, metric, site, basis, layers)
    agg = getattr(pl.col("value"), layer_agg)()
    per = m.group_by("trial_id", "step").agg(value=agg, tokens=pl.col("tokens").first())
    per = _join_runs(per, runs)
    keys = _keys(per, by)
    return summarise(per, [*keys, "step"], confidence=confidence, extra=[pl.col("tokens").mean()])


def basis_comparison(
    results: Source,
    metric: str = "kurtosis",
    step: int | None = None,
    *,
    by: Sequence[str] | None = None,
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """The metric per layer in each basis: the residual stream in its stored basis and in a
    random basis (the ~3 control), and the attention / MLP inputs in their computation basis.
    Long format: one row per config, layer and (site, basis), named in ``series``."""
    metrics, runs = _inputs(results, "metrics", runs)
    wanted = pl.lit(False)
    for site, basis in BASIS_SERIES:
        wanted = wanted | ((pl.col("site") == site) & (pl.col("basis") == basis))
    m = _at_step(metrics.filter((pl.col("metric") == metric) & wanted), step)
    m = _join_runs(m, runs)
    keys = _keys(m, by)
    out = summarise(m, [*keys, "layer", "site", "basis"], confidence=confidence)
    series = pl.concat_str(pl.col("site"), pl.col("basis"), separator="/").replace_strict(
        {f"{s}/{b}": name for (s, b), name in BASIS_SERIES.items()}, return_dtype=pl.String
    )
    return out.with_columns(series=series)


def sql(results: Results | str | os.PathLike[str], query: str) -> pl.DataFrame:
    """Run a Polars SQL ``query`` over the tables ``runs``, ``metrics``, ``curves``,
    ``checks`` (and ``done_runs``, the runs with status done). ``results`` is a ``Results``
    or a path to load. Errors (bad SQL, unknown table or column) raise ``QueryError``
    naming the tables and their columns."""
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


# ---------------------------------------------------------------- internals


def _inputs(
    results: Source, table: str, runs: pl.LazyFrame | None
) -> tuple[pl.LazyFrame, pl.LazyFrame | None]:
    if isinstance(results, Results):
        return getattr(results, table), results.done_runs() if runs is None else runs
    if isinstance(results, pl.DataFrame | pl.LazyFrame):
        frame = results.lazy()
        names = frame.collect_schema().names()
        base = [c for c in names if c in _TABLE_COLUMNS[table]]
        extra = [c for c in names if c not in _TABLE_COLUMNS[table]]
        if runs is None and extra and "trial_id" in names:
            # a frame with the run columns already joined: split it back apart
            runs = frame.select("trial_id", *extra).unique(subset="trial_id")
            frame = frame.select(base)
        return frame, runs
    raise TypeError(f"expected Results or a Polars frame, got {type(results).__name__}")


def _pick(
    metrics: pl.LazyFrame, metric: str, site: str, basis: str, layers: Layers
) -> pl.LazyFrame:
    m = metrics.filter(
        (pl.col("metric") == metric) & (pl.col("site") == site) & (pl.col("basis") == basis)
    )
    if layers == "blocks":
        return m.filter(pl.col("layer") != 0)
    if layers == "all":
        return m
    if isinstance(layers, str):
        raise ValueError(f"layers must be 'blocks', 'all' or a list of ints, not {layers!r}")
    return m.filter(pl.col("layer").is_in(list(layers)))


def _at_step(m: pl.LazyFrame, step: int | None) -> pl.LazyFrame:
    if step is None:
        return m.filter(pl.col("step") == pl.col("step").max().over("trial_id"))
    return m.filter(pl.col("step") == step)


def _join_runs(frame: pl.LazyFrame, runs: pl.LazyFrame | None) -> pl.LazyFrame:
    if runs is None:
        return frame
    have = set(frame.collect_schema().names())
    runs = runs.filter(pl.col("status") == "done") if "status" in runs.collect_schema() else runs
    cols = [c for c in runs.collect_schema().names() if c == "trial_id" or c not in have]
    return frame.join(runs.select(cols), on="trial_id", how="inner")


def _keys(frame: pl.LazyFrame, by: Sequence[str] | None) -> list[str]:
    names = frame.collect_schema().names()
    if by is None:
        keys = config_keys(names)
        if not keys:
            raise QueryError(
                "no config columns to group by (expected some of "
                f"{', '.join((*CONFIG_COLUMNS, *SIZE_COLUMNS))}); pass a Results, or runs=, "
                f"or by=. Columns: {', '.join(names)}"
            )
        return keys
    missing = [c for c in by if c not in names]
    if missing:
        raise QueryError(f"by= names unknown columns {missing}; columns: {', '.join(names)}")
    return list(by)


def with_config_label(frame: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame | pl.DataFrame:
    """Add a ``config`` label column (see ``analysis.load.config_label``)."""
    return frame.with_columns(config_label())
