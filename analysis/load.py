"""Open a sweep's results store as lazy Polars tables, and label its configs.

    >>> r = load("results/scaling")
    >>> r.runs.filter(pl.col("status") == "done").collect()

``load``, ``Results`` and the tables' schemas are the store's reader (resultstore/reader.py,
resultstore/schema.py), re-exported here; this module adds what analysis means by a config:
its id column, its size and label columns, and readable labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from resultstore.layout import DamagedFile, NoSweepError  # noqa: F401  (re-exported)
from resultstore.reader import Results, find_sweep, load, verify_footers  # noqa: F401  (re-exported)
from resultstore.schema import (  # noqa: F401  (re-exported: the contract lives in resultstore)
    CHECKS_SCHEMA,
    CURVES_SCHEMA,
    DIMS_SCHEMA,
    HYPER_ORDER,
    METRICS_SCHEMA,
    RUNS_SCHEMA,
    SAE_SCHEMA,
    SCHEMAS,
    TABLES,
    Role,
    runs_columns,
)

__all__ = [
    "CHECKS_SCHEMA",
    "CONFIG_ID",
    "CURVES_SCHEMA",
    "DIMS_SCHEMA",
    "METRICS_SCHEMA",
    "RUNS_SCHEMA",
    "SAE_SCHEMA",
    "SIZE_COLUMNS",
    "TABLES",
    "axis_labels",
    "NoSweepError",
    "Results",
    "config_label",
    "find_sweep",
    "load",
    "rotation_label",
]

# A config is a trial's science config without its seed: the runs column ``config_id`` (a hash
# written by the study, see analysis.identity). Seeds are its replicates; every seed aggregate
# groups by it, never by a hand-picked list of columns, so two configs that differ in any
# hyper-parameter (momentum, eps, rotation groups, ...) are never averaged together.
CONFIG_ID = "config_id"
SIZE_COLUMNS = ("d_model", "n_layers", "n_heads", "d_mlp", "params", "params_non_embedding")


def label_columns() -> tuple[str, ...]:
    """Run columns that are functions of ``config_id``: carried along aggregates as labels (the
    first value per config), never grouped by. The schema's axes, their labels and the
    hyper-parameters (``resultstore.schema`` roles AXIS, LABEL, HYPER), ordered as report tables
    have always carried them: the optimiser's, its first hyper-parameters (``HYPER_ORDER``), the
    other axes and labels, then every later hyper-parameter (one an optimiser module declares
    too: read at call time), so that a table's earlier columns keep their places."""
    described = runs_columns(Role.AXIS, Role.LABEL)
    hypers = runs_columns(Role.HYPER)
    first_hyper = runs_columns().index(hypers[0])
    optimizer = [c for c in described if runs_columns().index(c) < first_hyper]
    return (*optimizer, *(h for h in hypers if h in HYPER_ORDER), *(c for c in described if c not in optimizer),
            *(h for h in hypers if h not in HYPER_ORDER))


ADDED_LATER = {"attention": "softmax", "parametrization": "sp"}
"""Axis columns added after stores were written, with the value every trial before them ran: what
their rows read."""


def attention_label() -> pl.Expr:
    """The stored ``attention`` (``softmax``, ``gated``, ``clipped(zeta=1.03,gamma=-0.01)``, ...);
    ``softmax`` for rows written before the attention axis existed, every one of which ran it."""
    return pl.col("attention").fill_null(ADDED_LATER["attention"]).alias("attention")


def parametrization_label() -> pl.Expr:
    """The stored ``parametrization`` (``sp``, ``mup``); ``sp`` for rows written before that
    column existed, every one of which ran it."""
    return pl.col("parametrization").fill_null(ADDED_LATER["parametrization"]).alias("parametrization")


def axis_labels(names: Sequence[str]) -> list[pl.Expr]:
    """Each axis column (``resultstore.schema`` role AXIS) among ``names`` as its label: read as
    stored, a column added later filled with what earlier rows ran (``ADDED_LATER``), and
    ``rotation_label`` derived where null (``rotation_label``)."""
    have = set(names)
    out = []
    for column in runs_columns(Role.AXIS):
        if column == "rotation_label" and {"rotation", "group_size", "rotation_label"} <= have:
            out.append(rotation_label())
        elif column in have and column in ADDED_LATER:
            out.append(pl.col(column).fill_null(ADDED_LATER[column]).alias(column))
    return out


def rotation_label() -> pl.Expr:
    """The stored ``rotation_label`` (``none``, ``partial(2)``, ``groups[[0,1],[2]]``, ...);
    for rows written before that column existed, ``rotation`` with ``(k)`` for a partial
    plan's group size. The one place a label is derived."""
    gs = pl.col("group_size")
    derived = (
        pl.when((pl.col("rotation") == "partial") & gs.is_not_null())
        .then(pl.format("partial({})", gs))
        .otherwise(pl.col("rotation"))
    )
    return pl.coalesce(pl.col("rotation_label"), derived).alias("rotation_label")


def config_label(
    parts: Sequence[str] = ("optimizer", "norm", "rotation"), *, sep: str = " · "
) -> pl.Expr:
    """A readable label for a config, as an expression over run columns.

    ``rotation`` reads the stored ``rotation_label`` (see ``rotation_label``), e.g.
    ``"adam · layernorm · shared"`` or ``"sgd · rmsnorm_scalar · partial(2)"``.
    Nulls read ``?``. Use it with ``.with_columns(label=config_label())``."""
    exprs = []
    for p in parts:
        e = rotation_label() if p == "rotation" else pl.col(p)
        exprs.append(e.cast(pl.String).fill_null("?"))
    return pl.concat_str(exprs, separator=sep).alias("config")
