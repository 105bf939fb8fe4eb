"""adam: torch AdamW (decoupled weight decay; default 0). Fused on CUDA, foreach on CPU."""

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
    # Fused on CUDA (one kernel for every parameter); foreach on CPU keeps the reference path.
    fused = all(p.is_cuda for p in model.parameters()) or None
    return torch.optim.AdamW(decay_groups(model, o.weight_decay), lr=o.lr, betas=o.betas, eps=o.eps,
                             weight_decay=o.weight_decay, fused=fused)


register(Optimizer("adam", order=1, family="per_coordinate", reads=("betas", "eps", "weight_decay"), build=build))
