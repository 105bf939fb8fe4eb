"""Readable names, declared once: the recorded sites and bases (chart titles, legends, table
labels) and trial labels that name what varies within a sweep (progress lines, `sweep status`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from resultstore.schema import Role, runs_columns
from resultstore.vocabulary import Basis, Site

ENDS = ("ends in bases of their own", "ends in the group's basis", "ends unrotated")
"""Where a partial rotation's ends (the embedding's write, the unembedding's read) compute, as
``analysis.selection.group_size_table`` names them, in the order a chart's panels take."""

# label_rows and labels_for take sweep's Trial objects: they serve sweep's CLI, not analysis's public surface
__all__ = ["BASIS_SERIES", "SITE_NAMES", "label_axes", "trial_label", "trial_labels", "varying_axes"]

SITE_NAMES = {
    (Site.RESID, Basis.STORED): "residual stream",
    (Site.RESID, Basis.RANDOM): "residual stream, random basis",
    (Site.ATTN_IN, Basis.COMPUTATION): "attention input",
    (Site.MLP_IN, Basis.COMPUTATION): "MLP input",
    (Site.MLP_ACT, Basis.NEURON): "MLP neurons",
    (Site.MODEL, Basis.COMPUTATION): "model",
    (Site.ATTN, Basis.HEADS): "attention pattern",
    (Site.ATTN, Basis.UNIFORM): "uniform causal attention",
}
"""A site (and basis) in words, e.g. in ``kurtosis − control, residual stream``."""

BASIS_SERIES = {
    (Site.RESID, Basis.STORED): "residual, stored basis",
    (Site.RESID, Basis.RANDOM): "residual, random basis",
    (Site.ATTN_IN, Basis.COMPUTATION): "attention input, computation basis",
    (Site.MLP_IN, Basis.COMPUTATION): "MLP input, computation basis",
}
"""The (site, basis) series ``queries.basis_comparison`` compares, with their legend names
(in legend order)."""


OPTIMIZER = "optimizer"


def label_axes() -> tuple[str, ...]:
    """The flat runs columns (``TrialConfig.flat()``) a trial label may name, in label order, from
    the schema's roles: the model's shape, the optimiser and its hyper-parameters, the other axes
    (norm, attention, rotation_label), the data and the seed. Read at call time, so a
    hyper-parameter column an optimiser module declares, or a store read stamps, counts too. Options of an optimiser
    that no column holds (``muon_lr_ratio``, ``shampoo_beta``, ...) go after its hyper-parameters."""
    axes = [a for a in runs_columns(Role.AXIS) if a != OPTIMIZER]
    return (*runs_columns(Role.SHAPE), OPTIMIZER, *runs_columns(Role.HYPER), *axes, *runs_columns(Role.DATA),
            *runs_columns(Role.SEED))

_WITHIN = {"optimizer": (), "d_mlp": ("optimizer", "d_model"), "n_heads": ("optimizer", "d_model")}
"""An axis varies when it takes several values among trials equal in these columns (default: the
optimiser); d_mlp and n_heads that change only with d_model (d_mlp = 4 d_model by default) add
nothing to its label."""


def _bare() -> tuple[str, ...]:
    """Values that name themselves ("sgd", not "optimizer sgd"): the schema's axes."""
    return runs_columns(Role.AXIS)


def _axes_of(options: Iterable[str]) -> list[str]:
    axes = label_axes()
    at = axes.index(runs_columns(Role.HYPER)[-1]) + 1
    return [*axes[:at], *sorted(set(options) - set(axes)), *axes[at:]]


def _key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _varying(rows: Sequence[Mapping[str, Any]], options: Iterable[str]) -> dict[str, set[tuple]]:
    """axis -> the groups (values of its ``_WITHIN`` columns) in which it takes several values."""
    out: dict[str, set[tuple]] = {}
    for axis in _axes_of(options):
        within = _WITHIN.get(axis, ("optimizer",))
        groups: dict[tuple, set] = {}
        for r in rows:
            if r.get(axis) is not None:
                groups.setdefault(tuple(_key(r.get(c)) for c in within), set()).add(_key(r[axis]))
        varying = {g for g, values in groups.items() if len(values) > 1}
        if varying:
            out[axis] = varying
    return out


def varying_axes(rows: Sequence[Mapping[str, Any]], options: Iterable[str] = ()) -> list[str]:
    """The axes (``label_axes()`` and optimiser options) that take more than one value among
    ``rows`` (flat run columns, one mapping per trial). An optimiser's hyper-parameter varies
    when it differs between trials of the same optimiser: adam at 3e-3 beside sgd at 0.3 is told
    apart by the optimiser alone, an sgd lr ladder is not; d_mlp that grows with d_model is not
    named beside it. Nulls (an option that does not apply) never count as a value.
    ``options``: further keys of ``rows`` to consider: an optimiser's options that no runs column
    holds (``sweep.progress.label_rows`` gives them)."""
    return list(_varying(rows, options))


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_value(v) for v in value)
    return str(value)


def trial_label(row: Mapping[str, Any], axes: Sequence[str], *, sep: str = " · ") -> str:
    """``row`` named by ``axes`` (from ``varying_axes``), e.g. ``d_model 64 · sgd · lr 0.3``;
    an axis that does not apply to this trial (null) is left out."""
    parts, bare = [], _bare()
    for axis in axes:
        value = row.get(axis)
        if value is not None:
            parts.append(_value(value) if axis in bare else f"{axis} {_value(value)}")
    return sep.join(parts)


def trial_labels(rows: Sequence[Mapping[str, Any]], options: Iterable[str] = (), *, sep: str = " · ") -> list[str]:
    """One label per row naming the axes that vary among ``rows`` (``varying_axes``), each where
    it varies: an adam beta2 ladder beside muon names beta2 on the adam trials only. "" for every
    row when nothing varies (a one-trial sweep). ``options``: see ``varying_axes``."""
    varying = _varying(rows, options)
    out = []
    for r in rows:
        axes = [a for a, groups in varying.items()
                if tuple(_key(r.get(c)) for c in _WITHIN.get(a, ("optimizer",))) in groups]
        out.append(trial_label(r, axes, sep=sep))
    return out


def label_rows(trials: Sequence[Any]) -> tuple[list[dict], list[str]]:
    """Each trial's flat columns plus the options of its own optimiser that no runs column holds
    (muon_lr_ratio, shampoo_beta, ...: its config's label_options), and the names of those
    options: the input of trial_labels. Duck-typed over study.config.TrialConfig."""
    rows, options = [], set()
    for t in trials:
        own = t.optimizer.label_options()
        options |= set(own)
        rows.append({**t.flat(), **own})
    return rows, sorted(options)


def labels_for(trials: Sequence[Any]) -> dict[str, str]:
    """trial_id -> a label naming every axis that varies among `trials` (and no other)."""
    rows, options = label_rows(trials)
    return dict(zip((t.trial_id for t in trials), trial_labels(rows, options), strict=True))
