"""Summary of a sharing sweep (issue 17, the paper's question 5): kurtosis of the normalised block
inputs (attn_in, mlp_in) in each block's computation basis at the final step, by layer and by
rotation plan (none; partial(k): k consecutive blocks share one basis; the embedding's write and
the unembedding's read in bases of their own, in the group's basis (`ends: group`, where k = 6 is
`shared`) or unrotated), as a
mean over seeds with a 95% t-interval, against the exact null 3(d-1)/(d+1). The slope of the
excess against k is fitted per seed, its interval a t over the seeds' slopes, with a lack-of-fit
test of a line in k (``analysis.group_size``): "linear in k" is never read from it.
Usage: python tools/summaries/sharing_summary.py RESULTS/SWEEP   (e.g. results/sharing)"""
import sys

import numpy as np
import polars as pl
from scipy import stats

from analysis.group_size import compare_group_size_slopes, group_size_slope
from resultstore.reader import load

results = load(sys.argv[1])
runs = results.runs.collect().filter(pl.col("status") == "done")
# the arms: ends in bases of their own (k=K), in the group's basis (k=K, ends in group: the control,
# k = 6 is `shared`), left in the residual basis (k=K, ends unrotated)
label = pl.col("rotation_label").fill_null("")
ends = (pl.when(label.str.ends_with("-groupends")).then(pl.lit(", ends in group"))
        .when(~pl.col("rotate_embeddings").fill_null(True)).then(pl.lit(", ends unrotated")).otherwise(pl.lit("")))
runs = runs.select("trial_id", "seed", "steps", "d_model", "final_val_loss",
                   plan=pl.when(pl.col("rotation") == "none").then(pl.lit("none"))
                   .otherwise(pl.format("k={}{}", pl.col("group_size"), ends)))
ARMS = {"ends own basis": "", "ends in group": ", ends in group", "ends unrotated": ", ends unrotated"}
m = results.metrics.collect().join(runs, on="trial_id")
fin = m.filter(pl.col("step") == pl.col("steps"), pl.col("metric") == "kurtosis",
               pl.col("site").is_in(["attn_in", "mlp_in"]), pl.col("basis") == "computation")
d = runs["d_model"][0]
null = 3 * (d - 1) / (d + 1)


def interval(values: list[float]) -> str:
    x = np.asarray(values)
    if len(x) < 2:
        return f"{x.mean():.2f} (one seed)"
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return f"{x.mean():.2f} ± {half:.2f}"


print(f"null 3(d-1)/(d+1) = {null:.3f} (d = {d}); final step; mean ± 95% t half-width over seeds (n per cell)")
plans = sorted(fin["plan"].unique().to_list(), key=lambda p: (p != "none", "unrotated" in p, "group" in p, p))
for site in ("attn_in", "mlp_in"):
    rows = []
    for plan in plans:
        cell = fin.filter(pl.col("plan") == plan, pl.col("site") == site)
        per_layer = {f"L{l}": interval(g.sort("seed")["value"].to_list())
                     for (l,), g in sorted(cell.group_by("layer"), key=lambda kv: kv[0][0])}
        by_seed = cell.group_by("seed").agg(pl.col("value").mean())["value"].to_list()
        rows.append({"plan": plan, "n": cell["seed"].n_unique(), **per_layer, "mean over layers": interval(by_seed)})
    print(f"\n{site}, computation basis")
    with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200, fmt_str_lengths=30):
        print(pl.DataFrame(rows))
loss = runs.group_by("plan").agg(pl.len().alias("n"), pl.col("final_val_loss").mean().round(3).alias("val loss"),
                                 pl.col("final_val_loss").std().round(3).alias("sd"))
print("\nfinal val loss"); print(loss.sort("plan"))

# one number per trial: the excess over the null of the mean over blocks and both layer inputs
per_trial = fin.group_by("trial_id", "plan", "seed").agg((pl.col("value").mean() - null).alias("excess"))
print("\nexcess over the null per trial (mean over blocks, attn_in and mlp_in): mean ± 95% t half-width")
for plan in plans:
    x = per_trial.filter(pl.col("plan") == plan)["excess"].to_numpy()
    if len(x) > 1:
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
        print(f"  {plan:<24} n={len(x)}  {x.mean():+.3f} ± {half:.3f}   p(excess = 0, one-sample t) = "
              f"{stats.ttest_1samp(x, 0).pvalue:.2g}")


def welch(a: str, b: str) -> None:
    x = per_trial.filter(pl.col("plan") == a)["excess"].to_numpy()
    y = per_trial.filter(pl.col("plan") == b)["excess"].to_numpy()
    if len(x) < 2 or len(y) < 2:
        return
    res = stats.ttest_ind(x, y, equal_var=False)
    ci = res.confidence_interval(0.95)
    print(f"  {a} minus {b}: {x.mean() - y.mean():+.3f} [{ci.low:+.3f}, {ci.high:+.3f}]  (Welch p = {res.pvalue:.2g})")


print("\ndifferences (Welch t, 95% interval)")
for a, b in (("none", "k=6, ends in group"), ("none", "k=6"), ("k=6", "k=3"), ("k=3", "k=1"), ("k=6", "k=1"),
             ("k=6, ends in group", "k=1, ends in group")):
    welch(a, b)


def slope_against_k(rows: pl.DataFrame, label: str):
    """Excess against k per seed (``analysis.group_size``): the mean of the seeds' slopes with a
    95% t-interval over seeds, and the lack-of-fit test of a line in k (seed-blocked F)."""
    k = rows["plan"].str.extract(r"k=(\d+)").cast(pl.Int64).to_numpy()
    if len(set(k)) < 2:
        return None
    fit = group_size_slope(k, rows["excess"].to_numpy(), rows["seed"].to_numpy())
    per_seed = ", ".join(f"{v:+.3f}" for v in fit.seed_slopes.values())
    print(f"\nexcess against k ({label}, {fit.n} trials): {fit} (p(slope = 0) = {fit.p_value:.2g}; "
          f"seeds' slopes {per_seed})")
    return fit


shared = per_trial.filter(pl.col("plan").str.starts_with("k="))
suffix = pl.col("plan").str.replace(r"^k=\d+", "")
fits = {arm: slope_against_k(shared.filter(suffix == tag), arm) for arm, tag in ARMS.items()}
for a, b in (("ends in group", "ends own basis"), ("ends own basis", "ends unrotated"), ("ends in group", "ends unrotated")):
    if fits[a] and fits[b]:
        d = compare_group_size_slopes(fits[b], fits[a])
        ci = "" if np.isnan(d.p_value) else f" [{d.difference_ci[0]:+.3f}, {d.difference_ci[1]:+.3f}]  (p = {d.p_value:.2g})"
        print(f"  slope, {a} minus {b}: {d.difference:+.3f}{ci}, {d.method}")
print("\nthe arms against each other at each k (Welch t, 95% interval)")
for k in sorted({int(p.split("=")[1].split(",")[0]) for p in plans if p.startswith("k=")}):
    welch(f"k={k}, ends in group", f"k={k}")
    welch(f"k={k}", f"k={k}, ends unrotated")
