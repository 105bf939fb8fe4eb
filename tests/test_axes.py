"""sweep.axes: each grid axis declared once. The spec's Grid, expansion, the whole-grid checks,
`sweep plan` and `sweep next` follow AXES, and the runs row holds each axis's columns; a new axis
is one entry there (and a runs column), seen expanded, checked, stored, labelled, charted and
written back by `sweep next`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from resultstore.schema import Role, role_of
from sweep.axes import AXES, grid_axes, point_axes, replicate
from sweep.grid import expand
from sweep.spec import parse_spec
from sweep.spec_schema import Grid

REPO = Path(__file__).resolve().parents[1]

SPEC = {
    "name": "axes", "train": {"steps": 2},
    "grid": {"model": [{"d_model": 32, "n_layers": 2, "n_heads": 2, "parametrization": "mup", "mup_base_width": 16}],
             "optimizer": [{"name": "adam", "lr": 1e-3}], "norm": ["rmsnorm"], "attention": ["gated"],
             "rotation": [{"mode": "partial", "group_size": 1}], "seed": [0, 1]},
}


def test_the_grid_is_the_axes_in_expansion_order():
    assert [a.key for a in grid_axes()] == list(Grid.model_fields) == [
        "model", "optimizer", "norm", "attention", "rotation", "seed"]
    assert replicate().key == "seed" and [a.key for a in point_axes()] == list(Grid.model_fields)[:-1]
    for a in AXES:  # a spec may leave out exactly the axes with a default, and gets that default
        assert Grid.model_fields[a.key].is_required() == (a.default is None)


def test_each_axis_value_and_columns_are_in_the_trial_and_its_runs_row():
    spec = parse_spec(SPEC)
    t = expand(spec)[1]
    row = t.flat()
    for a in AXES:
        assert a.value(t) == getattr(spec.grid, a.key)[-1 if a.replicate else 0] or a.ladders
        for column in a.columns or (a.key,):
            assert role_of(column) is not None and column in row, (a.key, column)
    assert [row[a.columns[0] if a.columns else a.key] for a in AXES] == [
        32, "adam", "rmsnorm", "gated", "partial(1)", 1]
    assert row["parametrization"] == "mup" and role_of("parametrization") is Role.AXIS  # rides on the model axis


NEW_AXIS = '''
from typing import Literal  # noqa: E402
AXES = (*AXES, Axis("lr_schedule", Literal["cosine", "linear", "constant"], "The lr's decay after warmup.", field="train.lr_schedule", default=("cosine",)))
'''

SCRIPT = '''
import os, sys
from pathlib import Path
import polars as pl, pytest, yaml
from typer.testing import CliRunner
from resultstore.schema import Role, declare_runs_column
declare_runs_column("lr_schedule", "string", Role.AXIS)  # the runs column it needs
from analysis.charts.frames import decorate
from analysis.labels import labels_for, trial_labels
from analysis.load import load
from resultstore.writer import ResultsStore
from study.train import train
from sweep.cli import app
from sweep.grid import expand
from sweep.spec import SpecError, load_spec, parse_spec

tmp = Path(sys.argv[1])
text = """name: axes
data: {corpus: stdlib, seq_len: 16}
train: {steps: 2, batch_size: 4, eval_every: 2, eval_batch: {sequences: 2}, checkpoint_every: 0, invariance_check: false}
grid:
  model: [{d_model: 32, n_layers: 2, n_heads: 2}]
  optimizer: [{name: adam, lr: 1.0e-2}]
  lr_schedule: [cosine, linear]
  seed: [0, 1]
"""
spec_path = tmp / "axes.yaml"
spec_path.write_text(text)

# expanded: a grid point per value, after the other axes and before the seeds; the default is every earlier trial
trials = expand(load_spec(spec_path))
assert [(t.train.lr_schedule, t.seed) for t in trials] == [("cosine", 0), ("cosine", 1), ("linear", 0), ("linear", 1)]
plain = expand(parse_spec(yaml.safe_load(text.replace("  lr_schedule: [cosine, linear]\\n", ""))))
assert [t.trial_id for t in plain] == [t.trial_id for t in trials[:2]]
# checked: a bad value and a repeated one named at their place
for bad, message in (("[cosine, step]", "grid.lr_schedule[1]: Input should be 'cosine', 'linear' or 'constant'"),
                     ("[linear, linear]", "grid.lr_schedule[1]: the same grid point as grid.lr_schedule[0]")):
    with pytest.raises(SpecError, match=message.replace("[", "\\\\[").replace("]", "\\\\]")):
        parse_spec(yaml.safe_load(text.replace("[cosine, linear]", bad)))

# stored: trained through the store, its value in its runs column
store = ResultsStore(str(tmp / "results"), "axes")
with store.writing("test"):
    for t in trials[::2]:
        assert train(t, store.sink(t.trial_id)).status in ("done", "diverged")
runs = load(store.uri).runs.collect().sort("lr_schedule")
assert runs.get_column("lr_schedule").to_list() == ["cosine", "linear"]

# labelled (its value names itself) and charted (a chart frame's line variant)
assert list(labels_for(trials[::2]).values()) == ["cosine", "linear"] == trial_labels(runs.to_dicts())
chart = decorate(runs, facet=None)
assert chart.get_column("variant").to_list() == ["cosine", "linear"]
assert chart.get_column("variant_axes").unique().to_list() == ["lr_schedule"]

# sweep plan's column, and sweep next writes it back: the linear ladder's spec holds it, the cosine one its default
os.environ["COLUMNS"] = "250"
spec_path.write_text(text.replace("seed: [0, 1]", "seed: [0]"))  # the seeds trained
plan = CliRunner().invoke(app, ["plan", str(spec_path), "--results", str(tmp / "results")])
assert plan.exit_code == 0 and "lr_schedule" in plan.output and "linear" in plan.output, plan.output
out = tmp / "next"
done = CliRunner().invoke(app, ["next", str(spec_path), "--results", str(tmp / "results"), "--seeds", "1", "--out", str(out)])
assert done.exit_code == 0, done.output
written = {p.name: yaml.safe_load(p.read_text()) for p in out.iterdir()}
assert sorted(written) == ["axes_edges_d32_cosine.yaml", "axes_edges_d32_linear.yaml"], sorted(written)
assert written["axes_edges_d32_linear.yaml"]["grid"]["lr_schedule"] == ["linear"]
assert "lr_schedule" not in written["axes_edges_d32_cosine.yaml"]["grid"]
again = expand(load_spec(out / "axes_edges_d32_linear.yaml"))
assert {t.train.lr_schedule for t in again} == {"linear"} and len(again) == 2
print("ok")
'''


def test_a_new_axis_is_one_entry(tmp_path):
    """A copy of sweep/ whose axes.py gains one entry (an lr_schedule axis setting
    train.lr_schedule), and its runs column declared: nothing else edited."""
    shutil.copytree(REPO / "sweep", tmp_path / "code" / "sweep", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "code" / "sweep" / "axes.py").open("a") as f:
        f.write(NEW_AXIS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "code"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1:] == ["ok"], done.stdout
