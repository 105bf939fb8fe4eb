"""One bounded parser for the numbers a user gives: finite, of a size the thing it counts can
have, within limits stated here. A spec's fields (resources, the grid's size) and the verbs'
options (`data prepare --workers`, `next --seeds`) are checked by these before anything is built,
so a number too large is a located message, never a hang or a list that fills memory."""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = [
    "MAX_GRID_POINTS", "MAX_SEEDS", "MIN_SHARE", "WORKERS_PER_CORE", "bounded", "grid_points_problem", "max_workers",
    "share_problem",
]  # fmt: skip

MIN_SHARE = 0.01
"""The smallest CPU or GPU share of one trial (or 0 GPUs): Ray schedules resources in units of
1/10000, so a share such as 1e-300 rounds to nothing and every trial fails once it starts."""
WORKERS_PER_CORE = 4
"""`sweep data prepare --workers` is at most this many processes per core (more only thrash)."""
MAX_SEEDS = 1000
"""`sweep next --seeds` asks for at most this many seeds per best lr."""
MAX_GRID_POINTS = 100_000
"""A spec's grid holds at most this many points (the product of its axes' lengths, ladders
expanded), checked before any list of them is built: each point is a training run, and a list of
a million configs takes gigabytes before the first one starts."""


def bounded(option: str, value: Any, lo: float | None = None, hi: float | None = None, *,
            why: str = "") -> str | None:
    """None, or what is wrong with `value` as `option`: not finite, below `lo` or above `hi`."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return f"{option} {value!r}: must be a finite number"
    shown = value if isinstance(value, int) else f"{value:g}"
    if lo is not None and value < lo:
        return f"{option} {shown}: must be at least {lo:g}" + (f" ({why})" if why else "")
    if hi is not None and value > hi:
        return f"{option} {shown}: must be at most {hi:g}" + (f" ({why})" if why else "")
    return None


def share_problem(value: float, *, zero_ok: bool) -> str | None:
    """None, or why `value` is no share of a CPU or GPU for one trial: 0 (where `zero_ok`) or at
    least MIN_SHARE."""
    if zero_ok and value == 0:
        return None
    if value < MIN_SHARE:
        zero = "0 or " if zero_ok else ""
        return (f"must be {zero}at least {MIN_SHARE:g}, got {value:g}: Ray schedules shares in units of 1/10000, "
                "so a smaller one is no share at all")
    return None


def max_workers() -> int:
    """The most processes `sweep data prepare --workers` may start here: WORKERS_PER_CORE x cores."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def grid_points_problem(lengths: dict[str, int]) -> str | None:
    """None, or why a grid of these axis lengths ({axis: points}) is too large: the product is
    computed from the lengths alone, before any point exists."""
    points = math.prod(lengths.values())
    if points <= MAX_GRID_POINTS:
        return None
    shown = " x ".join(f"{n:,} {axis}" for axis, n in lengths.items())
    return (f"{points:,} grid points ({shown}) is over the {MAX_GRID_POINTS:,} a sweep may hold: "
            "split it into several specs (each point is a training run)")
