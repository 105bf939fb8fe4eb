"""lion: sign of an interpolated momentum (rules.lion.Lion); signsgd: Lion with b1 = b2 =
momentum, the sign of a momentum. Both move every coordinate by exactly lr."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from study.optim.registry import Optimizer, OptimizerConfig, Trial, register

if TYPE_CHECKING:
    from torch import nn


__all__ = ["LionConfig", "SignSGDConfig", "build_lion", "build_signsgd"]


class LionConfig(OptimizerConfig):
    """Lion."""

    name: Literal["lion"] = "lion"
    betas: tuple[float, float] = (0.9, 0.95)
    """The interpolation rate of the update and the momentum's decay rate."""

    own_columns: ClassVar[tuple[str, ...]] = ("beta1", "beta2")


class SignSGDConfig(OptimizerConfig):
    """signSGD with momentum: the sign of a momentum."""

    name: Literal["signsgd"] = "signsgd"
    momentum: float = Field(default=0.9, ge=0, lt=1)
    """The decay rate of the momentum whose sign is the update."""

    own_columns: ClassVar[tuple[str, ...]] = ("momentum",)


def _lion(model: nn.Module, lr: float, betas: tuple[float, float], weight_decay: float,
          scales: dict[str, float] | None = None):
    from study.optim.rules.groups import decay_groups
    from study.optim.rules.lion import Lion

    return Lion(decay_groups(model, weight_decay, scales, lr), lr=lr, betas=betas, weight_decay=weight_decay)


def build_lion(cfg: Trial, model: nn.Module):
    from study.optim.rules.groups import mup_scales

    o = cfg.optimizer
    return _lion(model, o.lr, o.betas, o.weight_decay, mup_scales(cfg))


def build_signsgd(cfg: Trial, model: nn.Module):
    from study.optim.rules.groups import mup_scales

    o = cfg.optimizer
    return _lion(model, o.lr, (o.momentum, o.momentum), o.weight_decay, mup_scales(cfg))


register(Optimizer("lion", order=7, family="per_coordinate", config=LionConfig, build=build_lion, mup="adam"))
register(Optimizer("signsgd", order=8, family="per_coordinate", config=SignSGDConfig, build=build_signsgd, mup="adam"))
