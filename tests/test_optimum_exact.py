"""The exact tests at lr* (analysis.optimum_exact): each optimiser against its rotated twin paired by
seed at one lr, and the per-coordinate family against the rest with the optimiser as the unit."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis.optimum_exact import family_exact, twin_contrasts


def _trials(diffs: list[float]) -> pl.DataFrame:
    """adam and rotated_adam at d 64, lrs 1e-3 and 1e-2, 3 seeds each; at lr 1e-2 adam's log
    kurtosis exceeds the twin's by ``diffs[seed]``, at 1e-3 by 5 (a lr the test must not read)."""
    rows = []
    for seed, d in enumerate(diffs):
        for lr, gap in ((1e-3, 5.0), (1e-2, d)):
            base = 0.1 * seed
            rows += [{"optimizer": "adam", "d_model": 64, "lr": lr, "seed": seed, "log_kurtosis": base + gap,
                      "tuning_id": "a64"},
                     {"optimizer": "rotated_adam", "d_model": 64, "lr": lr, "seed": seed, "log_kurtosis": base,
                      "tuning_id": "r64"}]  # fmt: skip
    return pl.from_dicts(rows)


def test_the_twins_are_paired_at_the_shared_lr_nearest_lr_star() -> None:
    """lr* 8e-3 is nearest 1e-2: the paired differences there, their mean and t interval, the
    exact sign-flip p (all three of one sign: 2 / 2^3), and the ratio exp(mean)."""
    levels = pl.DataFrame({"tuning_id": ["a64", "r64"], "optimizer": ["adam", "rotated_adam"], "d_model": [64, 64],
                           "lr_star": [8e-3, 5e-3], "best_lr": [1e-2, 1e-2], "flag": ["", ""]})  # fmt: skip
    (row,) = twin_contrasts(_trials([0.4, 0.5, 0.6]), levels).iter_rows(named=True)
    assert row["lr"] == 1e-2 and row["n_seeds"] == 3 and row["twin"] == "rotated_adam"
    assert row["difference"] == pytest.approx(0.5) and row["ratio"] == pytest.approx(math.exp(0.5))
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((0.5 - half, 0.5 + half))
    assert row["p_sign_flip"] == pytest.approx(0.25) and row["p_min"] == pytest.approx(0.25)
    mixed = twin_contrasts(_trials([0.4, -0.5, 0.6]), levels).row(0, named=True)
    # |sum| 0.5; of the 8 sign patterns, 6 reach it (all but the two of sum ±0.3)
    assert mixed["p_sign_flip"] == pytest.approx(0.75)


def test_the_family_test_takes_the_optimiser_as_its_unit() -> None:
    """Two per-coordinate optimisers above two others at each of two widths: the exact one-sided
    permutation p is 1 / C(4, 2) = 1/6 at each, Holm over the two widths 1/3; a flagged optimiser
    is left out and named."""
    rows = []
    for d in (64, 128):
        for o, fam, v in (("adam", "per_coordinate", 1.0), ("lion", "per_coordinate", 0.8),
                          ("sgd", "basis_free", 0.0), ("soap", "basis_free", 0.1), ("muon", "basis_free", math.nan)):
            rows.append({"optimizer": o, "optimizer_family": fam, "d_model": d, "flag": "edge" if o == "muon" else "",
                         "log_kurtosis_over_null": v})  # fmt: skip
    out = family_exact(pl.from_dicts(rows))
    assert out.height == 2 and np.allclose(out.get_column("p_exact"), 1 / 6)
    assert np.allclose(out.get_column("p_exact_holm"), 1 / 3)
    assert out.get_column("difference").to_list() == pytest.approx([0.85, 0.85])
    assert set(out.get_column("left_out")) == {"muon (edge)"}
