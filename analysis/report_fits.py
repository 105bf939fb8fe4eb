"""The power laws the report fits (``FitSpec``, ``DEFAULT_FITS``) and the comparisons of
their exponents between optimisers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from analysis import charts, fits, queries, selection
from analysis.labels import SITE_NAMES

__all__ = ["DEFAULT_FITS", "FitSpec", "compare_lines"]


@dataclass(frozen=True)
class FitSpec:
    """One power law to fit against model size, per config: a metric (aggregated over
    blocks with ``layer_agg``, then per trial) or, with ``site=None``, a runs column.
    ``offset`` is subtracted before fitting (3 = excess kurtosis over the Gaussian)."""

    metric: str
    site: str | None = "resid"
    basis: str | None = "stored"
    layer_agg: queries.LayerAgg = "mean"
    offset: float = 0.0
    chart: bool = True
    control: bool = False
    """Fit the excess over the no-privilege control (``queries.CONTROL``: the residual stream
    in a random basis, same trial, layer and step) instead of the raw value."""

    @property
    def name(self) -> str:
        """A file-name-safe identifier, e.g. ``kurtosis_resid_stored``."""
        if self.site is None:
            return self.metric
        parts = [self.metric, self.site]
        if self.basis not in ("stored", "computation", "neuron"):
            parts.append(str(self.basis))
        if self.layer_agg != "mean":
            parts.append(self.layer_agg)
        if self.control:
            parts.append("excess")
        return "_".join(parts)

    @property
    def label(self) -> str:
        """A readable description for tables, e.g. ``kurtosis − 3, residual stream (mean over blocks)``."""
        what = self.metric if self.offset == 0 else f"{self.metric} − {self.offset:g}"
        what = f"{self.metric} − control" if self.control else what
        if self.site is None:
            return what
        where = SITE_NAMES.get((self.site, self.basis or ""), f"{self.site}/{self.basis}")
        return f"{what}, {where} ({self.layer_agg} over blocks)"


DEFAULT_FITS: tuple[FitSpec, ...] = (
    FitSpec("kurtosis", "resid", "stored", control=True, chart=False),
    FitSpec("kurtosis", "mlp_in", "computation", control=True, chart=False),
    FitSpec("kurtosis", "resid", "stored", offset=0.0),
    FitSpec("kurtosis", "mlp_in", "computation", offset=0.0),
    FitSpec("final_val_loss", site=None),
)
"""Excess kurtosis over the control (stored basis minus the random basis at the same layer
and step: 0 without a privileged basis at every width, where the random basis reads
3d/(d+2), not 3) of the residual stream and of the MLP input in its computation basis, in the
tables (undefined, and listed as skipped, where a config has no excess); raw kurtosis, fitted
and charted: every config has one, ~0 exponent without outliers, so slopes can be compared
with SGD's; and the final validation loss."""


def compare_lines(
    per: pl.DataFrame,
    x: str,
    line: str,
    spec: FitSpec,
    n_boot: int,
    seed: int,
    confidence: float,
    fitted: dict[Any, Any],
) -> list[dict[str, Any]]:
    """Every pair of fitted lines of different optimisers within one stratum (same norm and
    rotation): exponent(b) - exponent(a), a the reference optimiser (sgd, else the first in
    ``charts.OPTIMIZER_COLORS`` order). Welch t over per-seed exponents where both have
    2+ seeds, else independent bootstraps."""
    if "optimizer" not in per.columns:
        return []
    strata = [c for c in ("norm", "rotation_label") if c in per.columns]
    labels = selection.line_labels(per, line)
    ok = {k[0] for k, v in fitted.items() if isinstance(v, fits.PowerLawFit)}
    info = per.group_by(line).agg(pl.col(c).first() for c in ["optimizer", *strata]).filter(pl.col(line).is_in(list(ok)))
    info = info.join(labels.select(line, "config"), on=line, how="left")
    order = list(dict.fromkeys(["sgd", *charts.OPTIMIZER_COLORS]))
    rank = {o: i for i, o in enumerate(order)}
    rows = []
    memo: dict[Any, Any] = {}  # each line's fit, reused across its pairs
    for key, group in (info.partition_by(strata, as_dict=True) if strata else {(): info}).items():
        lines = sorted(group.iter_rows(named=True), key=lambda r: (rank.get(r["optimizer"], 99), r["config"]))
        for i, ra in enumerate(lines):
            for rb in lines[i + 1 :]:
                if ra["optimizer"] == rb["optimizer"]:
                    continue
                try:
                    c = fits.compare_exponents(
                        per, x, "value", line, ra[line], rb[line], offset=spec.offset, n_boot=n_boot,
                        seed=seed, seeds="seed", confidence=confidence, memo=memo,
                    )  # fmt: skip
                except ValueError:
                    continue
                rows.append({
                    "fit": spec.label, **dict(zip(strata, key, strict=True)),
                    "a": ra["config"], "b": rb["config"],
                    "exponent_a": c.fit_a.exponent, "exponent_b": c.fit_b.exponent,
                    "n_a": c.fit_a.n_label, "n_b": c.fit_b.n_label,
                    "difference": c.difference, "difference_low": c.difference_ci[0],
                    "difference_high": c.difference_ci[1], "p_value": c.p_value, "method": c.method,
                })  # fmt: skip
    return rows
