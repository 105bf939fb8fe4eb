"""soap: Adam in the eigenbasis of Shampoo's preconditioner (rules.soap.SOAP), an adaptive basis."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from study.optim.adam import AdamConfig
from study.optim.registry import PER_COORDINATE_GAINS, Optimizer, Trial, register

if TYPE_CHECKING:
    from torch import nn


__all__ = ["SOAPConfig", "build", "family"]


class SOAPConfig(AdamConfig):
    """SOAP: Adam's fields, and Shampoo's preconditioner."""

    name: Literal["soap"] = "soap"  # type: ignore[assignment]
    precondition_frequency: int = Field(default=10, gt=0)
    """Steps between recomputations of the eigenbasis (and at the first step)."""
    shampoo_beta: float = Field(default=0.95, ge=0, lt=1)
    """Decay rate of Shampoo's factors L = E[G G^T], R = E[G^T G]."""
    max_precond_dim: int = Field(default=4096, gt=0)
    """Matrix sides longer than this are not preconditioned (identity basis there)."""
    soap_vectors: Literal["adam", "shampoo"] = "adam"
    """Gain and bias vectors by plain Adam, per coordinate (the reference's default; with
    layernorm/rmsnorm the run's family is `mixed`), or in the eigenbasis of E[g g^T], one-sided
    as a 1 x n matrix (the reference's precondition_1d; family adaptive_basis)."""

    id_optional: ClassVar[tuple[str, ...]] = ("soap_vectors",)
    own_columns: ClassVar[tuple[str, ...]] = ("precondition_frequency",)


def build(cfg: Trial, model: nn.Module):
    from study.optim.rules.groups import decay_groups
    from study.optim.rules.soap import SOAP

    o = cfg.optimizer
    return SOAP(decay_groups(model, o.weight_decay), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                shampoo_beta=o.shampoo_beta, precondition_frequency=o.precondition_frequency,
                max_precond_dim=o.max_precond_dim, precondition_vectors=o.soap_vectors == "shampoo", seed=cfg.seed)


def family(o: SOAPConfig, norm: str) -> str:
    """Its matrices' update is equivariant (the eigenbasis rotates with the gradients), but
    vectors get plain Adam (unless soap_vectors: shampoo), so with per-coordinate gains it is `mixed`."""
    return "mixed" if o.soap_vectors == "adam" and norm in PER_COORDINATE_GAINS else "adaptive_basis"


register(Optimizer("soap", order=4, family="adaptive_basis", config=SOAPConfig, build=build, family_for=family,
                   unshardable="its preconditioner needs whole matrices (Shampoo's eigenbases of G G^T and G^T G)"))
