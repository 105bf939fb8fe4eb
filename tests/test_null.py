"""analysis.null: the exact null of centred per-token kurtosis in a Haar-random basis."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from analysis.null import NULL_LABEL, kurtosis_null, null_expr


def _centred_kurtosis(x: np.ndarray) -> np.ndarray:
    c = x - x.mean(axis=1, keepdims=True)
    return (c**4).mean(axis=1) / (c**2).mean(axis=1) ** 2


def _haar(d: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def test_values_quoted_in_the_design() -> None:
    assert kurtosis_null(32) == pytest.approx(2.818, abs=5e-4)
    assert kurtosis_null(128) == pytest.approx(2.953, abs=5e-4)
    assert kurtosis_null(np.array([32, 128])) == pytest.approx([3 * 31 / 33, 3 * 127 / 129])
    frame = pl.DataFrame({"d_model": [32, 64]}).select(null_expr())
    assert frame.to_series().to_list() == pytest.approx([kurtosis_null(32), kurtosis_null(64)])
    assert NULL_LABEL == "null 3(d−1)/(d+1)"


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "heavy_tailed"])
def test_haar_rotated_activations_read_the_null_on_average(kind: str) -> None:
    """Whatever the activations (even with outlier coordinates), their mean centred kurtosis
    in Haar-random bases is 3(d-1)/(d+1), not 3 and not the uncentred 3d/(d+2)."""
    rng = np.random.default_rng(0)
    d, tokens, bases = 16, 400, 200
    x = rng.standard_normal((tokens, d))
    if kind == "sphere":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    if kind == "heavy_tailed":
        x = rng.standard_t(3, (tokens, d)) * np.r_[20.0, np.ones(d - 1)]  # one outlier dimension
        assert _centred_kurtosis(x).mean() > 5
    means = [_centred_kurtosis(x @ _haar(d, rng)).mean() for _ in range(bases)]
    got = float(np.mean(means))
    sem = float(np.std(means) / np.sqrt(bases))
    assert got == pytest.approx(kurtosis_null(d), abs=4 * sem + 2e-3)
    if kind != "heavy_tailed":  # (heavy-tailed tokens spread too widely across bases to tell the formulas apart)
        assert abs(got - 3 * d / (d + 2)) > 4 * sem  # the uncentred formula is wrong here


def test_width_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="d must be >= 2"):
        kurtosis_null(1)
