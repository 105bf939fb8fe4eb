"""What the outlier dimensions are and what they do: queries over the `dims` table.

The table (resultstore/schema.py; measures defined in study/attribution.py) holds, per trial and
attributed eval step, each layer's top-k dimensions (layer >= 0) and the ablations (layer -1).
Every function takes Polars frames (the table, and done runs with `config_id`) and returns a
frame: pure, lazy where the input is, no I/O.

    >>> r = analysis.load("results/x")
    >>> persistence(r.dims).collect()
"""

from __future__ import annotations

import polars as pl
from resultstore.vocabulary import Site

__all__ = [
    "RUN_COLUMNS",
    "ablation_band",
    "final_step",
    "largest_per_optimizer",
    "persistence",
    "persistence_map",
    "persistence_over_evals",
    "token_label",
    "token_table",
]

RUN_COLUMNS = ("trial_id", "config_id", "optimizer", "norm", "rotation_label", "d_model", "n_layers",
               "params_non_embedding", "seed", "lr", "corpus", "final_val_loss")
"""The runs columns the views carry along."""


def final_step(dims: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """Each trial's rows at its last attributed step (the final eval)."""
    dims = dims.lazy()
    return dims.filter(pl.col("step") == pl.col("step").max().over("trial_id"))


def _top_sets(dims: pl.LazyFrame) -> pl.LazyFrame:
    """(trial_id, step, site, layer, dim) of each layer's top-k by max |x|."""
    return dims.filter((pl.col("layer") >= 0) & pl.col("rank_max").is_not_null()).select(
        "trial_id", "step", "site", "layer", "dim")


def persistence(dims: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """Per (trial_id, step, site, layer): the share of the layer's top-k (by max |x|) that is
    also in the next layer's (`overlap_next`; null at the last layer) and in the last layer's
    (`overlap_last`), k = the layer's set size. Across layers of one computation basis only:
    under independent rotations the attn_in / mlp_in axes of two layers are unrelated."""
    top = _top_sets(dims.lazy())
    keys = ["trial_id", "step", "site"]
    size = top.group_by(*keys, "layer").agg(k=pl.len())
    last = top.group_by(keys).agg(last_layer=pl.col("layer").max())
    nxt = top.with_columns(pl.col("layer") - 1).with_columns(hit_next=pl.lit(1))
    at_last = top.join(last, on=keys).filter(pl.col("layer") == pl.col("last_layer")).select(
        *keys, "dim", hit_last=pl.lit(1))
    shares = (top.join(nxt, on=[*keys, "layer", "dim"], how="left").join(at_last, on=[*keys, "dim"], how="left")
              .group_by(*keys, "layer").agg(next=pl.col("hit_next").sum(), at_last=pl.col("hit_last").sum()))
    return (size.join(shares, on=[*keys, "layer"]).join(last, on=keys)
            .with_columns(overlap_next=pl.when(pl.col("layer") < pl.col("last_layer"))
                          .then(pl.col("next") / pl.col("k")),
                          overlap_last=pl.col("at_last") / pl.col("k"))
            .select(*keys, "layer", "k", "overlap_next", "overlap_last").sort(*keys, "layer"))


def persistence_over_evals(dims: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """Per (trial_id, site, layer, step): the share of the top-k at this attributed step that
    was in the top-k at the previous one (`overlap_prev`; the first step is left out). Needs
    train.attribution_every > 0 for more than the final step."""
    top = _top_sets(dims.lazy())
    keys = ["trial_id", "site", "layer"]
    steps = top.select(*keys, "step").unique().sort("step").with_columns(
        prev_step=pl.col("step").shift(1).over(keys))
    prev = top.rename({"step": "prev_step"}).with_columns(hit=pl.lit(1))
    cur = top.join(steps, on=[*keys, "step"]).filter(pl.col("prev_step").is_not_null())
    return (cur.join(prev, on=[*keys, "prev_step", "dim"], how="left")
            .group_by(*keys, "step", "prev_step").agg(overlap_prev=pl.col("hit").sum() / pl.len())
            .sort(*keys, "step"))


def largest_per_optimizer(runs: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """The done trials shown per optimiser: its largest model (params_non_embedding), at the
    config (config_id) with the lowest seed-mean final val loss there; every seed of it."""
    runs = runs.lazy().filter(pl.col("status") == "done") if "status" in runs.lazy().collect_schema() else runs.lazy()
    runs = runs.filter(pl.col("params_non_embedding") == pl.col("params_non_embedding").max().over("optimizer"))
    best = (runs.group_by("optimizer", "config_id").agg(loss=pl.col("final_val_loss").mean())
            .sort("loss").group_by("optimizer").first().select("optimizer", "config_id"))
    keep = [c for c in RUN_COLUMNS if c in runs.collect_schema()]
    return runs.join(best, on=["optimizer", "config_id"]).select(keep).sort("optimizer", "seed").collect()


def persistence_map(dims: pl.LazyFrame | pl.DataFrame, shown: pl.DataFrame, site: str = Site.RESID) -> pl.DataFrame:
    """Dimensions x layers at the final step for the `shown` trials (largest_per_optimizer):
    per (optimizer, layer, dim), `share` = the fraction of its seeds in which the dim is in the
    layer's top-k by max |x|, and `rank` = its mean rank there. Only dims in some top-k appear."""
    top = final_step(dims).filter((pl.col("site") == site) & (pl.col("layer") >= 0) & pl.col("rank_max").is_not_null())
    seeds = shown.group_by("optimizer").agg(n_seeds=pl.len())
    return (top.join(shown.lazy().select("trial_id", "optimizer", "d_model"), on="trial_id").collect()
            .group_by("optimizer", "d_model", "layer", "dim").agg(n=pl.len(), rank=pl.col("rank_max").mean())
            .join(seeds, on="optimizer").with_columns(share=pl.col("n") / pl.col("n_seeds"))
            .sort("optimizer", "dim", "layer"))


def ablation_band(dims: pl.LazyFrame | pl.DataFrame, shown: pl.DataFrame) -> pl.DataFrame:
    """The final step's ablations of the `shown` trials in long form: per (trial_id,
    ablation in zero / mean), the top dims' deltas (rank, dim, delta, p) beside their trial's
    null band (null_lo, null_median, null_hi: min, median, max of the random-dim deltas)."""
    rows = final_step(dims).filter(pl.col("layer") == -1).join(
        shown.lazy().select("trial_id", "optimizer", "d_model", "seed"), on="trial_id")
    long = pl.concat([
        rows.select("trial_id", "optimizer", "d_model", "seed", "role", "dim", "rank_max",
                    ablation=pl.lit(kind), delta=pl.col(f"{kind}_delta"), p=pl.col(f"{kind}_p"))
        for kind in ("zero", "mean")
    ])  # fmt: skip
    band = (long.filter(pl.col("role") == "null").group_by("trial_id", "ablation")
            .agg(null_lo=pl.col("delta").min(), null_median=pl.col("delta").median(), null_hi=pl.col("delta").max(),
                 n_null=pl.len()))
    return (long.filter(pl.col("role") == "top").join(band, on=["trial_id", "ablation"], how="left")
            .rename({"rank_max": "rank"}).sort("optimizer", "seed", "ablation", "rank").collect())


def token_label(token: int, byte_level: bool) -> str:
    """A readable token: for byte corpora the byte as a Python literal (b'\\n' -> '\\n'),
    a space as '␣'; else '#id'."""
    if byte_level and 0 <= token < 256:
        return "␣" if token == 32 else repr(bytes([token]))[2:-1]
    return f"#{token}"


def _labels(tokens: str | None, byte_level: bool) -> str:
    if not tokens:
        return ""
    out = []
    for part in tokens.split(","):
        token, count = part.split(":")
        out.append(f"{token_label(int(token), byte_level)} ×{count}")
    return "  ".join(out)


def token_table(dims: pl.LazyFrame | pl.DataFrame, shown: pl.DataFrame, n_dims: int = 3) -> pl.DataFrame:
    """Which tokens carry the top dimensions: for each shown trial's first seed, its `n_dims`
    ablation candidates with their last-layer residual measures (max_median, pos0_share,
    delimiter_share, freq_corr, top_tokens) and zero-ablation delta, p and loss_tokens, token
    ids rendered readable (bytes for byte corpora: corpus stdlib or text:). The last-layer
    measures are null for a candidate outside the last layer's top-k (no row there)."""
    first = shown.sort("seed").group_by("optimizer").first()
    final = final_step(dims).join(first.lazy().select("trial_id", "optimizer", "d_model", "seed", "corpus"),
                                  on="trial_id")
    cand = final.filter((pl.col("layer") == -1) & (pl.col("role") == "top") & (pl.col("rank_max") <= n_dims)).select(
        "trial_id", "optimizer", "d_model", "seed", "corpus", "dim", rank="rank_max", zero_delta="zero_delta",
        zero_p="zero_p", mean_delta="mean_delta", loss_tokens="loss_tokens")
    resid = final.filter(pl.col("site") == Site.RESID)
    last = resid.filter(pl.col("layer") == pl.col("layer").max().over("trial_id")).select(
        "trial_id", "dim", "max_median", "pos0_share", "delimiter_share", "freq_corr", "top_tokens")
    table = cand.join(last, on=["trial_id", "dim"], how="left").sort("optimizer", "rank").collect()
    byte = [c is not None and (c == "stdlib" or c.startswith("text:")) for c in table.get_column("corpus")]
    return table.with_columns(
        top_tokens=pl.Series([_labels(t, b) for t, b in zip(table.get_column("top_tokens"), byte)], dtype=pl.String),
        loss_tokens=pl.Series([_labels(t, b) for t, b in zip(table.get_column("loss_tokens"), byte)], dtype=pl.String),
    ).drop("corpus")
