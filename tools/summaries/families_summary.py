"""Summary of a families sweep (issue 17, the headline with intervals; issue 33, both measures):
each optimiser at its best lr per width (``analysis.selection.best_lr``; a best at the edge of its
ladder is marked "edge", a bound; an lr with no ladder around it "one lr"), at the final step, of the residual stream (stored basis) and
of the MLP input (computation basis), mean over blocks, in two measures side by side:
- kurtosis over the exact null 3(d-1)/(d+1): it grows with width when one coordinate holds a
  fixed share f of each token's energy (about d f^2), so a rise across widths is not by itself
  growth of the effect;
- the top-1 share of each token's centred energy (``top1_share``, the width-honest measure): a
  fixed share reads the same at every width; its null (Gaussian tokens) falls with d and is
  printed beside it (stores written before the metric existed skip it);
the slope of log(measure) against log(non-embedding params) per optimiser; and the differences
between optimiser families.

Slopes: one least-squares slope per seed over the widths that seed has; the interval is a 95%
t-interval over seeds (with one seed: the fit's own t-interval over the widths, marked).
Family differences (of slopes, and of kurtosis / null at each width): the optimiser is the unit.
Each optimiser's value is its seed mean after removing seed effects (seeds are shared across
optimisers, so they pair), a family's value the mean of its optimisers' (the family as exactly
these optimisers), and the difference between two families gets a Welch-Satterthwaite t-interval
from the families' between-optimiser variances; a one-optimiser family gets no interval
(``analysis.families.compare_family_values``, what ``sweep report`` uses). Usage: python tools/summaries/families_summary.py RESULTS/SWEEP"""
import sys

import numpy as np
import polars as pl
from scipy import stats

from analysis.families import compare_family_values
from analysis.null import top_share_null
from analysis.selection import best_lr
from resultstore.reader import load

SITES = {("resid", "stored"): "residual", ("mlp_in", "computation"): "MLP input"}
ORDER = ["adam", "adafactor", "lion", "signsgd", "rotated_adam", "soap", "sgd", "muon"]
MEASURES = {"kurtosis": "kurtosis / null", "top1_share": "top-1 energy share"}

results = load(sys.argv[1])
best = best_lr(results)
edges = set(best.filter(pl.col("edge").is_not_null()).get_column("config_id").to_list())
untuned = set(best.filter(pl.col("untuned")).get_column("config_id").to_list())  # a ladder of one lr
runs = (results.runs.collect().filter(pl.col("status") == "done").join(best.select("config_id"), on="config_id", how="semi")
        .select("trial_id", "config_id", "optimizer", "optimizer_family", "lr", "d_model", "params_non_embedding",
                "seed", "steps", "final_val_loss"))
m = results.metrics.collect().join(runs, on="trial_id")
fin = m.filter(pl.col("step") == pl.col("steps"), pl.col("metric").is_in(list(MEASURES)), pl.col("layer") > 0,
               pl.struct("site", "basis").is_in([{"site": s, "basis": b} for s, b in SITES]))
# "over_null" is the value read: kurtosis over its null; the top-1 share as it is
per_trial = fin.group_by("trial_id", "metric", "site", "basis").agg(pl.col("value").mean()).join(runs, on="trial_id").with_columns(
    over_null=pl.when(pl.col("metric") == "kurtosis").then(pl.col("value") / (3 * (pl.col("d_model") - 1) / (pl.col("d_model") + 1)))
    .otherwise(pl.col("value")))
measures = [k for k in MEASURES if per_trial.filter(pl.col("metric") == k).height]


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
if "top1_share" not in measures:
    print("(no top1_share rows: this store predates the width-honest measure; kurtosis alone)")
for (site, basis), name in SITES.items():
    rows = []
    for o in optimisers:
        row = {"optimizer": o}
        for d in widths:
            for k in measures:
                cell = per_trial.filter(pl.col("optimizer") == o, pl.col("d_model") == d, pl.col("site") == site,
                                        pl.col("metric") == k)
                row[f"d={d} {MEASURES[k]}"] = interval(cell["over_null"].to_numpy(), 3 if k == "top1_share" else 2) \
                    if cell.height else "-"
        rows.append(row)
    nulls = "; ".join(f"d={d}: {float(top_share_null(d)):.3f}" for d in widths) if "top1_share" in measures else ""
    print(f"\n{name} ({basis} basis), mean over blocks" + (f"; top-1 share's null (Gaussian tokens) {nulls}" if nulls else ""))
    with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=250, fmt_str_lengths=30):
        print(pl.DataFrame(rows))
loss_rows = []
for o in optimisers:
    row = {"optimizer": o}
    for d in widths:
        cell = runs.filter(pl.col("optimizer") == o, pl.col("d_model") == d)
        chosen = cell["config_id"][0] if cell.height else None
        edge = " (edge)" if chosen in edges else " (one lr)" if chosen in untuned else ""
        row[f"d={d}"] = (interval(cell["final_val_loss"].to_numpy(), 3) + f" @ lr {cell['lr'][0]:g}{edge}") if cell.height else "-"
    loss_rows.append(row)
print("\nfinal val loss (lr = the best lr at that width; edge: the best is the ladder's smallest or largest lr, a "
      "bound; one lr: no ladder ran there, untuned)")
with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200, fmt_str_lengths=40):
    print(pl.DataFrame(loss_rows))


def seed_slopes(frame: pl.DataFrame) -> list[tuple[int, float, float, int]]:
    """(seed, slope of log(value) on log(params), its standard error, n widths) per seed with 2+ widths."""
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


for k, (site, basis) in ((k, sb) for k in measures for sb in SITES):
    name, measure = SITES[(site, basis)], MEASURES[k]
    sub = per_trial.filter(pl.col("site") == site, pl.col("metric") == k)
    print(f"\nslope of log({measure}) against log(non-embedding params), {name}")
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
    print(f"\nfamily differences in {measure} at each width, {name} (the same contrast on the seed values):")
    for d in widths:
        at = sub.filter(pl.col("d_model") == d)
        values = {o: dict(at.filter(pl.col("optimizer") == o).select("seed", "over_null").iter_rows()) for o in optimisers}
        print(f"  d={d}")
        family_contrasts({o: v for o, v in values.items() if v}, family)
