"""rotated_adam: Adam(W) with its moments in a fixed Haar-random basis per parameter
(rules.rotated_adam.RotatedAdam); `rotate` says which dimensions turn."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from study.optim.adam import AdamConfig
from study.optim.registry import Optimizer, Trial, register

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MAX_ROTATED_VOCAB", "RotatedAdamConfig", "build", "check_vocab"]

MAX_ROTATED_VOCAB = 8192
"""rotate "all" turns the vocabulary dimension too: a V x V basis, refused above this V."""


class RotatedAdamConfig(AdamConfig):
    """AdamW with its moments in a fixed random basis: Adam's fields, and which dimensions turn."""

    name: Literal["rotated_adam"] = "rotated_adam"  # type: ignore[assignment]
    rotate: Literal["all", "residual"] = "residual"
    """Rotate every dimension, or only those of size d_model."""

    own_columns: ClassVar[tuple[str, ...]] = ("rotate",)


def build(cfg: Trial, model: nn.Module):
    from study.optim.rules.groups import decay_groups, index_dims, mup_scales
    from study.optim.rules.rotated_adam import RotatedAdam

    o = cfg.optimizer
    return RotatedAdam(decay_groups(model, o.weight_decay, mup_scales(cfg), o.lr), lr=o.lr, betas=o.betas, eps=o.eps,
                       weight_decay=o.weight_decay, rotate=o.rotate, d_model=cfg.model.d_model, seed=cfg.seed,
                       index_dims=index_dims(model, cfg.vocab_size))


def check_vocab(cfg: Trial) -> tuple[str, str] | None:
    if cfg.optimizer.rotate == "all" and cfg.vocab_size > MAX_ROTATED_VOCAB:
        return "optimizer.rotate", (f"optimizer.rotate: 'all' would need a {cfg.vocab_size} x {cfg.vocab_size} basis; "
                                    "use 'residual' with a large vocabulary")
    return None


register(Optimizer("rotated_adam", order=3, family="fixed_random_basis", config=RotatedAdamConfig, build=build,
                   trial_check=check_vocab, mup="adam",
                   unshardable="its moments live in a rotated basis that mixes every row and column of a matrix"))
