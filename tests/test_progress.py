"""Trial labels (analysis.labels, sweep.progress): every label a user reads names each axis that
varies within the sweep and omits those that do not."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from typer.testing import CliRunner

from analysis.labels import trial_labels, varying_axes
from sweep.cli import app
from sweep.grid import expand
from sweep.progress import ProgressCallback, labels_for
from sweep.spec import load_spec, parse_spec

SPECS = Path(__file__).parent.parent / "specs"


class _Trial:
    """What the callback reads of a Ray Tune trial: the grid point it ran."""

    def __init__(self, trial_id: str):
        self.config = {"point": {"trial_id": trial_id}}


def test_laptop_sgd_ladder_prints_three_different_lines_naming_their_lr():
    """Before: three `done ... (d_model 128 sgd layernorm none seed 0)` lines, identical."""
    trials = expand(load_spec(SPECS / "laptop.yaml"))
    console = Console(file=io.StringIO(), width=200, color_system=None)
    callback = ProgressCallback(trials, Progress(console=console))
    sgd = [t for t in trials if t.optimizer.name == "sgd" and t.model.d_model == 128]
    for t in sgd:
        callback.on_trial_result(0, [], _Trial(t.trial_id), {"step": t.total_steps, "val_loss": 2.5})
        callback.on_trial_complete(0, [], _Trial(t.trial_id))
    lines = [line for line in console.file.getvalue().splitlines() if line.startswith("done")]
    assert lines == [f"done {t.trial_id} (d_model 128 · sgd · lr {t.optimizer.lr:g}): val loss 2.500" for t in sgd]
    assert len(set(lines)) == 3
    # norm, rotation and seed do not vary in the laptop spec: no label names them
    assert not any(word in line for line in lines for word in ("layernorm", "none", "seed", "momentum"))


def test_a_rerun_of_one_ladder_point_still_names_its_lr():
    trials = expand(load_spec(SPECS / "laptop.yaml"))
    console = Console(file=io.StringIO(), width=200, color_system=None)
    last = trials[-2]  # d_model 128, sgd lr 3
    callback = ProgressCallback([last], Progress(console=console), sweep_trials=trials)
    callback.on_trial_complete(0, [], _Trial(last.trial_id))
    assert f"done {last.trial_id} (d_model 128 · sgd · lr 3)" in console.file.getvalue()


def test_hyper_parameters_vary_within_an_optimiser_not_between_optimisers():
    rows = [
        {"optimizer": "adam", "lr": 3e-3, "eps": 1e-8, "momentum": None, "norm": "layernorm", "seed": 0},
        {"optimizer": "sgd", "lr": 0.3, "eps": None, "momentum": 0.9, "norm": "layernorm", "seed": 0},
        {"optimizer": "sgd", "lr": 0.3, "eps": None, "momentum": 0.5, "norm": "layernorm", "seed": 0},
    ]
    assert varying_axes(rows) == ["optimizer", "momentum"]  # lr differs only with the optimiser
    assert trial_labels(rows) == ["adam", "sgd · momentum 0.9", "sgd · momentum 0.5"]
    one = [{**rows[0], "seed": s} for s in (0, 1)]
    assert trial_labels(one) == ["seed 0", "seed 1"]
    assert trial_labels(one[:1]) == [""]  # nothing varies in a one-trial sweep


def test_optimiser_options_beyond_the_runs_columns_are_named():
    spec = parse_spec({
        "name": "muons", "data": {"corpus": "stdlib", "seq_len": 16},
        "train": {"steps": 2, "batch_size": 4, "eval_batch": {"sequences": 2}},
        "grid": {"model": [{"d_model": 16, "n_layers": 1, "n_heads": 2}],
                 "optimizer": [{"name": "muon", "lr": 3e-3, "muon_lr_ratio": [1.0, 2.0]},
                               {"name": "soap", "lr": 3e-3, "shampoo_beta": [0.9, 0.95]},
                               {"name": "adam", "lr": 3e-3, "betas": [[0.9, 0.95], [0.9, 0.99]]}],
                 "rotation": ["none", "shared"]},
    })
    trials = expand(spec)
    labels = labels_for(trials)
    assert labels[trials[0].trial_id] == "muon · muon_lr_ratio 1 · none"
    assert labels[trials[2].trial_id] == "muon · muon_lr_ratio 2 · none"
    assert labels[trials[4].trial_id] == "soap · shampoo_beta 0.9 · none"
    assert labels[trials[-1].trial_id] == "adam · beta2 0.99 · shared"
    assert len(set(labels.values())) == len(trials)


LADDER = """name: ladder
data: {corpus: stdlib, seq_len: 16}
train: {steps: 3, batch_size: 4, eval_every: 3, eval_batch: {sequences: 2}, checkpoint_every: 0, invariance_check: false}
grid:
  model: [{d_model: 16, n_layers: 1, n_heads: 2}]
  optimizer: [{name: sgd, lr: [0.3, 1.0e+9], momentum: 0.9}]
resources: {cpu: 1}
"""


def test_status_names_the_lr_of_the_trial_that_diverged(tmp_path):
    spec = tmp_path / "ladder.yaml"
    spec.write_text(LADDER)
    runner = CliRunner()
    for i, code in ((0, 0), (1, 1)):  # lr 1e9 diverges: exit 1
        assert runner.invoke(app, ["train", str(spec), "--trial", str(i), "--results", str(tmp_path)]).exit_code == code
    status = runner.invoke(app, ["status", str(tmp_path / "ladder")])
    assert status.exit_code == 1, status.output
    bad = expand(load_spec(spec))[1]
    line = next(line for line in status.output.splitlines() if bad.trial_id in line)
    assert line.startswith(f"diverged {bad.trial_id} (lr 1e+09):"), line
