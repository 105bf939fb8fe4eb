"""muon: torch Muon (Newton-Schulz-orthogonalised Nesterov momentum) on the hidden matrices;
the ends (embeddings, unembedding, gains; `muon_exclude` says which matrices) by `muon_ends`:
torch AdamW (default), torch SGD (momentum: then the whole update is rotation-equivariant, a
pure Muon) or RotatedAdam (rotate "residual"). rules.muon.MuonAdamW steps both as one."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from study.optim.adam import AdamConfig
from study.optim.registry import Optimizer, Trial, register

if TYPE_CHECKING:
    from torch import nn

__all__ = ["HIDDEN_MATRICES", "MUON_ENDS_FAMILY", "MUON_ENDS_MUP", "MUON_MUP_HIDDEN", "MuonConfig"]

MUON_ENDS_FAMILY: dict[str, str] = {"adamw": "mixed", "sgd": "rotation_equivariant", "rotated_adam": "fixed_random_basis"}
"""muon's family by what trains its ends (muon_ends); its matrices are rotation-equivariant."""

HIDDEN_MATRICES = ("blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.fc.weight",
                   "blocks.0.mlp.proj.weight")
"""The first block's matrices, by the model's parameter names (a test holds them to the model):
muon_exclude must leave Muon at least one of them (checked without the model's depth, so that
the spec loader can name the optimiser entry)."""


class MuonConfig(AdamConfig):
    """Muon on the hidden matrices; its ends (embeddings, unembedding, gains) by `muon_ends`, with
    Adam's fields (betas, eps) for adamw or rotated_adam ends and SGD's (momentum, nesterov) for sgd."""

    name: Literal["muon"] = "muon"  # type: ignore[assignment]
    momentum: float = Field(default=0.9, ge=0, lt=1)
    """The sgd ends' momentum."""
    nesterov: bool = False
    """The sgd ends' Nesterov momentum."""
    muon_momentum: float = Field(default=0.95, ge=0, lt=1)
    """Nesterov momentum of the orthogonalised matrices."""
    muon_lr_ratio: float = Field(default=1.0, gt=0)
    """The matrices' peak lr as a multiple of lr (1 under match_rms_adamw, where Muon reuses
    AdamW's lr; about 7 under original)."""
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    """Per-shape lr scale: 0.2 sqrt(max(out, in)) (Moonshot) or sqrt(max(1, out/in)) (Keller)."""
    muon_exclude: tuple[str, ...] = ("tok_emb.*", "pos_emb.*", "unembed.*")
    """Name globs of matrices that the ends' optimiser (muon_ends) trains instead (embeddings,
    unembedding); vectors and scalars always go to it."""
    muon_ends: Literal["adamw", "sgd", "rotated_adam"] = "adamw"
    """What trains every parameter Muon does not orthogonalise (embeddings, unembedding, gains):
    adamw (per coordinate: the run's family is `mixed`), sgd (momentum, nesterov, as the sgd
    fields: the whole run is rotation-equivariant), rotated_adam (rotate "residual", as its
    fields: a fixed random basis)."""
    muon_ends_lr_ratio: float = Field(default=1.0, gt=0)
    """The ends' peak lr as a multiple of lr. Needed for sgd ends, whose good lr is an SGD's (the
    tests' 0.1), not Adam's (1e-3 to 1e-2): about 10 to 100 there."""

    id_optional: ClassVar[tuple[str, ...]] = ("muon_ends", "muon_ends_lr_ratio")
    column_fields: ClassVar[tuple[str, ...]] = ("betas", "muon_momentum")
    own_columns: ClassVar[tuple[str, ...]] = ("momentum", "nesterov", "muon_ends")
    """momentum holds muon_momentum (see runs_columns)."""

    @field_validator("muon_exclude")
    @classmethod
    def _leaves_a_matrix(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        keeps_a_matrix(value)
        return value

    def runs_columns(self) -> dict[str, Any]:
        """Its momentum column is Muon's, and Muon's momentum is always Nesterov (momentum and
        nesterov themselves only reach sgd ends)."""
        return {**super().runs_columns(), "momentum": self.muon_momentum, "nesterov": True}


MUON_MUP_HIDDEN = {"original": 0.0, "match_rms_adamw": -0.5}
"""muP's lr multiplier of Muon's matrices, as a power of the width multiplier m, by muon_adjust_lr.
The spectral condition for feature learning (Yang, Simon & Bernstein 2023) asks ||dW||_2 ~
sqrt(fan_out / fan_in); an orthogonalised update has every singular value ~1, so its spectral norm
is lr x the shape scale: original's sqrt(max(1, out / in)) meets the condition at a fixed lr (m^0),
match_rms_adamw's 0.2 sqrt(max(out, in)) grows as sqrt(m), so lr / sqrt(m)."""
MUON_ENDS_MUP = {"adamw": "adam", "sgd": "sgd", "rotated_adam": "adam"}
"""The muP rule (study/optim/rules/groups.py's MUP_EXPONENTS) of what trains the ends."""


def build(cfg: Trial, model: nn.Module):
    import torch

    from study.optim.rules.groups import by_role, index_dims, mup_scales
    from study.optim.rules.muon import muon_adamw
    from study.optim.rules.rotated_adam import RotatedAdam

    o = cfg.optimizer
    ends = {
        "adamw": lambda gs: torch.optim.AdamW(gs, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay),
        "sgd": lambda gs: torch.optim.SGD(gs, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov,
                                          weight_decay=o.weight_decay),
        "rotated_adam": lambda gs: RotatedAdam(gs, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                               rotate="residual", d_model=cfg.model.d_model, seed=cfg.seed,
                                               index_dims=index_dims(model, cfg.vocab_size)),
    }[o.muon_ends]
    scales = mup_scales(cfg, MUON_ENDS_MUP[o.muon_ends])
    if scales is not None:  # muP: the ends split by role, each at its multiplier
        make_ends = ends
        ends = lambda gs: make_ends(by_role(gs, scales, o.lr))  # noqa: E731
    elif o.muon_ends == "adamw":
        ends = None  # muon_adamw's own AdamW, as before
    optimizer = muon_adamw(model, lr=o.lr, lr_ratio=o.muon_lr_ratio, momentum=o.muon_momentum,
                           adjust_lr=o.muon_adjust_lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                           exclude=o.muon_exclude, ends=ends, ends_lr_ratio=o.muon_ends_lr_ratio)
    if scales is not None:
        scale = cfg.model.width_mult ** MUON_MUP_HIDDEN[o.muon_adjust_lr]
        for group in optimizer.muon.param_groups:
            group["lr_scale"], group["lr"] = scale, o.lr * scale
    return optimizer


def keeps_a_matrix(exclude: tuple[str, ...]) -> None:
    """muon_exclude must leave Muon a hidden matrix of every block."""
    if all(any(fnmatch.fnmatchcase(n, g) for g in exclude) for n in HIDDEN_MATRICES):
        raise ValueError(f"{list(exclude)} leaves Muon only embedding matrices (it excludes every hidden matrix "
                         f"of a block: {', '.join(HIDDEN_MATRICES)}); Muon needs at least one per block")


register(Optimizer(
    "muon", order=5, family="rotation_equivariant", config=MuonConfig, build=build,
    family_for=lambda o, norm: MUON_ENDS_FAMILY[o.muon_ends], mup="muon",
    unshardable="its Newton-Schulz orthogonalisation needs whole matrices",
))
