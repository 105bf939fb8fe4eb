"""What every query shares: its inputs (a ``Results`` or a frame), the join with the done
runs (with their ids), the group keys, and the seed summary (mean, sd, n, t-interval)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import polars as pl

from analysis.power_law import t_critical
from analysis.identity import ID_COLUMNS, with_ids
from analysis.load import (
    CONFIG_ID, SCHEMAS, SIZE_COLUMNS, TABLES, Results, Role, axis_labels, label_columns, runs_columns,
)
from resultstore.vocabulary import Basis, Site

__all__ = [
    "CONTROL", "SORT", "LayerAgg", "Layers", "QueryError", "Source", "at_step", "carried", "config_keys",
    "group_keys", "inputs", "join_runs", "minus_control", "pick_metric", "prepare_runs", "runs_of", "summarise",
]  # fmt: skip

Source = Results | pl.LazyFrame | pl.DataFrame
LayerAgg = Literal["mean", "max", "min", "median", "sum"]
Layers = Literal["blocks", "all"] | Sequence[int]

CONTROL = (Site.RESID, Basis.RANDOM)
"""The measured no-privilege control: the residual stream in random bases (one basis in older
stores, the mean over >= 32 Haar bases in newer ones), whose expectation is the exact null
3(d-1)/(d+1) (``analysis.null``; below 3 at small width d). ``control=CONTROL`` measures a
metric as its value minus the control's at the same trial, layer and step; the report's
fits use the exact null instead (``over_null``), defined for every config."""


class QueryError(ValueError):
    """A query could not run (bad SQL, unknown column, missing run columns)."""


def config_keys(columns: Sequence[str] | pl.Schema) -> list[str]:
    """The default grouping key, ``["config_id"]``, when present among ``columns``."""
    return [CONFIG_ID] if CONFIG_ID in set(columns) else []


def carried(columns: Sequence[str] | pl.Schema, keys: Sequence[str] = ()) -> list[str]:
    """The label columns present among ``columns`` (sizes, hyper-parameters, ids) that ride
    along a config_id aggregate as its first value."""
    names = set(columns)
    every = (*SIZE_COLUMNS, *label_columns(), *ID_COLUMNS)  # at call time: a registered optimiser's column too
    return [c for c in dict.fromkeys(every) if c in names and c not in keys]


SORT = (*runs_columns(Role.AXIS), "params_non_embedding", "lr")
"""The order of config tables' rows: the axes (``resultstore.schema`` role AXIS, in column order:
optimizer, norm, attention, rotation_label, parametrization), then size and lr."""


def summarise(
    frame: pl.LazyFrame,
    keys: Sequence[str],
    value: str = "value",
    *,
    confidence: float = 0.95,
    extra: Sequence[pl.Expr] = (),
    carry: Sequence[str] = (),
) -> pl.LazyFrame:
    """Group ``frame`` by ``keys`` and aggregate ``value`` over the rest (the seeds):
    mean, std, n, sem, ci_low, ci_high (t-based), plus any ``extra`` aggregations, and the
    first value of each ``carry`` column (labels that are functions of the keys)."""
    v = pl.col(value)
    finite = frame.filter(v.is_not_null() & v.is_finite())
    out = finite.group_by(list(keys)).agg(
        *[pl.col(c).first() for c in carry if c not in keys],
        mean=v.mean(), std=v.std(), n=v.count().cast(pl.Int64), *extra,
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
    order = [c for c in SORT if c in carry and c not in keys]
    return out.sort([*order, *keys], nulls_last=True)


def inputs(
    results: Source, table: str, runs: pl.LazyFrame | None
) -> tuple[pl.LazyFrame, pl.LazyFrame | None]:
    if isinstance(results, Results):
        runs = results.done_runs() if runs is None else runs
        return getattr(results, table), prepare_runs(runs)
    if isinstance(results, pl.DataFrame | pl.LazyFrame):
        frame = results.lazy()
        names = frame.collect_schema().names()
        base = [c for c in names if c in SCHEMAS[table]]  # read now: a column a store's stamp declared counts
        extra = [c for c in names if c not in SCHEMAS[table]]
        if runs is None and extra and "trial_id" in names:
            # a frame with the run columns already joined: split it back apart
            runs = frame.select("trial_id", *extra).unique(subset="trial_id")
            frame = frame.select(base)
        return frame, None if runs is None else prepare_runs(runs)
    raise TypeError(f"expected Results or a Polars frame, got {type(results).__name__}")


def runs_of(results: Source) -> pl.LazyFrame:
    if isinstance(results, Results):
        return results.runs
    return results.lazy()


def minus_control(
    m: pl.LazyFrame, metrics: pl.LazyFrame, metric: str, control: tuple[str, str]
) -> pl.LazyFrame:
    c = metrics.filter(
        (pl.col("metric") == metric) & (pl.col("site") == control[0]) & (pl.col("basis") == control[1])
    ).select("trial_id", "step", "layer", _control="value")
    joined = m.join(c, on=["trial_id", "step", "layer"], how="inner")
    return joined.with_columns(value=pl.col("value") - pl.col("_control")).drop("_control")


def pick_metric(
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


def at_step(m: pl.LazyFrame, step: int | None) -> pl.LazyFrame:
    if step is None:
        return m.filter(pl.col("step") == pl.col("step").max().over("trial_id"))
    return m.filter(pl.col("step") == step)


def join_runs(frame: pl.LazyFrame, runs: pl.LazyFrame | None) -> pl.LazyFrame:
    if runs is None:
        return frame
    have = set(frame.collect_schema().names())
    runs = runs.filter(pl.col("status") == "done") if "status" in runs.collect_schema() else runs
    cols = [c for c in runs.collect_schema().names() if c == "trial_id" or c not in have]
    return frame.join(runs.select(cols), on="trial_id", how="inner")


def prepare_runs(runs: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """Runs with their ids (``analysis.identity.with_ids``) and their axes' labels
    (``analysis.load.axis_labels``: the rotation label, attention and parametrization filled for
    rows written before they existed)."""
    runs = runs.lazy()
    names = runs.collect_schema().names()
    if "config_id" not in names and "config_json" not in names and "optimizer" not in names:
        return runs  # not a runs frame: nothing to identify
    return with_ids(runs).with_columns(axis_labels(names))


def group_keys(frame: pl.LazyFrame, by: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(group keys, carried label columns)."""
    names = frame.collect_schema().names()
    if by is None:
        keys = config_keys(names)
        if not keys:
            raise QueryError(
                f"no {CONFIG_ID} column to group by; pass a Results, or runs=, "
                f"or by=. Columns: {', '.join(names)}"
            )
        return keys, carried(names, keys)
    missing = [c for c in by if c not in names]
    if missing:
        raise QueryError(f"by= names unknown columns {missing}; columns: {', '.join(names)}")
    return list(by), []
