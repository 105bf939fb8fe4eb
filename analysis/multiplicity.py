"""One pre-declared primary contrast per study; every other reported test Holm-adjusted.

The primary contrast (``PrimaryContrast``, default: ``per_coordinate`` minus every other family
pooled, the optimisers as the units) is read in one fit (the report's first unless named): its
slope and its level at the largest size keep their raw p. Every other p-value the report's
comparison tables carry (optimiser pairs, family pairs, family levels) is one Holm family
(``holm``): ``p_holm`` beside ``p_value``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

__all__ = ["DEFAULT_PRIMARY", "PrimaryContrast", "adjust_tables", "holm", "parse_primary"]

PRIMARY, SECONDARY = "primary", "secondary"


@dataclass(frozen=True)
class PrimaryContrast:
    """Family ``family`` minus the ``against`` families pooled (empty: every other family in the
    stratum), their optimisers as the units, in the fit named ``fit`` (a ``FitSpec.name``; None:
    the report's first fit): its slope, and its level at the largest size."""

    family: str = "per_coordinate"
    against: tuple[str, ...] = ()
    fit: str | None = None

    def against_in(self, families: Sequence[str]) -> list[str]:
        """The pooled side among ``families`` present (in their order)."""
        wanted = self.against or tuple(f for f in families if f != self.family)
        return [f for f in families if f in wanted and f != self.family]

    def __str__(self) -> str:
        against = " + ".join(self.against) if self.against else "every other family"
        where = f" in {self.fit}" if self.fit else " in the first fit"
        return f"{self.family} − ({against}){where}"


DEFAULT_PRIMARY = PrimaryContrast()


def parse_primary(text: str | PrimaryContrast | None) -> PrimaryContrast | None:
    """``FAMILY[:AGAINST+AGAINST...][@FIT]`` (e.g. ``per_coordinate``,
    ``per_coordinate:rotation_equivariant+adaptive_basis@kurtosis_mlp_in_over_null``) as a
    ``PrimaryContrast``; ``none`` (or None) declares no primary: every test is Holm-adjusted."""
    if text is None or isinstance(text, PrimaryContrast):
        return text
    text = text.strip()
    if text.lower() in ("", "none"):
        return None
    head, _, fit = text.partition("@")
    family, _, against = head.partition(":")
    pooled = tuple(f.strip() for f in against.split("+") if f.strip())
    if not family.strip() or (against and not pooled):
        raise ValueError(f"primary contrast {text!r}: expected FAMILY[:AGAINST+AGAINST...][@FIT] or 'none'")
    from analysis.charts.style import FAMILY_ORDER  # the families' vocabulary, declared once

    unknown = [f for f in (family.strip(), *pooled) if f not in FAMILY_ORDER]
    if unknown:
        raise ValueError(f"primary contrast {text!r}: unknown famil{'ies' if len(unknown) > 1 else 'y'} "
                         f"{', '.join(unknown)} (choose from {', '.join(FAMILY_ORDER)})")
    if "@" in text and not fit.strip():
        raise ValueError(f"primary contrast {text!r}: '@' names no fit")
    return PrimaryContrast(family.strip(), pooled, fit.strip() or None)


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment over the finite p-values (NaN stays NaN): sorted ascending,
    p_(i) -> max over j <= i of min(1, (m - j + 1) p_(j)), m the number of finite p-values."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if ok.size == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    m = order.size
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


def adjust_tables(tables: Sequence[pl.DataFrame]) -> list[pl.DataFrame]:
    """``p_holm`` on every table: Holm over the secondary rows of all the tables together (a
    row is primary where its ``role`` column says so); a primary row keeps its raw p.
    Tables without a ``p_value`` column are returned unchanged."""
    roles = [
        t.get_column("role").to_list() if "role" in t.columns else [SECONDARY] * t.height
        for t in tables
    ]
    p = np.concatenate([
        t.get_column("p_value").cast(pl.Float64).fill_null(math.nan).to_numpy() if "p_value" in t.columns
        else np.full(t.height, math.nan) for t in tables
    ] or [np.empty(0)])  # fmt: skip
    primary = np.array([r == PRIMARY for rs in roles for r in rs], dtype=bool)
    adjusted = holm(np.where(primary, math.nan, p))
    adjusted[primary] = p[primary]
    out, at = [], 0
    for t in tables:
        part = adjusted[at : at + t.height]
        at += t.height
        out.append(t.with_columns(p_holm=pl.Series(part, dtype=pl.Float64)) if "p_value" in t.columns else t)
    return out
