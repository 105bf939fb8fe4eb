"""The optimiser registry: one `Optimizer` entry per name, registered by its own module in
study/optim/ (adam.py, sgd.py, ...). Everything the config, the runs table and the builder
need to know about an optimiser is in its entry, so adding one is one module there.

Torch-free: study.config reads the names, families and checks from here when it is imported,
and a config validates without torch. Each entry's `build` imports torch when it is called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from study.config import OptimizerConfig, TrialConfig

__all__ = [
    "FAMILIES", "OPTIMIZERS", "OPTIMIZER_COLUMNS", "PER_COORDINATE_GAINS", "Optimizer",
    "optimizer_family", "optimizer_names", "register", "runs_columns", "sharding_problem",
]  # fmt: skip

FAMILIES: dict[str, str] = {
    "per_coordinate": "every parameter's update is per coordinate of the stored basis (adam, adafactor, lion, signsgd)",
    "rotation_equivariant": "rotating the basis rotates the whole run (sgd; muon with sgd ends)",
    "fixed_random_basis": "Adam in a fixed Haar-random basis per parameter (rotated_adam; muon with rotated_adam ends)",
    "adaptive_basis": "Adam in Shampoo's eigenbasis (soap, with soap_vectors: shampoo or no per-coordinate gain vectors)",
    "mixed": ("some parameters in the residual basis per coordinate, the rest not: muon with adamw ends (embeddings, "
              "unembedding, gains), soap with layernorm/rmsnorm gains (trained by plain Adam)"),
}
"""The runs column `optimizer_family`: what trains every parameter that lives in the residual
basis (the one place these strings are defined; `optimizer_family` derives them)."""

PER_COORDINATE_GAINS = ("layernorm", "rmsnorm")
"""Norms with a gain (and bias) vector per coordinate; rmsnorm_scalar has one scalar gain."""

OPTIMIZER_COLUMNS: dict[str, Callable[[OptimizerConfig], Any]] = {
    "momentum": lambda o: o.momentum,
    "eps": lambda o: o.eps,
    "beta1": lambda o: o.betas[0],
    "beta2": lambda o: o.betas[1],
    "nesterov": lambda o: o.nesterov,
    "rotate": lambda o: o.rotate,
    "precondition_frequency": lambda o: o.precondition_frequency,
    "muon_ends": lambda o: o.muon_ends,
}
"""The runs table's hyper-parameter columns, in its order, each read from an OptimizerConfig
field. An optimiser's row fills the ones whose field it `reads` (beta1 and beta2 from betas),
then its `columns`; the rest stay null."""

_COLUMN_FIELD = {"beta1": "betas", "beta2": "betas"}  # a column read from a differently named field


@dataclass(frozen=True)
class Optimizer:
    """One optimiser: its name, what it reads from the config, how it writes its runs row,
    and how it is built."""

    name: str
    """`optimizer.name` in a spec."""
    order: int
    """Its place in the list of names (the validation message for an unknown name lists them)."""
    family: str
    """Its rule on a hidden matrix: a FAMILIES key. The runs column may differ (see `family_for`)."""
    reads: tuple[str, ...]
    """The OptimizerConfig fields it uses besides name and lr; each fills its runs column, if any."""
    build: Callable[[TrialConfig, Any], Any]
    """(cfg, model) -> the optimiser over model's trainable parameters, group "lr" at the peak."""
    columns: Callable[[OptimizerConfig], dict[str, Any]] | None = None
    """Runs columns it fills otherwise than from `reads` (OPTIMIZER_COLUMNS keys)."""
    family_for: Callable[[OptimizerConfig, str], str] | None = None
    """(optimizer, norm) -> the runs column `optimizer_family`, when not simply `family`."""
    field_checks: Mapping[str, Callable[[Any], None]] = field(default_factory=dict)
    """OptimizerConfig field -> a check of its value (raises ValueError) that binds this optimiser only."""
    trial_check: Callable[[TrialConfig], tuple[str, str] | None] | None = None
    """A check of the whole trial, e.g. against the vocabulary: None, or (the field's place in
    the trial, "optimizer.rotate", and the message) for TrialConfig to raise as a FieldError."""
    unshardable: str | None = None
    """None when it trains FSDP-sharded parameters (each coordinate's update reads only that
    coordinate's gradient and state, so a shard updates alone); else why not, one clause
    ("its preconditioner needs whole matrices"). Such optimisers are refused under
    `resources.sharding: fsdp` rather than gathering each matrix every step: that all-gather
    costs a full copy of every matrix per step and gives back the memory sharding saved."""

    @property
    def shardable(self) -> bool:
        """It can train under FSDP (`unshardable` is None)."""
        return self.unshardable is None


OPTIMIZERS: dict[str, Optimizer] = {}
"""name -> entry, filled by the modules of study/optim/ when study.optim is imported (its __init__)."""


def register(entry: Optimizer) -> Optimizer:
    """Add `entry` (each name once, its family a FAMILIES key) and return it."""
    if entry.name in OPTIMIZERS:
        raise ValueError(f"optimiser {entry.name!r} is registered twice")
    if entry.family not in FAMILIES:
        raise ValueError(f"optimiser {entry.name!r}: family {entry.family!r} is not one of {list(FAMILIES)}")
    OPTIMIZERS[entry.name] = entry
    return entry


def optimizer_names() -> tuple[str, ...]:
    """Every registered name, by `order`."""
    return tuple(sorted(OPTIMIZERS, key=lambda n: OPTIMIZERS[n].order))


def optimizer_family(optimizer: OptimizerConfig, norm: str) -> str:
    """The FAMILIES entry of this optimiser training a model with this norm: what trains every
    parameter that lives in the residual basis (the entry's `family_for`, else its `family`)."""
    entry = OPTIMIZERS[optimizer.name]
    return entry.family_for(optimizer, norm) if entry.family_for else entry.family


def runs_columns(optimizer: OptimizerConfig) -> dict[str, Any]:
    """The OPTIMIZER_COLUMNS of this optimiser's runs row, in order; null where it does not apply."""
    entry = OPTIMIZERS[optimizer.name]
    row = {c: read(optimizer) if _COLUMN_FIELD.get(c, c) in entry.reads else None for c, read in OPTIMIZER_COLUMNS.items()}
    row.update(entry.columns(optimizer) if entry.columns else {})
    return row


def sharding_problem(name: str, place: str = "resources.sharding") -> str | None:
    """Why optimiser `name` cannot train FSDP-sharded (one line, naming the spec's `place` that asks
    for fsdp), or None when it can."""
    entry = OPTIMIZERS[name]
    if entry.shardable:
        return None
    return f"{name} cannot train sharded ({place}: fsdp): {entry.unshardable}; use sharding: ddp"
