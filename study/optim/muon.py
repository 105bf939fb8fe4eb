"""muon: torch Muon (Newton-Schulz-orthogonalised Nesterov momentum) on the hidden matrices;
the ends (embeddings, unembedding, gains; `muon_exclude` says which matrices) by `muon_ends`:
torch AdamW (default), torch SGD (momentum: then the whole update is rotation-equivariant, a
pure Muon) or RotatedAdam (rotate "residual"). rules.muon.MuonAdamW steps both as one."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

from study.optim.registry import Optimizer, register

if TYPE_CHECKING:
    from torch import nn

    from study.config import TrialConfig

__all__ = ["HIDDEN_MATRICES", "MUON_ENDS_FAMILY"]

MUON_ENDS_FAMILY: dict[str, str] = {"adamw": "mixed", "sgd": "rotation_equivariant", "rotated_adam": "fixed_random_basis"}
"""muon's family by what trains its ends (muon_ends); its matrices are rotation-equivariant."""

HIDDEN_MATRICES = ("blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.fc.weight",
                   "blocks.0.mlp.proj.weight")
"""The first block's matrices, by the model's parameter names (a test holds them to the model):
muon_exclude must leave Muon at least one of them (checked without the model's depth, so that
the spec loader can name the optimiser entry)."""


def build(cfg: TrialConfig, model: nn.Module):
    import torch

    from study.optim.rules.groups import index_dims
    from study.optim.rules.muon import muon_adamw
    from study.optim.rules.rotated_adam import RotatedAdam

    o = cfg.optimizer
    ends = {
        "adamw": None,
        "sgd": lambda gs: torch.optim.SGD(gs, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov,
                                          weight_decay=o.weight_decay),
        "rotated_adam": lambda gs: RotatedAdam(gs, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                               rotate="residual", d_model=cfg.model.d_model, seed=cfg.seed,
                                               index_dims=index_dims(model, cfg.vocab_size)),
    }[o.muon_ends]
    return muon_adamw(model, lr=o.lr, lr_ratio=o.muon_lr_ratio, momentum=o.muon_momentum, adjust_lr=o.muon_adjust_lr,
                      betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, exclude=o.muon_exclude,
                      ends=ends, ends_lr_ratio=o.muon_ends_lr_ratio)


def keeps_a_matrix(exclude: tuple[str, ...]) -> None:
    """muon_exclude must leave Muon a hidden matrix of every block."""
    if all(any(fnmatch.fnmatchcase(n, g) for g in exclude) for n in HIDDEN_MATRICES):
        raise ValueError(f"{list(exclude)} leaves Muon only embedding matrices (it excludes every hidden matrix "
                         f"of a block: {', '.join(HIDDEN_MATRICES)}); Muon needs at least one per block")


register(Optimizer(
    "muon", order=5, family="rotation_equivariant",
    reads=("betas", "eps", "weight_decay", "momentum", "nesterov", "muon_momentum", "muon_lr_ratio", "muon_adjust_lr",
           "muon_exclude", "muon_ends", "muon_ends_lr_ratio"),
    build=build,
    # its momentum column is Muon's, and Muon's momentum is always Nesterov (momentum and
    # nesterov themselves only reach sgd ends)
    columns=lambda o: {"momentum": o.muon_momentum, "nesterov": True},
    family_for=lambda o, norm: MUON_ENDS_FAMILY[o.muon_ends],
    field_checks={"muon_exclude": keeps_a_matrix},
    unshardable="its Newton-Schulz orthogonalisation needs whole matrices",
))
