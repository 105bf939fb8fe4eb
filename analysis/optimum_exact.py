"""The exact tests at the fitted loss-optimal lr, per width (``analysis.optimum`` reads the levels):
the per-coordinate family against every other optimiser, the optimiser the unit (an exact
permutation p beside Welch's, Holm over widths: ``family_exact``), and each optimiser against its
rotated twin, paired by seed at one lr (an exact sign-flip p: ``twin_contrasts``)."""

from __future__ import annotations

import math

import polars as pl
from resultstore.vocabulary import Metric

from analysis.width_trend import LINE_AXES, WORDS

__all__ = ["family_exact", "twin_contrasts"]


def family_exact(levels: pl.DataFrame, measure: str = Metric.KURTOSIS, family: str = "per_coordinate") -> pl.DataFrame:
    """Per width: ``family``'s optimisers against every other optimiser pooled, each at its fitted
    lr* (one value per optimiser: log(measure / null)); the difference of the two means with the
    Welch interval over optimisers (``families.compare_family_values``) and the exact one-sided
    permutation p (``families.permutation_p``), Holm-adjusted over the widths (``p_exact_holm``).
    Optimisers without an optimum at that width (flagged) are left out and named."""
    from analysis.families import compare_family_values
    from analysis.multiplicity import holm

    col = f"log_{measure}_over_null"
    if not levels.height or col not in levels.columns:
        return pl.DataFrame()
    rows = []
    for (d,), g in levels.sort("d_model", "optimizer").partition_by("d_model", as_dict=True, maintain_order=True).items():
        ok = g.filter(pl.col("flag") == "", pl.col(col).is_not_null())
        mine = ok.filter(pl.col("optimizer_family") == family)
        rest = ok.filter(pl.col("optimizer_family") != family)
        if not mine.height or not rest.height:
            continue
        c = compare_family_values([[v] for v in rest.get_column(col)], [[v] for v in mine.get_column(col)],
                                  labels=("others", family))  # fmt: skip
        rows.append({
            "measure": WORDS[measure], "d_model": d, "family": family,
            "optimizers": " + ".join(mine.get_column("optimizer")), "others": " + ".join(rest.get_column("optimizer")),
            "difference": c.difference, "welch_low": c.difference_ci[0], "welch_high": c.difference_ci[1],
            "p_welch": c.p_value, "p_exact": c.p_exact,
            "left_out": "; ".join(f"{r['optimizer']} ({r['flag']})" for r in g.filter(pl.col("flag") != "").iter_rows(named=True)),
        })  # fmt: skip
    if not rows:
        return pl.DataFrame()
    out = pl.from_dicts(rows, infer_schema_length=None)
    return out.with_columns(p_exact_holm=pl.Series(holm(out.get_column("p_exact").to_numpy())))


def twin_contrasts(trials: pl.DataFrame, levels: pl.DataFrame, confidence: float = 0.95,
                   measure: str = Metric.KURTOSIS) -> pl.DataFrame:
    """Each optimiser ``o`` minus its rotated twin ``rotated_<o>`` (the same rule in a fixed random
    basis) where the store has both: log(measure / null) paired by seed at one lr, per width
    (and norm, rotation): the mean paired difference with its t-interval over seeds
    (``families.paired_interval``) and the exact two-sided sign-flip p (``families.sign_flip_p``;
    2 / 2^n at best over n seeds).

    The lr: the same for both, the one (of those where the two share 2+ seeds) nearest ``o``'s
    fitted lr* (its best grid lr where it has no optimum). At one lr the twins differ in nothing
    but the basis the rule acts in (the same per-coordinate step size, init and data order per
    seed); each at its own fitted optimum has no per-seed value to pair (lr* is read from seed
    means, and a ladder's neighbours often ran one seed). ``twin_best_lr`` says where the twin's
    own loss was lowest."""
    from analysis.families import paired_interval, sign_flip_p

    col = f"log_{measure}"
    names = set(trials.get_column("optimizer").unique().to_list()) if trials.height else set()
    strata = [c for c in ("d_model", *LINE_AXES) if c in trials.columns]
    rows = []
    for o in sorted(n for n in names if f"rotated_{n}" in names):
        mine = trials.filter(pl.col("optimizer") == o).sort(strata)
        twin = trials.filter(pl.col("optimizer") == f"rotated_{o}")
        for key, g in mine.partition_by(strata, as_dict=True, maintain_order=True).items():
            t = twin.filter(*[pl.col(c) == v for c, v in zip(strata, key, strict=True)])
            pairs = g.select("lr", "seed", a=col).join(t.select("lr", "seed", b=col), on=["lr", "seed"])
            shared = pairs.group_by("lr").agg(n=pl.len()).filter(pl.col("n") >= 2)
            if not shared.height:
                continue
            lv = levels.filter(pl.col("tuning_id") == g.get_column("tuning_id")[0]).row(0, named=True)
            target = lv["lr_star"] if lv["flag"] == "" else lv["best_lr"]
            lr = min(shared.get_column("lr").to_list(), key=lambda v: (abs(math.log(v / target)), v))
            p = pairs.filter(pl.col("lr") == lr).sort("seed")
            d = (p.get_column("a") - p.get_column("b")).to_numpy()
            mean, lo, hi = paired_interval(d, confidence)
            tw = levels.filter(pl.col("optimizer") == f"rotated_{o}", *[pl.col(c) == v for c, v in zip(strata, key, strict=True)])
            rows.append({
                "measure": WORDS[measure], "optimizer": o, "twin": f"rotated_{o}", **dict(zip(strata, key, strict=True)),
                "lr": lr, "lr_star": lv["lr_star"], "best_lr": lv["best_lr"],
                "twin_best_lr": tw.get_column("best_lr")[0] if tw.height else None, "n_seeds": d.size,
                "difference": mean, "ci_low": lo, "ci_high": hi, "ratio": math.exp(mean),
                "p_sign_flip": sign_flip_p(d), "p_min": 2.0 / 2**d.size,
            })  # fmt: skip
    return pl.from_dicts(rows, infer_schema_length=None) if rows else pl.DataFrame()
