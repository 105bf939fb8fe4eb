"""The configs' common base: typed, frozen, unknown keys refused, numbers checked, and the rule
that keeps stored ids stable when a field is added (`id_optional`, `without_new_defaults`).

Torch-free, like every config module: study.config and study.attention build on it.
"""

from __future__ import annotations

import types
import typing
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

__all__ = ["INT64_MAX", "FieldError", "string_is", "without_new_defaults"]


INT64_MAX = 2**63 - 1
"""Largest integer the results store (int64 columns) can hold."""


class FieldError(ValueError):
    """A check across fields that belongs to one of them: `loc` ("train.eval_batch.seq_len" or
    a tuple, relative to the model raising it) lets the spec loader report that field's line."""

    def __init__(self, loc: str | tuple, message: str):
        super().__init__(message)
        self.loc = tuple(loc.split(".")) if isinstance(loc, str) else tuple(loc)


def _allows(annotation: Any, kind: type) -> bool:
    """Does `annotation` accept values of `kind` (through unions, containers and Literal members)?"""
    if annotation is kind:
        return True
    if typing.get_origin(annotation) is Literal:
        return any(type(a) is kind for a in typing.get_args(annotation))
    return any(_allows(a, kind) for a in typing.get_args(annotation) if not isinstance(a, (str, int, types.NoneType)))


def _numbers(value: Any, at: tuple = ()):
    """(place, number) for every number (and bool) in value, looking inside lists and tuples only."""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _numbers(v, at + (i,))
    elif isinstance(value, (int, float)):
        yield at, value


class _Frozen(BaseModel):
    """Typed, frozen, unknown keys refused; floats finite, no booleans where numbers go, and
    integers that fit the store's int64, for every field of every config."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    id_optional: ClassVar[tuple[str, ...]] = ()
    """Fields added after trials were stored: left out of the ids (and of config_json) while they
    hold their default, so every trial_id and config_id stored before them stays what it was.
    A new field of a config class is listed here (tests/test_config.py holds golden ids)."""
    id_fill: ClassVar[dict[str, Any]] = {}
    """Keys the ids (and config_json) hold at these values when the class has no such field: a
    field that moved to another class stays in every id it was hashed into (the optimisers'
    classes fill in the old flat optimiser config's fields, study.optim.registry.ID_FIELDS)."""

    @field_validator("*", mode="before")
    @classmethod
    def _strict_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        for at, v in _numbers(value):
            annotation = cls.__pydantic_fields__[info.field_name].annotation  # looked up only for numbers
            if isinstance(v, bool) and not _allows(annotation, bool):
                raise FieldError(at, "expected a number, not a boolean")
            if abs(v) > INT64_MAX and (isinstance(v, int) or not _allows(annotation, float)):
                raise FieldError(at, "must fit in a 64-bit integer (|x| <= 2**63 - 1), as the results store holds it")
        return value


def without_new_defaults(cfg: _Frozen, payload: dict) -> dict:
    """`payload` (cfg's JSON dump) without the `id_optional` fields that hold their default and
    with the `id_fill` keys it lacks, at every level. Modifies and returns `payload`."""
    fields = type(cfg).model_fields
    for name in type(cfg).id_optional:
        if name in payload and getattr(cfg, name) == fields[name].default:
            del payload[name]
    for name, value in type(cfg).id_fill.items():
        payload.setdefault(name, value)
    for name in fields:
        value = getattr(cfg, name)
        if isinstance(value, _Frozen) and isinstance(payload.get(name), dict):
            without_new_defaults(value, payload[name])
    return payload


def string_is(field: str) -> Any:
    """A config's shorthand: a bare string `x` is read as `{field: x}` (assign it in the class body:
    `_from_string = string_is("mode")`)."""

    def read(cls: type, data: Any) -> Any:
        return {field: data} if isinstance(data, str) else data

    return model_validator(mode="before")(classmethod(read))
