"""THE results-store schema: one declaration of every table's columns and types.

The contract between the halves: the writer (`resultstore.writer`) writes with the pyarrow
schemas (`ARROW`), the reader (`resultstore.reader`, behind `analysis.load`) reads with the
polars ones derived from them (`RUNS_SCHEMA` ...).

A new core runs column is added here, once, with its role (`CORE_COLUMNS`, `Role`: axis,
hyper-parameter, label, outcome, ...), from which analysis derives its label and chart columns;
`study.train.run_row` fills it (a test checks that every key run_row writes is declared here).
An optimiser module declares its own hyper-parameter columns (`declare_runs_column`, through
study/optim's registry), the built-in ones as any other; the writer stamps every runs file with
them and the reader declares what it finds (`resultstore.stamps`), so a process that never
imports study knows them from the store. Files written before stamps hold `LEGACY_COLUMNS`. Identity columns: `trial_id` hashes the science config
(seed included); `config_id` hashes it without the seed (`resultstore.ids`), so seeds of one
config share it and every seed aggregate groups by it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

import polars as pl
import pyarrow as pa

__all__ = [
    "ARROW",
    "CHECKS_SCHEMA",
    "CORE_COLUMNS",
    "CURVES_SCHEMA",
    "DIMS_SCHEMA",
    "FAMILY_MEANING",
    "FINISHED",
    "HYPER_ORDER",
    "LEGACY_COLUMNS",
    "METRICS_SCHEMA",
    "RUNS_COLUMNS",
    "RUNS_SCHEMA",
    "SAE_SCHEMA",
    "SCHEMAS",
    "STATUSES",
    "TABLES",
    "UNSUCCESSFUL",
    "Family",
    "Role",
    "Status",
    "declare_runs_column",
    "declared_columns",
    "kind_of",
    "role_of",
    "runs_columns",
]

TABLES = ("runs", "metrics", "curves", "checks", "dims", "sae")

Status = Literal["done", "failed", "diverged"]
"""A trial's status in the runs table."""
STATUSES: tuple[str, ...] = get_args(Status)
FINISHED: tuple[Status, ...] = ("done", "diverged")
"""Statuses that need no more work (failed trials are retried)."""
UNSUCCESSFUL: tuple[Status, ...] = ("failed", "diverged")
"""Statuses that make `sweep run` and `sweep status` exit 1."""


class Role(StrEnum):
    """What a runs column is, declared once with the column (`RUNS_COLUMNS`): analysis derives
    its label, grouping and chart columns from these, sweep its progress labels."""

    ID = "id"
    """Who the trial is: trial_id, config_id, sweep."""
    SHAPE = "shape"
    """The model's shape (d_model, n_layers, n_heads, d_mlp): axes a label names first."""
    SIZE = "size"
    """Sizes derived from the shape (params, params_non_embedding, flops_per_token)."""
    AXIS = "axis"
    """A config choice a label names by its value: optimizer, norm, attention, rotation_label."""
    HYPER = "hyper"
    """An optimiser hyper-parameter (lr, weight_decay; an optimiser module declares its own, momentum
    ...: `declare_runs_column`). Null where it does not apply to the trial's optimiser."""
    LABEL = "label"
    """A description of an axis's value, carried along with it (optimizer_family; the rotation
    plan's mode, group_size, groups)."""
    DETAIL = "detail"
    """A config detail already spelled out in an axis's label, not carried on its own
    (rotate_embeddings: rotation_label's `-noemb`)."""
    DATA = "data"
    """What the model reads and in what batches: corpus, seq_len, batch_size."""
    SEED = "seed"
    """The replicate: every seed aggregate averages over it."""
    OUTCOME = "outcome"
    """What the trial measured: status, tokens, losses, throughput, memory."""
    PROVENANCE = "provenance"
    """Where and what ran: device, versions, the corpus fingerprint, the error, the config."""


class Family(StrEnum):
    """The runs column `optimizer_family`: what trains every parameter that lives in the residual
    basis (the one place these values are defined; study/optim's registry assigns them)."""

    PER_COORDINATE = "per_coordinate"
    ROTATION_EQUIVARIANT = "rotation_equivariant"
    FIXED_RANDOM_BASIS = "fixed_random_basis"
    ADAPTIVE_BASIS = "adaptive_basis"
    MIXED = "mixed"


FAMILY_MEANING: dict[Family, str] = {
    Family.PER_COORDINATE: "every parameter's update is per coordinate of the stored basis (adam, adafactor, lion, signsgd)",
    Family.ROTATION_EQUIVARIANT: "rotating the basis rotates the whole run (sgd; muon with sgd ends)",
    Family.FIXED_RANDOM_BASIS: ("a per-coordinate rule in a fixed Haar-random basis per parameter (rotated_adam, "
                                "rotated_adafactor, rotated_lion, rotated_signsgd; muon with rotated_adam ends)"),
    Family.ADAPTIVE_BASIS: "Adam in Shampoo's eigenbasis (soap, with soap_vectors: shampoo or no per-coordinate gain vectors)",
    Family.MIXED: ("some parameters in the residual basis per coordinate, the rest not: muon with adamw ends (embeddings, "
                   "unembedding, gains), soap with layernorm/rmsnorm gains (trained by plain Adam)"),
}
"""Each family in words."""

_S, _I, _F, _B = pa.string(), pa.int64(), pa.float64(), pa.bool_()
_ID, _SHAPE, _SIZE, _AXIS, _HYPER, _LABEL = Role.ID, Role.SHAPE, Role.SIZE, Role.AXIS, Role.HYPER, Role.LABEL
_DETAIL, _DATA, _SEED, _OUT, _PROV = Role.DETAIL, Role.DATA, Role.SEED, Role.OUTCOME, Role.PROVENANCE

CORE_COLUMNS: tuple[tuple[str, pa.DataType, Role], ...] = (
    # identity
    ("trial_id", _S, _ID), ("config_id", _S, _ID), ("sweep", _S, _ID), ("status", _S, _OUT),
    # model shape and size
    ("d_model", _I, _SHAPE), ("n_layers", _I, _SHAPE), ("n_heads", _I, _SHAPE), ("d_mlp", _I, _SHAPE),
    ("params", _I, _SIZE), ("params_non_embedding", _I, _SIZE), ("flops_per_token", _F, _SIZE),
    # optimiser
    # (an optimiser's own hyper-parameters follow weight_decay: LEGACY_COLUMNS, then stamped ones at the end)
    ("optimizer", _S, _AXIS), ("optimizer_family", _S, _LABEL), ("lr", _F, _HYPER), ("weight_decay", _F, _HYPER),
    # norm, attention (study.attention's label; null in stores before it: softmax) and rotation plan
    ("norm", _S, _AXIS), ("attention", _S, _AXIS), ("rotation", _S, _LABEL), ("group_size", _I, _LABEL),
    ("rotation_groups", _S, _LABEL), ("rotation_label", _S, _AXIS),
    ("rotate_embeddings", _B, _DETAIL),
    # parameterisation (sp, mup; null in stores before it: sp) and muP's base width (null under sp)
    ("parametrization", _S, _AXIS), ("mup_base_width", _I, _LABEL),
    # data and schedule
    ("seed", _I, _SEED), ("corpus", _S, _DATA), ("seq_len", _I, _DATA), ("batch_size", _I, _DATA),
    # results
    ("tokens", _I, _OUT), ("steps", _I, _OUT),
    ("final_train_loss", _F, _OUT), ("final_val_loss", _F, _OUT),
    ("tokens_per_s", _F, _OUT), ("wall_s", _F, _OUT), ("mfu", _F, _OUT), ("peak_memory_bytes", _I, _OUT),
    # where and what ran
    ("device", _S, _PROV), ("node", _S, _PROV), ("torch_version", _S, _PROV), ("version", _S, _PROV),
    ("git_sha", _S, _PROV), ("corpus_fingerprint", _S, _PROV), ("error", _S, _PROV), ("config_json", _S, _PROV),
    ("device_detail", _S, _PROV),  # GPU name, CPU model, torch's CPU kernel path: results differ across them
)  # fmt: skip
"""The runs table's core: the columns every process knows, whatever optimisers it has, each with
its type and role, in file order. Every other column is an optimiser's own (`declare_runs_column`)."""

LEGACY_COLUMNS: tuple[tuple[str, str, Role], ...] = (
    ("momentum", "float", _HYPER), ("eps", "float", _HYPER), ("beta1", "float", _HYPER), ("beta2", "float", _HYPER),
    ("nesterov", "bool", _HYPER), ("rotate", "string", _HYPER), ("precondition_frequency", "int", _HYPER),
    ("muon_ends", "string", _HYPER),
)  # fmt: skip
"""The optimisers' own columns (name, kind, role) that runs files written before stamps
(`resultstore.stamps`) hold after weight_decay, in this order: what such a file is read as
stamped with. Declared when this module loads, so every process reads those files (every kept
store) as it always has; the built-in optimisers declare the same columns (their `own_columns`)
and a test holds the two equal. Frozen: a later column is declared by its optimiser module,
stamped by the writer and declared by the reader from the stamp, appended after the others."""

RUNS_COLUMNS: list[tuple[str, pa.DataType, Role]] = list(CORE_COLUMNS)
"""The runs table: one row per trial, its columns in file order, each with its type and role:
the core, then the declared columns (`declare_runs_column`; LEGACY_COLUMNS after weight_decay)."""

HYPER_ORDER = ("lr", "momentum", "nesterov", "weight_decay", "eps", "beta1", "beta2", "rotate")
"""The order labels and report tables name these hyper-parameters in (as they have since the first
stores); every other HYPER column follows them, in column order."""

ARROW: dict[str, pa.Schema] = {
    "runs": pa.schema([(name, kind) for name, kind, _ in RUNS_COLUMNS]),
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

_ROLES: dict[str, Role] = {name: role for name, _, role in RUNS_COLUMNS}
_KINDS = {"string": _S, "int": _I, "float": _F, "bool": _B}


def role_of(column: str) -> Role | None:
    """A runs column's role; None for a name the runs table does not declare."""
    return _ROLES.get(column)


def runs_columns(*roles: Role) -> tuple[str, ...]:
    """The runs columns of these roles (every one without), in file order; HYPER columns in
    `HYPER_ORDER` first. Read at call time: a column declared later counts too."""
    named = tuple(c for c, r in _ROLES.items() if not roles or r in roles)
    if roles != (Role.HYPER,):
        return named
    return (*(c for c in HYPER_ORDER if c in named), *(c for c in named if c not in HYPER_ORDER))


def declare_runs_column(name: str, kind: str, role: Role = Role.HYPER, *, after: str | None = None) -> None:
    """Add a runs column of this `kind` (string, int, float or bool), e.g. an optimiser's own
    hyper-parameter: the writer writes (and stamps) it, the reader reads it, analysis labels and
    charts it by its role. It goes at the end (files written before it keep their order), or
    right `after` that column. Declaring a column again with the same type and role does nothing;
    with another, or a name the table has, is an error."""
    if kind not in _KINDS:
        raise ValueError(f"runs column {name!r}: kind {kind!r} is not one of {list(_KINDS)}")
    if name in _ROLES:
        if ARROW["runs"].field(name).type == _KINDS[kind] and _ROLES[name] == role:
            return
        raise ValueError(f"runs column {name!r} is declared already ({_ROLES[name].value}, "
                         f"{kind_of(ARROW['runs'].field(name).type)}), not as {role.value}, {kind}")
    at = len(RUNS_COLUMNS) if after is None else [c for c, _, _ in RUNS_COLUMNS].index(after) + 1
    RUNS_COLUMNS.insert(at, (name, _KINDS[kind], role))
    ARROW["runs"] = ARROW["runs"].insert(at, pa.field(name, _KINDS[kind]))
    # _ROLES and RUNS_SCHEMA (SCHEMAS["runs"], held by every importer) are refilled in place, in file order
    _ROLES.clear()
    _ROLES.update({c: r for c, _, r in RUNS_COLUMNS})
    polars = list(RUNS_SCHEMA.items())
    polars.insert(at, (name, _POLARS[_KINDS[kind]]))
    RUNS_SCHEMA.clear()
    RUNS_SCHEMA.update(polars)


def kind_of(arrow: pa.DataType) -> str:
    """The kind (`declare_runs_column`'s string, int, float or bool) of a runs column's Arrow type."""
    return next(k for k, t in _KINDS.items() if t == arrow)


def declared_columns() -> list[tuple[str, str, Role]]:
    """Every runs column beyond the core, (name, kind, role) in file order: what the writer stamps."""
    core = {c for c, _, _ in CORE_COLUMNS}
    return [(c, kind_of(t), r) for c, t, r in RUNS_COLUMNS if c not in core]


for _at, (_name, _kind, _role) in zip(("weight_decay", *(c for c, _, _ in LEGACY_COLUMNS)), LEGACY_COLUMNS):
    declare_runs_column(_name, _kind, _role, after=_at)
