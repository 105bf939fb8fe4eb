"""The exact no-privilege null of centred per-token kurtosis, declared once.

Under a Haar-random rotation each token vector is uniform on its sphere (after centring, on
the sphere of the (d-1)-dimensional mean-zero subspace), so the expected centred per-token
kurtosis is 3(d-1)/(d+1) whatever the activations: 2.818 at d 32, 2.953 at d 128, 3 only as
d grows. Excess kurtosis is measured against it, and the report's kurtosis fits use
kurtosis / null, which is 1 for every config without a privileged basis (SGD's included).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, overload

import numpy as np
import polars as pl

__all__ = [
    "NULL_LABEL", "TOP_SHARE_NULL_LABEL", "kurtosis_null", "null_expr", "top_share_label", "top_share_null",
    "top_share_null_expr",
]

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


# ---------------------------------------------------------------- the top-k energy share

TOP_SHARE_NULL_LABEL = "top-1 null (random basis)"
"""How charts and tables name the top-1 share's null (``top_share_null(d)``)."""


def top_share_label(k: int = 1) -> str:
    """The null's label for the top-``k`` share, e.g. ``top-4 null (random basis)``."""
    return f"top-{k} null (random basis)"


def top_share_null(d: Any, k: int = 1) -> Any:
    """E[top-k share] of a centred token uniform on its sphere in R^d (equivalently Gaussian
    coordinates): with c = x - mean(x), the expected sum of the k largest c_j^2 / sum_j c_j^2,
    what the metrics ``top1_share`` / ``top4_share`` read in a Haar-random basis whatever the
    activations (a number, or a numpy array of widths). It falls with d: top-1 0.282 / 0.178 /
    0.108 / 0.0636 / 0.0367 at d 16 / 32 / 64 / 128 / 256 (of order 2 ln(d) / d), while
    a coordinate holding a fixed share f of every token reads f at every width.

    Exact up to quadrature (relative error below 1e-6 from d 3 to 32768; d 2 and k = d are
    closed forms: 1/2 and 1), no Monte Carlo. The derivation: c = P g for g ~ N(0, I_d) and P the
    centring projection; |c|^2 ~ chi^2(d-1) is independent of the direction c / |c|, so
    E[share] = E[sum of the k largest c_j^2] / (d-1) = (1/(d-1)) int_0^inf E[min(N_s, k)] 2s ds,
    with N_s = #{j : |c_j| > s}. And c is g conditioned on sum(g) = 0, so by Fourier inversion of
    that sum's density, P(N_s = m) = sqrt(2 pi d) / pi * C(d, m) int_0^inf a^(d-m) b^m dw, where
    a(w) = E[cos(w g); |g| <= s] and b(w) = E[cos(w g); |g| > s] = exp(-s^2/2) Re[exp(isw)
    w_F((w + is) / sqrt 2)] (w_F the Faddeeva function), integrated by Gauss-Legendre in s and w.
    Cached per (d, k)."""
    if isinstance(d, np.ndarray):
        return np.array([top_share_null(int(v), k) for v in d.ravel()], dtype=float).reshape(d.shape)
    if isinstance(d, float) and not d.is_integer():
        raise ValueError(f"top_share_null: width d must be a whole number, got {d:g}")
    return _top_share_null(int(d), int(k))


def top_share_null_expr(d: str | pl.Expr = "d_model", k: int = 1) -> pl.Expr:
    """``top_share_null`` of a width column, as a Polars expression."""
    col = pl.col(d) if isinstance(d, str) else d

    def values(s: pl.Series) -> pl.Series:
        return pl.Series([None if v is None else top_share_null(int(v), k) for v in s.to_list()], dtype=pl.Float64)

    return col.map_batches(values, return_dtype=pl.Float64, is_elementwise=True)


@lru_cache(maxsize=None)
def _top_share_null(d: int, k: int, refine: int = 1) -> float:
    """``top_share_null``; ``refine`` > 1 takes the w-integral ``refine`` times further and every
    grid ``refine`` times finer (the tests' convergence check)."""
    if d < 2:
        raise ValueError(f"top_share_null: width d must be >= 2, got {d}")
    if not 1 <= k <= d:
        raise ValueError(f"top_share_null: k must be in 1..d ({d}), got {k}")
    if k == d or (d == 2):  # every share, or a centred pair: two equal shares
        return 1.0 if k == d else 0.5
    n = d - k + 1  # the smallest power of a(w) below: the w-integrand's narrowest width is 1 / sqrt(n)
    s_max = math.sqrt(2.0 * math.log(d)) + 6.0  # d P(|g| > s_max) < 1e-10
    s, ws = _gauss_legendre(0.0, s_max, 20 * refine)
    # w: out to 30 widths of the integrand's Gaussian core (further at small d, where the box's
    # sharp edge makes a(w) decay only as 1/w); panels resolve both the core and exp(isw)
    w_max = 30.0 / math.sqrt(n) * (4.0 if d <= 6 else 1.0) * refine
    w, ww = _gauss_legendre(0.0, w_max, refine * math.ceil(w_max / min(6.0 / s_max, 2.0 / math.sqrt(n))))
    log_c = [math.lgamma(d + 1) - math.lgamma(m + 1) - math.lgamma(d - m + 1) for m in range(k)]
    short = np.empty_like(s)  # k - E[min(N_s, k)] = sum_{m<k} (k - m) P(N_s = m)
    for rows in np.array_split(np.arange(s.size), max(1, s.size * w.size // 200_000)):
        S, W = s[rows, None], w[None, :]
        b = np.exp(-(S**2) / 2) * np.real(np.exp(1j * S * W) * _faddeeva((W + 1j * S) / math.sqrt(2.0)))
        a = np.exp(-(W**2) / 2) - b
        la, lb = np.log(np.abs(a) + 1e-300), np.log(np.abs(b) + 1e-300)
        total = np.zeros(rows.size)
        for m in range(k):
            sign = np.sign(a) ** (d - m) * np.sign(b) ** m
            with np.errstate(under="ignore"):
                term = sign * np.exp((d - m) * la + m * lb + log_c[m])
            total += (k - m) * math.sqrt(2.0 * math.pi * d) / math.pi * (term @ ww)
        short[rows] = total
    return float(np.sum((k - short) * 2.0 * s * ws)) / (d - 1)


def _gauss_legendre(lo: float, hi: float, panels: int, nodes: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre nodes and weights on [lo, hi]: ``panels`` equal panels."""
    x, w = np.polynomial.legendre.leggauss(nodes)
    edges = np.linspace(lo, hi, panels + 1)
    half, mid = np.diff(edges)[:, None] / 2, (edges[:-1] + edges[1:])[:, None] / 2
    return (mid + half * x).ravel(), (half * w).ravel()


def _faddeeva(z: np.ndarray, n: int = 32) -> np.ndarray:
    """w(z) = exp(-z^2) erfc(-iz) for Im z >= 0: Weideman's (1994) rational series, |error|
    ~1e-14 at n = 32 (tests/test_null.py compares it with scipy.special.wofz)."""
    m = 2 * n
    t_scale = math.sqrt(n / math.sqrt(2.0))
    t = t_scale * np.tan(np.arange(-m + 1, m) * np.pi / (2 * m))
    f = np.concatenate([[0.0], np.exp(-(t**2)) * (t_scale**2 + t**2)])
    coef = (np.real(np.fft.fft(np.fft.fftshift(f))) / (2 * m))[1 : n + 1][::-1]
    denom = t_scale - 1j * z
    return 2.0 * np.polyval(coef, (t_scale + 1j * z) / denom) / denom**2 + 1.0 / math.sqrt(math.pi) / denom
