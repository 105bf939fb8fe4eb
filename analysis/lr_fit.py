"""The best lr against model size: lr*(N) = lr0 (N / N0)^b per tuned line (optimiser, norm,
rotation and every other hyper-parameter), from ``selection.best_lr``'s points, so the sizes
without a ladder can use the fitted lr (a spec's ``lr_scaling: {reference_params: N0,
exponent: b}`` with ``lr: lr0``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from analysis.selection import line_labels

__all__ = ["LR_FIT_COLUMNS", "fit_lr_scaling", "lr_fit_curves", "round_reference"]

LR_FIT_COLUMNS = (
    "optimizer", "norm", "rotation_label", "config", "reference_params", "lr_at_reference", "exponent",
    "exponent_lo", "exponent_hi", "n_sizes", "note", "tuned_line_id",
)  # fmt: skip


def round_reference(sizes: np.ndarray) -> float:
    """N0: the geometric mean of the fitted sizes (where lr0 is best determined), rounded
    to two significant figures so a spec can quote it."""
    g = float(np.exp(np.log(sizes).mean()))
    digits = 1 - int(math.floor(math.log10(g)))
    return float(round(g, digits))


def fit_lr_scaling(
    best: pl.DataFrame, x: str = "params_non_embedding", *, confidence: float = 0.95
) -> pl.DataFrame:
    """One row per tuned line with a ladder (``n_lrs`` > 1) at two or more sizes: least
    squares of log lr* on log(N / N0); ``exponent_lo``/``exponent_hi`` the t(n_sizes - 2)
    interval (null with two sizes). ``note`` flags optima at a ladder's edge (there the
    fitted lr* is a bound, not an optimum) and sizes left out (untuned, one lr)."""
    from scipy import stats

    schema: dict[str, Any] = {
        "optimizer": pl.String, "norm": pl.String, "rotation_label": pl.String, "config": pl.String,
        "reference_params": pl.Float64, "lr_at_reference": pl.Float64, "exponent": pl.Float64,
        "exponent_lo": pl.Float64, "exponent_hi": pl.Float64, "n_sizes": pl.Int64, "note": pl.String,
        "tuned_line_id": pl.String,
    }  # fmt: skip
    need = {"tuned_line_id", "lr", "n_lrs", x}
    if best.height == 0 or not need <= set(best.columns):
        return pl.DataFrame(schema=schema)
    labels = line_labels(best, "tuned_line_id")
    rows = []
    for (line,), part in best.partition_by("tuned_line_id", as_dict=True, maintain_order=True).items():
        tuned = part.filter((pl.col("n_lrs") > 1) & pl.col(x).is_not_null() & (pl.col("lr") > 0)).sort(x)
        if tuned.get_column(x).n_unique() < 2:
            continue
        n_left = part.height - tuned.height
        size = tuned.get_column(x).cast(pl.Float64).to_numpy()
        lr = tuned.get_column("lr").cast(pl.Float64).to_numpy()
        n0 = round_reference(np.unique(size))
        lx, ly = np.log(size / n0), np.log(lr)
        b, a = np.polyfit(lx, ly, 1)
        n = len(size)
        lo = hi = None
        if n > 2:
            resid = ly - (a + b * lx)
            s2 = float(resid @ resid) / (n - 2)
            se = math.sqrt(s2 / float(((lx - lx.mean()) ** 2).sum()))
            t = float(stats.t.ppf((1 + confidence) / 2, n - 2))
            lo, hi = float(b - t * se), float(b + t * se)
        words = []
        if n == 2:
            words.append("2 sizes: no interval")
        edge = tuned.filter(pl.col("edge").is_not_null()) if "edge" in tuned.columns else tuned.head(0)
        for r in edge.iter_rows(named=True):
            bound = "≤" if r["edge"] == "low" else "≥"
            words.append(f"edge of ladder at {x}={r[x]:,}: lr* {bound} {r['lr']:g}")
        if n_left:
            words.append(f"{n_left} untuned size(s) left out")
        first = part.row(0, named=True)
        label = labels.filter(pl.col("tuned_line_id") == line)
        rows.append({
            "optimizer": first.get("optimizer"), "norm": first.get("norm"),
            "rotation_label": first.get("rotation_label"),
            "config": label.get_column("config")[0] if label.height else None,
            "reference_params": n0, "lr_at_reference": float(math.exp(a)), "exponent": float(b),
            "exponent_lo": lo, "exponent_hi": hi, "n_sizes": n, "note": "; ".join(words), "tuned_line_id": line,
        })  # fmt: skip
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame(rows, schema=schema).sort("optimizer", "norm", "rotation_label", "config", nulls_last=True)


def lr_fit_curves(lr_fits: pl.DataFrame, best: pl.DataFrame, x: str = "params_non_embedding", n_points: int = 30) -> pl.DataFrame:
    """The fitted lr*(N) of each line over its sizes' range, for the chart."""
    frames = []
    for r in lr_fits.iter_rows(named=True):
        sizes = best.filter(pl.col("tuned_line_id") == r["tuned_line_id"]).get_column(x).cast(pl.Float64)
        grid = np.geomspace(float(sizes.min()), float(sizes.max()), n_points)
        fit = r["lr_at_reference"] * (grid / r["reference_params"]) ** r["exponent"]
        frames.append(pl.DataFrame({x: grid, "fit": fit}).with_columns(
            tuned_line_id=pl.lit(r["tuned_line_id"]), optimizer=pl.lit(r["optimizer"])))  # fmt: skip
    if not frames:
        return pl.DataFrame(schema={x: pl.Float64, "fit": pl.Float64, "tuned_line_id": pl.String, "optimizer": pl.String})
    return pl.concat(frames)
