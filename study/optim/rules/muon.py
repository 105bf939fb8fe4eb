"""Muon on the hidden matrices, another optimiser (AdamW by default) on the ends, as one optimiser."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["EquivariantMuon", "MuonAdamW", "muon_adamw", "newton_schulz"]


def newton_schulz(g: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """torch.optim.Muon's quintic Newton-Schulz orthogonalisation of a matrix, computed in g's own
    dtype (at least float32) instead of bfloat16.

    Orthogonalisation commutes with rotations (NS(Q^T G P) = Q^T NS(G) P for orthogonal Q, P), so
    Muon is rotation-equivariant, but only up to the rounding of the dtype it runs in: rounding is
    per coordinate of the parameter's basis, one side of which is the residual stream's. In
    bfloat16 (torch's choice) a float64 model trained from a rotated init drifts from the rotated
    run by ~6e-2 in 8 steps (tests/test_invariance.py::test_rotated_init_twin), in float64 it stays
    within 1e-9."""
    a, b, c = coefficients
    x = g.to(torch.promote_types(g.dtype, torch.float32))
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.T if tall else x).to(g.dtype)


class EquivariantMuon(torch.optim.Muon):
    """torch.optim.Muon step for step (momentum, Nesterov, decoupled weight decay, adjust_lr_fn),
    with its Newton-Schulz in the parameter's precision (`newton_schulz`), so that the pure Muon
    is rotation-equivariant to rounding, as its family label claims."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        from torch.optim._muon import _adjust_lr

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss


class MuonAdamW:
    """Muon (EquivariantMuon) on the hidden 2-D matrices, another optimiser (`ends`: AdamW, SGD or
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
    muon = EquivariantMuon([{"params": matrices, "lr_ratio": lr_ratio}], lr=lr, weight_decay=weight_decay,
                            momentum=momentum, nesterov=True, adjust_lr_fn=adjust_lr)
    groups = [g for g in ({"params": [(n, p) for n, p in rest if p.ndim >= 2], "weight_decay": weight_decay},
                          {"params": [(n, p) for n, p in rest if p.ndim < 2], "weight_decay": 0.0}) if g["params"]]
    for g in groups:
        g["lr_ratio"] = ends_lr_ratio
    if ends is None:
        ends = lambda gs: torch.optim.AdamW(gs, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)  # noqa: E731
    return MuonAdamW(muon, ends(groups) if groups else None)
