"""analysis.lr_fit: lr*(N) = lr0 (N/N0)^b from the best-lr points of ladders at several sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analysis import selection
from analysis.load import load
from analysis.lr_fit import LR_FIT_COLUMNS, fit_lr_scaling, round_reference


def test_recovers_a_planted_exponent_from_ladders(tmp_path: Path) -> None:
    """A store whose best lr moves as N^-0.5 (adam) and stays put (sgd), ladders of ratio ~1.3:
    the fit recovers each exponent within the ladder's resolution, with an interval."""
    from synthetic_store import Synthetic

    ladder = [float(v) for v in np.geomspace(1e-4, 3e-2, 21)]
    truth = (Synthetic("ladders")
             .trials(sizes=(32, 48, 64, 96, 128), seeds=(0,), optimizers=("adam", "sgd"),
                     lrs={"adam": ladder, "sgd": [v * 100 for v in ladder]})
             .planted(best_lrs={"adam": 1e-2, "sgd": 0.3}, lr_exponents={"adam": -0.5}, lr_penalty=5.0)
             .rows(steps=(0, 10), quant=False)
             .write(tmp_path))  # fmt: skip
    fit = fit_lr_scaling(selection.best_lr(load(truth.path)))
    assert tuple(fit.columns) == LR_FIT_COLUMNS
    adam = fit.filter(pl.col("optimizer") == "adam").row(0, named=True)
    sgd = fit.filter(pl.col("optimizer") == "sgd").row(0, named=True)
    assert adam["exponent"] == pytest.approx(-0.5, abs=0.08)
    assert adam["exponent_lo"] < adam["exponent"] < adam["exponent_hi"]
    assert sgd["exponent"] == pytest.approx(0.0, abs=0.08)
    assert adam["n_sizes"] == 5 and adam["note"] == ""
    # lr0 is the fitted lr at N0: the planted law evaluated there, within the ladder's step
    p_min = min(truth.params_non_embedding)
    want = 1e-2 * (adam["reference_params"] / p_min) ** -0.5
    assert adam["lr_at_reference"] == pytest.approx(want, rel=0.2)


def _best(lrs: list[float], edges: list[str | None], n_lrs: int = 5) -> pl.DataFrame:
    sizes = [1e5, 4e5, 1.6e6][: len(lrs)]
    return pl.DataFrame({
        "tuned_line_id": ["a"] * len(lrs), "optimizer": ["adam"] * len(lrs), "norm": ["rmsnorm"] * len(lrs),
        "rotation_label": ["none"] * len(lrs), "params_non_embedding": sizes, "lr": lrs,
        "n_lrs": [n_lrs] * len(lrs), "edge": edges,
    })  # fmt: skip


def test_edges_two_sizes_and_untuned_lines_are_flagged() -> None:
    fit = fit_lr_scaling(_best([1e-2, 5e-3, 2.5e-3], [None, None, "low"])).row(0, named=True)
    assert fit["exponent"] == pytest.approx(-0.5)
    assert "edge of ladder at params_non_embedding=1,600,000" in fit["note"] and "≤ 0.0025" in fit["note"]
    two = fit_lr_scaling(_best([1e-2, 5e-3], [None, None])).row(0, named=True)
    assert two["exponent_lo"] is None and "2 sizes: no interval" in two["note"]
    assert fit_lr_scaling(_best([1e-2, 5e-3, 2.5e-3], [None] * 3, n_lrs=1)).height == 0  # no ladder, no fit


def test_reference_is_a_quotable_round_number() -> None:
    assert round_reference(np.array([49_152.0, 196_608.0, 786_432.0])) == 200_000.0
