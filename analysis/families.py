"""Family contrasts with the optimiser as the unit, seeds paired.

A family claim ("per-coordinate optimisers grow outliers faster than basis-free ones") is a claim
about optimisers, so the optimiser (one line: an optimiser config) is the unit of replication,
not the seed. The seed is shared across optimisers (same init, same data order), so seeds pair.

``compare_family_values``: each line's value is its seed mean after removing seed effects, from
the additive model value[line, seed] = mu_line + s_seed fitted by least squares over every
(line, seed) cell whose seed two or more lines share (in a balanced design mu_line is the plain
seed mean: a seed effect shared by every line cancels from every contrast). A family's value is
the mean of its lines' mu; family b minus family a gets a Welch-Satterthwaite t-interval whose
variance is each family's between-optimiser variance / its optimiser count. A family with one
optimiser has no between-optimiser variance and cannot carry a family claim: the difference is
reported without an interval, and ``method`` says why. Beside the Welch interval, ``p_exact``: the
exact one-sided permutation p over the optimisers (``permutation_p``), which needs no normality of
four optimiser means; ``sign_flip_p`` and ``paired_interval`` test a paired contrast over seeds
(an optimiser minus its rotated twin).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.power_law import PowerLawFit

__all__ = [
    "FamilyComparison", "SeedValues", "compare_families", "compare_family_values", "paired_interval", "permutation_p",
    "seed_adjusted_means", "sign_flip_p",
]  # fmt: skip

SeedValues = Mapping[Hashable, float] | Sequence[float] | np.ndarray
"""One line's values by seed (``{seed: value}``); a bare array is unlabelled (never paired)."""


@dataclass(frozen=True)
class FamilyComparison:
    """Family b minus family a, the optimiser as the unit:
    difference = mean(mu_b) - mean(mu_a) over each family's lines' seed-adjusted means mu;
    se² = var(mu_a)/n_a + var(mu_b)/n_b (between-optimiser sample variances);
    df = se⁴ / (v_a²/(n_a-1) + v_b²/(n_b-1)) (Welch-Satterthwaite);
    interval difference ± t(df) se, p two-sided. NaN interval and p where a side has one
    optimiser (``method`` says why)."""

    difference: float
    difference_ci: tuple[float, float]
    p_value: float
    method: str
    se: float = math.nan
    df: float = math.nan
    n_optimizers: tuple[int, int] = (0, 0)
    """Lines (optimiser configs) in family a and family b."""
    line_means: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
    """Each line's seed-adjusted mean mu, family a then family b."""
    n_paired_seeds: int = 0
    """Seeds shared by two or more lines (the pairing); 0 when nothing paired."""
    p_exact: float = math.nan
    """Exact one-sided permutation p of b > a over the line means (``permutation_p``: every split
    of the optimisers into the two families' sizes; 1/70 at best for 4 vs 4)."""


def seed_adjusted_means(lines: Sequence[SeedValues]) -> tuple[np.ndarray, int]:
    """Each line's mean after removing seed effects: mu from the least-squares fit of
    value[line, seed] = mu_line + s_seed over every finite cell, with an effect s only for the
    seeds two or more lines share (sum zero over them). Returns (mu per line, paired seed
    count). A line sharing no seed with another keeps its plain mean (nothing to pair with);
    with no shared seed at all every mean is plain."""
    cells = [_cells(v) for v in lines]
    plain = np.array([np.mean(list(c.values())) if c else math.nan for c in cells])
    counts: dict[Hashable, int] = {}
    for c in cells:
        for s in c:
            counts[s] = counts.get(s, 0) + 1
    shared = sorted((s for s, n in counts.items() if n >= 2), key=str)
    if not shared:
        return plain, 0
    col = {s: len(cells) + j for j, s in enumerate(shared)}
    rows, ys = [], []
    for i, c in enumerate(cells):
        for s, v in c.items():
            r = np.zeros(len(cells) + len(shared))
            r[i] = 1.0
            if s in col:
                r[col[s]] = 1.0
            rows.append(r)
            ys.append(v)
    X, y = np.array(rows), np.array(ys)
    sol, _, rank, _ = np.linalg.lstsq(X, y, rcond=None)
    if rank < X.shape[1] - 1:  # lines in two or more sets sharing no seed: their offsets are not paired
        return plain, 0
    mu, effects = sol[: len(cells)], sol[len(cells) :]
    # the model is unchanged by mu + c, s - c within a connected set of lines: fix s to sum zero
    mu = mu + effects.mean()
    paired = np.array([any(s in col for s in c) for c in cells])
    return np.where(paired, mu, plain), len(shared)


def compare_family_values(
    a: Sequence[SeedValues], b: Sequence[SeedValues], confidence: float = 0.95, labels: tuple[str, str] = ("a", "b")
) -> FamilyComparison:
    """Family b minus family a (see ``FamilyComparison``), each family its lines' values by seed
    (``{seed: value}`` per optimiser config: a level at one size, or per-seed exponents). Seeds
    pair across both families' lines (``seed_adjusted_means``). ``labels`` name the families in
    ``method``."""
    from scipy import stats

    a = [c for c in map(_cells, a) if c]
    b = [c for c in map(_cells, b) if c]
    if not a or not b:
        raise ValueError("compare_family_values: each family needs at least one line with a value")
    mu, n_paired = seed_adjusted_means([*a, *b])
    mu_a, mu_b = mu[: len(a)], mu[len(a) :]
    difference = float(mu_b.mean() - mu_a.mean())
    pairing = f"seeds paired ({n_paired} shared)" if n_paired else "seeds unpaired (none shared)"
    common = dict(n_optimizers=(len(a), len(b)), line_means=(tuple(map(float, mu_a)), tuple(map(float, mu_b))),
                  n_paired_seeds=n_paired, p_exact=permutation_p(mu_a, mu_b))  # fmt: skip
    nan2 = (math.nan, math.nan)
    single = [f"{name} has 1 optimiser" for name, m in zip(labels, (mu_a, mu_b), strict=True) if m.size < 2]
    if single:
        why = " and ".join(single)
        return FamilyComparison(difference, nan2, math.nan,
                                f"no interval: {why} (no between-optimiser variance; one optimiser cannot "
                                "carry a family claim)", **common)  # fmt: skip
    va, vb = float(np.var(mu_a, ddof=1)) / mu_a.size, float(np.var(mu_b, ddof=1)) / mu_b.size
    var = va + vb
    if var == 0:
        return FamilyComparison(difference, (difference, difference), 0.0 if difference else 1.0,
                                "no spread between optimisers in either family: nothing to test", **common)  # fmt: skip
    df = var**2 / (va**2 / (mu_a.size - 1) + vb**2 / (mu_b.size - 1))
    se = math.sqrt(var)
    half = float(stats.t.ppf((1 + confidence) / 2, df)) * se
    p = float(2 * stats.t.sf(abs(difference) / se, df))
    method = (f"optimisers as the unit: Welch-Satterthwaite t over {mu_a.size} vs {mu_b.size} optimiser means "
              f"(df {df:.1f}), {pairing}")  # fmt: skip
    return FamilyComparison(difference, (difference - half, difference + half), p, method, se=se, df=df, **common)


def compare_families(
    a: Sequence[PowerLawFit], b: Sequence[PowerLawFit], confidence: float = 0.95, labels: tuple[str, str] = ("a", "b")
) -> FamilyComparison:
    """Family b's exponent minus family a's, the optimiser as the unit: ``compare_family_values``
    on each line's per-seed exponents (by seed label, so seeds pair), or its pooled exponent
    where it has no per-seed fits (one seed)."""
    if not a or not b:
        raise ValueError("compare_families: each family needs at least one fitted line")
    return compare_family_values([_seed_values(f) for f in a], [_seed_values(f) for f in b], confidence, labels)


def _seed_values(fit: PowerLawFit) -> SeedValues:
    """A line's exponents by seed, as the family contrast pairs them."""
    if fit.seed_exponents.size and len(fit.seed_labels) == fit.seed_exponents.size:
        return dict(zip(fit.seed_labels, map(float, fit.seed_exponents), strict=True))
    if fit.seed_exponents.size:
        return fit.seed_exponents
    return np.array([fit.exponent])


def _cells(values: SeedValues) -> dict[Hashable, float]:
    """``{seed: value}`` of the finite values; an unlabelled array gets labels of its own
    (never shared with another line)."""
    if isinstance(values, Mapping):
        return {s: float(v) for s, v in values.items() if v is not None and math.isfinite(float(v))}
    arr = np.asarray(values, dtype=float).ravel()
    line = next(_UNPAIRED)
    return {("unpaired", line, i): float(v) for i, v in enumerate(arr) if math.isfinite(v)}


_UNPAIRED = itertools.count()


# ---------------------------------------------------------------- exact tests, the optimiser (or seed) as the unit


def permutation_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Exact one-sided p of mean(b) - mean(a) > 0 with the values (one per optimiser) as the units:
    over all C(n_a + n_b, n_b) ways to call n_b of the pooled values "b", the share whose
    difference of means is >= the observed one (the observed split included), so 1 / C(n_a + n_b,
    n_b) at best: 1/70 for 4 vs 4. NaN where a side is empty."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        return math.nan
    pooled = np.concatenate([a, b])
    total = pooled.sum()
    observed = b.mean() - a.mean()
    splits = np.array(list(itertools.combinations(range(pooled.size), b.size)))
    sum_b = pooled[splits].sum(axis=1)
    diffs = sum_b / b.size - (total - sum_b) / a.size
    return float(np.mean(diffs >= observed - 1e-12 * max(1.0, abs(observed))))


def sign_flip_p(differences: Sequence[float]) -> float:
    """Exact two-sided p of paired differences (one per seed) under the null that each is
    symmetric about 0: over all 2^n sign flips, the share whose |mean| is >= the observed |mean|
    (the observed and its mirror included), so 2 / 2^n at best. NaN with no differences."""
    d = np.asarray(differences, dtype=float)
    if d.size == 0:
        return math.nan
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
    means = np.abs(signs @ d) / d.size
    observed = abs(d.mean())
    return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def paired_interval(differences: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t-interval of the mean paired difference over seeds, n - 1 dof
    (NaN bounds with one seed)."""
    from scipy import stats

    d = np.asarray(differences, dtype=float)
    mean = float(d.mean()) if d.size else math.nan
    if d.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf((1 + confidence) / 2, d.size - 1)) * float(d.std(ddof=1)) / math.sqrt(d.size)
    return mean, mean - half, mean + half
