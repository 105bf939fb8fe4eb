"""Which trials belong together: identities derived from a run's science config.

Every id is a 12-hex-digit sha256 of the canonical JSON of the trial's config (the runs
column ``config_json``) with some parts removed, by ``resultstore.ids.science_hash``, the
function ``study.config.TrialConfig.config_id`` computes its own with (so ``config_id``
recomputed here equals the stored one):

- ``config_id``: without the seed (and the non-science ``sweep`` / ``runtime``): the seeds of
  one config. Stored by the writer; filled here only for rows written before it existed.
- ``tuning_id``: also without ``optimizer.lr``: the points of one learning-rate ladder, at one
  model size (``selection.best_lr`` picks one lr per tuning_id).
- ``line_id``: without the seed, the model's shape (``model.d_model``, ``n_layers``,
  ``n_heads``, ``d_mlp``) and what a spec's size rules set per size (``train.batch_size`` by
  ``batch_scaling``, ``train.warmup`` by ``warmup_tokens_per_param``: resolved to plain numbers
  in each trial's config, so with the rule on every size had its own line and no fit spanned
  sizes): one config across sizes, what a power-law fit or a line in a size chart is drawn
  through. The rest of ``model`` stays: SP and muP are two lines. The batch is no grid axis, so
  within one spec a line still never merges two batches at one size; two specs that share a
  store and differ only in their batch would (give such an arm its own store).
- ``tuned_line_id``: also without ``optimizer.lr``: the best-lr points of one config across
  sizes (the tuned lr may differ from size to size).

Rows without a usable ``config_json`` (stores written before it) fall back to hashing the run
columns that describe the config (``_FALLBACK``), a documented approximation.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from analysis.load import SIZE_COLUMNS, label_columns
from resultstore.ids import science_hash  # the one implementation, also TrialConfig.config_id's

__all__ = ["ID_COLUMNS", "science_hash", "with_ids"]

ID_COLUMNS = ("config_id", "tuning_id", "line_id", "tuned_line_id")
_SHAPE = ("model.d_model", "model.n_layers", "model.n_heads", "model.d_mlp", "train.batch_size", "train.warmup")
_DROPS: dict[str, tuple[str, ...]] = {
    "config_id": (),
    "tuning_id": ("optimizer.lr",),
    "line_id": _SHAPE,
    "tuned_line_id": (*_SHAPE, "optimizer.lr"),
}
_FALLBACK = (*label_columns(), *SIZE_COLUMNS, "corpus", "seq_len", "batch_size", "tokens")
_SIZE_KEYS = ("d_model", "n_layers", "n_heads", "d_mlp", "params", "params_non_embedding", "tokens", "batch_size")


def _ids(row: dict[str, Any]) -> dict[str, str]:
    text = row.get("config_json")
    try:
        config = json.loads(text) if text else None
    except ValueError:
        config = None
    if isinstance(config, dict) and config.get("model") and config.get("optimizer"):
        return {name: science_hash(config, drop) for name, drop in _DROPS.items()}
    # fallback: the config's run columns
    base = {k: row.get(k) for k in _FALLBACK if k in row}
    out = {}
    for name, drop in _DROPS.items():
        gone = {"lr"} if "optimizer.lr" in drop else set()
        if "model.d_model" in drop:
            gone |= set(_SIZE_KEYS)
        out[name] = science_hash({k: v for k, v in base.items() if k not in gone})
    return out


def with_ids(runs: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """``runs`` (lazily) with ``tuning_id``, ``line_id`` and ``tuned_line_id`` added and
    ``config_id`` filled where it is null. Idempotent."""
    lazy = runs.lazy()
    names = lazy.collect_schema().names()
    if all(c in names for c in ID_COLUMNS[1:]):
        return lazy
    src = [c for c in ("config_json", *_FALLBACK) if c in names]
    struct_type = pl.Struct({c: pl.String for c in ID_COLUMNS})

    def batch(s: pl.Series) -> pl.Series:
        cache: dict[Any, dict[str, str]] = {}
        out = []
        for row in s.to_list():
            key = json.dumps(row, sort_keys=True, default=str)
            if key not in cache:
                cache[key] = _ids(row)
            out.append(cache[key])
        return pl.Series(out, dtype=struct_type)

    ids = pl.struct(src).map_batches(batch, return_dtype=struct_type).alias("_ids")
    lazy = lazy.with_columns(ids)
    fields = {c: pl.col("_ids").struct.field(c) for c in ID_COLUMNS}
    if "config_id" in names:
        fields["config_id"] = pl.coalesce(pl.col("config_id"), fields["config_id"])
    return lazy.with_columns(**fields).drop("_ids")
