"""Summary of the attention study (issue 36: specs/attention/attention.yaml): the optimiser and the attention
set side by side. At the final step, mean over blocks, per optimiser x attention:
- final val loss;
- the residual stream (stored basis) in both measures: kurtosis over its exact null 3(d-1)/(d+1)
  and the top-1 share of each token's centred energy (width-honest; its Gaussian null printed);
- the MLP input in its computation basis, kurtosis / null;
- the per-trial rank test: (trial, block) cells whose stored-basis residual kurtosis beats all 32
  of the probe's random bases (``kurtosis_rank_p`` = 1/33, its floor; the null expects cells / 33);
- the sink measures (study/sinks.py): mass on position 0, on delimiters, on no key (softmax1's
  zero logit, clipped softmax's clipped mass), and the fraction of heads whose top key is a sink,
  with what uniform causal attention reads on the same tokens (the probe's reference rows).
Cells read mean ± 95% t half-width over seeds ("one seed" when there is one).

Adam runs at two lrs (3e-3 and 1e-2: its d128 best moved between machines); each lr is an arm of
its own ("adam lr=0.003"). Then the two causes, as differences of residual kurtosis / null (and top-1 share), paired by seed:
- Adam's excess under each attention: adam - rotated_adam (the same model trained with Adam's
  moments in a fixed random basis: what the per-coordinate normaliser adds);
- what each attention variant does to Adam: adam(variant) - adam(softmax);
and Spearman's rank correlation across trials of the sink masses with residual kurtosis / null
(trials of one config share it: a description, not a test).

    python tools/summaries/attention_summary.py RESULTS/SWEEP      # e.g. docs/stores/attention
"""
import sys

import numpy as np
import polars as pl
from scipy import stats

from analysis import queries
from analysis.load import load
from analysis.null import top_share_null
from analysis.report.privilege import P_PRIVILEGED
from analysis.report.sinks import uniform_level

results = load(sys.argv[1])
ORDER = ["adam", "rotated_adam", "muon"]
ATTENTIONS = ["softmax", "softmax1", "gated", "clipped", "kv_bias"]
KEY = ["optimizer", "lr", "attention", "seed"]


def column(metric: str, site: str, basis: str, name: str, over_null: bool = False) -> pl.DataFrame:
    rows = queries.per_trial(results, metric, site, basis, over_null=over_null).collect()
    return rows.select(*KEY, pl.col("value").alias(name))


runs = results.runs.collect().filter(pl.col("status") == "done").with_columns(pl.col("attention").fill_null("softmax"))
table = runs.select(*KEY, "d_model", "final_val_loss", "trial_id")
for frame in (
    column("kurtosis", "resid", "stored", "resid kurt/null", over_null=True),
    column("top1_share", "resid", "stored", "resid top-1 share"),
    column("kurtosis", "mlp_in", "computation", "mlp_in kurt/null", over_null=True),
    column("first_mass", "attn", "heads", "mass on pos 0"),
    column("delimiter_mass", "attn", "heads", "mass on delims"),
    column("null_mass", "attn", "heads", "mass on no key"),
    column("sink_heads", "attn", "heads", "sink heads"),
):
    table = table.join(frame.with_columns(pl.col("attention").fill_null("softmax")), on=KEY, how="left")
# an arm is an optimiser, or an optimiser at one lr where the study runs it at several (Adam)
lrs = table.group_by("optimizer").agg(pl.col("lr").n_unique().alias("n_lr"))
table = table.join(lrs, on="optimizer").with_columns(arm=pl.when(pl.col("n_lr") > 1).then(
    pl.format("{} lr={}", "optimizer", pl.col("lr").map_elements(lambda v: f"{v:g}", return_dtype=pl.String)))
    .otherwise(pl.col("optimizer")))
tested = results.metrics.filter(pl.col("metric") == "kurtosis_rank_p", pl.col("site") == "resid",
                                pl.col("basis") == "random", pl.col("layer") > 0)
tested = (tested.join(results.runs.select("trial_id", "steps"), on="trial_id").filter(pl.col("step") == pl.col("steps"))
          .group_by("trial_id").agg(privileged=(pl.col("value") <= P_PRIVILEGED * (1 + 1e-6)).sum(), blocks=pl.len())
          .collect())  # 1e-6: 1/33 stored in float32
table = table.join(tested, on="trial_id", how="left")

VALUES = ["final_val_loss", "resid kurt/null", "resid top-1 share", "mlp_in kurt/null", "mass on pos 0",
          "mass on delims", "mass on no key", "sink heads"]


def interval(x: np.ndarray, digits: int = 3, sign: str = "") -> str:
    """mean ± 95% t half-width over seeds; "(one seed)" with one value, "-" with none."""
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return "-"
    if len(x) < 2:  # the table's seeds column says so; a difference says it itself
        return f"{x.mean():{sign}.{digits}f}" + (" (one seed)" if sign else "")
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return f"{x.mean():{sign}.{digits}f} ± {half:.{digits}f} ({len(x)} seeds)"


def rank(value: str, order: list[str]) -> int:
    return order.index(value) if value in order else len(order)


arms = table.select("arm", "optimizer", "lr").unique()
arms = [a for a, _, _ in sorted(arms.iter_rows(), key=lambda r: (rank(r[1], ORDER), r[2]))]
attentions = sorted(table["attention"].unique().to_list(), key=lambda a: rank(a, ATTENTIONS))
widths = sorted(table["d_model"].unique().to_list())
print(f"{table.height} done trials; final step, mean over blocks; mean ± 95% t half-width over seeds")
print("top-1 share's null (Gaussian tokens): " + "; ".join(f"d={d}: {float(top_share_null(d)):.3f}" for d in widths)
      + "; kurtosis / null reads 1 without a privileged basis")
rows = []
for o in arms:
    for a in attentions:
        cell = table.filter(pl.col("arm") == o, pl.col("attention") == a)
        if not cell.height:
            continue
        row = {"optimizer": o, "attention": a, "seeds": cell.height}
        for v in VALUES:
            row[v] = interval(cell[v].cast(pl.Float64).fill_null(np.nan).to_numpy(), 2 if "kurt" in v else 3)
        if cell["blocks"].null_count() == 0:
            row["cells at p ≤ 1/33"] = f"{int(cell['privileged'].sum())}/{int(cell['blocks'].sum())}"
        rows.append(row)
with pl.Config(tbl_rows=60, tbl_cols=20, tbl_width_chars=320, fmt_str_lengths=40, tbl_hide_dataframe_shape=True,
               tbl_hide_column_data_types=True):
    print(pl.DataFrame(rows))
levels = {m: uniform_level(results, m) for m in ("first_mass", "delimiter_mass", "sink_heads")}
print("uniform causal attention on the same tokens: " + "; ".join(
    f"{m} {v:.3f}" for m, v in levels.items() if v is not None) + "; mass on no key 0 for softmax and gated; "
      "cells at p ≤ 1/33: the null expects cells / 33")


def paired(a: pl.DataFrame, b: pl.DataFrame, measure: str) -> str:
    """a - b on `measure`, paired by seed: mean ± 95% t half-width (one seed: the difference alone)."""
    j = a.select("seed", x=pl.col(measure)).join(b.select("seed", y=pl.col(measure)), on="seed").drop_nulls()
    return interval((j["x"] - j["y"]).to_numpy(), 3, sign="+")


def at(o: str, a: str) -> pl.DataFrame:
    return table.filter(pl.col("arm") == o, pl.col("attention") == a)


for measure in ("resid kurt/null", "resid top-1 share"):
    for adam in (o for o in arms if o.startswith("adam")):
        print(f"\n{measure}: {adam}'s excess over rotated_adam under each attention, and each attention's effect on it")
        for a in attentions:
            excess = paired(at(adam, a), at("rotated_adam", a), measure)
            effect = paired(at(adam, a), at(adam, "softmax"), measure) if a != "softmax" else "(the reference)"
            print(f"  {a:<9} {adam} - rotated_adam: {excess:<28}  ({a}) - (softmax): {effect}")

print("\nSpearman's rank correlation of each sink measure with residual kurtosis / null, across all done trials "
      "and within each optimiser (where only the attention and the seed vary); a description, not a test")
for mass in ("mass on pos 0", "mass on delims", "mass on no key", "sink heads"):
    cells = []
    for name, sub in [("all", table), *((o, table.filter(pl.col("arm") == o)) for o in arms)]:
        sub = sub.select(mass, "resid kurt/null").drop_nulls()
        if sub.height >= 3 and sub[mass].n_unique() > 1 and sub["resid kurt/null"].n_unique() > 1:
            rho = stats.spearmanr(sub[mass].to_numpy(), sub["resid kurt/null"].to_numpy()).statistic
            cells.append(f"{name} {rho:+.2f} ({sub.height} trials)")
    print(f"  {mass:<15} " + "; ".join(cells))
