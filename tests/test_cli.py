import re
from pathlib import Path

import pytest

from conftest import invoke


SMOKE = Path(__file__).parent.parent / "specs" / "smoke.yaml"
@pytest.mark.parametrize("command", ["run", "plan", "train"])
def test_bad_spec_exits_2_with_a_located_message_and_writes_nothing(tmp_path, command):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMOKE.read_text().replace("lr: 3.0e-3}, {name: rotated_adam", "lr: -1}, {name: rotated_adam"))
    extra = ["--trial", "0"] if command == "train" else []
    result = invoke(command, bad, "--results", tmp_path / "results", *extra)
    assert result.exit_code == 2, result.output
    assert "grid.optimizer[0].lr: Input should be greater than 0" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "results").exists()


def test_plan_lists_every_trial_with_its_size(tmp_path):
    result = invoke("plan", SMOKE, "--results", tmp_path)
    assert result.exit_code == 0, result.output
    assert "smoke: 2 trials" in result.output and "rotated_adam" in result.output
    assert "0/2 done" in result.output and "42k" in result.output
    assert not (tmp_path / "smoke").exists()


def test_plan_marks_a_started_trial_with_no_result_as_started_not_pending(tmp_path):
    from resultstore.writer import ResultsStore
    from sweep.cli import load

    _, trials = load(SMOKE)
    store = ResultsStore(tmp_path, "smoke")
    (Path(store.path) / "trials" / trials[0].trial_id).mkdir(parents=True)  # what a trial writes when it begins
    rows = [line for line in invoke("plan", SMOKE, "--results", tmp_path).output.splitlines() if "│" in line]
    started = [r for r in rows if trials[0].trial_id in r]
    pending = [r for r in rows if trials[1].trial_id in r]
    assert started and "started" in started[0] and "pending" not in started[0], rows
    assert pending and "pending" in pending[0], rows


def test_status_of_a_sweep_that_began_and_wrote_no_rows_yet_lists_its_started_trials(tmp_path):
    """The first minutes of a run: trials/ holds configs, no table folder exists yet. Status names
    the trials started (exit 1: no result yet), where it said "no sweep found"; report still refuses."""
    from resultstore.writer import ResultsStore
    from sweep.cli import load

    _, trials = load(SMOKE)
    store = ResultsStore(tmp_path, "smoke")
    (Path(store.path) / "trials" / trials[0].trial_id).mkdir(parents=True)  # what a trial writes when it begins
    for where in (tmp_path / "smoke", tmp_path):  # the sweep folder, or the results root holding it
        result = invoke("status", where)
        assert result.exit_code == 1, result.output
        assert "started, no result" in result.output and trials[0].trial_id in result.output, result.output
    assert "no sweep found" in invoke("report", tmp_path / "smoke").output


def test_plan_shows_the_attention_column_where_a_trial_varies_it(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")  # the whole table on one line per trial
    plain = invoke("plan", SMOKE, "--results", tmp_path)
    assert plain.exit_code == 0 and "┃ attention" not in plain.output, plain.output
    spec = tmp_path / "gated.yaml"
    spec.write_text(SMOKE.read_text().replace("norm: [rmsnorm_scalar]", "norm: [rmsnorm_scalar]\n  attention: [softmax, gated]"))
    result = invoke("plan", spec, "--results", tmp_path)
    assert result.exit_code == 0 and "smoke: 4 trials" in result.output, result.output
    rows = [line for line in result.output.splitlines() if "rmsnorm_scalar" in line]
    assert "┃ attention" in result.output and sorted(r.split("rmsnorm_scalar")[1].split()[1] for r in rows) == [
        "gated", "gated", "softmax", "softmax"], result.output



def test_plan_tells_a_mup_trial_from_the_sp_one_of_its_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    spec = tmp_path / "mup.yaml"
    text = SMOKE.read_text()
    shape = re.search(r"\{d_model: (\d+), n_layers: (\d+), n_heads: (\d+)\}", text)
    spec.write_text(text.replace(shape.group(0), f"{shape.group(0)}, {shape.group(0)[:-1]}, parametrization: mup, "
                                                 f"mup_base_width: {shape.group(3)}}}", 1))
    result = invoke("plan", spec, "--results", tmp_path)
    assert result.exit_code == 0, result.output
    d, L, h = shape.groups()
    rows = [line for line in result.output.splitlines() if "rmsnorm_scalar" in line]
    assert sum(f"{d}×{L}×{h} mup b{h} " in r for r in rows) == len(rows) // 2 > 0, result.output

def test_train_then_status_then_query(tmp_path):
    result = invoke("train", SMOKE, "--trial", "1", "--results", tmp_path)
    assert result.exit_code == 0, result.output
    assert "done: val loss" in result.output and str(tmp_path / "smoke") in result.output
    status = invoke("status", tmp_path / "smoke")
    assert status.exit_code == 0 and "done" in status.output
    q = invoke("query", tmp_path / "smoke", "SELECT optimizer, count(*) AS n FROM runs GROUP BY optimizer")
    assert q.exit_code == 0, q.output
    assert "rotated_adam" in q.output
    plan = invoke("plan", SMOKE, "--results", tmp_path)
    assert "1/2 done" in plan.output and "measured from this sweep's finished runs" in " ".join(plan.output.split())


def test_unknown_trial_and_missing_results_exit_2(tmp_path):
    assert invoke("train", SMOKE, "--trial", "7", "--results", tmp_path).exit_code == 2
    result = invoke("status", tmp_path)
    assert result.exit_code == 2 and "no sweep found" in result.output


def test_bad_query_exits_2(tmp_path):
    invoke("train", SMOKE, "--trial", "0", "--results", tmp_path)
    result = invoke("query", tmp_path / "smoke", "SELEKT nonsense")
    assert result.exit_code == 2 and "Traceback" not in result.output


OPTIMISER_SPEC = """name: optims
data: {corpus: stdlib, seq_len: 16}
train: {steps: 4, batch_size: 4, eval_every: 4, eval_batch: {sequences: 2}, checkpoint_every: 0, invariance_check: false}
grid:
  model: [{d_model: 16, n_layers: 1, n_heads: 2}]
  optimizer:
    - {name: adam, lr: 3.0e-3}
    - {name: soap, lr: 3.0e-3, precondition_frequency: 2}
    - {name: muon, lr: 3.0e-3}
    - {name: adafactor, lr: 1.0e-2}
    - {name: lion, lr: 3.0e-4}
    - {name: signsgd, lr: 3.0e-4}
  norm: [rmsnorm]
  rotation: [none]
  seed: [0]
resources: {cpu: 1}
"""


def test_sweep_train_runs_each_optimiser(tmp_path):
    spec = tmp_path / "optims.yaml"
    spec.write_text(OPTIMISER_SPEC)
    for i in range(1, 6):
        result = invoke("train", spec, "--trial", i, "--results", tmp_path / "results")
        assert result.exit_code == 0, result.output
        assert "done: val loss" in result.output
    q = invoke("query", tmp_path / "results" / "optims",
               "SELECT optimizer, optimizer_family, precondition_frequency FROM runs ORDER BY optimizer")
    assert q.exit_code == 0, q.output
    for name in ("adafactor", "lion", "muon", "signsgd", "soap", "mixed", "per_coordinate"):  # soap on rmsnorm gains, muon with adamw ends: mixed
        assert name in q.output


@pytest.mark.parametrize("bad, where", [
    ("precondition_frequency: 2}", "grid.optimizer[1].precondition_frequency: Input should be greater than 0, got 0 (line 8)"),
    ("name: muon, lr: 3.0e-3}", "grid.optimizer[2].muon_exclude: ['*'] leaves Muon only embedding matrices"),
])
def test_bad_optimiser_options_exit_2_located(tmp_path, bad, where):
    spec = tmp_path / "bad.yaml"
    fix = {"precondition_frequency: 2}": "precondition_frequency: 0}",
           "name: muon, lr: 3.0e-3}": "name: muon, lr: 3.0e-3, muon_exclude: ['*']}"}[bad]
    spec.write_text(OPTIMISER_SPEC.replace(bad, fix))
    result = invoke("plan", spec, "--results", tmp_path / "results")
    assert result.exit_code == 2, result.output
    assert where in result.output, result.output
    assert ("(line 8)" if "precondition" in where else "(line 9)") in result.output
    assert "Traceback" not in result.output and not (tmp_path / "results").exists()


def test_error_messages_print_what_they_quote_not_markup(capsys):
    from sweep.cli import bad_input

    bad_input("`tokenizers` is not installed; pip install 'privileged-bases-sweep[data]'")
    assert "privileged-bases-sweep[data]" in capsys.readouterr().err


def test_resources_this_machine_cannot_hold_are_refused_at_their_line_before_ray(tmp_path):
    import ray

    spec = tmp_path / "g.yaml"
    spec.write_text("name: g\ndata: {seq_len: 16}\ntrain: {steps: 2, batch_size: 2, eval_batch: {sequences: 2}}\n"
                    "grid:\n  model: [{d_model: 16, n_layers: 1, n_heads: 1}]\n  optimizer: [{name: adam, lr: 1.0e-3}]\n"
                    "resources:\n  cpu: 1\n  gpu: 8\n")
    assert not ray.is_initialized()
    r = invoke("run", spec, "--results", tmp_path / "r")
    assert r.exit_code == 2, r.output
    assert "needs cpu=1 gpu=8, but this machine has" in r.output and "(line 9)" in r.output, r.output
    assert "to run" not in r.output  # refused before saying what it would run (issue 18)
    assert not ray.is_initialized() and not (tmp_path / "r").exists()
    spec.write_text(spec.read_text().replace("gpu: 8", "gpu: 1000"))  # no node holds it: plan refuses too
    for verb in ("plan", "run"):
        r = invoke(verb, spec, "--results", tmp_path / "r")
        assert r.exit_code == 2 and "resources.gpu: a trial runs on one node: at most 16 GPUs" in r.output, r.output
        assert "H200" not in r.output and "to run" not in r.output


def test_rerunning_a_sweep_whose_trials_diverged_says_so(tmp_path):
    from sweep.cli import load
    from resultstore.writer import ResultsStore
    from sweep.trainable import failed_row

    _, trials = load(SMOKE)
    store = ResultsStore(tmp_path, "smoke")
    for t in trials:
        store.write_run({**failed_row(t, "loss 1e9 > 20 x initial"), "status": "diverged", "steps": 12})
    r = invoke("run", SMOKE, "--results", tmp_path)  # nothing to run: Ray never starts
    assert r.exit_code == 0, r.output
    assert "2 already complete (2 of them diverged" in r.output and trials[0].trial_id in r.output, r.output


def test_the_run_summary_counts_an_interrupted_run_s_unfinished_trials_apart():
    from sweep.cli import run_summary
    from sweep.launch import SweepOutcome

    interrupted = SweepOutcome(total=24, skipped=0, launched=24, wall_s=5760.0,
                               statuses={**{f"d{i}": "done" for i in range(4)}, **{f"m{i}": "missing" for i in range(20)}})
    assert run_summary(interrupted) == "24 trials launched, 0 skipped, in 1.6h: 4 done, 20 unfinished."
    mixed = SweepOutcome(total=5, skipped=2, launched=3, wall_s=30.0,
                         statuses={"a": "done", "b": "diverged", "c": "failed"})
    assert run_summary(mixed) == "3 trials launched, 2 skipped, in 30s: 1 done, 1 failed, 1 diverged."
    assert run_summary(SweepOutcome(total=2, skipped=2, launched=0, wall_s=1.0, statuses={})) == (
        "0 trials launched, 2 skipped, in 1s.")


def test_stop_launching_at_reads_a_clock_time_a_date_or_a_duration_and_refuses_the_past():
    import datetime as dt

    import typer

    from sweep.cli import launch_deadline

    now = dt.datetime(2026, 12, 4, 15, 0, 0).timestamp()  # local time, as the option reads it
    assert launch_deadline("+2h30m", now) == now + 9000
    assert launch_deadline("+45s", now) == now + 45 and launch_deadline("+90m", now) == now + 5400
    assert launch_deadline("17:05", now) == dt.datetime(2026, 12, 4, 17, 5).timestamp()
    assert launch_deadline("2026-12-05T09:30", now) == dt.datetime(2026, 12, 5, 9, 30).timestamp()
    for bad in ("14:59", "2026-12-03T23:00", "+0m", "+", "soon", "25:00", "2h"):
        with pytest.raises(typer.Exit) as raised:
            launch_deadline(bad, now)
        assert raised.value.exit_code == 2, bad


def test_run_refuses_a_past_stop_launching_at_before_it_writes_anything(tmp_path):
    r = invoke("run", SMOKE, "--results", tmp_path / "r", "--stop-launching-at", "2001-01-01T00:00")
    assert r.exit_code == 2, r.output
    assert "--stop-launching-at '2001-01-01T00:00': that time has passed" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "r").exists()


def test_the_run_summary_counts_trials_the_launch_deadline_kept_apart():
    from sweep.cli import run_summary
    from sweep.launch import SweepOutcome

    outcome = SweepOutcome(total=6, skipped=1, launched=5, wall_s=600.0,
                           statuses={"a": "done", "b": "done", "c": "missing", "d": "missing", "e": "missing"},
                           not_started=frozenset({"d", "e"}))
    assert run_summary(outcome) == "5 trials launched, 1 skipped, in 10min: 2 done, 1 unfinished, 2 not started."
    assert outcome.missing == ["c"] and outcome.unexpected == ["c"]


def test_run_reuse_copies_another_sweep_s_finished_trials_and_trains_nothing(tmp_path):
    """The smoke spec renamed: the same trial ids. Its two trials, finished in the smoke sweep,
    are copied into the new sweep's store (renamed to it) and nothing runs (Ray never starts)."""
    from resultstore.writer import ResultsStore
    from sweep.cli import load
    from sweep.trainable import failed_row

    _, trials = load(SMOKE)
    source = ResultsStore(tmp_path / "old", "smoke")
    for t in trials:  # diverged: finished, with no eval rows a done trial would need
        source.write_run({**failed_row(t, "loss 1e9 > 20 x initial"), "status": "diverged", "steps": 12})
    renamed = tmp_path / "again.yaml"
    renamed.write_text(SMOKE.read_text().replace("name: smoke", "name: smoke_again"))
    assert "name: smoke_again" in renamed.read_text()
    r = invoke("run", renamed, "--results", tmp_path / "new", "--reuse", source.uri)
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "2 of the spec's 2 trials finished there" in flat and "copied 2 finished trial(s)" in flat, flat
    assert "2 already complete" in flat and "0 trials launched, 2 skipped" in flat, flat
    copied = ResultsStore(tmp_path / "new", "smoke_again").read("runs")
    assert sorted(copied["trial_id"]) == sorted(t.trial_id for t in trials) and set(copied["sweep"]) == {"smoke_again"}


def test_run_reuse_of_a_store_whose_config_json_is_garbage_exits_2_naming_it(tmp_path):
    """Issue 50 (seen once): --reuse over a runs row whose config_json is not JSON was a traceback
    at the copy; now exit 2 before anything, naming the store and the trial, nothing written."""
    from resultstore.writer import ResultsStore
    from sweep.cli import load
    from sweep.trainable import failed_row

    _, trials = load(SMOKE)
    source = ResultsStore(tmp_path / "old", "smoke")
    for t in trials:
        source.write_run({**failed_row(t, "loss 1e9 > 20 x initial"), "status": "diverged", "steps": 12,
                          "config_json": "{not json" if t is trials[0] else failed_row(t, "")["config_json"]})
    renamed = tmp_path / "again.yaml"
    renamed.write_text(SMOKE.read_text().replace("name: smoke", "name: smoke_again"))
    r = invoke("run", renamed, "--results", tmp_path / "new", "--reuse", source.uri)
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and f"trial {trials[0].trial_id}'s config_json is not a JSON object" in flat, r.output
    assert "Traceback" not in r.output and not (tmp_path / "new").exists()


@pytest.mark.parametrize("where", ["own", "nothing"])
def test_run_reuse_of_its_own_store_or_of_nothing_exits_2_before_anything(tmp_path, where):
    reuse = tmp_path / "r" / "smoke" if where == "own" else tmp_path / "nowhere"
    (tmp_path / "r" / "smoke" / "runs").mkdir(parents=True)
    r = invoke("run", SMOKE, "--results", tmp_path / "r", "--reuse", reuse)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert ("this sweep's own store" if where == "own" else "nowhere") in " ".join(r.output.split()), r.output
    assert not (tmp_path / "r" / "smoke" / "trials").exists() and not (tmp_path / "r" / "smoke" / "run.lock").exists()
