"""THE results-store schema: one declaration of every table's columns and types.

The contract between the halves: the writer (`resultstore.writer`) writes with the pyarrow
schemas (`ARROW`), the reader (`resultstore.reader`, behind `analysis.load`) reads with the
polars ones derived from them (`RUNS_SCHEMA` ...).

A new runs column is added here, once; `study.train.run_row` fills it (a test checks that every
key run_row writes is declared here). Identity columns: `trial_id` hashes the science config
(seed included); `config_id` hashes it without the seed (`resultstore.ids`), so seeds of one
config share it and every seed aggregate groups by it.
"""

from __future__ import annotations

from typing import Literal, get_args

import polars as pl
import pyarrow as pa

__all__ = [
    "ARROW",
    "CHECKS_SCHEMA",
    "CURVES_SCHEMA",
    "DIMS_SCHEMA",
    "FINISHED",
    "METRICS_SCHEMA",
    "RUNS_SCHEMA",
    "SAE_SCHEMA",
    "SCHEMAS",
    "STATUSES",
    "TABLES",
    "UNSUCCESSFUL",
    "Status",
]

TABLES = ("runs", "metrics", "curves", "checks", "dims", "sae")

Status = Literal["done", "failed", "diverged"]
"""A trial's status in the runs table."""
STATUSES: tuple[str, ...] = get_args(Status)
FINISHED: tuple[Status, ...] = ("done", "diverged")
"""Statuses that need no more work (failed trials are retried)."""
UNSUCCESSFUL: tuple[Status, ...] = ("failed", "diverged")
"""Statuses that make `sweep run` and `sweep status` exit 1."""

_S, _I, _F, _B = pa.string(), pa.int64(), pa.float64(), pa.bool_()

ARROW: dict[str, pa.Schema] = {
    "runs": pa.schema([
        # identity
        ("trial_id", _S), ("config_id", _S), ("sweep", _S), ("status", _S),
        # model shape and size
        ("d_model", _I), ("n_layers", _I), ("n_heads", _I), ("d_mlp", _I),
        ("params", _I), ("params_non_embedding", _I), ("flops_per_token", _F),
        # optimiser
        ("optimizer", _S), ("optimizer_family", _S), ("lr", _F), ("weight_decay", _F),
        ("momentum", _F), ("eps", _F), ("beta1", _F), ("beta2", _F), ("nesterov", _B), ("rotate", _S),
        ("precondition_frequency", _I),
        ("muon_ends", _S),
        # norm, attention (study.attention's label; null in stores before it: softmax) and rotation plan
        ("norm", _S), ("attention", _S), ("rotation", _S), ("group_size", _I), ("rotation_groups", _S),
        ("rotation_label", _S),
        ("rotate_embeddings", _B),
        # data and schedule
        ("seed", _I), ("corpus", _S), ("seq_len", _I), ("batch_size", _I),
        # results
        ("tokens", _I), ("steps", _I),
        ("final_train_loss", _F), ("final_val_loss", _F),
        ("tokens_per_s", _F), ("wall_s", _F), ("mfu", _F), ("peak_memory_bytes", _I),
        # where and what ran
        ("device", _S), ("node", _S), ("torch_version", _S), ("version", _S),
        ("git_sha", _S), ("corpus_fingerprint", _S), ("error", _S), ("config_json", _S),
        ("device_detail", _S),  # GPU name, CPU model, torch's CPU kernel path: results differ across them
    ]),
    "metrics": pa.schema([
        ("trial_id", _S), ("step", _I), ("tokens", _I), ("layer", _I),
        ("site", _S), ("basis", _S), ("metric", _S), ("value", _F),
    ]),
    "curves": pa.schema([
        ("trial_id", _S), ("step", _I), ("tokens", _I),
        ("train_loss", _F), ("val_loss", _F), ("lr", _F),
        ("grad_norm", _F), ("tokens_per_s", _F),
    ]),
    "checks": pa.schema([
        ("trial_id", _S), ("check", _S), ("dtype", _S), ("value", _F),
    ]),
    # What the outlier dimensions are and do (study/attribution.py has the exact definitions).
    # One row per (trial_id, step, layer, site, dim), at the final eval and every
    # train.attribution_every-th one. Rows with layer >= 0 describe a layer's top-k dimensions
    # (site resid / basis stored, layers 0..L; attn_in, mlp_in / computation, layers 1..L):
    # rank_max, rank_m4 (1 = largest; null when outside that top-k), the measures, and
    # top_tokens ("id:count,..."). Rows with layer -1 (site resid) are the ablations: role "top"
    # (rank_max = the candidate's rank, first_layer) or "null" (a random dimension), the val-loss
    # change of setting the dim to 0 / its eval-batch mean at every layer (zero_delta,
    # mean_delta) or at first_layer only (*_first), the empirical p-values against the null
    # draws (zero_p, mean_p) and loss_tokens (the targets whose loss rises most).
    "dims": pa.schema([
        ("trial_id", _S), ("step", _I), ("tokens", _I), ("layer", _I),
        ("site", _S), ("basis", _S), ("dim", _I), ("role", _S),
        ("rank_max", _I), ("rank_m4", _I),
        ("max_abs", _F), ("median_abs", _F), ("max_median", _F), ("sun_ratio", _F), ("m4_share", _F),
        ("pos0_share", _F), ("frequent_share", _F), ("delimiter_share", _F), ("freq_corr", _F),
        ("gain_ratio", _F), ("top_tokens", _S),
        ("first_layer", _I), ("zero_delta", _F), ("mean_delta", _F),
        ("zero_delta_first", _F), ("mean_delta_first", _F), ("zero_p", _F), ("mean_p", _F),
        ("loss_tokens", _S),
    ]),
    # `sweep probe sae`: one row per (trial, layer, basis, SAE optimiser). basis: `stored` (the
    # trial's residual basis) or `random` (a fixed Haar-random one); sae_optimizer: `adam` or
    # `sgd` (the rotation-equivariant control). Decoder alignment is measured in the basis the
    # SAE saw (random directions: decoder_kurtosis_null = 3(d-1)/(d+1)); agreement is the mean
    # matched cosine between this SAE and the other basis's one, rotated back.
    "sae": pa.schema([
        ("trial_id", _S), ("layer", _I), ("basis", _S), ("sae_optimizer", _S),
        ("d_model", _I), ("n_latents", _I), ("k", _I), ("steps", _I), ("tokens", _I),
        ("fve", _F), ("l0", _F), ("dead_fraction", _F),
        ("loss_orig", _F), ("loss_zero", _F), ("loss_sae", _F), ("loss_recovered", _F),
        ("decoder_kurtosis", _F), ("decoder_kurtosis_null", _F), ("decoder_max_share", _F),
        ("agreement", _F), ("wall_s", _F), ("sae_config_json", _S),
    ]),
}  # fmt: skip


_POLARS = {_S: pl.String(), _I: pl.Int64(), _F: pl.Float64(), _B: pl.Boolean()}


def _polars(schema: pa.Schema) -> dict[str, pl.DataType]:
    # A plain map, not pl.from_arrow: that imports pandas (0.15 s on every CLI start)
    return {f.name: _POLARS[f.type] for f in schema}


SCHEMAS: dict[str, dict[str, pl.DataType]] = {t: _polars(ARROW[t]) for t in TABLES}
"""The polars view of each table's contract (column -> dtype), in ARROW's column order."""
RUNS_SCHEMA = SCHEMAS["runs"]
METRICS_SCHEMA = SCHEMAS["metrics"]
CURVES_SCHEMA = SCHEMAS["curves"]
CHECKS_SCHEMA = SCHEMAS["checks"]
DIMS_SCHEMA = SCHEMAS["dims"]
SAE_SCHEMA = SCHEMAS["sae"]
