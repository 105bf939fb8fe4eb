"""Shared fixtures for the analysis tests: small synthetic results stores on disk.

Import the fixtures into a test module (``from analysis_fixtures import store``). The stores
follow the results-store contract (see analysis/synthetic.py for the generating model):
3 sizes x {adam, sgd} x 3 seeds x 4 layers, adam's excess kurtosis growing as
(P / P_min) ** 0.5, sgd's staying at 3.
"""

from __future__ import annotations

import pytest

from analysis.synthetic import SyntheticStore, write_store

EXPONENT = 0.5


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    """A clean store: every trial done, checks and curves present."""
    root = tmp_path_factory.mktemp("results")
    return write_store(root, name="toy", exponents={"adam": EXPONENT, "sgd": None}, seed=2)


@pytest.fixture(scope="module")
def messy_store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    """Two norms and two rotations, one failed and one diverged trial, no checks table."""
    root = tmp_path_factory.mktemp("results")
    return write_store(
        root,
        name="messy",
        norms=("layernorm", "rmsnorm_scalar"),
        rotations=("none", ("partial", 2)),
        failed=1,
        diverged=1,
        checks=False,
        seed=5,
    )


@pytest.fixture(scope="module")
def single_size_store(tmp_path_factory: pytest.TempPathFactory) -> SyntheticStore:
    """One model size only: nothing to fit."""
    root = tmp_path_factory.mktemp("results")
    return write_store(root, name="single", sizes=(64,), seed=3)
