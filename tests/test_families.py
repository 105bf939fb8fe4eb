"""analysis.families: family contrasts with the optimiser as the unit, seeds paired."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from analysis.families import compare_families, compare_family_values, seed_adjusted_means
from analysis.fits import compare_family_values as reexported
from analysis.power_law import fit_power_law

PER_COORDINATE = {"adam": 0.34, "adafactor": 0.19, "lion": 0.44}
BASIS_FREE = {"rotated_adam": -0.005, "soap": 0.005, "sgd": 0.015, "muon": 0.016}
"""The per-optimiser slopes of log(kurtosis / null) the referee review quoted (families study)."""


def _lines(means: dict[str, float], seed_effects: dict[int, float], noise: float, rng: np.random.Generator):
    """One {seed: value} per optimiser whose seed mean is exactly its planted mean: a seed effect
    shared by every optimiser plus noise centred within the optimiser."""
    out = []
    for mean in means.values():
        z = rng.normal(0.0, noise, len(seed_effects))
        z -= z.mean()
        out.append({s: mean + e + zi for (s, e), zi in zip(seed_effects.items(), z, strict=True)})
    return out


def _seeds_as_replicates(a: list[dict], b: list[dict]) -> float:
    """The contrast the report used before (seeds as the replicates of a family): the
    variance is each line's seed sem² x (1 / its family's line count)², Welch-Satterthwaite df."""
    from scipy import stats

    parts = [(1 / len(a), np.array(list(v.values()))) for v in a] + [(-1 / len(b), np.array(list(v.values()))) for v in b]
    d = -sum(w * v.mean() for w, v in parts)
    terms = [w * w * v.var(ddof=1) / v.size for w, v in parts]
    df = sum(terms) ** 2 / sum(t * t / (v.size - 1) for t, (_, v) in zip(terms, parts, strict=True))
    return float(2 * stats.t.sf(abs(d) / math.sqrt(sum(terms)), df))


def test_the_reviews_numbers_with_the_optimisers_as_the_unit() -> None:
    """Per-optimiser slopes adam +0.34, adafactor +0.19, lion +0.44 against rotated_adam -0.005,
    soap +0.005, sgd +0.015, muon +0.016 (3 seeds each, a shared seed effect): per_coordinate
    minus basis-free = +0.32 [+0.005, +0.63], p = 0.049 (3 vs 4 optimisers, Welch)."""
    rng = np.random.default_rng(3)
    seeds = {0: 0.03, 1: -0.01, 2: -0.02}
    c = compare_family_values(_lines(BASIS_FREE, seeds, 0.02, rng), _lines(PER_COORDINATE, seeds, 0.02, rng),
                              labels=("basis-free", "per_coordinate"))  # fmt: skip
    assert c.difference == pytest.approx(0.97 / 3 - 0.031 / 4, abs=1e-12)
    assert round(c.difference, 2) == 0.32
    assert c.difference_ci[0] == pytest.approx(0.005, abs=0.001) and c.difference_ci[1] == pytest.approx(0.63, abs=0.005)
    assert c.p_value == pytest.approx(0.049, abs=0.001)
    assert c.n_optimizers == (4, 3) and c.df == pytest.approx(2.0, abs=0.05) and c.n_paired_seeds == 3
    assert c.method.startswith("optimisers as the unit: Welch-Satterthwaite t over 4 vs 3 optimiser means")


def test_one_optimiser_carrying_the_family_is_not_a_family_effect() -> None:
    """3 per-coordinate optimisers of which one reads +0.3 and two the null, against 4 at the null,
    20 seeds each with tiny noise: not a family effect (p > 0.05). Seeds as the replicates (the
    report's contrast before) call it one at p < 1e-6."""
    rng = np.random.default_rng(4)
    seeds = {s: rng.normal(0, 0.01) for s in range(20)}
    null = _lines({o: 0.0 for o in BASIS_FREE}, seeds, 0.005, rng)
    carried = _lines({"adam": 0.3, "adafactor": 0.0, "lion": 0.0}, seeds, 0.005, rng)
    c = compare_family_values(null, carried)
    assert c.difference == pytest.approx(0.1, abs=1e-9)
    assert c.p_value > 0.05 and c.difference_ci[0] < 0 < c.difference_ci[1]
    assert _seeds_as_replicates(null, carried) < 1e-6


def test_a_family_all_of_whose_optimisers_differ_is_one() -> None:
    """The same design with every per-coordinate optimiser at +0.3 (between-optimiser sd 0.02):
    a family effect, decided."""
    rng = np.random.default_rng(5)
    seeds = {s: rng.normal(0, 0.01) for s in range(5)}
    null = _lines({o: rng.normal(0, 0.02) for o in BASIS_FREE}, seeds, 0.005, rng)
    moved = _lines({o: 0.3 + rng.normal(0, 0.02) for o in PER_COORDINATE}, seeds, 0.005, rng)
    c = compare_family_values(null, moved)
    assert c.p_value < 0.01 and c.difference_ci[0] > 0.2


def test_seeds_pair_across_optimisers() -> None:
    """A large seed effect shared by every optimiser, one optimiser missing seed 2: the seed-
    adjusted means are the planted optimiser means exactly (plain seed means are off by the
    missing seed's effect), and the contrast is exact."""
    effects = {0: 1.0, 1: -0.4, 2: -0.6}
    truth = [0.1, 0.3, 0.5]
    lines = [{s: m + e for s, e in effects.items()} for m in truth]
    del lines[1][2]
    mu, paired = seed_adjusted_means(lines)
    assert paired == 3
    # the offsets between lines are what the model identifies: compare after centring on line 0
    assert mu - mu[0] == pytest.approx(np.array(truth) - truth[0], abs=1e-12)
    plain = np.array([np.mean(list(v.values())) for v in lines])
    assert abs((plain[1] - plain[0]) - 0.2) > 0.2  # unpaired, the missing seed biases the mean
    c = compare_family_values([lines[0]], [lines[1], lines[2]])
    assert c.difference == pytest.approx((0.3 + 0.5) / 2 - 0.1, abs=1e-12)
    assert "seeds paired (3 shared)" in c.method or c.method.startswith("no interval")


def test_a_one_optimiser_family_has_no_interval_and_says_why() -> None:
    """One optimiser a side (or on one side) supports no family claim: the difference is
    reported, the interval and p are NaN, the method names the family."""
    a = [{0: 0.1, 1: 0.12, 2: 0.11}]
    b = [{0: 0.5, 1: 0.52, 2: 0.49}, {0: 0.6, 1: 0.61, 2: 0.62}]
    c = compare_family_values(a, b, labels=("rotation_equivariant", "per_coordinate"))
    assert c.difference == pytest.approx((0.503333 + 0.61) / 2 - 0.11, abs=1e-5)
    assert math.isnan(c.p_value) and all(math.isnan(v) for v in c.difference_ci)
    assert c.method.startswith("no interval: rotation_equivariant has 1 optimiser")
    assert "cannot carry a family claim" in c.method
    with pytest.raises(ValueError, match="at least one line"):
        compare_family_values([], b)


def test_mixed_model_cross_check() -> None:
    """statsmodels MixedLM (family fixed; optimiser and seed crossed random effects), REML, on
    balanced 4 vs 4 optimisers x 3 seeds: the same family difference and standard error."""
    import pandas as pd
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(6)
    for _ in range(3):
        seeds = {s: rng.normal(0, 0.2) for s in range(3)}
        a = _lines({f"a{i}": rng.normal(0, 0.1) for i in range(4)}, seeds, 0.03, rng)
        b = _lines({f"b{i}": 0.3 + rng.normal(0, 0.1) for i in range(4)}, seeds, 0.03, rng)
        rows = [{"family": fam, "optimizer": f"{fam}{i}", "seed": s, "y": v, "all": 1}
                for fam, lines in (("a", a), ("b", b)) for i, line in enumerate(lines) for s, v in line.items()]  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mixed = smf.mixedlm("y ~ family", pd.DataFrame(rows), groups="all",
                                vc_formula={"optimizer": "0 + C(optimizer)", "seed": "0 + C(seed)"}).fit(reml=True)  # fmt: skip
        c = compare_family_values(a, b)
        assert mixed.converged
        assert c.difference == pytest.approx(mixed.params["family[T.b]"], rel=1e-6)
        assert c.se == pytest.approx(mixed.bse["family[T.b]"], rel=1e-3)


def test_interval_covers_at_its_nominal_rate() -> None:
    """500 simulated studies, 3 vs 4 optimisers drawn around their family means (sd 0.1) x 3
    seeds (shared seed effects, noise 0.03): the 95% interval covers the true difference 92-99%
    of the time (Welch-Satterthwaite is a little conservative at these sizes)."""
    rng = np.random.default_rng(20261203)
    covered = 0
    for _ in range(500):
        seeds = {s: rng.normal(0, 0.1) for s in range(3)}
        a = _lines({f"a{i}": rng.normal(0, 0.1) for i in range(4)}, seeds, 0.0, rng)
        b = _lines({f"b{i}": 0.3 + rng.normal(0, 0.1) for i in range(3)}, seeds, 0.0, rng)
        b = [{s: v + rng.normal(0, 0.03) for s, v in line.items()} for line in b]
        c = compare_family_values(a, b)
        covered += c.difference_ci[0] <= 0.3 <= c.difference_ci[1]
    assert 0.92 <= covered / 500 <= 0.99, covered


def test_families_of_fitted_lines_pair_their_seed_exponents() -> None:
    """compare_families reads each fit's per-seed exponents by seed label: the same contrast as
    compare_family_values on {seed: exponent}; a one-seed line counts with its one exponent, paired."""
    rng = np.random.default_rng(7)
    x = np.repeat([1e5, 1e6, 1e7], 3)
    seeds = np.tile([10, 11, 12], 3)

    def fit(b: float, keep=slice(None)):
        y = 3.0 + 0.02 * x**b * np.exp(0.05 * rng.standard_normal(x.size))
        return fit_power_law(x[keep], y[keep], offset=3.0, seeds=seeds[keep], n_boot=0)

    a, b = [fit(0.1), fit(0.12)], [fit(0.5), fit(0.45), fit(0.55, keep=seeds == 10)]
    assert a[0].seed_labels == (10, 11, 12) and b[2].seed_labels == (10,)
    assert b[2].seed_exponents[0] == pytest.approx(b[2].exponent, rel=1e-12)
    c = compare_families(a, b)
    values = [dict(zip(f.seed_labels, f.seed_exponents, strict=True)) for f in (*a, *b)]
    want = compare_family_values(values[:2], values[2:])
    assert c.difference == pytest.approx(want.difference, rel=1e-12) and c.p_value == pytest.approx(want.p_value)
    assert c.n_optimizers == (2, 3) and reexported is compare_family_values


# ---------------------------------------------------------------- exact tests (issue 45, item 4)


def test_permutation_p_is_exactly_one_in_seventy_when_all_four_exceed_all_four() -> None:
    """4 per-coordinate optimisers each above all 4 basis-free ones: of the C(8,4) = 70 splits only the
    observed one reaches its difference; reversed, every split does (p = 1)."""
    from analysis.families import permutation_p

    high, low = [0.5, 0.9, 0.6, 1.2], [0.01, -0.02, 0.0, 0.03]
    assert permutation_p(low, high) == 1 / 70
    assert permutation_p(high, low) == 1.0
    # one basis-free optimiser above one per-coordinate: the observed split and the one swapping them
    assert permutation_p([0.01, -0.02, 0.0, 0.55], [0.5, 0.9, 0.6, 1.2]) == 2 / 70
    # 4 vs 3: C(7,3) = 35 splits
    assert permutation_p(low, high[:3]) == 1 / 35
    assert math.isnan(permutation_p([], high))


def test_family_comparison_carries_the_exact_p_beside_welch() -> None:
    from analysis.families import permutation_p

    rng = np.random.default_rng(3)
    c = compare_family_values(_lines(BASIS_FREE, {0: 0.0, 1: 0.01, 2: -0.01}, 0.001, rng),
                              _lines(PER_COORDINATE, {0: 0.0, 1: 0.01, 2: -0.01}, 0.001, rng))
    assert c.p_exact == 1 / 35 == permutation_p(c.line_means[0], c.line_means[1])


def test_holm_over_widths_of_exact_ps_is_exact() -> None:
    """Three widths at p = 1/70: Holm multiplies the smallest by 3, then carries the maximum: every
    adjusted p is 3/70; with 1/70, 2/70, 5/70: 3/70, 4/70, 5/70."""
    from analysis.multiplicity import holm

    assert list(holm([1 / 70] * 3)) == [3 / 70] * 3
    assert list(holm([2 / 70, 1 / 70, 5 / 70])) == pytest.approx([4 / 70, 3 / 70, 5 / 70], abs=0)


def test_sign_flip_p_over_n_seeds_is_two_over_two_to_the_n_at_best() -> None:
    from analysis.families import paired_interval, sign_flip_p

    for n in (1, 3, 5, 8):
        assert sign_flip_p(np.linspace(0.2, 1.0, n)) == 2 / 2**n
        assert sign_flip_p(-np.linspace(0.2, 1.0, n)) == 2 / 2**n
    # 3 seeds, one against: the flips reaching |mean| >= the observed, counted by brute force
    d = np.array([0.5, 0.4, -0.1])
    flips = [abs(np.dot(s, d)) >= abs(d.sum()) for s in np.array(np.meshgrid(*[[1, -1]] * 3)).T.reshape(-1, 3)]
    assert sign_flip_p(d) == sum(flips) / 8 == 4 / 8
    assert sign_flip_p(np.zeros(4)) == 1.0
    mean, lo, hi = paired_interval([0.1, 0.3, 0.2])
    from scipy import stats

    half = stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)
    assert (mean, lo, hi) == pytest.approx((0.2, 0.2 - half, 0.2 + half), abs=1e-12)
    assert math.isnan(paired_interval([0.1])[1])
