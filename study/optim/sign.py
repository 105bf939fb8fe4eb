"""lion: sign of an interpolated momentum (rules.lion.Lion); signsgd: Lion with b1 = b2 =
momentum, the sign of a momentum. Both move every coordinate by exactly lr."""

from __future__ import annotations

from typing import TYPE_CHECKING

from study.optim.registry import Optimizer, register

if TYPE_CHECKING:
    from torch import nn

    from study.config import TrialConfig


__all__ = ["build_lion", "build_signsgd"]


def _lion(model: nn.Module, lr: float, betas: tuple[float, float], weight_decay: float):
    from study.optim.rules.groups import decay_groups
    from study.optim.rules.lion import Lion

    return Lion(decay_groups(model, weight_decay), lr=lr, betas=betas, weight_decay=weight_decay)


def build_lion(cfg: TrialConfig, model: nn.Module):
    o = cfg.optimizer
    return _lion(model, o.lr, o.betas, o.weight_decay)


def build_signsgd(cfg: TrialConfig, model: nn.Module):
    o = cfg.optimizer
    return _lion(model, o.lr, (o.momentum, o.momentum), o.weight_decay)


register(Optimizer("lion", order=7, family="per_coordinate", reads=("betas", "weight_decay"), build=build_lion))
register(Optimizer("signsgd", order=8, family="per_coordinate", reads=("momentum", "weight_decay"), build=build_signsgd))
