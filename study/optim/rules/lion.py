"""Lion and signSGD: the update is the sign of a momentum, so every coordinate moves by lr."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["Lion"]


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023): the update is the sign of an interpolated momentum.

        u = sign(b1 m + (1 - b1) G) ;  W <- W (1 - lr wd) - lr u ;  m <- b2 m + (1 - b2) G

    With b1 = b2 = mu it is signSGD with momentum: u = sign(m_t), m_t = mu m + (1 - mu) G
    (`build_optimizer`'s "signsgd"). Every coordinate moves by exactly lr: maximally
    per-coordinate.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            (b1, b2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
            grads = [p.grad for p in ps]
            ms = []
            for p in ps:
                if "exp_avg" not in self.state[p]:
                    self.state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                ms.append(self.state[p]["exp_avg"])
            u = torch._foreach_lerp(ms, grads, 1 - b1)
            torch._foreach_sign_(u)
            if wd != 0:
                torch._foreach_mul_(ps, 1 - lr * wd)
            torch._foreach_add_(ps, u, alpha=-lr)
            torch._foreach_lerp_(ms, grads, 1 - b2)
        return loss
