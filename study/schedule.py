"""The learning-rate schedule: linear warmup from 0, then cosine or linear decay to a floor (or
constant), written into every param group at its "lr_scale" (muP's per-role multiplier) if it has one."""

from __future__ import annotations

import math

from study.config import TrialConfig

__all__ = ["lr_at", "set_lr"]


def lr_at(cfg: TrialConfig, step: int) -> float:
    """Peak lr times warmup (linear from 0) then cosine/linear decay to min_lr_ratio."""
    peak, total, warm = cfg.optimizer.lr, cfg.total_steps, cfg.warmup_steps
    if step < warm:
        return peak * (step + 1) / warm
    if cfg.train.lr_schedule == "constant" or total <= warm:
        return peak
    frac = (step - warm) / max(1, total - warm)
    floor = cfg.train.min_lr_ratio
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if cfg.train.lr_schedule == "cosine" else 1 - frac
    return peak * (floor + (1 - floor) * shape)


def set_lr(cfg: TrialConfig, param_groups: list[dict], step: int) -> float:
    """Each group's lr at `step`: lr_at, times the group's "lr_scale" where it has one (muP's
    groups; SP's have none, so their lr is lr_at's number itself). Returns lr_at's."""
    lr = lr_at(cfg, step)
    for group in param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr
    return lr
