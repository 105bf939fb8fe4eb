"""sgd: torch SGD with momentum (optionally Nesterov); its update rotates with the basis."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from study.optim.registry import Optimizer, OptimizerConfig, Trial, register

if TYPE_CHECKING:
    from torch import nn


__all__ = ["SGDConfig", "build"]


class SGDConfig(OptimizerConfig):
    """SGD with momentum; weight decay added to the gradient (torch's, not decoupled)."""

    name: Literal["sgd"] = "sgd"
    momentum: float = Field(default=0.9, ge=0, lt=1)
    """Momentum."""
    nesterov: bool = False
    """Nesterov momentum."""

    own_columns: ClassVar[tuple[str, ...]] = ("momentum", "nesterov")


def build(cfg: Trial, model: nn.Module):
    import torch

    from study.optim.rules.groups import decay_groups, mup_scales

    o = cfg.optimizer
    return torch.optim.SGD(decay_groups(model, o.weight_decay, mup_scales(cfg), o.lr), lr=o.lr, momentum=o.momentum, nesterov=o.nesterov,
                           weight_decay=o.weight_decay)


register(Optimizer("sgd", order=2, family="rotation_equivariant", config=SGDConfig, build=build, mup="sgd"))
