"""analysis.multiplicity: Holm's adjustment, the primary contrast and its text form."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis.multiplicity import PrimaryContrast, adjust_tables, holm, parse_primary


def test_holm_matches_statsmodels() -> None:
    """Holm's step-down on random p-values (ties and values near 1 included) equals
    statsmodels' multipletests(method="holm"); NaN stays NaN and is not counted in m."""
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 30):
        p = rng.uniform(0, 1, n) ** 3
        if n > 2:
            p[1] = p[0]
        assert holm(p) == pytest.approx(multipletests(p, method="holm")[1], rel=1e-12)
    p = np.array([0.01, math.nan, 0.04, 0.03])
    out = holm(p)
    assert math.isnan(out[1]) and out[[0, 2, 3]] == pytest.approx(multipletests(p[[0, 2, 3]], method="holm")[1])


def test_adjust_tables_is_one_holm_family_and_the_primary_keeps_its_raw_p() -> None:
    pairs = pl.DataFrame({"p_value": [0.01, 0.2]})
    families = pl.DataFrame({"p_value": [0.03, 0.04, math.nan], "role": ["primary", "secondary", "secondary"]})
    levels = pl.DataFrame({"p_value": [0.001], "role": ["secondary"]})
    a, b, c = adjust_tables([pairs, families, levels])
    want = holm([0.01, 0.2, 0.04, 0.001])
    assert a.get_column("p_holm").to_list() == pytest.approx(want[:2].tolist())
    assert b.get_column("p_holm").to_list()[:2] == pytest.approx([0.03, want[2]])
    assert math.isnan(b.get_column("p_holm")[2]) and c.get_column("p_holm").to_list() == pytest.approx([want[3]])


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("per_coordinate", PrimaryContrast()),
        (" rotation_equivariant ", PrimaryContrast("rotation_equivariant")),
        ("per_coordinate:rotation_equivariant+adaptive_basis",
         PrimaryContrast("per_coordinate", ("rotation_equivariant", "adaptive_basis"))),
        ("per_coordinate@kurtosis_mlp_in_over_null", PrimaryContrast(fit="kurtosis_mlp_in_over_null")),
        ("none", None),
        (None, None),
    ],
)  # fmt: skip
def test_parse_primary(text: str | None, want: PrimaryContrast | None) -> None:
    assert parse_primary(text) == want


def test_parse_primary_rejects_an_unknown_family_or_fit_name() -> None:
    with pytest.raises(ValueError, match="unknown family lion-family"):
        parse_primary("lion-family")
    with pytest.raises(ValueError, match="unknown family nonsense"):
        parse_primary("per_coordinate:nonsense")
    with pytest.raises(ValueError, match="names no fit"):
        parse_primary("per_coordinate@")


def test_parse_primary_rejects_an_empty_side() -> None:
    with pytest.raises(ValueError, match="FAMILY"):
        parse_primary("per_coordinate:+")
    with pytest.raises(ValueError, match="FAMILY"):
        parse_primary(":sgd")


def test_the_pooled_side_is_every_other_family_present() -> None:
    fams = ["rotation_equivariant", "per_coordinate", "fixed_random_basis"]
    assert PrimaryContrast().against_in(fams) == ["rotation_equivariant", "fixed_random_basis"]
    assert PrimaryContrast(against=("fixed_random_basis", "soap_family")).against_in(fams) == ["fixed_random_basis"]
