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
from typing import Literal

import polars as pl

from analysis._stats import t_critical
from analysis.identity import ID_COLUMNS, with_ids
from analysis.labels import BASIS_SERIES
from analysis.load import (
    CONFIG_ID,
    LABEL_COLUMNS,
    SCHEMAS,
    SIZE_COLUMNS,
    TABLES,
    Results,
    config_label,
    load,
    rotation_label,
)

__all__ = [
    "CONTROL",
    "QueryError",
    "basis_comparison",
    "best_lr",
    "best_lr_results",
    "carried",
    "config_keys",
    "layer_profile",
    "line_labels",
    "loss_table",
    "metric_over_training",
    "onset",
    "per_trial",
    "quant_penalty",
    "runs_table",
    "scale_table",
    "sql",
    "summarise",
    "versus",
]

Source = Results | pl.LazyFrame | pl.DataFrame
LayerAgg = Literal["mean", "max", "min", "median"]
Layers = Literal["blocks", "all"] | Sequence[int]



_TABLE_COLUMNS = {t: set(SCHEMAS[t]) for t in TABLES}

CONTROL = ("resid", "random")
"""The no-privilege control: the residual stream in a fixed random basis, which reads
3d/(d+2) (below 3 at small width d), not 3. ``control=CONTROL`` measures a metric as its
value minus the control's at the same trial, layer and step."""


class QueryError(ValueError):
    """A query could not run (bad SQL, unknown column, missing run columns)."""


def config_keys(columns: Sequence[str] | pl.Schema) -> list[str]:
    """The default grouping key, ``["config_id"]``, when present among ``columns``."""
    return [CONFIG_ID] if CONFIG_ID in set(columns) else []


def carried(columns: Sequence[str] | pl.Schema, keys: Sequence[str] = ()) -> list[str]:
    """The label columns present among ``columns`` (sizes, hyper-parameters, ids) that ride
    along a config_id aggregate as its first value."""
    names = set(columns)
    every = (*SIZE_COLUMNS, *LABEL_COLUMNS, *ID_COLUMNS)
    return [c for c in dict.fromkeys(every) if c in names and c not in keys]


_SORT = ("optimizer", "norm", "rotation_label", "params_non_embedding", "lr")


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
    order = [c for c in _SORT if c in carry and c not in keys]
    return out.sort([*order, *keys], nulls_last=True)


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
    control: tuple[str, str] | None = None,
) -> pl.LazyFrame:
    """One row per done trial: its run columns plus ``value``, the metric at the trial's
    final step (or ``step``) aggregated over ``layers`` with ``layer_agg``.

    ``layers="blocks"`` drops layer 0 (the embeddings) and keeps blocks 1..L (and the
    model-level layer -1); ``"all"`` keeps every layer; a list keeps those layers.
    ``control=(site, basis)`` (e.g. ``CONTROL``) subtracts that series' value at the same
    trial, step and layer before aggregating (layers without a control value drop out)."""
    metrics, runs = _inputs(results, "metrics", runs)
    m = _pick(metrics, metric, site, basis, layers)
    if control is not None:
        m = _minus_control(m, metrics, metric, control)
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
    keys, carry = _keys(m, by)
    extra = [pl.col("step").max(), pl.col("tokens").max()]
    out = summarise(m, [*keys, "layer"], confidence=confidence, extra=extra, carry=carry)
    if "n_layers" in [*keys, *carry]:
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
    control: tuple[str, str] | None = None,
) -> pl.LazyFrame:
    """One row per config (a config has one model size): the metric aggregated over layers
    (``layer_agg`` of ``layers``, see ``per_trial``, ``control`` too) within each trial, then
    over seeds (mean, std, n, t-based CI), with the size and label columns carried along."""
    per = per_trial(
        results, metric, site, basis, layer_agg, step=step, layers=layers, runs=runs,
        control=control,
    )  # fmt: skip
    keys, carry = _keys(per, by)
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
    runs = _prepare_runs(runs)
    keys, carry = _keys(runs, by)
    return summarise(runs, keys, column, confidence=confidence, carry=carry)


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
    keys, carry = _keys(per, by)
    return summarise(
        per, [*keys, "step"], confidence=confidence, extra=[pl.col("tokens").mean()], carry=carry
    )


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
    keys, carry = _keys(m, by)
    out = summarise(m, [*keys, "layer", "site", "basis"], confidence=confidence, carry=carry)
    series = pl.concat_str(pl.col("site"), pl.col("basis"), separator="/").replace_strict(
        {f"{s}/{b}": name for (s, b), name in BASIS_SERIES.items()}, return_dtype=pl.String
    )
    return out.with_columns(series=series)


def best_lr(
    results: Source, column: str = "final_val_loss", *, confidence: float = 0.95
) -> pl.DataFrame:
    """The best learning rate per ``tuning_id`` (optimiser, size, norm, rotation and every
    other hyper-parameter: the config without its seed and lr, see ``analysis.identity``):
    the lr whose done seeds have the lowest mean ``column``. One row per tuning_id with the
    chosen ``config_id``, ``lr``, its seed ``mean``/``ci_low``/``ci_high``/``n``, the ladder
    (``lrs``, ``n_lrs``: every lr tried, diverged ones included) and flags:

    - ``edge``: ``"low"`` / ``"high"`` when the best lr is the smallest / largest tried (the
      ladder is too short there); ``untuned``: a ladder of one lr.
    - ``tie``: the runner-up lr (``runner_up_lr``) is not distinguishable: its seed mean is
      within t * sqrt(sem_best² + sem_runner_up²) of the best's (t at ``confidence`` with the
      smaller seed count - 1 dof), or equal when there is one seed.
    - An lr at which any seed diverged is not chosen while another lr had none diverge
      (``diverged`` counts the chosen lr's diverged seeds; then the flag says so).
    ``flag`` summarises them in words ("" when the choice is clean)."""
    runs = _prepare_runs(_runs_of(results))
    runs = runs.filter(pl.col("status").is_in(["done", "diverged"]))
    ladders = runs.group_by("tuning_id").agg(lrs=pl.col("lr").unique().sort())
    div = runs.group_by("config_id").agg(diverged=(pl.col("status") == "diverged").sum().cast(pl.Int64))
    done = runs.filter(pl.col("status") == "done")
    keys, carry = _keys(done, None)
    table = summarise(done, keys, column, confidence=confidence, carry=carry)
    table = table.join(div, on="config_id", how="left").with_columns(pl.col("diverged").fill_null(0))
    table = table.collect()
    ladders = ladders.collect()
    if table.height == 0:
        return table.with_columns(
            lrs=pl.lit(None, pl.List(pl.Float64)), n_lrs=pl.lit(None, pl.Int64),
            edge=pl.lit(None, pl.String), untuned=pl.lit(None, pl.Boolean),
            tie=pl.lit(None, pl.Boolean), runner_up_lr=pl.lit(None, pl.Float64),
            flag=pl.lit(None, pl.String),
        )  # fmt: skip
    clean = pl.col("diverged") == 0
    eligible = table.filter(clean | ~clean.any().over("tuning_id")).sort("tuning_id", "mean", "lr")
    ranked = eligible.with_columns(rank=pl.int_range(pl.len()).over("tuning_id"))
    best = ranked.filter(pl.col("rank") == 0).drop("rank")
    second = ranked.filter(pl.col("rank") == 1).select(
        "tuning_id", runner_up_lr="lr", _m2="mean", _s2="sem", _n2="n"
    )
    best = best.join(ladders, on="tuning_id", how="left").join(second, on="tuning_id", how="left")
    rows = []
    for r in best.iter_rows(named=True):
        ladder = sorted(r["lrs"] or [r["lr"]])
        untuned = len(ladder) == 1
        edge = None if untuned else "low" if r["lr"] == ladder[0] else "high" if r["lr"] == ladder[-1] else None
        tie = False
        if r["runner_up_lr"] is not None:
            diff = r["_m2"] - r["mean"]
            s1, s2 = r["sem"], r["_s2"]
            if s1 is None or s2 is None or not (s1 == s1 and s2 == s2):
                tie = diff == 0
            else:
                t = t_critical(float(min(r["n"], r["_n2"]) - 1), confidence)
                tie = diff <= t * (s1**2 + s2**2) ** 0.5
        words = []
        if untuned:
            words.append("untuned (one lr)")
        if edge:
            words.append(f"edge: {'smallest' if edge == 'low' else 'largest'} lr tried")
        if tie:
            words.append(f"tie with lr={r['runner_up_lr']:g}")
        if r["diverged"]:
            words.append(f"{r['diverged']} seed(s) diverged at every lr; mean over the rest")
        rows.append({"tuning_id": r["tuning_id"], "n_lrs": len(ladder), "edge": edge,
                     "untuned": untuned, "tie": tie, "flag": "; ".join(words)})  # fmt: skip
    flags = pl.DataFrame(rows, schema={"tuning_id": pl.String, "n_lrs": pl.Int64, "edge": pl.String,
                                       "untuned": pl.Boolean, "tie": pl.Boolean, "flag": pl.String})  # fmt: skip
    out = best.drop("_m2", "_s2", "_n2").join(flags, on="tuning_id", how="left")
    order = [c for c in _SORT if c in out.columns]
    return out.sort([*order, "tuning_id"], nulls_last=True)


def best_lr_results(results: Results, best: pl.DataFrame | None = None) -> Results:
    """``results`` whose runs hold only the best-lr configs (``best_lr``), every status:
    every query over it then shows the best-lr points. Tables are filtered lazily by join."""
    import dataclasses

    best = best_lr(results) if best is None else best
    ids = best.select("config_id").lazy()
    runs = _prepare_runs(results.runs).join(ids, on="config_id", how="semi")
    return dataclasses.replace(results, runs=runs)


def versus(
    x_table: pl.LazyFrame | pl.DataFrame, y_table: pl.LazyFrame | pl.DataFrame
) -> pl.LazyFrame:
    """Two per-config seed aggregates side by side (e.g. kurtosis against val loss, the
    matched-loss view): ``y_table``'s columns as they are, ``x_table``'s ``mean``,
    ``ci_low``, ``ci_high``, ``n`` as ``x``, ``x_low``, ``x_high``, ``x_n``; joined on
    ``config_id`` (inner)."""
    x = x_table.lazy().select(
        "config_id", x="mean", x_low="ci_low", x_high="ci_high", x_n="n"
    )
    out = y_table.lazy().join(x, on="config_id", how="inner")
    order = [c for c in _SORT if c in out.collect_schema().names()]
    return out.sort([*order, "config_id"], nulls_last=True)


def quant_penalty(
    results: Source,
    basis: str = "w8a8",
    *,
    metric: str = "kurtosis",
    site: str = "resid",
    metric_basis: str = "stored",
    layer_agg: LayerAgg = "mean",
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """The quantisation penalty (metric ``quant_loss_delta`` at site ``model``, layer -1,
    basis ``basis``: quantised minus float val loss at the final step) against an outlier
    measure (``metric`` at ``site``/``metric_basis``, ``layer_agg`` over blocks), both
    aggregated over seeds per config: ``versus`` columns (x = the outlier measure)."""
    penalty = scale_table(
        results, "quant_loss_delta", "model", basis, layers=[-1], confidence=confidence, runs=runs
    )
    measure = scale_table(
        results, metric, site, metric_basis, layer_agg, confidence=confidence, runs=runs
    )
    return versus(measure, penalty).with_columns(quant=pl.lit(basis))


def onset(
    results: Source,
    metric: str = "kurtosis",
    threshold: float = 3.5,
    site: str = "resid",
    basis: str = "stored",
    layer_agg: LayerAgg = "mean",
    *,
    layers: Layers = "blocks",
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """When each config's ``metric`` (``layer_agg`` over ``layers``) first exceeds
    ``threshold``: per trial the first eval step with value > threshold, then over seeds per
    config the mean onset ``tokens`` (``mean``/``ci_low``/``ci_high``/``n``: seeds that
    crossed), ``step_mean``, and ``n_never``: seeds that never crossed by their last eval
    (the interval covers only the seeds that crossed; with n_never > 0 the onset is later)."""
    metrics, runs = _inputs(results, "metrics", runs)
    m = _pick(metrics, metric, site, basis, layers)
    agg = getattr(pl.col("value"), layer_agg)()
    per = m.group_by("trial_id", "step").agg(value=agg, tokens=pl.col("tokens").first())
    first = per.group_by("trial_id").agg(
        crossed=(pl.col("value") > threshold).any(),
        onset_step=pl.col("step").filter(pl.col("value") > threshold).min(),
        tokens=pl.col("tokens").sort_by("step").filter(pl.col("value").sort_by("step") > threshold).first(),
    )
    first = _join_runs(first, runs).with_columns(tokens=pl.col("tokens").cast(pl.Float64))
    keys, carry = _keys(first, None)
    crossed = summarise(
        first, keys, "tokens", confidence=confidence, extra=[pl.col("onset_step").mean().alias("step_mean")]
    )
    seeds = first.group_by(keys).agg(
        *[pl.col(c).first() for c in carry],
        n_seeds=pl.len().cast(pl.Int64),
        n_never=(~pl.col("crossed")).sum().cast(pl.Int64),
    )
    out = seeds.join(crossed, on=keys, how="left").with_columns(
        pl.col("n").fill_null(0), threshold=pl.lit(threshold)
    )
    return out.sort([*[c for c in _SORT if c in carry], *keys], nulls_last=True)


def runs_table(results: Source, status: str | None = "done") -> pl.LazyFrame:
    """The runs with their ids (``analysis.identity``) and stored rotation labels: those
    with ``status`` (every run with ``status=None``)."""
    runs = results.runs if isinstance(results, Results) else results.lazy()
    if status is not None and "status" in runs.collect_schema():
        runs = runs.filter(pl.col("status") == status)
    return _prepare_runs(runs)


_LINE_LABELS = ("optimizer", "optimizer_family", "norm", "rotation_label")
_HYPER = ("momentum", "nesterov", "weight_decay", "eps", "beta1", "beta2", "rotate")


def line_labels(frame: pl.DataFrame | pl.LazyFrame, key: str = "tuned_line_id") -> pl.DataFrame:
    """A readable ``config`` label per ``key`` (a line across sizes): ``optimizer · norm ·
    rotation``, then every other hyper-parameter that differs between lines of one optimiser
    (``momentum=0.5``), then the lr (``lr=0.003``, or ``lr tuned per size`` when the best lr
    differs between sizes); also the optimizer, family, norm and rotation_label columns."""
    df = frame.lazy().collect() if isinstance(frame, pl.LazyFrame) else frame
    present = [c for c in (*LABEL_COLUMNS,) if c in df.columns and c != "lr"]
    lines = df.group_by(key).agg(
        *[pl.col(c).first() for c in present],
        lrs=pl.col("lr").unique().sort() if "lr" in df.columns else pl.lit([]),
    )
    varying = [
        c for c in _HYPER
        if c in lines.columns and "optimizer" in lines.columns
        and int(lines.group_by("optimizer").agg(pl.col(c).n_unique()).get_column(c).max() or 0) > 1
    ]  # fmt: skip
    out = []
    for r in lines.iter_rows(named=True):
        parts = [str(r.get(c)) for c in ("optimizer", "norm", "rotation_label") if r.get(c) is not None]
        parts += [f"{c}={r[c]:g}" if isinstance(r[c], float) else f"{c}={r[c]}" for c in varying if r[c] is not None]
        lrs = r.get("lrs") or []
        if len(lrs) == 1:
            parts.append(f"lr={lrs[0]:g}")
        elif lrs:
            parts.append("lr tuned per size")
        out.append({key: r[key], "config": " · ".join(parts),
                    **{c: r.get(c) for c in _LINE_LABELS if c in present}})  # fmt: skip
    schema = {key: pl.String, "config": pl.String, **{c: df.schema[c] for c in _LINE_LABELS if c in present}}
    return pl.DataFrame(out, schema=schema)


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
        runs = results.done_runs() if runs is None else runs
        return getattr(results, table), _prepare_runs(runs)
    if isinstance(results, pl.DataFrame | pl.LazyFrame):
        frame = results.lazy()
        names = frame.collect_schema().names()
        base = [c for c in names if c in _TABLE_COLUMNS[table]]
        extra = [c for c in names if c not in _TABLE_COLUMNS[table]]
        if runs is None and extra and "trial_id" in names:
            # a frame with the run columns already joined: split it back apart
            runs = frame.select("trial_id", *extra).unique(subset="trial_id")
            frame = frame.select(base)
        return frame, None if runs is None else _prepare_runs(runs)
    raise TypeError(f"expected Results or a Polars frame, got {type(results).__name__}")


def _runs_of(results: Source) -> pl.LazyFrame:
    if isinstance(results, Results):
        return results.runs
    return results.lazy()


def _minus_control(
    m: pl.LazyFrame, metrics: pl.LazyFrame, metric: str, control: tuple[str, str]
) -> pl.LazyFrame:
    c = metrics.filter(
        (pl.col("metric") == metric) & (pl.col("site") == control[0]) & (pl.col("basis") == control[1])
    ).select("trial_id", "step", "layer", _control="value")
    joined = m.join(c, on=["trial_id", "step", "layer"], how="inner")
    return joined.with_columns(value=pl.col("value") - pl.col("_control")).drop("_control")


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


def _prepare_runs(runs: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """Runs with their ids (``analysis.identity.with_ids``) and the stored rotation label
    (filled for rows written before it existed)."""
    runs = runs.lazy()
    names = runs.collect_schema().names()
    if "config_id" not in names and "config_json" not in names and "optimizer" not in names:
        return runs  # not a runs frame: nothing to identify
    runs = with_ids(runs)
    if {"rotation", "group_size", "rotation_label"} <= set(names):
        runs = runs.with_columns(rotation_label())
    return runs


def _keys(frame: pl.LazyFrame, by: Sequence[str] | None) -> tuple[list[str], list[str]]:
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


def with_config_label(frame: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame | pl.DataFrame:
    """Add a ``config`` label column (see ``analysis.load.config_label``)."""
    return frame.with_columns(config_label())
