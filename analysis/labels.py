"""Readable names for the recorded sites and bases, declared once (chart titles, legends,
table labels)."""

from __future__ import annotations

__all__ = ["BASIS_SERIES", "SITE_NAMES"]

SITE_NAMES = {
    ("resid", "stored"): "residual stream",
    ("resid", "random"): "residual stream, random basis",
    ("attn_in", "computation"): "attention input",
    ("mlp_in", "computation"): "MLP input",
    ("mlp_act", "neuron"): "MLP neurons",
    ("model", "computation"): "model",
}
"""A site (and basis) in words, e.g. in ``kurtosis − control, residual stream``."""

BASIS_SERIES = {
    ("resid", "stored"): "residual, stored basis",
    ("resid", "random"): "residual, random basis",
    ("attn_in", "computation"): "attention input, computation basis",
    ("mlp_in", "computation"): "MLP input, computation basis",
}
"""The (site, basis) series ``queries.basis_comparison`` compares, with their legend names
(in legend order)."""
