"""The outlier level at the loss-optimal learning rate, and its trend across widths.

In standard parameterisation a fixed lr is a larger effective step at a larger width, so a level
read "at one lr" or "at the best grid point" mixes width with lr (DESIGN.md, "Width and lr").
Here each level is read at the fitted loss-optimal lr of its ladder:

- a ladder is one ``group``: the config without its seed and lr (``tuning_id``, see
  ``analysis.identity``), i.e. one optimiser config at one width;
- x = log10 lr; per lr the seed means of the final val loss and of each measure's log (the
  trial's measure: ``log(kurtosis / 3(d-1)/(d+1))`` and ``log(top-1 share / its null)``, residual
  stream, stored basis, mean over blocks, final step: what the report's fits read);
- i = the lr with the lowest mean loss; the parabola through (x, loss) at i-1, i, i+1 (exactly
  three points: the best and its two neighbours) gives x* = its vertex. A best at the ladder's
  end has no optimum: flagged ``edge``, never extrapolated; a parabola that does not open upward:
  ``concave`` (through the first-lowest point and its neighbours it always opens upward, so only
  a NaN loss gets there); a ladder of fewer than 3 lrs: ``few lrs``;
- the measure at x* from the least-squares line of (x, mean log measure) over the same three
  points (a local linear fit: exact where log measure is linear in log lr, and smoother than the
  interpolating quadratic, which would follow each point's seed noise). This is the registered
  reading (``reading="line"``). Where the measure bends sharply at the best (flat below it, steep
  above) the line can land outside the two measured rungs around x*; ``reading="interpolated"``
  (``interpolate_at``: straight between those two rungs, so never outside them) is the check the
  report prints beside it (optimum_slopes.csv's ``*_interpolated`` columns);
- the interval: a seed-level bootstrap over the whole surface: in each replicate every (group,
  lr) cell's trials are resampled with replacement (a one-seed cell is that one trial every
  time: it adds no variance, so where the ladder's neighbours have one seed the interval is
  conditional on them), the best lr is re-chosen and the parabola and the line refitted;
  percentile intervals over the replicates whose best is inside the ladder (``boot_inside``
  says how many were). A ladder of one seed at every lr has no replicates at all (each would be
  the data itself, a zero-width interval): its intervals are NaN, and so is any slope's through it;
- across widths (``fit_slope``), the least-squares slope of the levels against log N over the widths
  with an optimum and its percentile interval over the replicates; ``analysis.width_trend`` builds
  the report's tables, the twin contrasts and the arm differences from these pieces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from resultstore.vocabulary import Metric

__all__ = ["EDGE", "FEW", "CONCAVE", "MEASURES", "Ladder", "Optimum", "WidthSlope", "READINGS", "fit_ladder", "fit_slope",
           "interpolate_at", "ladders_from", "paired_replicates", "read_at", "seed_replicates", "vertex"]  # fmt: skip

EDGE, CONCAVE, FEW = "edge", "concave", "few lrs"
_CODES = ("", EDGE, CONCAVE, FEW)
MEASURES = (Metric.KURTOSIS, Metric.TOP1_SHARE)
"""The measures read at lr*: columns ``log_kurtosis`` and ``log_top1_share`` of the trials frame
(log of the measure over its null)."""


def vertex(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``y`` (B, L) over sorted ``x`` (L,): i = argmin; the parabola
    y = a x² + b x + c through the points i-1, i, i+1, with
    a = ((y2-y1)/(x2-x1) - (y1-y0)/(x1-x0)) / (x2-x0), b = (y1-y0)/(x1-x0) - a (x0+x1),
    x* = -b / (2a). Returns (x*, i, code): code 0 an optimum inside the ladder, 1 ``edge``
    (i is the first or last lr), 2 ``concave`` (a <= 0), 3 ``few lrs`` (L < 3); x* is NaN where
    code > 0."""
    y = np.atleast_2d(np.asarray(y, dtype=float))
    x = np.asarray(x, dtype=float)
    n_rows, n_lr = y.shape
    i = np.argmin(y, axis=1)
    if n_lr < 3:
        return np.full(n_rows, math.nan), i, np.full(n_rows, 3)
    j = np.clip(i, 1, n_lr - 2)
    rows = np.arange(n_rows)
    x0, x1, x2 = x[j - 1], x[j], x[j + 1]
    y0, y1, y2 = y[rows, j - 1], y[rows, j], y[rows, j + 1]
    a = ((y2 - y1) / (x2 - x1) - (y1 - y0) / (x1 - x0)) / (x2 - x0)
    b = (y1 - y0) / (x1 - x0) - a * (x0 + x1)
    code = np.where((i == 0) | (i == n_lr - 1), 1, np.where(a > 0, 0, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        x_star = np.where(code == 0, -b / (2 * a), math.nan)
    return x_star, i, code


def read_at(x: np.ndarray, m: np.ndarray, i: np.ndarray, x_star: np.ndarray) -> np.ndarray:
    """Per row of ``m`` (B, L): the least-squares line of m against x over the points i-1, i,
    i+1, evaluated at x*: mean(m) + slope (x* - mean(x)), slope = sum((x - mean x)(m - mean m)) /
    sum((x - mean x)²). NaN where x* is NaN or a point's m is NaN."""
    m = np.atleast_2d(np.asarray(m, dtype=float))
    x = np.asarray(x, dtype=float)
    if m.shape[1] < 3:
        return np.full(m.shape[0], math.nan)
    j = np.clip(np.asarray(i), 1, m.shape[1] - 2)
    rows = np.arange(m.shape[0])[:, None]
    cols = j[:, None] + np.array([-1, 0, 1])[None, :]
    xs, ms = x[cols], m[rows, cols]
    xc = xs - xs.mean(axis=1, keepdims=True)
    slope = (xc * (ms - ms.mean(axis=1, keepdims=True))).sum(axis=1) / (xc**2).sum(axis=1)
    return ms.mean(axis=1) + slope * (x_star - xs.mean(axis=1))


def interpolate_at(x: np.ndarray, m: np.ndarray, i: np.ndarray, x_star: np.ndarray) -> np.ndarray:
    """Per row of ``m`` (B, L): m at x* on the straight line between the two measured rungs around
    it (x* lies between the best's neighbours i-1 and i+1, as the vertex of an upward parabola
    through them does), so the value never leaves the range of those two rungs. NaN where x* is
    NaN or either rung's m is NaN. ``i`` is unused (the signature is ``read_at``'s)."""
    m = np.atleast_2d(np.asarray(m, dtype=float))
    x = np.asarray(x, dtype=float)
    x_star = np.broadcast_to(np.asarray(x_star, dtype=float), (m.shape[0],))
    if m.shape[1] < 2:
        return np.full(m.shape[0], math.nan)
    k = np.clip(np.searchsorted(x, np.nan_to_num(x_star, nan=x[0]), side="right") - 1, 0, x.size - 2)
    rows = np.arange(m.shape[0])
    t = (x_star - x[k]) / (x[k + 1] - x[k])
    return m[rows, k] + t * (m[rows, k + 1] - m[rows, k])


READINGS = {"line": read_at, "interpolated": interpolate_at}
"""How the level is read at x*: ``line`` (registered, the default) or ``interpolated`` (the check)."""


@dataclass(frozen=True)
class Ladder:
    """One group's trials: ``x`` the sorted log10 lrs; per lr the trials' final val loss
    (``loss[k]``) and log measures (``measures[name][k]``), aligned trial by trial (sorted by
    seed), and their ``seeds``."""

    x: np.ndarray
    loss: list[np.ndarray]
    measures: dict[str, list[np.ndarray]]
    seeds: list[np.ndarray]

    @property
    def replicable(self) -> bool:
        """Whether some lr has two trials or more: else every bootstrap replicate is the data."""
        return max((v.size for v in self.loss), default=0) > 1

    def means(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Per lr the seed means of the loss and of each log measure, as (1, L) rows."""
        loss = np.array([[v.mean() for v in self.loss]])
        return loss, {k: np.array([[v.mean() for v in cells]]) for k, cells in self.measures.items()}

    def resampled(self, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``n_boot`` bootstrap replicates of ``means``, (n_boot, L) each: every lr's trials
        resampled with replacement, the same draw for the loss and the measures (a trial is the
        unit); a one-trial lr is that trial in every replicate."""
        loss = np.empty((n_boot, len(self.loss)))
        meas = {k: np.empty((n_boot, len(self.loss))) for k in self.measures}
        for k, v in enumerate(self.loss):
            idx = rng.integers(0, v.size, size=(n_boot, v.size)) if v.size > 1 else np.zeros((n_boot, 1), int)
            loss[:, k] = v[idx].mean(axis=1)
            for name, cells in self.measures.items():
                meas[name][:, k] = cells[k][idx].mean(axis=1)
        return loss, meas

    def seed_resampled(self, counts: np.ndarray, pool: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Replicates of ``means`` with the seed as the unit: ``counts`` (n_boot, len(pool)) says how
        often each seed of the sorted ``pool`` was drawn; each lr's mean weights its trials by their
        seed's count. A cell none of whose seeds was drawn keeps its plain mean (a one-seed cell is
        that trial every time, as in ``resampled``). Two ladders given the same counts are resampled
        together: paired by seed."""
        loss = np.empty((counts.shape[0], len(self.loss)))
        meas = {k: np.empty_like(loss) for k in self.measures}
        for k, seeds in enumerate(self.seeds):
            w = counts[:, np.searchsorted(pool, seeds)].astype(float)
            w[w.sum(axis=1) == 0] = 1.0
            w /= w.sum(axis=1, keepdims=True)
            loss[:, k] = (w * np.where(w > 0, self.loss[k], 0.0)).sum(axis=1)
            for name, cells in self.measures.items():
                meas[name][:, k] = (w * np.where(w > 0, cells[k], 0.0)).sum(axis=1)
        return loss, meas


def _replicates(ladder: Ladder, b_loss: np.ndarray, b_meas: dict[str, np.ndarray],
                reading: str = "line") -> dict[str, np.ndarray]:
    """``Optimum.boot`` from replicates of a ladder's means: per replicate the best re-chosen, x*
    and each level refitted; NaN where the best fell at an edge, and everywhere for a ladder that
    is not ``replicable``."""
    bx, bi, bcode = vertex(ladder.x, b_loss)
    inside = (bcode == 0) & ladder.replicable
    bx = np.where(inside, bx, math.nan)
    read = READINGS[reading]
    return {"x_star": bx, **{k: np.where(inside, read(ladder.x, b_meas[k], bi, bx), math.nan) for k in b_meas}}


def seed_replicates(ladders: list[Ladder], n_boot: int, rng: np.random.Generator,
                    reading: str = "line") -> list[dict]:
    """Every ladder's bootstrap replicates (as ``Optimum.boot``) from one seed draw per replicate
    (``Ladder.seed_resampled``): ladders that share a seed's init (and data order) are drawn
    together, so what the seed adds to all of them cancels in their differences."""
    pool = np.unique(np.concatenate([s for ladder in ladders for s in ladder.seeds]))
    draws = rng.integers(0, pool.size, size=(n_boot, pool.size))
    counts = (draws[:, :, None] == np.arange(pool.size)).sum(axis=1)
    return [_replicates(ladder, *ladder.seed_resampled(counts, pool), reading) for ladder in ladders]


def paired_replicates(a: Ladder, b: Ladder, n_boot: int, rng: np.random.Generator,
                      reading: str = "line") -> tuple[dict, dict]:
    """Twins' replicates, paired by seed (``seed_replicates`` of the two)."""
    ra, rb = seed_replicates([a, b], n_boot, rng, reading)
    return ra, rb


@dataclass(frozen=True)
class Optimum:
    """One ladder's optimum: ``lr_star`` = 10^x* (``vertex``), its percentile interval
    ``lr_star_ci``; per measure the level log(measure / null) at x* (``read_at``) with its
    interval (``levels[name] = (value, lo, hi)``); ``flag`` ("" or ``EDGE`` / ``CONCAVE`` /
    ``FEW``: then no lr* and no level); ``best_lr`` the grid lr with the lowest mean loss;
    ``boot_inside`` the share of replicates whose best was inside the ladder (the interval is
    over those). ``boot``: the replicates (x* and each level; NaN where not inside), for slopes."""

    best_lr: float
    lr_star: float
    lr_star_ci: tuple[float, float]
    levels: dict[str, tuple[float, float, float]]
    flag: str
    boot_inside: float
    n_seeds_best: int
    replicable: bool = True
    """False for a ladder of one seed at every lr: no bootstrap, no interval (``Ladder.replicable``)."""
    boot: dict[str, np.ndarray] = field(default_factory=dict, repr=False)


def fit_ladder(ladder: Ladder, n_boot: int = 1000, rng: np.random.Generator | None = None,
               confidence: float = 0.95, reading: str = "line") -> Optimum:
    """``Optimum`` of one ladder (see the module docstring for the formulae); ``reading``: a key
    of ``READINGS``, how each level is read at x*."""
    rng = np.random.default_rng(0) if rng is None else rng
    q = (100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2)
    loss, meas = ladder.means()
    x_star, i, code = vertex(ladder.x, loss)
    flag = _CODES[int(code[0])]
    boot = _replicates(ladder, *ladder.resampled(n_boot, rng), reading)
    bx = boot["x_star"]
    levels = {}
    for k in meas:
        value = float(READINGS[reading](ladder.x, meas[k], i, x_star)[0])
        levels[k] = (value, *_percentiles(boot[k], q))
    lo, hi = _percentiles(bx, q)
    return Optimum(
        best_lr=float(10 ** ladder.x[int(i[0])]), lr_star=float(10 ** x_star[0]), lr_star_ci=(10**lo, 10**hi),
        levels=levels, flag=flag, boot_inside=float(np.isfinite(bx).mean()) if n_boot and ladder.replicable else math.nan,
        n_seeds_best=int(ladder.loss[int(i[0])].size), replicable=ladder.replicable, boot=boot,
    )  # fmt: skip


def _percentiles(values: np.ndarray, q: tuple[float, float]) -> tuple[float, float]:
    ok = values[np.isfinite(values)]
    if ok.size < 2:
        return math.nan, math.nan
    lo, hi = np.percentile(ok, q)
    return float(lo), float(hi)


@dataclass(frozen=True)
class WidthSlope:
    """The slope of the level (log measure / null at lr*) against log N across one line's widths:
    least squares over the widths with an optimum (``n_widths``); its percentile interval over the
    bootstrap replicates with an optimum at each of them (``boot_kept``: their share)."""

    slope: float
    ci: tuple[float, float]
    n_widths: int
    boot_kept: float


def fit_slope(log_n: np.ndarray, levels: np.ndarray, boots: list[np.ndarray], confidence: float = 0.95) -> WidthSlope:
    """``WidthSlope`` from each width's log N, level and bootstrap replicates of the level (one
    array per width, aligned by replicate; NaN where that replicate had no optimum), over the
    widths whose level is finite: slope = sum((u - mean u)(v - mean v)) / sum((u - mean u)²),
    u = log N, v = level."""
    ok = np.isfinite(levels)
    u = np.asarray(log_n, dtype=float)[ok]
    if np.unique(u).size < 2:
        return WidthSlope(math.nan, (math.nan, math.nan), int(ok.sum()), math.nan)
    uc = u - u.mean()
    weights = uc / (uc**2).sum()
    slope = float(weights @ levels[ok])
    reps = np.stack([b for b, k in zip(boots, ok, strict=True) if k], axis=1)  # (B, widths)
    kept = np.isfinite(reps).all(axis=1)
    b = reps[kept] @ weights
    q = (100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2)
    return WidthSlope(slope, _percentiles(b, q), int(ok.sum()), float(kept.mean()) if kept.size else math.nan)


def ladders_from(trials: pl.DataFrame, group: str = "tuning_id") -> dict[Any, Ladder]:
    """One ``Ladder`` per ``group`` from a trials frame with columns ``group``, ``lr``, ``seed``,
    ``final_val_loss`` and ``log_<measure>`` for each of ``MEASURES`` present (NaN allowed)."""
    names = [m for m in MEASURES if f"log_{m}" in trials.columns]
    out = {}
    for (key,), g in trials.sort(group, "lr", "seed").partition_by(group, as_dict=True, maintain_order=True).items():
        lrs = sorted(set(g.get_column("lr").to_list()))
        cells = [g.filter(pl.col("lr") == lr) for lr in lrs]
        out[key] = Ladder(
            x=np.log10(np.array(lrs, dtype=float)),
            loss=[c.get_column("final_val_loss").cast(pl.Float64).to_numpy() for c in cells],
            measures={m: [c.get_column(f"log_{m}").cast(pl.Float64).fill_null(math.nan).to_numpy() for c in cells]
                      for m in names},
            seeds=[c.get_column("seed").to_numpy() for c in cells],
        )  # fmt: skip
    return out

