"""sweep.ladder and `sweep next`: what to run next for each lr ladder, and the specs it writes."""

import math

import polars as pl
import pytest
import yaml
from hypothesis import given, strategies as st
from rich.console import Console
from typer.testing import CliRunner

from resultstore.writer import ResultsStore
from sweep.cli import app
from sweep.cli_next import _table
from sweep.grid import expand
from sweep.ladder import _beyond, next_specs, plan_next, seed_list
from sweep.spec import parse_spec

SPEC = """\
name: ladders
data: {corpus: stdlib, seq_len: 32}
train: {steps: 30, batch_size: 8, eval_every: 10, eval_batch: {sequences: 4}, checkpoint_every: 10}
grid:
  model: [{d_model: 32, n_layers: 2, n_heads: 2}, {d_model: 64, n_layers: 2, n_heads: 2}]
  optimizer:
    - {name: adam, lr: [1.0e-3, 3.0e-3, 1.0e-2]}
    - {name: lion, lr: [3.0e-4, 1.0e-3, 3.0e-3], betas: [0.9, 0.99]}
    - {name: muon, lr: [1.0e-3, 3.0e-3, 1.0e-2], muon_ends: sgd, muon_ends_lr_ratio: 33}
  norm: [rmsnorm_scalar]
  seed: [0]
resources: {cpu: 1}
retries: 1
"""
# seed-0 final val loss per (d_model, optimizer, lr); absent: not run yet; None: diverged
LOSSES = {
    (32, "adam", 1e-3): 2.0, (32, "adam", 3e-3): 1.8, (32, "adam", 1e-2): 1.9,      # inside
    (32, "lion", 3e-4): 2.1, (32, "lion", 1e-3): 2.2, (32, "lion", 3e-3): 2.9,      # low edge
    (32, "muon", 1e-3): 2.3, (32, "muon", 3e-3): 2.2, (32, "muon", 1e-2): None,     # top diverged: inside
    (64, "adam", 1e-3): 1.9, (64, "adam", 3e-3): 1.7, (64, "adam", 1e-2): 1.6,      # high edge
    (64, "lion", 3e-4): 2.0, (64, "lion", 1e-3): 2.1,                               # waiting: 3e-3 started
    (64, "muon", 1e-3): None, (64, "muon", 3e-3): None, (64, "muon", 1e-2): None,   # all diverged
}


def _spec(text=SPEC):
    spec = parse_spec(yaml.safe_load(text))
    return spec, expand(spec)


def _row(t, loss, status=None):
    status = status or ("diverged" if loss is None else "done")
    return {"trial_id": t.trial_id, "sweep": t.sweep, **t.flat(), "status": status, "steps": 30, "tokens": 7680,
            "final_train_loss": loss, "final_val_loss": loss, "tokens_per_s": 1.0, "wall_s": 1.0,
            "config_json": t.config_json()}


def _runs(trials, losses=LOSSES, extra=()):
    rows = [_row(t, losses[k]) for t in trials
            if (k := (t.model.d_model, t.optimizer.name, t.optimizer.lr)) in losses]
    return pl.DataFrame(rows + list(extra), infer_schema_length=None)


def _by(ladders):
    return {(lad.template.model.d_model, lad.template.optimizer.name): lad for lad in ladders}


def test_each_ladder_gets_its_verdict_and_next_trials():
    spec, trials = _spec()
    started = [t.trial_id for t in trials if (t.model.d_model, t.optimizer.name, t.optimizer.lr) == (64, "lion", 3e-3)]
    ladders = _by(plan_next(trials, _runs(trials), spec.grid.seed, 3, started))
    verdicts = {k: lad.verdict for k, lad in ladders.items()}
    assert verdicts == {(32, "adam"): "seeds", (32, "lion"): "extend", (32, "muon"): "seeds",
                        (64, "adam"): "extend", (64, "lion"): "waiting", (64, "muon"): "extend"}
    lrs_seeds = {k: sorted((n.optimizer.lr, n.seed) for n in lad.new) for k, lad in ladders.items()}
    assert lrs_seeds[(32, "adam")] == [(3e-3, 1), (3e-3, 2)]       # seeds 1-2 at the inside best
    assert lrs_seeds[(32, "lion")] == [(1e-4, 0)]                   # 3e-4 / (1e-3/3e-4) = 9e-5 -> 1e-4
    assert lrs_seeds[(32, "muon")] == [(3e-3, 1), (3e-3, 2)]       # a diverged top bounds the ladder
    assert lrs_seeds[(64, "adam")] == [(3e-2, 0)]                   # the high edge: 1e-2 x 3.33 -> 0.03
    assert lrs_seeds[(64, "lion")] == []                            # 3e-3 at d 64 not finished
    assert lrs_seeds[(64, "muon")] == [(3e-4, 0)]                   # every lr diverged: below the smallest
    assert ladders[(64, "lion")].why == "1 of its 3 trials not finished (started)"
    assert ladders[(32, "muon")].losses == {1e-3: 2.3, 3e-3: 2.2, 1e-2: None}
    assert ladders[(32, "adam")].best == 3e-3 and ladders[(64, "lion")].best is None
    assert {lad.label for lad in ladders.values()} == {"adam", "lion", "muon"}  # the model has its own column


def test_a_lr_from_another_spec_joins_the_ladder_and_finished_seeds_are_not_asked_again():
    spec, trials = _spec()
    lion = next(t for t in trials if t.model.d_model == 32 and t.optimizer.name == "lion")
    beyond = lion.model_copy(update={"optimizer": lion.optimizer.model_copy(update={"lr": 1e-4})})
    adam = next(t for t in trials if t.model.d_model == 32 and t.optimizer.name == "adam" and t.optimizer.lr == 3e-3)
    seed1 = adam.model_copy(update={"seed": 1})
    runs = _runs(trials, extra=[_row(beyond, 2.15), _row(seed1, 1.85)])
    ladders = _by(plan_next(trials, runs, spec.grid.seed, 3))
    assert ladders[(32, "lion")].verdict == "seeds" and ladders[(32, "lion")].best == 3e-4  # now inside
    assert sorted(n.seed for n in ladders[(32, "adam")].new) == [2]
    assert ladders[(32, "adam")].losses[3e-3] == pytest.approx(1.825)  # the seed mean
    done = _runs(trials, extra=[_row(seed1, 1.85), _row(adam.model_copy(update={"seed": 2}), 1.8)])
    assert _by(plan_next(trials, done, spec.grid.seed, 3))[(32, "adam")].verdict == "complete"



def test_neighbours_seeds_the_lr_either_side_of_an_inside_best_until_all_three_are_seeded():
    spec, trials = _spec()
    ladders = _by(plan_next(trials, _runs(trials), spec.grid.seed, 3, neighbours=True))
    lrs_seeds = {k: sorted((n.optimizer.lr, n.seed) for n in lad.new) for k, lad in ladders.items()}
    assert lrs_seeds[(32, "adam")] == [(1e-3, 1), (1e-3, 2), (3e-3, 1), (3e-3, 2), (1e-2, 1), (1e-2, 2)]
    assert lrs_seeds[(32, "muon")] == [(1e-3, 1), (1e-3, 2), (3e-3, 1), (3e-3, 2)]  # its diverged top: no loss to fit
    assert lrs_seeds[(32, "lion")] == [(1e-4, 0)] and ladders[(32, "lion")].verdict == "extend"  # edges as before
    assert "neighbours (0.001, 0.01)" in ladders[(32, "adam")].why
    adam = ladders[(32, "adam")].new
    specs = next_specs(yaml.safe_load(SPEC), spec.name, list(ladders.values()), spec.grid.seed, "t")
    seeds32 = next(s for s in specs if s.name == "ladders_seeds_d32.yaml")
    assert {n.trial_id for n in adam} <= {t.trial_id for t in seeds32.trials}
    half = _runs(trials, extra=[_row(n, 1.9) for n in adam if n.optimizer.lr != 1e-2])
    again = _by(plan_next(trials, half, spec.grid.seed, 3, neighbours=True))[(32, "adam")]
    assert again.verdict == "seeds" and sorted((n.optimizer.lr, n.seed) for n in again.new) == [(1e-2, 1), (1e-2, 2)]
    done = _runs(trials, extra=[_row(n, 1.9) for n in adam])
    assert _by(plan_next(trials, done, spec.grid.seed, 3, neighbours=True))[(32, "adam")].verdict == "complete"
    assert _by(plan_next(trials, _runs(trials), spec.grid.seed, 3))[(32, "adam")].new == ladders[(32, "adam")].new[:2]

def test_a_tie_with_a_runner_up_of_fewer_seeds_seeds_the_runner_up():
    """Seeds 1-2 at the best pull its mean to 1.67 while 1e-2 keeps seed 0's 1.75, lower than the
    best's seed 0 (1.8): a tie the best's seeds cannot settle, so the runner-up gets seeds 1-2;
    once both have them the ladder is complete (a tie or not, both are measured)."""
    spec, trials = _spec()
    adam = [t for t in trials if t.model.d_model == 32 and t.optimizer.name == "adam"]
    at = {t.optimizer.lr: t for t in adam}
    seeds = [_row(at[3e-3].model_copy(update={"seed": s}), 1.6) for s in (1, 2)]
    runs = _runs(trials, losses={**LOSSES, (32, "adam", 1e-2): 1.75}, extra=seeds)
    ladder = _by(plan_next(trials, runs, spec.grid.seed, 3))[(32, "adam")]
    assert ladder.verdict == "seeds" and ladder.best == 3e-3 and "a tie with 0.01" in ladder.why
    assert sorted((n.optimizer.lr, n.seed) for n in ladder.new) == [(1e-2, 1), (1e-2, 2)]
    rival = [_row(at[1e-2].model_copy(update={"seed": s}), 1.7) for s in (1, 2)]
    runs = _runs(trials, losses={**LOSSES, (32, "adam", 1e-2): 1.75}, extra=seeds + rival)
    assert _by(plan_next(trials, runs, spec.grid.seed, 3))[(32, "adam")].verdict == "complete"



def test_neighbours_also_seeds_a_tied_rival_beyond_them():
    """The tie above, with the rival two rungs from the best (3e-2, past the neighbour 1e-2)."""
    spec, trials = _spec()
    at = {t.optimizer.lr: t for t in trials if t.model.d_model == 32 and t.optimizer.name == "adam"}
    far = at[1e-2].model_copy(update={"optimizer": at[1e-2].optimizer.model_copy(update={"lr": 3e-2})})
    seeds = [_row(at[3e-3].model_copy(update={"seed": s}), 1.6) for s in (1, 2)]
    ladder = _by(plan_next(trials, _runs(trials, extra=[_row(far, 1.75), *seeds]), spec.grid.seed, 3,
                           neighbours=True))[(32, "adam")]
    assert ladder.verdict == "seeds" and ladder.best == 3e-3 and "a tie with 0.03" in ladder.why, ladder.why
    assert sorted((n.optimizer.lr, n.seed) for n in ladder.new) == [
        (1e-3, 1), (1e-3, 2), (1e-2, 1), (1e-2, 2), (3e-2, 1), (3e-2, 2)]

def test_a_one_lr_ladder_steps_out_both_sides():
    spec, trials = _spec(SPEC.replace("lr: [1.0e-3, 3.0e-3, 1.0e-2]}\n    - {name: lion", "lr: 3.0e-3}\n    - {name: lion"))
    ladders = _by(plan_next(trials, _runs(trials), spec.grid.seed, 3))
    assert sorted(n.optimizer.lr for n in ladders[(32, "adam")].new) == [1e-3, 1e-2]


@given(edge=st.floats(1e-6, 10.0), ratio=st.floats(1.2, 10.0), low=st.booleans())
def test_the_next_lr_is_beyond_the_edge_by_about_the_ladders_ratio(edge, ratio, low):
    lr = _beyond(edge, ratio, low)
    step = edge / lr if low else lr / edge
    assert step > 1  # strictly beyond the edge, so the ladder grows
    assert ratio / math.sqrt(2) * 0.999 <= step <= ratio * math.sqrt(2) * 1.001 or step == pytest.approx(ratio, rel=1e-2)


def test_seed_list_keeps_the_specs_seeds_first():
    assert seed_list([0], 3) == [0, 1, 2] and seed_list([4, 0], 3) == [4, 0, 1] and seed_list([0, 1, 2, 3], 2) == [0, 1]


def test_written_specs_expand_to_exactly_the_decided_trials():
    spec, trials = _spec()
    ladders = plan_next(trials, _runs(trials), spec.grid.seed, 3)
    specs = {s.name: s for s in next_specs(yaml.safe_load(SPEC), spec.name, ladders, spec.grid.seed, "test")}
    assert sorted(specs) == ["ladders_edges_d32.yaml", "ladders_edges_d64.yaml", "ladders_seeds_d32.yaml"]
    for s in specs.values():
        again = expand(parse_spec(yaml.safe_load(s.text)))
        assert [t.trial_id for t in again] == [t.trial_id for t in s.trials]
        assert s.text.startswith("# Written by `sweep next`: test\n")
        assert yaml.safe_load(s.text)["name"] == "ladders"  # the same store
    decided = {n.trial_id for lad in ladders for n in lad.new}
    assert decided == {t.trial_id for s in specs.values() for t in s.trials}
    edges32 = yaml.safe_load(specs["ladders_edges_d32.yaml"].text)["grid"]
    assert edges32["optimizer"] == [{"name": "lion", "lr": 1e-4, "betas": [0.9, 0.99]}] and edges32["seed"] == [0]
    assert "lion: lr 0.0003 (2.100) / 0.001 (2.200) / 0.003 (2.900); best at the smallest" in specs[
        "ladders_edges_d32.yaml"].text


def test_specs_name_the_axes_that_vary_between_them():
    text = SPEC.replace("norm: [rmsnorm_scalar]", "norm: [rmsnorm_scalar]\n  attention: [softmax, gated]")
    spec, trials = _spec(text)
    losses = {(t.model.d_model, t.optimizer.name, t.optimizer.lr, t.attention.name): LOSSES.get(
        (t.model.d_model, t.optimizer.name, t.optimizer.lr), 3.0) for t in trials}
    runs = pl.DataFrame([_row(t, losses[(t.model.d_model, t.optimizer.name, t.optimizer.lr, t.attention.name)])
                         for t in trials], infer_schema_length=None)
    specs = next_specs(yaml.safe_load(text), spec.name, plan_next(trials, runs, spec.grid.seed, 3), spec.grid.seed, "t")
    names = sorted(s.name for s in specs)
    assert "ladders_edges_d32_gated.yaml" in names and "ladders_edges_d32_softmax.yaml" in names, names
    gated = next(s for s in specs if s.name == "ladders_edges_d32_gated.yaml")
    assert yaml.safe_load(gated.text)["grid"]["attention"] == [{"name": "gated"}]
    assert all(t.attention.name == "gated" for t in gated.trials)



def test_sp_and_mup_ladders_of_one_width_are_written_to_a_spec_each():
    """The width study's grid: the same shape under sp and mup. Their ladders need their own files,
    each holding its own parameterisation (a file per d_model alone lost the mup trials)."""
    text = SPEC.replace("{d_model: 64, n_layers: 2, n_heads: 2}",
                        "{d_model: 32, n_layers: 2, n_heads: 2, parametrization: mup, mup_base_width: 16}")
    spec, trials = _spec(text)
    losses = {(32, "adam", 1e-3): 1.9, (32, "adam", 3e-3): 1.7, (32, "adam", 1e-2): 1.6}  # high edge in both
    runs = pl.DataFrame([_row(t, losses[(32, t.optimizer.name, t.optimizer.lr)]) for t in trials
                         if t.optimizer.name == "adam"], infer_schema_length=None)
    ladders = [lad for lad in plan_next(trials, runs, spec.grid.seed, 3) if lad.template.optimizer.name == "adam"]
    assert [lad.verdict for lad in ladders] == ["extend", "extend"]
    specs = {s.name: s for s in next_specs(yaml.safe_load(text), spec.name, ladders, spec.grid.seed, "t")}
    assert sorted(specs) == ["ladders_edges_d32_mup.yaml", "ladders_edges_d32_sp.yaml"]
    for name, kind in (("ladders_edges_d32_sp.yaml", "sp"), ("ladders_edges_d32_mup.yaml", "mup")):
        assert {t.model.parametrization for t in specs[name].trials} == {kind}
        assert [t.optimizer.lr for t in specs[name].trials] == [3e-2]
    assert {t.trial_id for s in specs.values() for t in s.trials} == {n.trial_id for lad in ladders for n in lad.new}
    console = Console(width=200, record=True)
    console.print(_table(spec.name, ladders))
    assert [line.split("│")[1].strip() for line in console.export_text().splitlines() if "adam" in line] == [
        "32×2×2", "32×2×2 mup b16"]  # sweep next's table tells them apart too


runner = CliRunner()


@pytest.fixture
def stored(tmp_path):
    spec, trials = _spec()
    path = tmp_path / "ladders.yaml"
    path.write_text(SPEC)
    store = ResultsStore(str(tmp_path / "results"), "ladders")
    for row in _runs(trials).to_dicts():
        store.write_run(row)
    return path, tmp_path


def test_sweep_next_prints_each_ladder_and_writes_specs_sweep_run_takes(stored, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    path, tmp = stored
    shown = runner.invoke(app, ["next", str(path), "--results", str(tmp / "results")])
    assert shown.exit_code == 0, shown.output
    assert "6 ladders: 1 waiting, 3 to extend, 2 to seed, 0 complete · 7 trials next" in shown.output
    assert "--out DIR writes them" in shown.output and not (tmp / "next").exists()
    written = runner.invoke(app, ["next", str(path), "--results", str(tmp / "results"), "--out", str(tmp / "next")])
    assert written.exit_code == 0, written.output
    assert sorted(p.name for p in (tmp / "next").iterdir()) == [
        "ladders_edges_d32.yaml", "ladders_edges_d64.yaml", "ladders_seeds_d32.yaml"]
    plan = runner.invoke(app, ["plan", str(tmp / "next" / "ladders_seeds_d32.yaml"), "--results", str(tmp / "results")])
    assert plan.exit_code == 0 and "0/4 done" in plan.output, plan.output  # adam and muon, seeds 1-2
    again = runner.invoke(app, ["next", str(path), "--results", str(tmp / "results"), "--out", str(tmp / "next")])
    assert again.exit_code == 0, again.output  # its own files are written over


def test_sweep_next_refuses_to_write_over_a_file_it_did_not_write(stored):
    path, tmp = stored
    (tmp / "next").mkdir()
    mine = tmp / "next" / "ladders_edges_d64.yaml"
    mine.write_text("name: mine\n")
    result = runner.invoke(app, ["next", str(path), "--results", str(tmp / "results"), "--out", str(tmp / "next")])
    assert result.exit_code == 2 and "ladders_edges_d64.yaml exist and were not written by `sweep next`" in result.output
    assert mine.read_text() == "name: mine\n" and sorted(p.name for p in (tmp / "next").iterdir()) == [mine.name]
    (tmp / "afile").write_text("x")
    result = runner.invoke(app, ["next", str(path), "--results", str(tmp / "results"), "--out", str(tmp / "afile")])
    assert result.exit_code == 2 and "is a file, not a folder" in result.output and "Traceback" not in result.output
