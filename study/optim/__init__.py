"""Optimisers: `build_optimizer(cfg, model)` builds the one named by cfg.optimizer.name from
its registry entry (registry.py). Each module here registers one optimiser, or a few closely
related ones, and every module here is loaded below, so a new optimiser is a new module:

- adam.py (adam: torch AdamW), sgd.py (sgd: torch SGD), adafactor.py (adafactor),
- rotated_adam.py (rotated_adam: Adam in a fixed random basis), soap.py (soap: Adam in
  Shampoo's eigenbasis), muon.py (muon: Muon on hidden matrices, muon_ends on the rest),
- sign.py (lion, signsgd), twins.py (rotated_adafactor, rotated_lion, rotated_signsgd: each
  per-coordinate rule in a fixed random basis, rules.rotated_basis.RotatedBasis).

Each module defines its optimiser's config class (an OptimizerConfig subclass: its fields, their
checks, its runs columns) and registers it with its builder.

The update rules torch lacks are in rules/ (RotatedAdam, SOAP, Lion, MuonAdamW). Weight decay,
for every optimiser, applies only to parameters with ndim >= 2 (nanoGPT's two groups), and
every group's "lr" starts at the peak lr.

This package and its entries import no torch (study.config reads the registry while it loads,
and configs validate without torch); the rules' classes are imported from here on first use.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from study.optim.registry import OPTIMIZERS, Trial, optimizer_names

if TYPE_CHECKING:
    import torch
    from torch import nn

    from study.optim.rules.groups import decay_groups, index_dims
    from study.optim.rules.lion import Lion
    from study.optim.rules.muon import MuonAdamW, muon_adamw
    from study.optim.rules.rotated_adam import RotatedAdam
    from study.optim.rules.rotated_basis import RotatedBasis
    from study.optim.rules.soap import SOAP

__all__ = [
    "Lion", "MuonAdamW", "OPTIMIZER_FAMILY", "RotatedAdam", "RotatedBasis", "SOAP", "build_optimizer", "decay_groups", "index_dims",
    "muon_adamw",
]  # fmt: skip

# Every module here but the registry is an optimiser's entry (rules/, a package, is not):
# importing it registers it, so a new optimiser needs no line here.
for _module in pkgutil.iter_modules(__path__):
    if not _module.ispkg and _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")

OPTIMIZER_FAMILY: dict[str, str] = {name: OPTIMIZERS[name].family for name in optimizer_names()}
"""Each optimiser's rule on a hidden matrix. Not the runs column: muon's ends and soap's gain
vectors are trained by other rules, see `registry.optimizer_family`."""


def build_optimizer(cfg: Trial, model: nn.Module) -> torch.optim.Optimizer | MuonAdamW:
    """The optimiser named by cfg.optimizer.name, over `model`'s trainable parameters in two
    groups (weight decay on ndim >= 2 only; muon: its matrices, then the ends' two groups).
    Group "lr" starts at the peak lr."""
    entry = OPTIMIZERS.get(cfg.optimizer.name)
    if entry is None:
        raise ValueError(f"optimizer.name: unknown optimiser {cfg.optimizer.name!r}")
    return entry.build(cfg, model)


_RULES = {
    "decay_groups": "groups", "index_dims": "groups", "Lion": "lion", "MuonAdamW": "muon", "muon_adamw": "muon",
    "RotatedAdam": "rotated_adam", "SOAP": "soap", "RotatedBasis": "rotated_basis",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    """`from study.optim import RotatedAdam` (and the other rules) without importing torch before."""
    if name in _RULES:
        return getattr(importlib.import_module(f"{__name__}.rules.{_RULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
