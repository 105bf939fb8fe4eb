"""soap: Adam in the eigenbasis of Shampoo's preconditioner (rules.soap.SOAP), an adaptive basis."""

from __future__ import annotations

from typing import TYPE_CHECKING

from study.optim.registry import PER_COORDINATE_GAINS, Optimizer, register

if TYPE_CHECKING:
    from torch import nn

    from study.config import OptimizerConfig, TrialConfig


__all__ = ["build", "family"]


def build(cfg: TrialConfig, model: nn.Module):
    from study.optim.rules.groups import decay_groups
    from study.optim.rules.soap import SOAP

    o = cfg.optimizer
    return SOAP(decay_groups(model, o.weight_decay), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                shampoo_beta=o.shampoo_beta, precondition_frequency=o.precondition_frequency,
                max_precond_dim=o.max_precond_dim, precondition_vectors=o.soap_vectors == "shampoo", seed=cfg.seed)


def family(o: OptimizerConfig, norm: str) -> str:
    """Its matrices' update is equivariant (the eigenbasis rotates with the gradients), but
    vectors get plain Adam (unless soap_vectors: shampoo), so with per-coordinate gains it is `mixed`."""
    return "mixed" if o.soap_vectors == "adam" and norm in PER_COORDINATE_GAINS else "adaptive_basis"


register(Optimizer("soap", order=4, family="adaptive_basis",
                   reads=("betas", "eps", "weight_decay", "precondition_frequency", "shampoo_beta", "max_precond_dim",
                          "soap_vectors"),
                   build=build, family_for=family,
                   unshardable="its preconditioner needs whole matrices (Shampoo's eigenbases of G G^T and G^T G)"))
