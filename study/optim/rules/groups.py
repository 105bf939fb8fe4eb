"""Parameter groups every optimiser is built over (muP's per-role lr multipliers among them), and
which parameter dims index tokens or positions rather than residual coordinates (never rotated by
RotatedAdam's rotate="residual")."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["MUP_EXPONENTS", "MUP_ROLES", "by_role", "decay_groups", "index_dims", "mup_role", "mup_scales"]

MUP_ROLES = ("input", "hidden", "output", "vector", "scalar")
"""muP's parameter roles (Tensor Programs V): input (token and position embeddings: fan_in fixed,
fan_out the width), hidden (width x width matrices), output (the unembedding), vector (gains,
biases, kv_bias's key and value: one width-sized dim, treated as input weights) and scalar
(rmsnorm_scalar's gain: no width-sized dim)."""

MUP_EXPONENTS: dict[str, dict[str, float]] = {
    "adam": {"hidden": -1.0},
    "adafactor": {"hidden": -0.5},
    "sgd": {"input": 1.0, "output": 1.0, "vector": 1.0},
}
"""muP's lr multiplier of each role as a power of the width multiplier m (absent: m^0 = 1), for
study.model's variant (output multiplier 1/m, unembedding init unchanged: TP5 Table 8).

- adam: Adam-like updates, a fixed size per coordinate (adam, lion, signsgd, rotated_adam):
  hidden lr / m (TP5 Table 3/8); the rest unchanged (the output's 1/m is the logits' multiplier).
- adafactor: torch's Adafactor steps by lr x RMS(parameter) (relative step), and the hidden
  matrices' RMS already falls as 1/sqrt(m) under muP's init, so lr / sqrt(m) gives Adam's lr / m
  per coordinate (Everett et al. 2024's Adam + parameter scaling); the rest unchanged.
- sgd: hidden lr unchanged; input, vector and output (with its 1/m multiplier, TP5 Table 8's
  SGD lr fan_in) lr x m; the scalar gain unchanged.
- muon: its hidden matrices' own rule, its ends the rule of what trains them (study/optim/muon.py)."""


def mup_role(name: str, p: nn.Parameter) -> str:
    """`p`'s muP role (MUP_ROLES) in study.model.Transformer, by its name and shape."""
    leaf = name.rsplit(".", 2)[-2] if "." in name else name
    if leaf in ("tok_emb", "pos_emb"):
        return "input"
    if leaf == "unembed":
        return "output"
    if p.ndim >= 2:
        return "hidden"
    return "scalar" if p.numel() == 1 else "vector"


def mup_scales(cfg: Any, rule: str | None = None) -> dict[str, float] | None:
    """Each role's lr multiplier under muP for `rule` (default: the optimiser's registry entry's
    `mup`), or None under sp. At m = 1 every multiplier is exactly 1."""
    from study.optim.registry import OPTIMIZERS

    if cfg.model.parametrization != "mup":
        return None
    rule = rule if rule is not None else OPTIMIZERS[cfg.optimizer.name].mup
    if rule not in MUP_EXPONENTS:
        raise ValueError(f"model.parametrization: mup is not defined for {cfg.optimizer.name} (rule {rule!r})")
    m = cfg.model.width_mult
    return {role: m ** MUP_EXPONENTS[rule].get(role, 0.0) for role in MUP_ROLES}


def by_role(groups: list[dict[str, Any]], scales: dict[str, float], lr: float) -> list[dict[str, Any]]:
    """Each group of named parameters split by muP role, each part with its "lr_scale" (the
    schedule's multiplier, study.schedule.set_lr) and "lr" at lr x that; other keys kept."""
    out = []
    for group in groups:
        for role in MUP_ROLES:
            params = [(n, p) for n, p in group["params"] if mup_role(n, p) == role]
            if params:
                out.append({**group, "params": params, "lr_scale": scales[role], "lr": lr * scales[role]})
    return out


def decay_groups(model: nn.Module, weight_decay: float, scales: dict[str, float] | None = None,
                 lr: float | None = None) -> list[dict[str, Any]]:
    """Two named param groups: ndim >= 2 with `weight_decay`, the rest (gains, biases, scalars)
    with 0. Empty groups are dropped. Frozen parameters are left out. With muP's `scales`
    (`mup_scales`), each split by role (`by_role`, at the peak `lr`)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [(n, p) for n, p in named if p.ndim >= 2]
    no_decay = [(n, p) for n, p in named if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if scales is None:
        return groups
    if lr is None:
        raise ValueError("decay_groups: muP's scales need the peak lr")
    return by_role(groups, scales, lr)


_HEAD_NAMES = ("lm_head", "head", "unembed", "unembedding", "w_u", "wu")
_EMBED_NAMES = ("wte", "wpe", "tok_emb", "pos_emb", "embed", "embedding", "w_e", "w_pos")


def index_dims(model: nn.Module, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
    """Parameter dims that index tokens or positions, not residual coordinates: they never
    rotate under rotate="residual", even when their size happens to equal d_model (byte-level
    vocab 256 = d_model 256, or seq_len = d_model).

    Found by module type and name: an nn.Embedding's weight, dim 0; an nn.Linear named like an
    unembedding (lm_head, head, unembed, ...) with out_features == vocab_size (any, if None),
    dim 0 of weight and bias; a bare 2-D parameter named like an embedding or unembedding,
    dim 0 (nanoGPT's (V, d) layout). Shapes alone cannot tell a (V, d) unembedding from a
    (d, d) projection when V == d, hence the names.
    """
    dims: dict[str, tuple[int, ...]] = {}
    for mname, module in model.named_modules():
        leaf = mname.rsplit(".", 1)[-1].lower()
        if isinstance(module, nn.Embedding):
            dims[_join(mname, "weight")] = (0,)
        elif isinstance(module, nn.Linear) and leaf in _HEAD_NAMES:
            if vocab_size is None or module.out_features == vocab_size:
                dims[_join(mname, "weight")] = (0,)
                if module.bias is not None:
                    dims[_join(mname, "bias")] = (0,)
    for pname, p in model.named_parameters():
        leaf = pname.rsplit(".", 1)[-1].lower()
        if pname not in dims and p.ndim == 2 and (leaf in _EMBED_NAMES or leaf in _HEAD_NAMES):
            dims[pname] = (0,)
    return dims


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
