"""adafactor: torch Adafactor (factored second moments, relative step size)."""

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
    return torch.optim.Adafactor(decay_groups(model, o.weight_decay), lr=o.lr, weight_decay=o.weight_decay)


register(Optimizer("adafactor", order=6, family="per_coordinate", reads=("weight_decay",), build=build,
                   unshardable="its factored second moments average whole rows and columns of each matrix"))
