"""The attention axis: which attention every block computes, as a typed config (torch-free).

Names map to classes in one place, study.model.ATTENTIONS. Per head, with scores
s_ij = q_i . k_j / sqrt(D) over the keys j <= i a causal query i sees, and values v_j:

- `softmax`: y_i = sum_j softmax(s_i)_j v_j (the default; every trial before the axis).
- `softmax1` (Miller 2023, "attention is off by one"; Kaul et al. 2025): one extra logit fixed at
  0 that holds no value, p_ij = exp(s_ij) / (1 + sum_k exp(s_ik)): a head may put its mass
  nowhere. Computed as SDPA over the keys plus a zero key with a zero value.
- `kv_bias` (Sun et al. 2024, "Massive activations", explicit attention bias): the same extra
  slot with a learned key k' and value v' per head (d_model each, split over the heads), seen
  by every query: softmax over [s_i, q_i . k' / sqrt(D)], values [v; v'].
- `gated` (Qiu et al. 2025, gate G1): y_i <- y_i * sigmoid(x_i W_g^T), elementwise on every
  head's output, after SDPA and before the output projection; x is the block's normalised input
  (what qkv reads), W_g a d_model x d_model map (no bias).
- `clipped` (Bondarenko et al. 2023): p_i = clip((zeta - gamma) softmax(s_i) + gamma, 0, 1) on
  the causal softmax (masked keys stay at 0 since gamma <= 0): attention can be exactly 0.

Every variant leaves the model rotation-invariant where `softmax` is: the extra parameters
(k', v', W_g's output side) live in the heads' coordinates, and W_g reads the normalised input
as qkv does (study.invariance rotates it with qkv).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from study.frozen import FieldError, _Frozen, string_is

__all__ = ["AttentionName", "ATTENTION_NAMES", "AttentionConfig"]

AttentionName = Literal["softmax", "softmax1", "gated", "clipped", "kv_bias"]
ATTENTION_NAMES: tuple[str, ...] = AttentionName.__args__

CLIPPED_ZETA = 1.0
CLIPPED_GAMMA = -0.03
"""Bondarenko et al.'s best stretch on BERT (their Table 1: gamma -0.03, zeta 1); about their
gamma = -alpha / T with alpha 4 at T = 128, this study's sequence length."""


class AttentionConfig(_Frozen):
    """The attention of every block. A bare string (`gated`) is accepted as `{name: gated}`."""

    name: AttentionName = "softmax"
    """softmax, softmax1 (an extra zero logit), kv_bias (an extra learned key and value per head),
    gated (a sigmoid gate on each head's output from the normalised input), clipped (clipped softmax)."""
    zeta: float | None = Field(default=None, ge=1)
    """clipped: the stretch's upper end (>= 1; default 1): softmax values above (1 - gamma) / (zeta - gamma) read 1."""
    gamma: float | None = Field(default=None, le=0)
    """clipped: the stretch's lower end (<= 0; default -0.03): softmax values below -gamma / (zeta - gamma) read 0."""

    id_optional: ClassVar[tuple[str, ...]] = ("zeta", "gamma")  # absent unless clipped: {"name": "gated"}
    _from_string = string_is("name")

    @model_validator(mode="after")
    def _stretch_for_clipped_only(self) -> AttentionConfig:
        if self.name == "clipped":
            object.__setattr__(self, "zeta", CLIPPED_ZETA if self.zeta is None else self.zeta)
            object.__setattr__(self, "gamma", CLIPPED_GAMMA if self.gamma is None else self.gamma)
        else:
            for stretch in ("zeta", "gamma"):
                if getattr(self, stretch) is not None:
                    raise FieldError(stretch, f"{stretch} applies to attention clipped only, not {self.name}")
        return self

    @property
    def label(self) -> str:
        """The runs column `attention`: the name, with the stretch when it is not the default
        (`clipped(zeta=1.03,gamma=-0.01)`)."""
        if self.name == "clipped" and (self.zeta, self.gamma) != (CLIPPED_ZETA, CLIPPED_GAMMA):
            return f"clipped(zeta={self.zeta:g},gamma={self.gamma:g})"
        return self.name

    def extra_params(self, d_model: int) -> int:
        """Parameters one block's attention holds beyond qkv and the output projection."""
        return {"gated": d_model * d_model, "kv_bias": 2 * d_model}.get(self.name, 0)

    @property
    def extra_keys(self) -> int:
        """Key slots every query sees beyond the sequence's own (the zero or learned key)."""
        return 1 if self.name in ("softmax1", "kv_bias") else 0
