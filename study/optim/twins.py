"""Rotated twins: `rotated_<name>` is per-coordinate optimiser <name>'s own rule run in a fixed
Haar-random basis per parameter (rules.rotated_basis.RotatedBasis), the primary contrast of a
per-coordinate optimiser (its rule with and without a privileged basis, paired by seed).

A twin's entry is its base's (dataclasses.replace: fields added to `Optimizer` carry over), with
family fixed_random_basis, its config the base's fields and `rotate` ("residual": only dims of
size d_model, never a vocabulary or position index; "all": every dim), and its builder the
base's builder, wrapped. Adam's twin is rotated_adam (rotated_adam.py), which keeps its ids.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model

import study.optim.adafactor  # noqa: F401  (the bases register first)
import study.optim.sign  # noqa: F401
from study.optim.registry import OPTIMIZERS, Optimizer, OptimizerConfig, Trial, register
from study.optim.rotated_adam import check_vocab

if TYPE_CHECKING:
    from torch import nn

__all__ = ["TWINS", "RotatedAdafactorConfig", "RotatedLionConfig", "RotatedSignSGDConfig", "twin"]

TWINS = ("adafactor", "lion", "signsgd")
"""The per-coordinate optimisers whose twin is built here (adam's is rotated_adam)."""

_ORDER = 100
"""A twin's order is its base's plus this: the twins follow every other name, as their bases do."""


class _AsBase:
    """The trial as the base's builder sees it: its optimizer is the base's config, the rest
    (model, seed, vocab_size, anything a builder reads) is the trial's."""

    def __init__(self, trial: Trial, optimizer: OptimizerConfig) -> None:
        self._trial, self.optimizer = trial, optimizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)


def base_config(optimizer: OptimizerConfig, base: str) -> OptimizerConfig:
    """The base optimiser's config with a twin's fields (all but rotate)."""
    return OPTIMIZERS[base].config.model_validate({**optimizer.model_dump(exclude={"rotate"}), "name": base})


def twin(base: str) -> Optimizer:
    """`rotated_<base>`'s entry, derived from the registered entry of `base`."""
    entry, name = OPTIMIZERS[base], f"rotated_{base}"
    config = create_model(
        f"Rotated{entry.config.__name__}", __base__=entry.config, __module__=__name__,
        __doc__=f"{base} in a fixed random basis per parameter: {base}'s fields, and which dimensions turn.",
        name=(Literal[name], name),
        rotate=(Literal["all", "residual"], Field("residual", description="Rotate every dimension, or only those of size d_model.")),
    )

    config.own_columns = ("rotate",)  # besides its base's

    def build(cfg: Trial, model: nn.Module):
        from study.optim.rules.groups import index_dims
        from study.optim.rules.rotated_basis import RotatedBasis

        o = cfg.optimizer
        inner = entry.build(_AsBase(cfg, base_config(o, base)), model)
        return RotatedBasis(inner, rotate=o.rotate, d_model=cfg.model.d_model, seed=cfg.seed,
                            index_dims=index_dims(model, cfg.vocab_size))

    def trial_check(cfg: Trial) -> tuple[str, str] | None:
        if problem := check_vocab(cfg):
            return problem
        return entry.trial_check(_AsBase(cfg, base_config(cfg.optimizer, base))) if entry.trial_check else None

    return dataclasses.replace(
        entry, name=name, order=entry.order + _ORDER, family="fixed_random_basis", config=config, build=build,
        family_for=None, trial_check=trial_check,
        unshardable="its update lives in a rotated basis that mixes every row and column of a matrix")


# Module attributes, so that a config pickles (Ray sends trials to its workers).
RotatedAdafactorConfig = register(twin("adafactor")).config
RotatedLionConfig = register(twin("lion")).config
RotatedSignSGDConfig = register(twin("signsgd")).config
