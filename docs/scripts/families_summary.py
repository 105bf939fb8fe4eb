"""Summary of a families sweep (issue 17, the headline with intervals): each optimiser at its best
lr per width (``analysis.selection.best_lr``: the sgd ladder's pick), the final-step kurtosis of
the residual stream (stored basis) and of the MLP input (computation basis), mean over blocks,
over the exact null 3(d-1)/(d+1); the slope of log(kurtosis / null) against log(non-embedding
params) per optimiser; and the differences between optimiser families.

Slopes: one least-squares slope per seed over the widths that seed has; the interval is a 95%
t-interval over seeds (with one seed: the fit's own t-interval over the widths, marked).
Family differences (of slopes, and of kurtosis / null at each width): the optimiser is the unit.
Each optimiser's value is its seed mean after removing seed effects (seeds are shared across
optimisers, so they pair), a family's value the mean of its optimisers' (the family as exactly
these optimisers), and the difference between two families gets a Welch-Satterthwaite t-interval
from the families' between-optimiser variances; a one-optimiser family gets no interval
(``analysis.families.compare_family_values``, what ``sweep report`` uses). Usage: python docs/scripts/families_summary.py RESULTS/SWEEP"""
import sys

import numpy as np
import polars as pl
from scipy import stats

from analysis.families import compare_family_values
from analysis.selection import best_lr
from resultstore.reader import load

SITES = {("resid", "stored"): "residual", ("mlp_in", "computation"): "MLP input"}
ORDER = ["adam", "adafactor", "lion", "rotated_adam", "soap", "sgd", "muon"]

results = load(sys.argv[1])
chosen = best_lr(results).select("config_id")
runs = (results.runs.collect().filter(pl.col("status") == "done").join(chosen, on="config_id", how="semi")
        .select("trial_id", "optimizer", "optimizer_family", "lr", "d_model", "params_non_embedding",
                "seed", "steps", "final_val_loss"))
m = results.metrics.collect().join(runs, on="trial_id")
fin = m.filter(pl.col("step") == pl.col("steps"), pl.col("metric") == "kurtosis", pl.col("layer") > 0,
               pl.struct("site", "basis").is_in([{"site": s, "basis": b} for s, b in SITES]))
per_trial = fin.group_by("trial_id", "site", "basis").agg(pl.col("value").mean()).join(runs, on="trial_id").with_columns(
    over_null=pl.col("value") / (3 * (pl.col("d_model") - 1) / (pl.col("d_model") + 1)))


def interval(x: np.ndarray, digits: int = 2) -> str:
    if len(x) < 2:
        return f"{x.mean():.{digits}f} (one seed)"
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return f"{x.mean():.{digits}f} ± {half:.{digits}f}"


def rank(o: str) -> int:
    return ORDER.index(o) if o in ORDER else len(ORDER)


optimisers = sorted(runs["optimizer"].unique().to_list(), key=rank)
widths = sorted(runs["d_model"].unique().to_list())
print(f"{runs.height} done trials at their best lr; final step; mean ± 95% t half-width over seeds")
for (site, basis), name in SITES.items():
    rows = []
    for o in optimisers:
        row = {"optimizer": o}
        for d in widths:
            cell = per_trial.filter(pl.col("optimizer") == o, pl.col("d_model") == d, pl.col("site") == site)
            row[f"d={d}"] = interval(cell["over_null"].to_numpy()) if cell.height else "-"
        rows.append(row)
    print(f"\nkurtosis / null, {name} ({basis} basis), mean over blocks")
    with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200, fmt_str_lengths=30):
        print(pl.DataFrame(rows))
loss_rows = []
for o in optimisers:
    row = {"optimizer": o}
    for d in widths:
        cell = runs.filter(pl.col("optimizer") == o, pl.col("d_model") == d)
        row[f"d={d}"] = (interval(cell["final_val_loss"].to_numpy(), 3) + f" @ lr {cell['lr'][0]:g}") if cell.height else "-"
    loss_rows.append(row)
print("\nfinal val loss (lr = the best lr at that width)")
with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200, fmt_str_lengths=40):
    print(pl.DataFrame(loss_rows))


def seed_slopes(frame: pl.DataFrame) -> list[tuple[int, float, float, int]]:
    """(seed, slope, its standard error, n widths) per seed with 2+ widths."""
    out = []
    for (seed,), g in frame.group_by("seed"):
        if g.height < 2:
            continue
        fit = stats.linregress(np.log(g["params_non_embedding"].to_numpy()), np.log(g["over_null"].to_numpy()))
        out.append((seed, fit.slope, fit.stderr if g.height > 2 else float("nan"), g.height))
    return sorted(out)


def family_contrasts(values: dict[str, dict[int, float]], family: dict[str, str]) -> None:
    """Every pair of families, a - b, then per_coordinate minus every other family pooled (the
    report's default primary contrast); ``compare_family_values`` gives its second family minus
    its first, the optimisers as the units, seeds paired."""
    fams = sorted({family[o] for o in values}, key=lambda f: min(rank(o) for o in values if family[o] == f))
    members = {f: [o for o in values if family[o] == f] for f in fams}
    contrasts = [(a, [b]) for i, a in enumerate(fams) for b in fams[i + 1:]]
    if "per_coordinate" in fams and len(fams) > 2:
        contrasts.append(("per_coordinate", [f for f in fams if f != "per_coordinate"]))
    for a, bs in contrasts:
        b_opts = [o for f in bs for o in members[f]]
        c = compare_family_values([values[o] for o in b_opts], [values[o] for o in members[a]],
                                  labels=(" + ".join(bs), a))
        ci = f"({c.method})" if np.isnan(c.p_value) else \
            f"[{c.difference_ci[0]:+.3f}, {c.difference_ci[1]:+.3f}]  p = {c.p_value:.2g} (df {c.df:.1f})"
        print(f"    {a} - {' + '.join(bs)}: {c.difference:+.3f} {ci}  ({'+'.join(members[a])} vs {'+'.join(b_opts)})")


for (site, basis), name in SITES.items():
    sub = per_trial.filter(pl.col("site") == site)
    print(f"\nslope of log(kurtosis / null) against log(non-embedding params), {name}")
    slopes: dict[str, dict[int, float]] = {}
    family: dict[str, str] = {}
    for o in optimisers:
        cell = sub.filter(pl.col("optimizer") == o)
        family[o] = cell["optimizer_family"][0]
        fits = seed_slopes(cell)
        if not fits:
            continue
        slopes[o] = {seed: s for seed, s, _, _ in fits}
        if len(fits) == 1:
            _, s, se, n = fits[0]
            if n > 2:
                half = stats.t.ppf(0.975, n - 2) * se
                print(f"  {o:<13} {family[o]:<22} {s:+.3f} ± {half:.3f}   (one seed: the fit's t-interval over {n} widths)")
            else:
                print(f"  {o:<13} {family[o]:<22} {s:+.3f}   (one seed, 2 widths: no interval)")
        else:
            x = np.asarray(list(slopes[o].values()))
            half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
            p = stats.ttest_1samp(x, 0).pvalue
            print(f"  {o:<13} {family[o]:<22} {x.mean():+.3f} ± {half:.3f}   ({len(x)} seeds; p(slope = 0) = {p:.2g})")
    print("  family differences (optimisers as the unit, seeds paired; Welch-Satterthwaite 95%):")
    family_contrasts(slopes, family)
    print(f"\nfamily differences in kurtosis / null at each width, {name} (the same contrast on the seed values):")
    for d in widths:
        at = sub.filter(pl.col("d_model") == d)
        values = {o: dict(at.filter(pl.col("optimizer") == o).select("seed", "over_null").iter_rows()) for o in optimisers}
        print(f"  d={d}")
        family_contrasts({o: v for o, v in values.items() if v}, family)
