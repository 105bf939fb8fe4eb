"""Tests for study.optim.registry: every entry is consistent with the config and the runs
table, the config loads it without torch, and a new optimiser is one module in study/optim/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Literal, get_args

import pytest

from analysis.charts.style import FAMILY_ORDER
from analysis.load import RUNS_SCHEMA
from study.config import OptimizerConfig, OptimizerName, TrialConfig
from study.optim import OPTIMIZER_FAMILY
from study.optim.registry import (
    FAMILIES, ID_FIELDS, OPTIMIZERS, Optimizer, optimizer_columns, optimizer_names, own_columns, register,
)
from resultstore.schema import LEGACY_COLUMNS, RUNS_COLUMNS, kind_of

OPTIMIZER_COLUMNS = optimizer_columns()
from synthetic_store import FAMILIES as SYNTHETIC_FAMILIES

REPO = Path(__file__).resolve().parents[1]


def _run(code: str, pythonpath: list[Path], *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=pythonpath[0], env=env, capture_output=True,
                          text=True, timeout=300)


def test_names_are_the_configs_in_a_fixed_order():
    assert get_args(OptimizerName) == optimizer_names() == (
        "adam", "sgd", "rotated_adam", "soap", "muon", "adafactor", "lion", "signsgd",
        "rotated_adafactor", "rotated_lion", "rotated_signsgd")
    assert list(OPTIMIZER_FAMILY) == list(optimizer_names()) and set(OPTIMIZER_FAMILY.values()) <= set(FAMILIES)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_entry_has_its_own_config_class_and_fills_runs_columns(name):
    entry = OPTIMIZERS[name]
    config = OptimizerConfig.model_validate({"name": name, "lr": 1e-3})
    assert type(config) is entry.config and config.name == name
    row = TrialConfig(model={"depth": 1}, optimizer={"name": name, "lr": 1e-3}, train={"steps": 1}).flat()
    assert set(config.runs_columns()) <= {*OPTIMIZER_COLUMNS, "lr", "weight_decay"}
    assert [c for c in list(RUNS_SCHEMA) if c in OPTIMIZER_COLUMNS] == list(OPTIMIZER_COLUMNS)  # the store's order
    assert set(row) <= set(list(RUNS_SCHEMA)) and row["optimizer_family"] in FAMILIES


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_field_of_the_old_flat_config_keeps_its_default_so_ids_stay(name):
    """Every id hashes the old flat config's fields (ID_FIELDS): a class that has one must default
    to the same value, and a JSON dump of the class holds every one it lacks at that value."""
    config = OPTIMIZERS[name].config
    for field, info in config.model_fields.items():
        if field in ID_FIELDS:
            default = list(info.default) if isinstance(info.default, tuple) else info.default
            assert default == ID_FIELDS[field], (name, field)
    cfg = TrialConfig(model={"depth": 1}, optimizer={"name": name, "lr": 1e-3}, train={"steps": 1})
    assert set(ID_FIELDS) <= set(json.loads(cfg.config_json())["optimizer"])


@pytest.mark.parametrize("name, columns", [
    ("adam", (None, 1e-8, 0.9, 0.95, None, None, None, None)),
    ("sgd", (0.9, None, None, None, False, None, None, None)),
    ("rotated_adam", (None, 1e-8, 0.9, 0.95, None, "residual", None, None)),
    ("soap", (None, 1e-8, 0.9, 0.95, None, None, 10, None)),
    ("muon", (0.95, 1e-8, 0.9, 0.95, True, None, None, "adamw")),  # Muon's momentum, always Nesterov
    ("adafactor", (None, None, None, None, None, None, None, None)),
    ("lion", (None, None, 0.9, 0.95, None, None, None, None)),
    ("signsgd", (0.9, None, None, None, None, None, None, None)),
])
def test_runs_columns_at_the_defaults_are_golden(name, columns):
    row = TrialConfig(model={"depth": 1}, optimizer={"name": name, "lr": 1e-3}, train={"steps": 1}).flat()
    assert tuple(row[c] for c in OPTIMIZER_COLUMNS) == columns
    assert list(row)[list(row).index("weight_decay") + 1 : list(row).index("norm")] == list(OPTIMIZER_COLUMNS)


def test_the_built_in_optimisers_declare_the_columns_unstamped_files_hold():
    """One mechanism: the built-ins' hyper-parameter columns are their modules' own_columns, each
    of the kind and place that runs files written before stamps hold (LEGACY_COLUMNS), and an
    optimiser fills exactly its own columns (besides lr and weight_decay)."""
    declared = {c for e in OPTIMIZERS.values() for c in own_columns(e.config)}
    assert declared == {c for c, _, _ in LEGACY_COLUMNS}
    kinds = {c: (kind_of(t), r) for c, t, r in RUNS_COLUMNS}
    assert all(kinds[c] == (k, r) for c, k, r in LEGACY_COLUMNS)
    for name, entry in OPTIMIZERS.items():
        config = OptimizerConfig.model_validate({"name": name, "lr": 1e-3})
        assert set(config.runs_columns()) - {"lr", "weight_decay"} == set(own_columns(entry.config)), name


def test_charts_and_the_synthetic_store_know_every_family():
    assert set(FAMILY_ORDER) == set(FAMILIES)  # a new family gets a panel place in analysis/charts/style.py
    assert SYNTHETIC_FAMILIES == OPTIMIZER_FAMILY


def test_an_entry_is_registered_once_with_a_known_family():
    entry = OPTIMIZERS["adam"]
    with pytest.raises(ValueError, match="registered twice"):
        register(entry)
    with pytest.raises(ValueError, match="family 'rotation_invariant' is not one of"):
        register(Optimizer("nadam", order=9, family="rotation_invariant", config=entry.config, build=entry.build))
    with pytest.raises(ValueError, match=r"its config's name must be Literal\['nadam'\]"):
        register(Optimizer("nadam", order=9, family="per_coordinate", config=entry.config, build=entry.build))
    with pytest.raises(ValueError, match="own column 'gamma' is not one of its fields"):
        register(Optimizer("nadam", order=9, family="per_coordinate", build=entry.build,
                           config=type("NAdamConfig", (entry.config,), {"__annotations__": {"name": Literal["nadam"]},
                                                                        "name": "nadam", "own_columns": ("gamma",)})))
    assert "nadam" not in OPTIMIZERS


def test_the_config_and_its_checks_need_no_torch():
    code = ("import sys\nfrom study.config import OptimizerConfig\nfrom pydantic import ValidationError\n"
            "try:\n    OptimizerConfig.model_validate(dict(name='muon', lr=1e-3, muon_exclude=['*']))\n"
            "except ValidationError as e:\n"
            "    assert 'Muon needs at least one per block' in str(e), e\n"
            "else:\n    raise SystemExit('muon_exclude [*] was accepted')\n"
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    done = _run(code, [REPO])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


NADAM = '''
"""nadam: torch NAdam (Adam with Nesterov momentum), per coordinate, with a hyper-parameter of its own."""

from typing import ClassVar, Literal

from pydantic import Field

from study.optim.registry import Optimizer, OptimizerConfig, register


class NAdamConfig(OptimizerConfig):
    name: Literal["nadam"] = "nadam"
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    momentum_decay: float = Field(default=4e-3, gt=0)
    """psi: how fast NAdam's momentum schedule warms up."""

    own_columns: ClassVar[tuple[str, ...]] = ("momentum_decay",)


def build(cfg, model):
    import torch

    from study.optim.rules.groups import decay_groups

    o = cfg.optimizer
    return torch.optim.NAdam(decay_groups(model, o.weight_decay), lr=o.lr, betas=o.betas, eps=o.eps,
                             weight_decay=o.weight_decay, momentum_decay=o.momentum_decay, decoupled_weight_decay=True)


register(Optimizer("nadam", order=9, family="per_coordinate", config=NAdamConfig, build=build))
'''

NINTH = """
import sys
import polars as pl
import pytest
import torch
from pydantic import ValidationError
from study.config import TrialConfig
from study.model import Transformer
from study.optim import OPTIMIZER_FAMILY, build_optimizer
from study.train import train
from resultstore.writer import ResultsStore
from analysis.charts.frames import decorate
from analysis.labels import labels_for, trial_labels
from analysis.load import load
from analysis.selection import line_labels
from sweep.grid import expand
from sweep.spec import SpecError, parse_spec

# validated: its own field is checked where the spec wrote it, and it is nadam's alone
spec = {"name": "ninth", "data": {"corpus": "stdlib", "seq_len": 16},
        "train": {"steps": 2, "batch_size": 4, "eval_every": 2, "eval_batch": {"sequences": 2}, "checkpoint_every": 0,
                  "invariance_check": False},
        "grid": {"model": [{"d_model": 32, "n_layers": 2, "n_heads": 2}],
                 "optimizer": [{"name": "nadam", "lr": 1e-2, "betas": [0.8, 0.9], "momentum_decay": [4e-3, 1e-2]}]}}
for bad, message in ([{"name": "nadam", "lr": 1e-2, "momentum_decay": -1}], "grid.optimizer[0].momentum_decay: Input should be greater than 0"), \
                    ([{"name": "adam", "lr": 1e-2, "momentum_decay": 1e-2}], "grid.optimizer[0].momentum_decay: momentum_decay does not apply to adam"):
    with pytest.raises(SpecError, match=message.replace("[", "\\[").replace("]", "\\]")):
        parse_spec({**spec, "grid": {**spec["grid"], "optimizer": bad}})
trials = expand(parse_spec(spec))
assert [type(t.optimizer).__name__ for t in trials] == ["NAdamConfig"] * 2
assert TrialConfig.model_validate_json(trials[0].config_json()) == trials[0]

# trained and stored: its column in the runs row and the Parquet file
store = ResultsStore(sys.argv[1], "ninth")
with store.writing("test"):
    for t in trials:
        assert train(t, store.sink(t.trial_id)).status == "done"
runs = load(store.uri).runs.collect().sort("momentum_decay")
assert runs.get_column("momentum_decay").to_list() == [4e-3, 1e-2] and runs.schema["momentum_decay"] == pl.Float64
row = runs.row(0, named=True)
assert (row["optimizer"], row["optimizer_family"], row["beta1"], row["eps"], row["momentum"]) == ("nadam", "per_coordinate", 0.8, 1e-8, None)
assert type(build_optimizer(trials[0], Transformer.from_config(trials[0]))) is torch.optim.NAdam

# labelled and charted: the sweep's progress, `sweep status`, line labels and chart variants name it
assert list(labels_for(trials).values()) == ["momentum_decay 0.004", "momentum_decay 0.01"]
assert trial_labels(runs.to_dicts()) == ["momentum_decay 0.004", "momentum_decay 0.01"]
lines = line_labels(runs.with_columns(tuned_line_id=pl.col("trial_id")))
assert sorted(lines.get_column("config")) == ["nadam · layernorm · none · momentum_decay=0.004 · lr=0.01",
                                              "nadam · layernorm · none · momentum_decay=0.01 · lr=0.01"]
assert decorate(runs, facet=None).get_column("variant").to_list() == ["0.004", "0.01"]
print(next(n for n in reversed(OPTIMIZER_FAMILY) if not n.startswith("rotated_")))  # the last but the twins
"""


READER = """
import sys
import polars as pl
from analysis.charts.frames import decorate
from analysis.labels import label_axes, trial_labels
from analysis.load import label_columns, load
from analysis.selection import line_labels
from resultstore.schema import Role, role_of

assert role_of("momentum_decay") is None  # nothing here declares it: the store will
runs = load(sys.argv[1]).runs.collect().sort("momentum_decay")
assert role_of("momentum_decay") is Role.HYPER and runs.schema["momentum_decay"] == pl.Float64
assert runs.get_column("momentum_decay").to_list() == [4e-3, 1e-2]
assert "momentum_decay" in label_axes() and "momentum_decay" in label_columns()
assert trial_labels(runs.to_dicts()) == ["momentum_decay 0.004", "momentum_decay 0.01"]
lines = line_labels(runs.with_columns(tuned_line_id=pl.col("trial_id")))
assert sorted(lines.get_column("config")) == ["nadam · layernorm · none · momentum_decay=0.004 · lr=0.01",
                                              "nadam · layernorm · none · momentum_decay=0.01 · lr=0.01"]
assert decorate(runs, facet=None).get_column("variant").to_list() == ["0.004", "0.01"]
print(sorted(m for m in ("study", "torch") if m in sys.modules))
"""


def test_a_new_optimizer_is_one_module(tmp_path):
    """A copy of study/ with one more module in study/optim/, nothing else edited: a ninth
    optimiser with a hyper-parameter of its own is validated (a bad value named at its place),
    trained, stored (its runs column), labelled and charted; and a fresh process that never
    imports study (the repository's, without nadam) reads its column's role from the store alone."""
    shutil.copytree(REPO / "study", tmp_path / "study", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "study" / "optim" / "nadam.py").write_text(NADAM)
    done = _run(NINTH + "\n", [tmp_path, REPO], str(tmp_path / "results"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["nadam"]
    read = _run(READER, [REPO], str(tmp_path / "results"))
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == "[]"  # neither study nor torch was imported


SHARDABLE = ("adam", "sgd", "lion", "signsgd")


def test_only_the_elementwise_optimisers_train_sharded_and_the_others_say_why():
    assert tuple(n for n in optimizer_names() if OPTIMIZERS[n].shardable) == SHARDABLE
    from study.optim.registry import sharding_problem

    assert sharding_problem("adam") is None
    assert sharding_problem("soap") == ("soap cannot train sharded (resources.sharding: fsdp): its preconditioner needs "
                                        "whole matrices (Shampoo's eigenbases of G G^T and G^T G); use sharding: ddp")
    for name in set(optimizer_names()) - set(SHARDABLE):
        assert "\n" not in sharding_problem(name) and sharding_problem(name).endswith("use sharding: ddp")


@pytest.mark.parametrize("name", [*SHARDABLE, "adafactor"])
def test_a_shardable_optimiser_updates_a_matrix_split_in_two_rows_shards_as_it_updates_it_whole(name):
    """What FSDP relies on: two row shards of a matrix, each stepped alone, end where the whole
    matrix does. adafactor's factored moments (row and column means) do not, hence its refusal."""
    import torch
    from torch import nn

    cfg = TrialConfig(model={"d_model": 32, "n_layers": 2, "n_heads": 2}, data={"seq_len": 16},
                      optimizer={"name": name, "lr": 1e-2, "weight_decay": 0.1}, train={"steps": 3})
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    grads = [torch.randn(6, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    whole, halves = nn.Module(), nn.Module()
    whole.w = nn.Parameter(w.clone())
    halves.top, halves.bottom = nn.Parameter(w[:3].clone()), nn.Parameter(w[3:].clone())
    opts = [OPTIMIZERS[name].build(cfg, whole), OPTIMIZERS[name].build(cfg, halves)]
    for g in grads:
        whole.w.grad, halves.top.grad, halves.bottom.grad = g.clone(), g[:3].clone(), g[3:].clone()
        for opt in opts:
            opt.step()
    same = torch.allclose(torch.cat([halves.top, halves.bottom]).detach(), whole.w.detach(), rtol=1e-12, atol=1e-14)
    assert same == OPTIMIZERS[name].shardable
