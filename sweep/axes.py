"""The grid's axes, each declared once: its spec key, the type of one value, its default, where
the value goes in the TrialConfig, its label, the runs columns that hold it and how `sweep next`
writes it back. The spec schema (Grid), expansion, the whole-grid checks, `sweep plan`'s table
and `sweep next` loop over AXES; a new axis is its config module (study/) and one entry here.

Expansion order is AXES' order, the replicate axis (seed) innermost: model, optimizer, norm,
attention, rotation, seed, as every stored sweep was expanded. An axis added later goes after
rotation (and before the seeds), and has a default, so every earlier spec expands as before."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from study.attention import AttentionConfig
from study.config import ModelConfig, NormName, OptimizerConfig, RotationConfig, TrialConfig

__all__ = ["AXES", "Axis", "axis", "grid_axes", "point_axes", "replicate"]


def _dump(value: Any, first: str | None = None) -> Any:
    """A config value as a spec writes it: its fields that differ from their defaults (`first`,
    e.g. the name, always and first); a plain value as it is."""
    if not hasattr(value, "model_dump"):
        return value
    lead = {first: getattr(value, first)} if first else {}
    return {**lead, **value.model_dump(mode="json", exclude_defaults=True, exclude=set(lead))}


@dataclass(frozen=True)
class Axis:
    """One grid axis."""

    key: str
    """Its key under the spec's `grid:` (and its name everywhere else)."""
    type: Any
    """The type of one value (the Grid validates each entry as this)."""
    doc: str
    """What the axis is, for the spec's schema."""
    field: str = ""
    """Where a value goes in the TrialConfig: a field (`norm`) or a dotted path into a part
    (`train.lr_schedule`); the key when empty."""
    default: tuple | None = None
    """The values where a spec leaves the axis out (None: the spec must give it). A later axis
    defaults to the value every earlier trial ran, so their specs expand to the same trials."""
    columns: tuple[str, ...] = ()
    """The runs columns that hold it (TrialConfig.flat() fills them; the first is the one that
    labels and charts name); the key when empty."""
    label: Callable[[Any], str] = str
    """A value in a few characters (`sweep plan`'s column, `sweep next`'s file names)."""
    write: Callable[[Any], Any] = _dump
    """A value as a spec writes it (`sweep next`); an entry's fields at their defaults left out."""
    plan_always: bool = False
    """`sweep plan` shows its column for every grid (else only where a trial is off its default)."""
    next_always: bool = False
    """`sweep next` writes it at its default too (else only where the trials left it)."""
    ladders: bool = False
    """An entry's field given as a list is a ladder of points (the optimizer axis)."""
    replicate: bool = False
    """Replicates of every other point (the seeds): innermost, copied, never validated per value."""
    crosses_model: bool = False
    """Its values are checked against the model's (a problem names the grid.model entry too)."""

    @property
    def path(self) -> tuple[str, ...]:
        return tuple((self.field or self.key).split("."))

    def value(self, trial: TrialConfig) -> Any:
        """This axis's value in a trial."""
        out: Any = trial
        for part in self.path:
            out = getattr(out, part)
        return out

    def defaults(self) -> list | None:
        return None if self.default is None else list(self.default)


def _shape(m: ModelConfig) -> str:
    """d×L×h, and `mup b<base width>` under mup (the width study holds both at every width)."""
    return f"{m.d_model}×{m.n_layers}×{m.n_heads}" + (f" mup b{m.mup_base_width}" if m.parametrization == "mup" else "")


def _model(m: ModelConfig) -> dict:
    out = _dump(m)
    if out.get("d_mlp") == 4 * m.d_model:
        del out["d_mlp"]  # the default, written out by the validator
    return out


AXES: tuple[Axis, ...] = (
    Axis("model", ModelConfig, "Model shapes: {depth: n} or {d_model, n_layers, n_heads, d_mlp} (and "
         "parametrization sp or mup, with mup_base_width).",
         columns=("d_model", "n_layers", "n_heads", "d_mlp", "parametrization", "mup_base_width"),
         label=_shape, write=_model, plan_always=True, next_always=True),
    Axis("optimizer", OptimizerConfig, "Optimisers with their hyper-parameters. Any field may be a list, a ladder: "
         "`{name: sgd, lr: [0.1, 0.3, 1.0]}` is three grid points; for betas, a list of pairs. Several ladders in one "
         "entry give their cartesian product. `lr_scaling` moves the lr with model size (LrScaling). Holds the "
         "expanded entries once validated.",
         label=lambda o: o.name, write=lambda o: _dump(o, "name"), plan_always=True, next_always=True, ladders=True),
    Axis("norm", NormName, "Norm types.", default=("layernorm",), plan_always=True, next_always=True),
    Axis("attention", AttentionConfig, "Attention variants: softmax, softmax1, kv_bias, gated, {name: clipped, "
         "zeta, gamma} (study/attention.py); softmax where absent, so earlier specs expand as before.",
         default=(AttentionConfig(),), label=lambda a: a.label, write=lambda a: _dump(a, "name")),
    Axis("rotation", RotationConfig, "Rotation plans: none, shared, independent, {mode: partial, group_size: k}, "
         "{mode: groups, ...}.", default=(RotationConfig(),),
         columns=("rotation_label", "rotation", "group_size", "rotation_groups", "rotate_embeddings"),
         label=lambda r: r.label.replace(" ", ""), write=lambda r: _dump(r, "mode"), plan_always=True,
         crosses_model=True),
    Axis("seed", int, "Seeds: replicates of every other point.", default=(0,), plan_always=True, next_always=True,
         replicate=True),
)
"""Every grid axis, in expansion order (the replicate axis innermost wherever it is listed)."""


def grid_axes(axes: Sequence[Axis] | None = None) -> tuple[Axis, ...]:
    """The axes in expansion order: every other axis as declared, then the replicate axis."""
    axes = AXES if axes is None else tuple(axes)
    return (*(a for a in axes if not a.replicate), *(a for a in axes if a.replicate))


def point_axes() -> tuple[Axis, ...]:
    """The axes whose product is validated point by point (all but the replicate axis)."""
    return tuple(a for a in grid_axes() if not a.replicate)


def replicate() -> Axis:
    """The replicate axis (the seeds)."""
    return next(a for a in AXES if a.replicate)


def axis(key: str) -> Axis:
    """The axis of this spec key."""
    return next(a for a in AXES if a.key == key)
