"""The trend across widths of the levels read at each ladder's fitted lr* (``analysis.optimum``
reads one ladder): the report's two tables, the primary contrast's trend and the difference of two
arms' contrasts.

- per line (``tuned_line_id``: one optimiser config across widths), the slope of the level (log
  measure at lr*) against log N by least squares over the widths with an optimum, its percentile
  interval from the same replicates (those with an optimum at every such width), and its verdict
  (``decide``);
- the primary contrast's slope (each optimiser minus its rotated twin, ``twin_slopes``) is paired
  by seed: at each width one draw of seeds resamples both twins' ladders at once, so a seed's
  init and data order, which the twins share, cancel in the difference; ``arm_difference`` reads
  two stores' contrasts against each other the same way, one draw resampling all four ladders;
- beside each top-1 share / null slope, its width-free reading (``RAW_SHARE``): the top-1 share's
  null falls with width (0.108 at d 64, 0.0636 at d 128), so a coordinate holding a fixed share f
  of every token, which reads f at every width, has a rising log(share / null). The slope of
  log(raw share) is that slope plus the null's own (``null_slope``: the null has no seed noise, so
  the interval shifts with it), and a fixed share reads 0. For a twin contrast it is the
  optimiser's raw-share slope less its twin's slope over the null (the twin's drift from it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl
from resultstore.vocabulary import Basis, Metric, Site

from analysis.optimum import MEASURES, Ladder, Optimum, fit_ladder, fit_slope, ladders_from, paired_replicates, seed_replicates

__all__ = ["LINE_AXES", "ONE_SEED", "RAW_SHARE", "WORDS", "arm_difference", "decide", "null_slope", "optimum_tables",
           "trials_from", "twin_slopes"]  # fmt: skip


_KEEP = ("optimizer", "optimizer_family", "norm", "rotation_label", "attention", "parametrization", "d_model")
LINE_AXES = ("norm", "rotation_label", "attention", "parametrization")
"""Axes besides the optimiser and the width that tell lines apart (sp and mup are two lines)."""
WORDS = {Metric.KURTOSIS: "kurtosis / null", Metric.TOP1_SHARE: "top-1 share / null"}
RAW_SHARE = "top-1 share (raw)"
"""The measure of the width-free rows of the slopes table: the slope of log(raw top-1 share)."""


def null_slope(log_n: np.ndarray, d_model: np.ndarray) -> float:
    """The least-squares slope of log ``top_share_null(d)`` against log N over the given widths:
    minus what a coordinate holding a fixed share reads in log(share / null) (-0.381 from d 64 to
    d 128 at N = 48 d²). NaN with fewer than two distinct N."""
    from analysis.null import top_share_null

    u = np.asarray(log_n, dtype=float)
    if np.unique(u).size < 2:
        return math.nan
    uc = u - u.mean()
    return float(uc @ np.log(top_share_null(np.asarray(d_model, dtype=int))) / (uc**2).sum())


def _raw_share_row(row: dict, log_n: np.ndarray, d_model: np.ndarray) -> dict:
    """The width-free twin of a top-1 share / null slope row (``RAW_SHARE``): its slope and interval
    plus ``null_slope`` over the widths the slope used, decided by the same rule."""
    ns = null_slope(log_n, d_model)
    lo, hi = row["slope_low"] + ns, row["slope_high"] + ns
    return {**row, "measure": RAW_SHARE, "slope": row["slope"] + ns, "slope_low": lo, "slope_high": hi,
            "decision": decide(lo, hi, one_seed=row["decision"] == ONE_SEED), "null_slope": ns}


ONE_SEED = "undecided (one seed: no interval)"


def decide(lo: float, hi: float, margin: float = 0.1, one_seed: bool = False) -> str:
    """A slope's verdict from its interval: ``grows`` (``falls``) where it excludes 0 above
    (below), ``no growth`` where it lies inside ±``margin`` across 0, else ``undecided``. An
    interval that excludes 0 but lies inside ±``margin`` says both: ``grows, by < 0.1``.
    ``one_seed``: a ladder behind the slope ran one seed at every lr (``ONE_SEED``)."""
    if one_seed:
        return ONE_SEED
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undecided"
    small = -margin < lo and hi < margin
    if lo > 0 or hi < 0:
        return ("grows" if lo > 0 else "falls") + (f", by < {margin:g}" if small else "")
    return "no growth" if small else "undecided"


def optimum_tables(
    trials: pl.DataFrame, x: str = "params_non_embedding", *, n_boot: int = 1000, seed: int = 0,
    confidence: float = 0.95, reading: str = "line",
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(levels, slopes). ``trials``: one row per done trial with ``tuning_id``, ``tuned_line_id``,
    ``lr``, ``seed``, ``final_val_loss``, ``log_kurtosis`` (and ``log_top1_share``), ``x``,
    ``tokens``, ``params`` and the label columns. levels: one row per ladder (``Optimum``; each
    measure as its ratio to the null, exp(level), with its interval; ``tokens_per_param`` =
    tokens / ``x``, the parameter count the slope is against; the raw top-1 share ``top1_share_raw``,
    its null times its ratio); slopes: one row per line and measure (``WidthSlope`` of the log ratio
    against log ``x``, its ``decision`` (``decide``), and the tokens per parameter each width saw),
    each top-1 share row followed by its width-free reading (``RAW_SHARE``, ``null_slope``).
    ``reading``: how each level is read at lr* (``READINGS``); the reading draws no random numbers,
    so two calls that differ only in it resample the same seeds."""
    from analysis.null import top_share_null

    rng = np.random.default_rng(seed)
    ladders = ladders_from(trials)
    info = trials.group_by("tuning_id").agg(
        *[pl.col(c).first() for c in (*_KEEP, "tuned_line_id", x) if c in trials.columns],
        tokens_per_param=(pl.col("tokens") / pl.col(x)).first(),
    )
    rows, fitted = [], {}
    for r in info.sort([c for c in ("optimizer", "tuned_line_id", x) if c in info.columns]).iter_rows(named=True):
        o = fitted[r["tuning_id"]] = fit_ladder(ladders[r["tuning_id"]], n_boot, rng, confidence, reading)
        row = {**r, "best_lr": o.best_lr, "n_seeds_best": o.n_seeds_best, "lr_star": o.lr_star,
               "lr_star_low": o.lr_star_ci[0], "lr_star_high": o.lr_star_ci[1], "flag": o.flag,
               "boot_inside": o.boot_inside}  # fmt: skip
        for m, (v, lo, hi) in o.levels.items():
            row |= {f"{m}_over_null": math.exp(v), f"{m}_over_null_low": math.exp(lo),
                    f"{m}_over_null_high": math.exp(hi), f"log_{m}_over_null": v}  # fmt: skip
            if m == Metric.TOP1_SHARE:
                null = top_share_null(int(r["d_model"]))
                row |= {f"{m}_raw": null * math.exp(v), f"{m}_raw_low": null * math.exp(lo),
                        f"{m}_raw_high": null * math.exp(hi)}  # fmt: skip
        rows.append(row)
    levels = pl.from_dicts(rows, infer_schema_length=None) if rows else pl.DataFrame()
    slopes = []
    for (line,), g in (levels.partition_by("tuned_line_id", as_dict=True, maintain_order=True).items()
                       if levels.height else []):  # fmt: skip
        g = g.sort(x)
        for m in MEASURES:
            if f"log_{m}_over_null" not in g.columns:
                continue
            log_n = np.log(g.get_column(x).cast(pl.Float64).to_numpy())
            level = g.get_column(f"log_{m}_over_null").fill_null(math.nan).to_numpy()
            s = fit_slope(log_n, level, [fitted[t].boot[m] for t in g.get_column("tuning_id")], confidence)
            first = g.row(0, named=True)
            gone = g.filter(pl.col("flag") != "")
            slopes.append({
                **{c: first[c] for c in _KEEP if c in g.columns and c != "d_model"}, "measure": WORDS[m],
                "slope": s.slope, "slope_low": s.ci[0], "slope_high": s.ci[1],
                "decision": decide(*s.ci, one_seed=_one_seed(fitted, g.get_column("tuning_id"))),
                "n_widths": s.n_widths, "boot_kept": s.boot_kept,
                "tokens_per_param": "; ".join(f"d {r['d_model']}: {r['tokens_per_param']:.1f}" for r in g.iter_rows(named=True)),
                "widths_left_out": "; ".join(f"d {r['d_model']} ({r['flag']})" for r in gone.iter_rows(named=True)),
                "tuned_line_id": line,
            })  # fmt: skip
            if m == Metric.TOP1_SHARE:
                ok = np.isfinite(level)
                slopes.append(_raw_share_row(slopes[-1], log_n[ok], g.get_column("d_model").to_numpy()[ok]))
    slopes += twin_slopes(levels, fitted, ladders, x, confidence, n_boot, rng, reading)
    return levels, pl.from_dicts(slopes, infer_schema_length=None) if slopes else pl.DataFrame()


def _one_seed(fitted: dict[Any, Optimum], tuning_ids: Any) -> bool:
    """Whether a ladder among ``tuning_ids`` with an optimum ran one seed at every lr."""
    return any(not fitted[t].replicable for t in tuning_ids if not fitted[t].flag)


def twin_slopes(levels: pl.DataFrame, fitted: dict[Any, Optimum], ladders: dict[Any, Ladder], x: str,
                confidence: float = 0.95, n_boot: int = 1000, rng: np.random.Generator | None = None,
                reading: str = "line") -> list[dict]:
    """The primary contrast's trend: for each optimiser ``o`` whose twin ``rotated_<o>`` has a line
    with the same other axes, the slope against log ``x`` of level(o) - level(twin), each read at
    its own fitted lr*, over the widths where both have an optimum. Its interval is paired by seed,
    as the estimand is: at each width one seed draw per replicate resamples both ladders
    (``paired_replicates``: the twins share each seed's init and data order), each refits its own
    lr* and level, and the replicate's contrast is their difference. One row per measure (the
    top-1 share's followed by its ``RAW_SHARE`` row), ``optimizer`` = "o − rotated_o",
    ``optimizer_family`` = "twin contrast"."""
    rng = np.random.default_rng(0) if rng is None else rng
    if not levels.height:
        return []
    keys = [c for c in LINE_AXES if c in levels.columns]
    names = set(levels.get_column("optimizer").to_list())
    out = []
    for o in sorted(n for n in names if f"rotated_{n}" in names):
        mine = levels.filter(pl.col("optimizer") == o, pl.col("flag") == "")
        for key, g in (mine.partition_by(keys, as_dict=True, maintain_order=True).items() if keys else [((), mine)]):
            tw = levels.filter(pl.col("optimizer") == f"rotated_{o}", pl.col("flag") == "",
                               *[pl.col(c) == v for c, v in zip(keys, key, strict=True)])
            both = g.join(tw.select("d_model", twin_id="tuning_id", **{f"twin_{m}": f"log_{m}_over_null" for m in MEASURES
                                                                        if f"log_{m}_over_null" in tw.columns}),
                          on="d_model").sort(x)  # fmt: skip
            if both.height < 2:
                continue
            paired = [paired_replicates(ladders[a], ladders[b], n_boot, rng, reading)
                      for a, b in both.select("tuning_id", "twin_id").iter_rows()]
            for m in MEASURES:
                if f"twin_{m}" not in both.columns:
                    continue
                diff = (both.get_column(f"log_{m}_over_null") - both.get_column(f"twin_{m}")).fill_null(math.nan).to_numpy()
                boots = [ba[m] - bb[m] for ba, bb in paired]
                log_n = np.log(both.get_column(x).cast(pl.Float64).to_numpy())
                s = fit_slope(log_n, diff, boots, confidence)
                out.append({
                    **dict(zip(keys, key, strict=True)), "optimizer": f"{o} − rotated_{o}",
                    "optimizer_family": "twin contrast", "measure": WORDS[m], "slope": s.slope, "slope_low": s.ci[0],
                    "slope_high": s.ci[1],
                    "decision": decide(*s.ci, one_seed=_one_seed(fitted, [*both["tuning_id"], *both["twin_id"]])),
                    "n_widths": s.n_widths, "boot_kept": s.boot_kept,
                    "tokens_per_param": "; ".join(f"d {r['d_model']}: {r['tokens_per_param']:.1f}"
                                                  for r in both.iter_rows(named=True)),
                    "widths_left_out": "", "tuned_line_id": None,
                })  # fmt: skip
                if m == Metric.TOP1_SHARE:
                    ok = np.isfinite(diff)
                    out.append(_raw_share_row(out[-1], log_n[ok], both.get_column("d_model").to_numpy()[ok]))
    return out


def trials_from(results: Any) -> pl.DataFrame:
    """The trials frame of ``optimum_tables`` from a ``Results`` (every done trial, every lr):
    the report's per-trial measures at the final step (``queries.per_trial``: residual stream,
    stored basis, mean over blocks), ``log_kurtosis`` = log(kurtosis / 3(d-1)/(d+1)) and
    ``log_top1_share`` = log(top1_share / ``null.top_share_null(d)``) (null where the store
    predates the metric)."""
    from analysis import queries
    from analysis.null import top_share_null_expr

    kurt = queries.per_trial(results, Metric.KURTOSIS, Site.RESID, Basis.STORED, over_null=True).collect()
    kurt = kurt.filter(pl.col("value") > 0).with_columns(log_kurtosis=pl.col("value").log()).drop("value")
    top = queries.per_trial(results, Metric.TOP1_SHARE, Site.RESID, Basis.STORED).select("trial_id", "value", "d_model").collect()
    top = top.filter(pl.col("value") > 0).select(
        "trial_id", log_top1_share=(pl.col("value") / top_share_null_expr("d_model")).log())
    out = kurt.join(top, on="trial_id", how="left")
    return out.filter(pl.col("final_val_loss").is_not_null() & pl.col("final_val_loss").is_finite())


def arm_difference(a: pl.DataFrame, b: pl.DataFrame, x: str = "params_non_embedding", *, n_boot: int = 1000,
                   seed: int = 0, confidence: float = 0.95, reading: str = "line") -> pl.DataFrame:
    """Whether a training choice moves the primary contrast's trend: two arms (``trials_from`` of two
    stores of one design that differ in one choice, e.g. the batch at fixed steps), and per optimiser
    ``o`` with a twin ``rotated_o`` in both, per line and measure, the slope against log ``x`` of
    [level_a(o) − level_a(twin)] − [level_b(o) − level_b(twin)], each level read at its own
    ladder's fitted lr*, over the widths where all four ladders have an optimum. Its interval: per
    width one seed draw per replicate resamples all four ladders (``seed_replicates``; a seed is
    the same init in both arms, so what it adds cancels as it does between twins). Columns:
    ``slope_a`` and ``slope_b`` (each arm's twin contrast, from the same replicates, with
    intervals), ``difference`` (their difference) with ``difference_low`` / ``_high`` and
    ``decision``: "larger in a" / "larger in b" where the interval excludes 0, "alike (within
    ±0.1)" where it lies inside ±0.1, else "undecided"."""
    rng = np.random.default_rng(seed)
    keys = [c for c in LINE_AXES if c in a.columns and c in b.columns]
    arms = []
    for trials in (a, b):
        ladders = ladders_from(trials)
        ids = trials.group_by("tuning_id").agg(pl.col("optimizer", "d_model", x, *keys).first())
        arms.append({tuple(r[c] for c in ("optimizer", *keys, "d_model")): (ladders[r["tuning_id"]], r[x])
                     for r in ids.iter_rows(named=True)})  # fmt: skip
    words = {"grows": "larger in a", "falls": "larger in b", "no growth": "alike (within ±0.1)"}
    rows = []
    for key in sorted({k[:-1] for k in arms[0]} & {k[:-1] for k in arms[1]}):
        o, line = key[0], key[1:]
        if o.startswith("rotated_"):
            continue
        widths = sorted(k[-1] for k in arms[0] if k[:-1] == key)
        quads, log_n = [], []
        for d in widths:
            cells = [arm.get((name, *line, d)) for arm in arms for name in (o, f"rotated_{o}")]
            if any(c is None for c in cells):
                continue
            fits = [fit_ladder(c[0], 0, reading=reading) for c in cells]
            if any(f.flag for f in fits):
                continue
            quads.append((fits, seed_replicates([c[0] for c in cells], n_boot, rng, reading)))
            log_n.append(math.log(cells[0][1]))
        if len(quads) < 2:
            continue
        u = np.array(log_n)
        for m in MEASURES:
            if m not in quads[0][0][0].levels:
                continue
            # per width the four levels (a: o, twin; b: o, twin), at the point and per replicate
            point = np.array([[f.levels[m][0] for f in fits] for fits, _ in quads])
            reps = [np.stack([r[m] for r in boots], axis=1) for _, boots in quads]
            ca, cb = point[:, 0] - point[:, 1], point[:, 2] - point[:, 3]
            sa = fit_slope(u, ca, [r[:, 0] - r[:, 1] for r in reps], confidence)
            sb = fit_slope(u, cb, [r[:, 2] - r[:, 3] for r in reps], confidence)
            diff = fit_slope(u, ca - cb, [r[:, 0] - r[:, 1] - r[:, 2] + r[:, 3] for r in reps], confidence)
            verdict = decide(*diff.ci)
            word = words.get(verdict.split(",")[0], verdict) + (", by < 0.1" if ", by" in verdict else "")
            rows.append({"optimizer": f"{o} − rotated_{o}", **dict(zip(keys, line, strict=True)), "measure": WORDS[m],
                         "reading": reading, "slope_a": sa.slope, "slope_a_low": sa.ci[0], "slope_a_high": sa.ci[1],
                         "slope_b": sb.slope, "slope_b_low": sb.ci[0], "slope_b_high": sb.ci[1],
                         "difference": diff.slope, "difference_low": diff.ci[0], "difference_high": diff.ci[1],
                         "decision": word, "n_widths": diff.n_widths, "boot_kept": diff.boot_kept})  # fmt: skip
    return pl.from_dicts(rows, infer_schema_length=None) if rows else pl.DataFrame()
