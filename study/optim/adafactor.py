"""adafactor: torch Adafactor (factored second moments, relative step size)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from study.optim.registry import Optimizer, OptimizerConfig, Trial, register

if TYPE_CHECKING:
    from torch import nn


__all__ = ["AdafactorConfig", "build"]


class AdafactorConfig(OptimizerConfig):
    """Adafactor: lr and weight decay only (torch's defaults for the rest)."""

    name: Literal["adafactor"] = "adafactor"


def build(cfg: Trial, model: nn.Module):
    import torch

    from study.optim.rules.groups import decay_groups, mup_scales

    o = cfg.optimizer
    return torch.optim.Adafactor(decay_groups(model, o.weight_decay, mup_scales(cfg), o.lr), lr=o.lr, weight_decay=o.weight_decay)


register(Optimizer("adafactor", order=6, family="per_coordinate", config=AdafactorConfig, build=build, mup="adafactor",
                   unshardable="its factored second moments average whole rows and columns of each matrix"))
