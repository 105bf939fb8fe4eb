"""Muon on the hidden matrices, another optimiser (AdamW by default) on the ends, as one optimiser."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["MuonAdamW", "muon_adamw"]


class MuonAdamW:
    """torch.optim.Muon on the hidden 2-D matrices, another optimiser (`ends`: AdamW, SGD or
    RotatedAdam) on everything else, as one optimiser: `param_groups` lists Muon's groups then
    the ends' (the same dicts, so a scheduler writing group["lr"] reaches both); every group
    carries "lr_ratio", the multiple of that lr it steps with. state_dict() holds both (the
    ends' under "adamw", whatever trains them, so older checkpoints load)."""

    def __init__(self, muon: torch.optim.Optimizer, ends: torch.optim.Optimizer | None) -> None:
        self.muon, self.ends = muon, ends
        self._parts = [o for o in (muon, ends) if o is not None]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self._parts for g in o.param_groups]

    @property
    def state(self) -> dict[Tensor, Any]:
        return {p: s for o in self._parts for p, s in o.state.items()}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self._parts:
            peaks = [g["lr"] for g in part.param_groups]
            for g in part.param_groups:
                g["lr"] = g["lr"] * g.get("lr_ratio", 1.0)
            try:
                part.step()
            finally:
                for g, lr in zip(part.param_groups, peaks):
                    g["lr"] = lr
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self._parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": None if self.ends is None else self.ends.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        if self.ends is not None:
            self.ends.load_state_dict(state_dict["adamw"])


def muon_adamw(model: nn.Module, *, lr: float, lr_ratio: float = 1.0, momentum: float = 0.95,
               adjust_lr: str = "match_rms_adamw", betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
               weight_decay: float = 0.0, exclude: Sequence[str] = (),
               ends: Callable[[list[dict[str, Any]]], torch.optim.Optimizer] | None = None,
               ends_lr_ratio: float = 1.0) -> MuonAdamW:
    """Muon for every trainable 2-D parameter whose name matches no glob in `exclude`; the rest
    (decay on ndim >= 2 only, at ends_lr_ratio x lr) to `ends(groups)`, AdamW(lr, betas, eps,
    weight_decay) if None. Raises ValueError when Muon would get nothing."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matrices = [(n, p) for n, p in named if p.ndim == 2 and not any(fnmatch.fnmatchcase(n, g) for g in exclude)]
    if not matrices:
        raise ValueError(f"optimizer.muon_exclude: no 2-D parameter is left for Muon (excluded: {list(exclude)}; "
                         f"2-D parameters: {[n for n, p in named if p.ndim == 2]})")
    taken = {id(p) for _, p in matrices}
    rest = [(n, p) for n, p in named if id(p) not in taken]
    muon = torch.optim.Muon([{"params": matrices, "lr_ratio": lr_ratio}], lr=lr, weight_decay=weight_decay,
                            momentum=momentum, nesterov=True, adjust_lr_fn=adjust_lr)
    groups = [g for g in ({"params": [(n, p) for n, p in rest if p.ndim >= 2], "weight_decay": weight_decay},
                          {"params": [(n, p) for n, p in rest if p.ndim < 2], "weight_decay": 0.0}) if g["params"]]
    for g in groups:
        g["lr_ratio"] = ends_lr_ratio
    if ends is None:
        ends = lambda gs: torch.optim.AdamW(gs, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)  # noqa: E731
    return MuonAdamW(muon, ends(groups) if groups else None)
