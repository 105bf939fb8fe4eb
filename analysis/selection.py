"""Views built on the queries: the best lr per tuning group, the matched-loss view, the
quantisation penalty, the onset of outliers, and line labels."""

from __future__ import annotations

import polars as pl

from analysis.labels import ENDS
from analysis.power_law import t_critical
from analysis.load import Results, label_columns
from analysis.query_base import (
    SORT, Source, group_keys, inputs, join_runs, pick_metric, prepare_runs, runs_of, summarise,
)  # fmt: skip
from analysis.queries import scale_table
from resultstore.schema import FINISHED, Role, runs_columns
from resultstore.vocabulary import Basis, Metric, Site

__all__ = [
    "best_lr", "best_lr_results", "group_size_table", "line_labels", "onset", "quant_penalty", "unrotated_table",
    "untuned_choices", "versus",
]


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
    - ``tie``: the runner-up lr (``runner_up_lr``) is not distinguishable. Seeds are paired across
      lrs (a seed fixes the init and the data order), so where the two share 2+ seeds the test is
      paired: the runner-up's mean excess over the best on those seeds is within t * its sem (t at
      ``confidence``, shared - 1 dof). Otherwise unpaired: within t * sqrt(sem_best² +
      sem_runner_up²) (the smaller seed count - 1 dof), or equal when either has one seed; and
      always when the runner-up ends lower on the one seed the two share (a best chosen by a
      mean over other seeds than its rival's).
      ``runner_up_margin``: the runner-up minus the best on the seeds they share
      (``shared_seeds`` of them; a ladder's neighbours often share seed 0 alone, and a small
      margin there is a choice resting on one seed).
    - An lr at which any seed diverged is not chosen while another lr had none diverge
      (``diverged`` counts the chosen lr's diverged seeds; then the flag says so).
    ``flag`` summarises them in words ("" when the choice is clean)."""
    runs = prepare_runs(runs_of(results))
    runs = runs.filter(pl.col("status").is_in(FINISHED))
    ladders = runs.group_by("tuning_id").agg(lrs=pl.col("lr").unique().sort())
    div = runs.group_by("config_id").agg(diverged=(pl.col("status") == "diverged").sum().cast(pl.Int64))
    done = runs.filter(pl.col("status") == "done")
    keys, carry = group_keys(done, None)
    table = summarise(done, keys, column, confidence=confidence, carry=carry)
    table = table.join(div, on="config_id", how="left").with_columns(pl.col("diverged").fill_null(0))
    table = table.collect()
    ladders = ladders.collect()
    if table.height == 0:
        return table.with_columns(
            lrs=pl.lit(None, pl.List(pl.Float64)), n_lrs=pl.lit(None, pl.Int64),
            edge=pl.lit(None, pl.String), untuned=pl.lit(None, pl.Boolean),
            tie=pl.lit(None, pl.Boolean), runner_up_lr=pl.lit(None, pl.Float64),
            runner_up_margin=pl.lit(None, pl.Float64), shared_seeds=pl.lit(None, pl.Int64),
            flag=pl.lit(None, pl.String),
        )  # fmt: skip
    clean = pl.col("diverged") == 0
    eligible = table.filter(clean | ~clean.any().over("tuning_id")).sort("tuning_id", "mean", "lr")
    ranked = eligible.with_columns(rank=pl.int_range(pl.len()).over("tuning_id"))
    best = ranked.filter(pl.col("rank") == 0).drop("rank")
    second = ranked.filter(pl.col("rank") == 1).select(
        "tuning_id", runner_up_lr="lr", _m2="mean", _s2="sem", _n2="n", _c2="config_id"
    )
    best = best.join(ladders, on="tuning_id", how="left").join(second, on="tuning_id", how="left")
    by_seed = done.select("config_id", "seed", column).collect()
    rows = []
    for r in best.iter_rows(named=True):
        ladder = sorted(r["lrs"] or [r["lr"]])
        untuned = len(ladder) == 1
        edge = None if untuned else "low" if r["lr"] == ladder[0] else "high" if r["lr"] == ladder[-1] else None
        tie, margin, shared = False, None, 0
        if r["runner_up_lr"] is not None:
            pairs = _paired(by_seed, r["config_id"], r["_c2"], column)
            shared = len(pairs)
            margin = sum(pairs) / shared if shared else None
            diff = r["_m2"] - r["mean"]
            s1, s2 = r["sem"], r["_s2"]
            if shared >= 2:
                sd = (sum((d - margin) ** 2 for d in pairs) / (shared - 1)) ** 0.5
                tie = margin <= t_critical(float(shared - 1), confidence) * sd / shared**0.5
            elif shared and margin < 0:  # lower mean, but worse on the one seed both have
                tie = True
            elif s1 is None or s2 is None or not (s1 == s1 and s2 == s2):
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
        rows.append({"tuning_id": r["tuning_id"], "n_lrs": len(ladder), "edge": edge, "untuned": untuned,
                     "tie": tie, "runner_up_margin": margin, "shared_seeds": shared, "flag": "; ".join(words)})  # fmt: skip
    flags = pl.DataFrame(rows, schema={"tuning_id": pl.String, "n_lrs": pl.Int64, "edge": pl.String,
                                       "untuned": pl.Boolean, "tie": pl.Boolean, "runner_up_margin": pl.Float64,
                                       "shared_seeds": pl.Int64, "flag": pl.String})  # fmt: skip
    out = best.drop("_m2", "_s2", "_n2", "_c2").join(flags, on="tuning_id", how="left")
    order = [c for c in SORT if c in out.columns]
    return out.sort([*order, "tuning_id"], nulls_last=True)


def _paired(by_seed: pl.DataFrame, best: str, runner_up: str, column: str) -> list[float]:
    """The runner-up config's ``column`` minus the best config's, seed by seed, on their shared seeds."""
    a = by_seed.filter(pl.col("config_id") == best).select("seed", _b=column)
    b = by_seed.filter(pl.col("config_id") == runner_up).select("seed", _r=column)
    joined = a.join(b, on="seed").sort("seed")
    return (joined.get_column("_r") - joined.get_column("_b")).to_list()


def best_lr_results(results: Results, best: pl.DataFrame | None = None) -> Results:
    """``results`` whose runs hold only the best-lr configs (``best_lr``), every status:
    every query over it then shows the best-lr points. Tables are filtered lazily by join."""
    import dataclasses

    best = best_lr(results) if best is None else best
    ids = best.select("config_id").lazy()
    runs = prepare_runs(results.runs).join(ids, on="config_id", how="semi")
    if best.height and {"edge", "untuned", "d_model"} <= set(best.columns):
        runs = runs.join(untuned_choices(best).lazy(), on="config_id", how="left")
    return dataclasses.replace(results, runs=runs)


def untuned_choices(best: pl.DataFrame) -> pl.DataFrame:
    """``config_id`` and ``lr_choice`` for each best-lr choice that is not an optimum inside its
    ladder: at the ladder's edge (a bound), or a single lr in a store where other configs have
    ladders (a store with no ladder at all is untuned throughout, and says so once). Line labels
    (``line_labels``) name them, so a fit "lr tuned per size" shows the sizes where it is not."""
    laddered = int(best.get_column("n_lrs").max() or 0) > 1
    words = (
        pl.when(pl.col("edge") == "low").then(pl.lit("best at the smallest lr tried"))
        .when(pl.col("edge") == "high").then(pl.lit("best at the largest lr tried"))
        .when(pl.col("untuned") & laddered).then(pl.lit("one lr"))
    )  # fmt: skip
    choice = pl.format("d_model {}: {}", pl.col("d_model"), words)
    return best.select("config_id", lr_choice=choice).filter(pl.col("lr_choice").is_not_null())


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
    order = [c for c in SORT if c in out.collect_schema().names()]
    return out.sort([*order, "config_id"], nulls_last=True)


def quant_penalty(
    results: Source,
    basis: str = Basis.W8A8,
    *,
    metric: str = Metric.KURTOSIS,
    site: str = Site.RESID,
    metric_basis: str = Basis.STORED,
    layer_agg: LayerAgg = "mean",
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """The quantisation penalty (metric ``quant_loss_delta`` at site ``model``, layer -1,
    basis ``basis``: quantised minus float val loss at the final step) against an outlier
    measure (``metric`` at ``site``/``metric_basis``, ``layer_agg`` over blocks), both
    aggregated over seeds per config: ``versus`` columns (x = the outlier measure). ``floor``:
    twice the penalty's standard error over the eval batch's sequences (metric
    ``quant_loss_delta_se``, mean over seeds; null for stores that predate it), below which
    two configs' penalties are not told apart by this eval batch."""
    penalty = scale_table(
        results, Metric.QUANT_LOSS_DELTA, Site.MODEL, basis, layers=[-1], confidence=confidence, runs=runs
    )
    measure = scale_table(
        results, metric, site, metric_basis, layer_agg, confidence=confidence, runs=runs
    )
    se = scale_table(
        results, Metric.QUANT_LOSS_DELTA_SE, Site.MODEL, basis, layers=[-1], confidence=confidence, runs=runs
    ).select("config_id", floor=2 * pl.col("mean"))
    out = versus(measure, penalty).join(se, on="config_id", how="left")
    return out.with_columns(quant=pl.lit(basis))


COMPUTATION_SITES = ((Site.ATTN_IN, Basis.COMPUTATION), (Site.MLP_IN, Basis.COMPUTATION))


def group_size_table(
    results: Source,
    metric: str = Metric.KURTOSIS,
    *,
    sites: tuple[tuple[str, str], ...] = COMPUTATION_SITES,
    over_null: bool = True,
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """The metric at the layer inputs in their computation basis (mean over blocks, over the
    exact null by default) against the number of consecutive blocks that share a basis: one
    row per config and site with the seed summary, ``group_size_x`` (``partial``: its group
    size; ``shared``: n_layers), ``ends`` (``ENDS``: where the embedding's write and the
    unembedding's read compute, from the label: in bases of their own, in the group's basis
    (``-groupends``, and ``shared``, which is k = n_layers with them) or unrotated (``-noemb``))
    and ``site_name``. Rotations without a
    group size (``none``, ``independent``, ``groups``) are left out."""
    out = _by_site(results, metric, sites, over_null=over_null, confidence=confidence, runs=runs)
    label = pl.col("rotation_label").cast(pl.String)
    out = out.filter(pl.col("rotation").is_in(["partial", "shared"])).with_columns(
        group_size_x=pl.when(pl.col("rotation") == "shared").then(pl.col("n_layers")).otherwise(pl.col("group_size")),
        ends=pl.when(label.str.ends_with("-noemb")).then(pl.lit(ENDS[2]))
        .when(label.str.ends_with("-groupends") | (pl.col("rotation") == "shared")).then(pl.lit(ENDS[1]))
        .otherwise(pl.lit(ENDS[0])),
    )
    order = [c for c in SORT if c in out.collect_schema().names()]
    return out.sort([*order, "site", "group_size_x"], nulls_last=True)


def unrotated_table(
    results: Source,
    metric: str = Metric.KURTOSIS,
    *,
    sites: tuple[tuple[str, str], ...] = COMPUTATION_SITES,
    over_null: bool = True,
    confidence: float = 0.95,
    runs: pl.LazyFrame | None = None,
) -> pl.LazyFrame:
    """``group_size_table``'s reference: the same sites and seed summary for the configs
    trained without rotation (``rotation: none``, whose computation basis is the stored one),
    one row per config and site with ``site_name``."""
    out = _by_site(results, metric, sites, over_null=over_null, confidence=confidence, runs=runs)
    order = [c for c in SORT if c in out.collect_schema().names()]
    return out.filter(pl.col("rotation") == "none").sort([*order, "site"], nulls_last=True)


def _by_site(
    results: Source, metric: str, sites: tuple[tuple[str, str], ...], *,
    over_null: bool, confidence: float, runs: pl.LazyFrame | None,
) -> pl.LazyFrame:
    """``scale_table`` at each (site, basis), stacked, with ``site`` and ``site_name``."""
    from analysis.labels import SITE_NAMES

    frames = []
    for site, basis in sites:
        t = scale_table(results, metric, site, basis, confidence=confidence, runs=runs, over_null=over_null)
        frames.append(t.with_columns(site=pl.lit(site), site_name=pl.lit(SITE_NAMES.get((site, basis), site))))
    return pl.concat(frames, how="diagonal_relaxed")


def onset(
    results: Source,
    metric: str = Metric.KURTOSIS,
    threshold: float = 3.5,
    site: str = Site.RESID,
    basis: str = Basis.STORED,
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
    metrics, runs = inputs(results, "metrics", runs)
    m = pick_metric(metrics, metric, site, basis, layers)
    agg = getattr(pl.col("value"), layer_agg)()
    per = m.group_by("trial_id", "step").agg(value=agg, tokens=pl.col("tokens").first())
    first = per.group_by("trial_id").agg(
        crossed=(pl.col("value") > threshold).any(),
        onset_step=pl.col("step").filter(pl.col("value") > threshold).min(),
        tokens=pl.col("tokens").sort_by("step").filter(pl.col("value").sort_by("step") > threshold).first(),
    )
    first = join_runs(first, runs).with_columns(tokens=pl.col("tokens").cast(pl.Float64))
    keys, carry = group_keys(first, None)
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
    return out.sort([*[c for c in SORT if c in carry], *keys], nulls_last=True)


_LINE_LABELS = ("optimizer", "optimizer_family", "norm", "rotation_label")
_LINE_PARTS = ("optimizer", "norm", "rotation_label")  # every line label starts with these


def _line_hyper() -> tuple[str, ...]:
    """What a line label names when it differs between lines of one optimiser: every
    hyper-parameter but lr (named on its own) and every other axis (attention), from the schema's
    roles."""
    return (*(h for h in runs_columns(Role.HYPER) if h != "lr"),
            *(a for a in runs_columns(Role.AXIS) if a not in _LINE_PARTS))


def line_labels(frame: pl.DataFrame | pl.LazyFrame, key: str = "tuned_line_id") -> pl.DataFrame:
    """A readable ``config`` label per ``key`` (a line across sizes): ``optimizer · norm ·
    rotation``, then every other hyper-parameter that differs between lines of one optimiser
    (``momentum=0.5``), then the lr (``lr=0.003``, or ``lr tuned per size`` when the best lr
    differs between sizes, with the sizes where the best lr is not an optimum inside its ladder when
    ``frame`` carries ``lr_choice``: ``untuned_choices``); also the optimizer, family, norm and
    rotation_label columns."""
    df = frame.lazy().collect() if isinstance(frame, pl.LazyFrame) else frame
    present = [c for c in label_columns() if c in df.columns and c != "lr"]
    lines = df.group_by(key).agg(
        *[pl.col(c).first() for c in present],
        lrs=pl.col("lr").unique().sort() if "lr" in df.columns else pl.lit([]),
        untuned=pl.col("lr_choice").drop_nulls().unique().sort() if "lr_choice" in df.columns else pl.lit([]),
    )
    varying = [
        c for c in _line_hyper()
        if c in lines.columns and "optimizer" in lines.columns
        and int(lines.group_by("optimizer").agg(pl.col(c).n_unique()).get_column(c).max() or 0) > 1
    ]  # fmt: skip
    out = []
    for r in lines.iter_rows(named=True):
        parts = [str(r.get(c)) for c in _LINE_PARTS if r.get(c) is not None]
        parts += [f"{c}={r[c]:g}" if isinstance(r[c], float) else f"{c}={r[c]}" for c in varying if r[c] is not None]
        lrs = r.get("lrs") or []
        if len(lrs) == 1:
            parts.append(f"lr={lrs[0]:g}")
        elif lrs:
            parts.append("lr tuned per size")
        if r.get("untuned"):
            parts[-1] += f" (not tuned at {'; '.join(r['untuned'])})"
        out.append({key: r[key], "config": " · ".join(parts),
                    **{c: r.get(c) for c in _LINE_LABELS if c in present}})  # fmt: skip
    schema = {key: pl.String, "config": pl.String, **{c: df.schema[c] for c in _LINE_LABELS if c in present}}
    return pl.DataFrame(out, schema=schema)
