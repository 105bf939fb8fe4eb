"""Parameter groups every optimiser is built over, and which parameter dims index tokens or
positions rather than residual coordinates (never rotated by RotatedAdam's rotate="residual")."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["decay_groups", "index_dims"]

def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two named param groups: ndim >= 2 with `weight_decay`, the rest (gains, biases, scalars)
    with 0. Empty groups are dropped. Frozen parameters are left out."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [(n, p) for n, p in named if p.ndim >= 2]
    no_decay = [(n, p) for n, p in named if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


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
