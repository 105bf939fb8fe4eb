"""The learning-rate schedule: linear warmup from 0, then cosine or linear decay to a floor (or constant)."""

from __future__ import annotations

import math

from study.config import TrialConfig

__all__ = ["lr_at"]


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
