"""The power laws the report fits (``FitSpec``, ``DEFAULT_FITS``), the comparisons of their
exponents between optimisers and families, and the levels at each size they are fitted to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from analysis import charts, families, fits, queries, selection
from analysis.labels import SITE_NAMES
from analysis.multiplicity import PRIMARY, SECONDARY, PrimaryContrast, adjust_tables
from analysis.null import NULL_LABEL
from analysis.query_base import summarise
from resultstore.vocabulary import Basis, Metric, Site

__all__ = [
    "DEFAULT_FITS", "FitSpec", "adjust_comparisons", "compare_family_lines", "compare_lines", "family_contrasts",
    "level_rows", "primary_fit",
]  # fmt: skip


@dataclass(frozen=True)
class FitSpec:
    """One power law to fit against model size, per config: a metric (aggregated over
    blocks with ``layer_agg``, then per trial) or, with ``site=None``, a runs column.
    ``offset`` is subtracted before fitting. ``over_null``: fit metric / the exact null
    3(d-1)/(d+1) (``analysis.null``; 1 without a privileged basis, so every config has a
    slope). ``count``: the metric is a count of coordinates (``outlier_dims_rel``) fitted as
    the fraction of d_model x blocks by a binomial GLM with seed-clustered errors
    (``analysis.counts``), zeros included."""

    metric: str
    site: str | None = Site.RESID
    basis: str | None = Basis.STORED
    layer_agg: queries.LayerAgg = "mean"
    offset: float = 0.0
    chart: bool = True
    control: bool = False
    """Fit the excess over the measured control (``queries.CONTROL``: the residual stream
    in random bases, same trial, layer and step) instead of the raw value; undefined where a
    config has no excess (not a default)."""
    over_null: bool = False
    count: bool = False

    @property
    def name(self) -> str:
        """A file-name-safe identifier, e.g. ``kurtosis_resid_stored``."""
        if self.site is None:
            return self.metric
        parts = [self.metric, self.site]
        if self.basis not in (Basis.STORED, Basis.COMPUTATION, Basis.NEURON):
            parts.append(str(self.basis))
        if self.layer_agg != "mean":
            parts.append(self.layer_agg)
        if self.control:
            parts.append("excess")
        if self.over_null:
            parts.append("over_null")
        if self.count:
            parts.append("fraction")
        return "_".join(parts)

    @property
    def label(self) -> str:
        """A readable description for tables, e.g. ``kurtosis − 3, residual stream (mean over blocks)``."""
        what = self.metric if self.offset == 0 else f"{self.metric} − {self.offset:g}"
        what = f"{self.metric} − control" if self.control else what
        what = f"{self.metric} / {NULL_LABEL}" if self.over_null else what
        if self.count:
            what = f"outlier fraction ({self.metric} / d_model)"
        if self.site is None:
            return what
        where = SITE_NAMES.get((self.site, self.basis or ""), f"{self.site}/{self.basis}")
        agg = "over blocks, binomial GLM" if self.count else f"{self.layer_agg} over blocks"
        return f"{what}, {where} ({agg})"


DEFAULT_FITS: tuple[FitSpec, ...] = (
    FitSpec(Metric.KURTOSIS, Site.RESID, Basis.STORED, over_null=True),
    FitSpec(Metric.KURTOSIS, Site.MLP_IN, Basis.COMPUTATION, over_null=True),
    FitSpec(Metric.TOP1_SHARE, Site.RESID, Basis.STORED),
    FitSpec(Metric.TOP1_SHARE, Site.MLP_IN, Basis.COMPUTATION),
    FitSpec(Metric.OUTLIER_DIMS_REL, Site.ATTN_IN, Basis.COMPUTATION, count=True),
    FitSpec(Metric.OUTLIER_DIMS_REL, Site.MLP_IN, Basis.COMPUTATION, count=True),
    FitSpec("final_val_loss", site=None),
)
"""Kurtosis over the exact null 3(d-1)/(d+1) (a power law of kurtosis / null: slope 0
without a privileged basis at every width, defined for every config, SGD's included, and
free of the null's own finite-width drift) of the residual stream and of the MLP input in
its computation basis. Beside it the width-honest measure at the same two sites: the top-1
coordinate share of each token's centred energy (mean over tokens), a plain power law of the
share, not over a null: a coordinate holding a fixed share of every token's energy reads that
share at every width (slope 0: no growth) where kurtosis grows as about d x share²; the
share's own null falls with d (about 0.11 / 0.064 / 0.037 for Gaussian tokens at d 64 / 128 /
256), so a slope above 0 cannot come from width alone. Stores written before the metric
existed skip these two fits. Then the outlier fraction (``outlier_dims_rel`` / d, a count
model that handles zeros) at the attention and MLP inputs, and the final validation loss."""


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
    if "optimizer" not in per.columns or spec.count:
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


def family_contrasts(families: Sequence[str], primary: PrimaryContrast | None) -> list[tuple[tuple[str, ...], str, bool]]:
    """The family contrasts of one stratum, ``(a families, b family, declared)``: every pair
    (a the reference: rotation_equivariant, else the first in ``charts.FAMILY_ORDER``), and the
    declared primary contrast (``primary.family`` minus its pooled others) where that family
    and another are present; a pair that is the declared contrast (either way round) is
    replaced by it."""
    order = list(dict.fromkeys(["rotation_equivariant", *charts.FAMILY_ORDER]))
    fams = sorted(families, key=lambda f: order.index(f) if f in order else len(order))
    pairs = [((fa,), fb, False) for i, fa in enumerate(fams) for fb in fams[i + 1 :]]
    if primary is None or primary.family not in fams:
        return pairs
    pooled = tuple(primary.against_in(fams))
    if not pooled:
        return pairs
    same = {(pooled, primary.family), ((primary.family,), pooled[0])} if len(pooled) == 1 else set()
    return [(pooled, primary.family, True), *(p for p in pairs if (p[0], p[1]) not in same)]


def compare_family_lines(
    per: pl.DataFrame,
    line: str,
    spec: FitSpec,
    confidence: float,
    fitted: dict[Any, Any],
    primary: PrimaryContrast | None = None,
    primary_fit: bool = False,
) -> list[dict[str, Any]]:
    """Every family contrast within one stratum (same norm and rotation) with fitted lines on
    both sides (``family_contrasts``): family b's exponent minus family a's, the optimisers as
    the units, seeds paired (``families.compare_families``). ``role`` is ``primary`` on the
    declared contrast when ``primary_fit`` (this spec is the primary's fit), else
    ``secondary``."""
    if not {"optimizer", "optimizer_family"} <= set(per.columns) or spec.count:
        return []
    strata = [c for c in ("norm", "rotation_label") if c in per.columns]
    ok = [k[0] for k, v in fitted.items() if isinstance(v, fits.PowerLawFit)]
    info = per.group_by(line).agg(pl.col(c).first() for c in ["optimizer", "optimizer_family", *strata])
    info = info.filter(pl.col(line).is_in(ok))
    rows = []
    for key, group in (info.partition_by(strata, as_dict=True) if strata else {(): info}).items():
        members: dict[str, list[dict[str, Any]]] = {}
        for r in sorted(group.iter_rows(named=True), key=lambda r: str(r["optimizer"])):
            members.setdefault(r["optimizer_family"], []).append(r)
        for fa, fb, declared in family_contrasts(list(members), primary):
            side_a = [r for f in fa for r in members[f]]
            name_a = " + ".join(fa)
            c = families.compare_families(
                [fitted[(r[line],)] for r in side_a], [fitted[(r[line],)] for r in members[fb]], confidence,
                labels=(name_a, fb),
            )  # fmt: skip
            rows.append({
                "fit": spec.label, **dict(zip(strata, key, strict=True)),
                "family_a": name_a, "family_b": fb,
                "optimizers_a": " + ".join(r["optimizer"] for r in side_a),
                "optimizers_b": " + ".join(r["optimizer"] for r in members[fb]),
                "difference": c.difference, "difference_low": c.difference_ci[0],
                "difference_high": c.difference_ci[1], "p_value": c.p_value, "p_exact": c.p_exact,
                "method": c.method, "role": PRIMARY if declared and primary_fit else SECONDARY,
            })  # fmt: skip
    return rows


def level_rows(
    per: pl.DataFrame,
    x: str,
    line: str,
    spec: FitSpec,
    confidence: float,
    primary: PrimaryContrast | None = None,
    primary_fit: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What the fits are fitted to, with intervals: each line's seed mean at each size with its
    t-interval (levels), and at each size, within one stratum (norm and rotation), every family
    contrast (``family_contrasts``) in level: the optimisers as the units, seeds paired
    (``families.compare_family_values``, a line being one optimiser config). ``role`` is
    ``primary`` on the declared contrast at the largest size when ``primary_fit``. With three
    widths a slope is rarely decided; the level at the largest width often is."""
    if spec.count or not per.height:
        return [], []
    strata = [c for c in ("norm", "rotation_label") if c in per.columns]
    carry = [c for c in ("optimizer", "optimizer_family", "lr", *strata) if c in per.columns]
    table = summarise(per.lazy(), [line, x], confidence=confidence, carry=carry).collect()
    table = table.join(selection.line_labels(per, line).select(line, "config"), on=line, how="left")
    levels = [
        {"fit": spec.label, "config": r["config"], **{c: r[c] for c in carry}, "size": r[x],
         "mean": r["mean"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "n_seeds": r["n"]}  # fmt: skip
        for r in table.sort(x, "config").iter_rows(named=True)
    ]
    if "optimizer_family" not in per.columns:
        return levels, []
    largest = per.get_column(x).max()
    rows = []
    for key, group in per.sort([*strata, x]).partition_by([*strata, x], as_dict=True, maintain_order=True).items():
        members: dict[str, list[tuple[str, dict[Any, float]]]] = {}  # family -> (optimizer, {seed: value}) per line
        for g in sorted(group.partition_by(line), key=lambda g: (str(g["optimizer"][0]), str(g[line][0]))):
            g = g.filter(pl.col("value").is_not_null() & pl.col("value").is_not_nan())
            if g.height:
                by_seed = dict(zip(g.get_column("seed").to_list(), g.get_column("value").to_list(), strict=True))
                members.setdefault(g["optimizer_family"][0], []).append((g["optimizer"][0], by_seed))
        for fa, fb, declared in family_contrasts(list(members), primary):
            side_a = [m for f in fa for m in members[f]]
            name_a = " + ".join(fa)
            c = families.compare_family_values([v for _, v in side_a], [v for _, v in members[fb]], confidence,
                                               labels=(name_a, fb))  # fmt: skip
            rows.append({
                "fit": spec.label, **dict(zip(strata, key[:-1], strict=True)), "size": key[-1],
                "family_a": name_a, "family_b": fb,
                "optimizers_a": " + ".join(o for o, _ in side_a),
                "optimizers_b": " + ".join(o for o, _ in members[fb]),
                "difference": c.difference, "difference_low": c.difference_ci[0],
                "difference_high": c.difference_ci[1], "p_value": c.p_value, "p_exact": c.p_exact,
                "method": c.method, "role": PRIMARY if declared and primary_fit and key[-1] == largest else SECONDARY,
            })  # fmt: skip
    return levels, _holm_over_sizes(rows)


def _holm_over_sizes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``p_exact_holm``: each contrast's exact permutation p (one-sided, b > a) Holm-adjusted over
    the sizes it is tested at (one family per contrast, stratum and fit)."""
    from analysis.multiplicity import holm

    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(v for k, v in r.items() if k not in _PER_SIZE), []).append(i)
    for idx in groups.values():
        for i, p in zip(idx, holm([rows[i]["p_exact"] for i in idx]), strict=True):
            rows[i]["p_exact_holm"] = float(p)
    return rows


_PER_SIZE = {"size", "optimizers_a", "optimizers_b", "difference", "difference_low", "difference_high", "p_value", "p_exact", "method", "role"}


def primary_fit(fit_specs: Sequence[FitSpec], primary: PrimaryContrast | None) -> FitSpec | None:
    """The fit the primary contrast is read in: the spec named ``primary.fit``, else the first
    (None without a primary, or when no spec has that name)."""
    if primary is None or not fit_specs:
        return None
    if primary.fit is None:
        return fit_specs[0]
    return next((s for s in fit_specs if s.name == primary.fit), None)


def adjust_comparisons(
    comparisons: pl.DataFrame, family_comparisons: pl.DataFrame, family_levels: pl.DataFrame,
    primary: PrimaryContrast | None, fit_specs: Sequence[FitSpec],
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, str]:
    """The three comparison tables with ``p_holm`` (``multiplicity.adjust_tables``: one Holm
    family over every secondary test; the primary rows keep their raw p), and a note saying
    what the primary contrast was and whether the report found it."""
    comparisons, family_comparisons, family_levels = adjust_tables([comparisons, family_comparisons, family_levels])
    n = sum(int(t.get_column("p_value").is_not_nan().sum()) for t in (comparisons, family_comparisons, family_levels)
            if "p_value" in t.columns)  # fmt: skip
    primary_rows = [t.filter(pl.col("role") == PRIMARY) for t in (family_comparisons, family_levels) if "role" in t.columns]
    found = sum(t.height for t in primary_rows)
    tested = sum(int(t.get_column("p_value").is_not_nan().sum()) for t in primary_rows if "p_value" in t.columns)
    spec = primary_fit(fit_specs, primary)
    if primary is None:
        return comparisons, family_comparisons, family_levels, (
            f"No primary contrast declared: all {n} p-values in the comparison tables are one Holm family (p_holm).")
    if spec is None or not found:
        where = f"fit {primary.fit!r} is not among the report's fits" if spec is None else \
            "its families are not both present with fitted lines"
        return comparisons, family_comparisons, family_levels, (
            f"Primary contrast {primary} not found ({where}): all {n} p-values in the comparison tables are one "
            "Holm family (p_holm).")  # fmt: skip
    return comparisons, family_comparisons, family_levels, (
        f"Primary contrast, declared before the run: {primary.family} minus "
        f"{' + '.join(primary.against) if primary.against else 'every other family pooled'}, the optimisers as "
        f"the units, in {spec.label}: its slope and its level at the largest size (role = primary, raw p"
        f"{'' if tested else '; here with no p-value: a family of one optimiser, or one seed, gives none'}). "
        f"The other {n - tested} p-values in the comparison tables are Holm-adjusted together (p_holm).")
