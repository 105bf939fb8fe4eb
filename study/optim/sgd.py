"""sgd: torch SGD with momentum (optionally Nesterov); its update rotates with the basis."""

from __future__ import annotations

from typing import TYPE_CHECKING

from study.optim.registry import Optimizer, register

if TYPE_CHECKING:
    from torch import nn

    from study.config import TrialConfig


__all__ = ["build"]


def build(cfg: TrialConfig, model: nn.Module):
    import torch

    from study.optim.rules.groups import decay_groups

    o = cfg.optimizer
    return torch.optim.SGD(decay_groups(model, o.weight_decay), lr=o.lr, momentum=o.momentum, nesterov=o.nesterov,
                           weight_decay=o.weight_decay)


register(Optimizer("sgd", order=2, family="rotation_equivariant", reads=("momentum", "nesterov", "weight_decay"),
                   build=build))
