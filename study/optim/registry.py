"""The optimiser registry: one `Optimizer` entry per name, registered by its own module in
study/optim/ (adam.py, sgd.py, ...) together with its config class, an `OptimizerConfig`
subclass holding that optimiser's fields only. Everything the config, the runs table and the
builder need to know about an optimiser is in its module, so adding one is one module there.

`OptimizerConfig` is a union discriminated by `name`: validating `{name: sgd, lr: 0.1}` against
it gives the registered SGDConfig. The registry, not a static `Union[...]`, picks the class, so
that a module registered later is a member too, and an error keeps its place in the spec
(`optimizer.lr`, not `optimizer.sgd.lr`).

Torch-free: study.config reads the names, families and configs from here when it is imported,
and a config validates without torch. Each entry's `build` imports torch when it is called.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from resultstore.schema import FAMILY_MEANING, Family, Role, declare_runs_column, role_of, runs_columns as schema_columns
from study.frozen import FieldError, _Frozen

__all__ = [
    "FAMILIES", "ID_FIELDS", "OPTIMIZERS", "PER_COORDINATE_GAINS", "WRITTEN", "Optimizer", "OptimizerConfig", "Trial",
    "optimizer_columns", "optimizer_family", "optimizer_names", "own_columns", "register", "runs_columns", "sharding_problem",
]  # fmt: skip

FAMILIES: dict[str, str] = {family.value: FAMILY_MEANING[family] for family in Family}
"""The runs column `optimizer_family`'s values (resultstore.schema.Family) and their meaning."""

PER_COORDINATE_GAINS = ("layernorm", "rmsnorm")
"""Norms with a gain (and bias) vector per coordinate; rmsnorm_scalar has one scalar gain."""

ID_FIELDS: dict[str, Any] = {
    "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.9, "nesterov": False, "rotate": "residual",
    "precondition_frequency": 10, "shampoo_beta": 0.95, "max_precond_dim": 4096, "muon_momentum": 0.95,
    "muon_lr_ratio": 1.0, "muon_adjust_lr": "match_rms_adamw", "muon_exclude": ["tok_emb.*", "pos_emb.*", "unembed.*"],
}  # fmt: skip
"""The fields (and defaults) of the one flat config every optimiser shared before each had its own
class: every stored trial_id hashes them all, so an optimiser's JSON still holds each one its class
lacks, at this value, and reading a stored config accepts (and drops) them there."""
_LATER_FIELDS = {"soap_vectors": "adam", "muon_ends": "adamw", "muon_ends_lr_ratio": 1.0}
"""Fields of that flat config that ids left out at their default (its id_optional)."""
WRITTEN = {"written": True}
"""The validation context of a config a user wrote (a spec's entry), not one read from a store:
`Model.model_validate(data, context=WRITTEN)` refuses a field its optimiser lacks at any value."""


class Trial(Protocol):
    """What an optimiser reads from the trial it trains (study.config.TrialConfig is one)."""

    @property
    def optimizer(self) -> Any: ...
    @property
    def model(self) -> Any: ...
    @property
    def seed(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...


class OptimizerConfig(_Frozen):
    """An optimiser and its hyper-parameters: the named optimiser's own config class (each
    registered with its module in study/optim/), chosen by `name`. Every optimiser has these."""

    name: str
    """adam (AdamW), sgd (momentum), rotated_adam (Adam moments in a fixed random basis), soap
    (Adam in Shampoo's eigenbasis), muon (orthogonalised momentum on hidden matrices, AdamW on
    the rest), adafactor (factored second moments), lion, signsgd (sign of a momentum)."""
    lr: float = Field(gt=0)
    """Peak learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay (AdamW style for every optimiser but sgd), on ndim >= 2 only."""

    chooses_by_name: ClassVar[bool] = True
    """Validating against this class gives the named optimiser's class (set on a class itself, not
    inherited: the optimisers' own classes validate as themselves)."""
    id_fill: ClassVar[dict[str, Any]] = ID_FIELDS
    own_columns: ClassVar[tuple[str, ...]] = ()
    """The runs columns of its own hyper-parameters (a field's name, or beta1 and beta2 for betas),
    besides those of the classes it derives from: `register` declares each in resultstore.schema
    with the role `hyper`, the writer stamps it in every runs file, and any reader learns it there.
    The built-in optimisers' columns (momentum .. muon_ends) are declared this way too."""
    column_fields: ClassVar[tuple[str, ...]] = ("betas",)
    """Fields whose values differently named runs columns hold (betas: beta1 and beta2)."""

    @classmethod
    def chosen(cls, config: type[OptimizerConfig]) -> type[OptimizerConfig]:
        """The class a value naming `config`'s optimiser validates as (a spec entry adds its rules)."""
        return config

    @model_validator(mode="wrap")
    @classmethod
    def _by_name(cls, data: Any, handler: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict):
            if cls.__dict__.get("chooses_by_name"):
                name = data.get("name")
                if "name" not in data:
                    return handler({k: v for k, v in data.items() if k in ("name", "lr")})  # name: Field required
                if not isinstance(name, str) or name not in OPTIMIZERS:
                    names = [repr(n) for n in optimizer_names()]
                    expected = f"{', '.join(names[:-1])} or {names[-1]}"
                    raise ValidationError.from_exception_data(cls.__name__, [InitErrorDetails(
                        type="literal_error", loc=("name",), input=name, ctx={"expected": expected})])
                return cls.chosen(OPTIMIZERS[name].config).model_validate(data, context=info.context)
            data = cls._applicable(data, written=bool((info.context or {}).get("written")))
        return handler(data)

    @classmethod
    def _applicable(cls, data: dict, written: bool = False) -> dict:
        """`data` without the fields of the old flat config that this optimiser lacks and that hold
        the value every stored config carries; any other field it lacks is refused at its place.
        `written` (a spec's entry, context WRITTEN): every field it lacks is refused, at any value."""
        fields, problems, out = cls.model_fields, [], {}
        old = {**ID_FIELDS, **_LATER_FIELDS}
        for key, value in data.items():
            if key in fields:
                out[key] = value
            elif key in old and _plain(value) == old[key] and not written:
                continue
            else:
                known = any(key in e.config.model_fields for e in OPTIMIZERS.values()) or key in old
                what = f"{key} does not apply to {data.get('name')}" if known else "unknown key"
                problems.append(InitErrorDetails(
                    type=PydanticCustomError("value_error", "{what} (expected one of: {fields})",
                                             {"what": what, "fields": ", ".join(fields)}),
                    loc=(key,), input=value))
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return out

    @model_validator(mode="after")
    def _check_pairs(self) -> OptimizerConfig:
        betas = getattr(self, "betas", None)
        if betas is not None and not all(0 <= b < 1 for b in betas):
            raise FieldError("betas", f"betas must lie in [0, 1), got {list(betas)}")
        if getattr(self, "nesterov", False) and getattr(self, "momentum", None) == 0:
            raise FieldError("nesterov", "nesterov needs momentum > 0")
        return self

    def runs_columns(self) -> dict[str, Any]:
        """Its hyper-parameter columns of the runs row: each field that is a runs column by name
        (lr, momentum, ..., its own_columns), betas as beta1 and beta2."""
        out: dict[str, Any] = {}
        for field in type(self).model_fields:
            if field == "betas":
                out["beta1"], out["beta2"] = self.betas
            elif role_of(field) is Role.HYPER:
                out[field] = getattr(self, field)
        return out

    def label_options(self) -> dict[str, Any]:
        """Its fields that the runs row holds in no column (shampoo_beta, muon_lr_ratio, ...): what
        a trial's label may name besides its runs columns."""
        held = {"name", *type(self).column_fields}
        return {f: getattr(self, f) for f in type(self).model_fields if f not in held and role_of(f) is None}


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Optimizer:
    """One optimiser: its name, its config class, its family and how it is built."""

    name: str
    """`optimizer.name` in a spec."""
    order: int
    """Its place in the list of names (the validation message for an unknown name lists them)."""
    family: str
    """Its rule on a hidden matrix: a Family value. The runs column may differ (see `family_for`)."""
    config: type[OptimizerConfig]
    """Its config class: an OptimizerConfig subclass with `name: Literal[<name>]` and its fields."""
    build: Callable[[Trial, Any], Any]
    """(cfg, model) -> the optimiser over model's trainable parameters, group "lr" at the peak."""
    family_for: Callable[[Any, str], str] | None = None
    """(its config, norm) -> the runs column `optimizer_family`, when not simply `family`."""
    trial_check: Callable[[Trial], tuple[str, str] | None] | None = None
    """A check of the whole trial, e.g. against the vocabulary: None, or (the field's place in
    the trial, "optimizer.rotate", and the message) for TrialConfig to raise as a FieldError."""
    unshardable: str | None = None
    """None when it trains FSDP-sharded parameters (each coordinate's update reads only that
    coordinate's gradient and state, so a shard updates alone); else why not, one clause
    ("its preconditioner needs whole matrices"). Such optimisers are refused under
    `resources.sharding: fsdp` rather than gathering each matrix every step: that all-gather
    costs a full copy of every matrix per step and gives back the memory sharding saved."""

    mup: Literal["adam", "adafactor", "sgd", "muon"] | None = None
    """Its muP lr rule (study/optim/rules/groups.py's MUP_EXPONENTS: the lr multiplier of each
    parameter role as a power of the width multiplier), or None where none is published:
    `model.parametrization: mup` is then refused at config time."""

    @property
    def shardable(self) -> bool:
        """It can train under FSDP (`unshardable` is None)."""
        return self.unshardable is None


OPTIMIZERS: dict[str, Optimizer] = {}
"""name -> entry, filled by the modules of study/optim/ when study.optim is imported (its __init__)."""

_KINDS = {float: "float", int: "int", bool: "bool", str: "string"}


_SPLIT = {"beta1": "betas", "beta2": "betas"}
"""Runs columns that hold one element of a config field (a tuple)."""


def own_columns(config: type[OptimizerConfig]) -> tuple[str, ...]:
    """The runs columns `config` declares: the own_columns of it and of every class it derives
    from, base classes' first."""
    return tuple(dict.fromkeys(c for k in reversed(config.__mro__) for c in vars(k).get("own_columns", ())))


def _column_kind(config: type[OptimizerConfig], column: str) -> str:
    """The runs column type of a config field: float, int, bool, or string (a str or string Literal);
    beta1 and beta2 an element of betas's."""
    field = column if column in config.model_fields else _SPLIT.get(column)
    if field not in config.model_fields:
        raise ValueError(f"{config.__name__}: own column {column!r} is not one of its fields")
    annotation = config.model_fields[field].annotation
    if field != column:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is Literal:
        annotation = type(typing.get_args(annotation)[0])
    if annotation not in _KINDS:
        raise ValueError(f"{config.__name__}.{column}: a runs column holds a number, bool or string, not {annotation}")
    return _KINDS[annotation]


def register(entry: Optimizer) -> Optimizer:
    """Add `entry` (each name once, its family a Family value, its config naming it) and declare
    its config's own_columns (`own_columns`) in the runs table; return it."""
    if entry.name in OPTIMIZERS:
        raise ValueError(f"optimiser {entry.name!r} is registered twice")
    if entry.family not in FAMILIES:
        raise ValueError(f"optimiser {entry.name!r}: family {entry.family!r} is not one of {list(FAMILIES)}")
    if entry.config.model_fields["name"].annotation != Literal[entry.name]:
        raise ValueError(f"optimiser {entry.name!r}: its config's name must be Literal[{entry.name!r}]")
    for column in own_columns(entry.config):
        declare_runs_column(column, _column_kind(entry.config, column), Role.HYPER)
    OPTIMIZERS[entry.name] = entry
    return entry


def optimizer_names() -> tuple[str, ...]:
    """Every registered name, by `order`."""
    return tuple(sorted(OPTIMIZERS, key=lambda n: OPTIMIZERS[n].order))


def optimizer_family(optimizer: OptimizerConfig, norm: str) -> str:
    """The Family value of this optimiser training a model with this norm: what trains every
    parameter that lives in the residual basis (the entry's `family_for`, else its `family`)."""
    entry = OPTIMIZERS[optimizer.name]
    return entry.family_for(optimizer, norm) if entry.family_for else entry.family


def optimizer_columns() -> tuple[str, ...]:
    """The runs table's hyper-parameter columns besides lr and weight_decay, in its order
    (momentum .. muon_ends, then any other an optimiser module declared or a store read stamped)."""
    return tuple(c for c in schema_columns() if role_of(c) is Role.HYPER and c not in ("lr", "weight_decay"))


def runs_columns(optimizer: OptimizerConfig) -> dict[str, Any]:
    """`optimizer_columns` of this optimiser's runs row, in order; null where it does not apply."""
    own = optimizer.runs_columns()
    return {c: own.get(c) for c in optimizer_columns()}


def sharding_problem(name: str, place: str = "resources.sharding") -> str | None:
    """Why optimiser `name` cannot train FSDP-sharded (one line, naming the spec's `place` that asks
    for fsdp), or None when it can."""
    entry = OPTIMIZERS[name]
    if entry.shardable:
        return None
    return f"{name} cannot train sharded ({place}: fsdp): {entry.unshardable}; use sharding: ddp"
