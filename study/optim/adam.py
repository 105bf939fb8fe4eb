"""adam: torch AdamW (decoupled weight decay; default 0). Fused on CUDA, foreach on CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from study.optim.registry import Optimizer, OptimizerConfig, Trial, register

if TYPE_CHECKING:
    from torch import nn


__all__ = ["AdamConfig", "build"]


class AdamConfig(OptimizerConfig):
    """AdamW."""

    name: Literal["adam"] = "adam"
    betas: tuple[float, float] = (0.9, 0.95)
    """Moment decay rates."""
    eps: float = Field(default=1e-8, gt=0)
    """Denominator epsilon."""

    own_columns: ClassVar[tuple[str, ...]] = ("eps", "beta1", "beta2")


def build(cfg: Trial, model: nn.Module):
    import torch

    from study.optim.rules.groups import decay_groups, mup_scales

    o = cfg.optimizer
    # Fused on CUDA (one kernel for every parameter); foreach on CPU keeps the reference path.
    fused = all(p.is_cuda for p in model.parameters()) or None
    return torch.optim.AdamW(decay_groups(model, o.weight_decay, mup_scales(cfg), o.lr), lr=o.lr, betas=o.betas, eps=o.eps,
                             weight_decay=o.weight_decay, fused=fused)


register(Optimizer("adam", order=1, family="per_coordinate", config=AdamConfig, build=build, mup="adam"))
