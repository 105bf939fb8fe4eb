"""The exact no-privilege null of centred per-token kurtosis, declared once.

Under a Haar-random rotation each token vector is uniform on its sphere (after centring, on
the sphere of the (d-1)-dimensional mean-zero subspace), so the expected centred per-token
kurtosis is 3(d-1)/(d+1) whatever the activations: 2.818 at d 32, 2.953 at d 128, 3 only as
d grows. Excess kurtosis is measured against it, and the report's kurtosis fits use
kurtosis / null, which is 1 for every config without a privileged basis (SGD's included).
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import polars as pl

__all__ = ["NULL_LABEL", "kurtosis_null", "null_expr"]

NULL_LABEL = "null 3(d−1)/(d+1)"
"""How charts and tables name the null."""


@overload
def kurtosis_null(d: float) -> float: ...
@overload
def kurtosis_null(d: np.ndarray) -> np.ndarray: ...
def kurtosis_null(d: Any) -> Any:
    """3(d-1)/(d+1): the expected centred per-token kurtosis at width ``d`` in a Haar-random
    basis (a number or a numpy array of widths)."""
    if isinstance(d, np.ndarray):
        d = d.astype(float)
        if (d < 2).any():
            raise ValueError("kurtosis_null: width d must be >= 2")
        return 3.0 * (d - 1.0) / (d + 1.0)
    d = float(d)
    if not d >= 2:
        raise ValueError(f"kurtosis_null: width d must be >= 2, got {d:g}")
    return 3.0 * (d - 1.0) / (d + 1.0)


def null_expr(d: str | pl.Expr = "d_model") -> pl.Expr:
    """``kurtosis_null`` of a width column, as a Polars expression."""
    col = pl.col(d) if isinstance(d, str) else d
    col = col.cast(pl.Float64)
    return 3.0 * (col - 1.0) / (col + 1.0)
