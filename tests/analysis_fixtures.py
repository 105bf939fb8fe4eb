"""Shared fixtures for the analysis tests: small synthetic results stores on disk.

Import the fixtures into a test module (``from analysis_fixtures import store``). The stores
follow the results-store contract (see tests/synthetic_store.py for the generating model):
3 sizes x {adam, sgd} x 3 seeds x 4 layers, adam's excess kurtosis growing as
(P / P_min) ** 0.5, sgd's staying at 3.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analysis.load import METRICS_SCHEMA, RUNS_SCHEMA
from analysis.null import kurtosis_null
from synthetic_store import Synthetic, SyntheticStore

EXPONENT = 0.5


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    """A clean store: every trial done, checks and curves present."""
    root = tmp_path_factory.mktemp("results")
    return Synthetic("toy", seed=2).planted(exponents={"adam": EXPONENT, "sgd": None}).write(root)


@pytest.fixture(scope="module")
def messy_store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    """Two norms and two rotations, one failed and one diverged trial, no checks table."""
    root = tmp_path_factory.mktemp("results")
    return (Synthetic("messy", seed=5)
            .trials(norms=("layernorm", "rmsnorm_scalar"), rotations=("none", ("partial", 2)), failed=1, diverged=1)
            .rows(checks=False)
            .write(root, parts=2))  # two flushes per trial: metrics/<id>.<first>-<last>.parquet twice


@pytest.fixture(scope="module")
def single_size_store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    """One model size only: nothing to fit."""
    root = tmp_path_factory.mktemp("results")
    return Synthetic("single", seed=3).trials(sizes=(64,)).write(root)


def _trial_rows(configs: list, values: dict[str, float]) -> tuple[list[dict], list[tuple]]:
    """Runs rows from real TrialConfigs (flat() + config_json) and final-step kurtosis rows
    (layers 1..2: value[label] * (d/32)^0.2 + 0.1 seed in the stored basis, the exact null 3(d-1)/(d+1) in the
    random-basis control) for a store written by hand."""
    runs, metrics = [], []
    for label, cfg in configs:
        row = {c: None for c in RUNS_SCHEMA}
        row.update(cfg.flat())
        row.update(trial_id=cfg.trial_id, sweep="ids", status="done", final_val_loss=values[label],
                   config_json=cfg.config_json())  # fmt: skip  (as study.train writes it)
        runs.append(row)
        d = cfg.model.d_model
        for layer in (1, 2):
            v = values[label] * (d / 32) ** 0.2 + 0.1 * cfg.seed
            metrics.append((cfg.trial_id, 10, 1000, layer, "resid", "stored", "kurtosis", v))
            metrics.append((cfg.trial_id, 10, 1000, layer, "resid", "random", "kurtosis", kurtosis_null(d)))
    return runs, metrics


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two SGD configs that differ only in momentum, and two rotated configs that differ only
    in their explicit rotation groups, at two sizes, two seeds each: real TrialConfig rows."""
    from study.config import TrialConfig

    def cfg(width: int, seed: int, momentum: float = 0.9, groups=None) -> TrialConfig:
        rotation = {"mode": "groups", "groups": groups} if groups else {"mode": "none"}
        return TrialConfig(
            model={"d_model": width, "n_layers": 4, "n_heads": 2},
            optimizer={"name": "sgd", "lr": 0.1, "momentum": momentum},
            rotation=rotation, train={"steps": 10}, seed=seed,
        )  # fmt: skip

    configs = []
    for width in (32, 64):
        for seed in (0, 1):
            configs += [
                ("m0.9", cfg(width, seed, 0.9)), ("m0.5", cfg(width, seed, 0.5)),
                ("g01", cfg(width, seed, groups=[[0, 1], [2, 3]])),
                ("g02", cfg(width, seed, groups=[[0, 2], [1, 3]])),
            ]  # fmt: skip
    values = {"m0.9": 3.0, "m0.5": 5.0, "g01": 7.0, "g02": 11.0}
    runs, metrics = _trial_rows(configs, values)
    sweep = tmp_path_factory.mktemp("r") / "ids"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "metrics").mkdir()
    pl.DataFrame(runs, schema=RUNS_SCHEMA).write_parquet(sweep / "runs" / "part.parquet")
    pl.DataFrame(metrics, schema=METRICS_SCHEMA, orient="row").write_parquet(sweep / "metrics" / "part.parquet")
    return sweep
