"""Summary of a families sweep (issue 17, the headline with intervals): each optimiser at its best
lr per width (``analysis.selection.best_lr``: the sgd ladder's pick), the final-step kurtosis of
the residual stream (stored basis) and of the MLP input (computation basis), mean over blocks,
over the exact null 3(d-1)/(d+1); the slope of log(kurtosis / null) against log(non-embedding
params) per optimiser; and the differences between optimiser families.

Slopes: one least-squares slope per seed over the widths that seed has; the interval is a 95%
t-interval over seeds (with one seed: the fit's own t-interval over the widths, marked).
Family differences (of slopes, and of kurtosis / null at each width): a family's value is the
mean of its optimisers' seed means (the family as exactly these optimisers); the difference
between two families gets a Welch-Satterthwaite t-interval from the optimisers' seed variances
(``analysis.fits.compare_family_values``, what ``sweep report`` uses). Usage: python docs/scripts/families_summary.py RESULTS/SWEEP"""
import sys

import numpy as np
import polars as pl
from scipy import stats

from analysis.fits import compare_family_values
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


def seed_slopes(frame: pl.DataFrame) -> list[tuple[float, float, int]]:
    """(slope, its standard error, n widths) per seed with 2+ widths."""
    out = []
    for _, g in frame.group_by("seed"):
        if g.height < 2:
            continue
        fit = stats.linregress(np.log(g["params_non_embedding"].to_numpy()), np.log(g["over_null"].to_numpy()))
        out.append((fit.slope, fit.stderr if g.height > 2 else float("nan"), g.height))
    return out


def family_contrasts(values: dict[str, np.ndarray], family: dict[str, str]) -> None:
    """Every pair of families, a - b (``analysis.fits.compare_family_values`` gives its second
    family minus its first; a family is the mean of its optimisers' seed means)."""
    fams = sorted({family[o] for o in values}, key=lambda f: min(rank(o) for o in values if family[o] == f))
    members = {f: [o for o in values if family[o] == f] for f in fams}
    for i, a in enumerate(fams):
        for b in fams[i + 1:]:
            c = compare_family_values([values[o] for o in members[b]], [values[o] for o in members[a]])
            ci = "(no interval: a line has one seed)" if np.isnan(c.p_value) else \
                f"[{c.difference_ci[0]:+.3f}, {c.difference_ci[1]:+.3f}]  p = {c.p_value:.2g}"
            print(f"    {a} - {b}: {c.difference:+.3f} {ci}  ({'+'.join(members[a])} vs {'+'.join(members[b])})")


for (site, basis), name in SITES.items():
    sub = per_trial.filter(pl.col("site") == site)
    print(f"\nslope of log(kurtosis / null) against log(non-embedding params), {name}")
    slopes: dict[str, list[float]] = {}
    family: dict[str, str] = {}
    for o in optimisers:
        cell = sub.filter(pl.col("optimizer") == o)
        family[o] = cell["optimizer_family"][0]
        fits = seed_slopes(cell)
        if not fits:
            continue
        slopes[o] = [s for s, _, _ in fits]
        if len(fits) == 1:
            s, se, n = fits[0]
            if n > 2:
                half = stats.t.ppf(0.975, n - 2) * se
                print(f"  {o:<13} {family[o]:<22} {s:+.3f} ± {half:.3f}   (one seed: the fit's t-interval over {n} widths)")
            else:
                print(f"  {o:<13} {family[o]:<22} {s:+.3f}   (one seed, 2 widths: no interval)")
        else:
            x = np.asarray(slopes[o])
            half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
            p = stats.ttest_1samp(x, 0).pvalue
            print(f"  {o:<13} {family[o]:<22} {x.mean():+.3f} ± {half:.3f}   ({len(x)} seeds; p(slope = 0) = {p:.2g})")
    print("  family differences (each family: the mean of its optimisers' mean slopes; Welch-Satterthwaite 95%):")
    family_contrasts({o: np.asarray(v) for o, v in slopes.items()}, family)
    print(f"\nfamily differences in kurtosis / null at each width, {name} (the same contrast on the seed values):")
    for d in widths:
        at = sub.filter(pl.col("d_model") == d)
        values = {o: at.filter(pl.col("optimizer") == o)["over_null"].to_numpy() for o in optimisers}
        print(f"  d={d}")
        family_contrasts({o: v for o, v in values.items() if v.size}, family)
