"""Trial labels (analysis.labels, sweep.progress): every label a user reads names each axis that
varies within the sweep and omits those that do not."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest
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


def test_a_trial_past_the_launch_deadline_is_named_and_leaves_the_count_and_the_flops():
    trials = expand(load_spec(SPECS / "laptop.yaml"))[:3]
    console = Console(file=io.StringIO(), width=200, color_system=None)
    progress = Progress(console=console)
    callback = ProgressCallback(trials, progress)
    first, late = trials[0], trials[2]
    callback.on_trial_result(0, [], _Trial(first.trial_id), {"step": first.total_steps, "val_loss": 2.5})
    callback.on_trial_complete(0, [], _Trial(first.trial_id))
    callback.on_trial_result(0, [], _Trial(late.trial_id), {"not_started": True, "finished": True})
    callback.on_trial_complete(0, [], _Trial(late.trial_id))
    text = console.file.getvalue()
    assert f"not started {late.trial_id}" in text and f"done {late.trial_id}" not in text
    (task,) = progress.tasks
    assert task.total == sum(t.flops_per_token * t.total_tokens for t in trials[:2])
    assert task.description.startswith("1/2 trials done")


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


def test_status_names_the_lr_of_the_trial_that_diverged_inside_its_ladder_and_exits_0(tmp_path):
    spec = tmp_path / "ladder.yaml"
    spec.write_text(LADDER)
    runner = CliRunner()
    for i, code in ((0, 0), (1, 1)):  # lr 1e9 diverges: `sweep train` of that one trial exits 1
        assert runner.invoke(app, ["train", str(spec), "--trial", str(i), "--results", str(tmp_path)]).exit_code == code
    status = runner.invoke(app, ["status", str(tmp_path / "ladder")])
    assert status.exit_code == 0, status.output  # lr 0.3 finished: the ladder's top diverging is expected
    bad = expand(load_spec(spec))[1]
    line = next(line for line in status.output.splitlines() if bad.trial_id in line)
    assert line.startswith(f"diverged (ladder) {bad.trial_id} (lr 1e+09):"), line
    assert re.search(r"│ diverged \(ladder\) +│ +1 │", status.output), status.output  # its own row of the table


def _write_runs(tmp_path, spec_text: str, statuses: dict[int, str]):
    """Runs rows (no training) for the spec's trials by grid index: status per index."""
    from resultstore.writer import ResultsStore
    from sweep.trainable import failed_row

    spec = tmp_path / "s.yaml"
    spec.write_text(spec_text)
    trials = expand(load_spec(spec))
    store = ResultsStore(tmp_path / "r", load_spec(spec).name)
    for i, status in statuses.items():
        store.write_run({**failed_row(trials[i], "loss 1e9 > 20 x initial" if status != "done" else None),
                         "status": status, "steps": 3})
    return trials, store


SEEDS = LADDER.replace("momentum: 0.9}]", "momentum: 0.9}]\n  seed: [0, 1]")  # (lr 0.3, 1e9) x (seed 0, 1)
OTHER = LADDER.replace("[{name: sgd, lr: [0.3, 1.0e+9], momentum: 0.9}]",  # two optimisers, no ladder
                       "[{name: sgd, lr: 1.0e+9, momentum: 0.9}, {name: adam, lr: 3.0e-3}]")


@pytest.mark.parametrize("spec, statuses, bad, code, shown", [
    (LADDER, {0: "done", 1: "diverged"}, 1, 0, "diverged (ladder)"),  # differs from a done trial only in its lr
    (LADDER, {1: "diverged"}, 1, 1, "diverged"),                        # no lr of its ladder finished
    (LADDER, {0: "failed", 1: "diverged"}, 1, 1, "diverged"),           # the other lr failed: not done
    (SEEDS, {1: "done", 2: "diverged"}, 2, 1, "diverged"),              # lr 1e9 seed 0 beside lr 0.3 seed 1: seed differs too
    (SEEDS, {0: "done", 1: "done", 3: "diverged"}, 3, 0, "diverged (ladder)"),  # lr 1e9 seed 1 beside lr 0.3 seed 1
    (OTHER, {0: "diverged", 1: "done"}, 0, 1, "diverged"),              # differs in the optimiser, not only the lr
    (LADDER, {0: "done", 1: "failed"}, 1, 1, "failed"),                 # a failure is never expected
])
def test_status_exits_0_only_when_what_did_not_finish_diverged_inside_an_lr_ladder(tmp_path, spec, statuses, bad,
                                                                                   code, shown):
    trials, store = _write_runs(tmp_path, spec, statuses)
    status = CliRunner().invoke(app, ["status", store.uri])
    assert status.exit_code == code, status.output
    line = next(line for line in status.output.splitlines() if trials[bad].trial_id in line)
    assert line.startswith(f"{shown} {trials[bad].trial_id}"), status.output


def test_status_exits_1_for_a_ladder_divergence_beside_a_trial_started_with_no_result(tmp_path):
    trials, store = _write_runs(tmp_path, LADDER, {0: "done", 1: "diverged"})
    (tmp_path / "r" / "ladder" / "trials" / "f00d").mkdir(parents=True)  # started, no runs row
    status = CliRunner().invoke(app, ["status", store.uri])
    assert status.exit_code == 1 and "started, no result" in status.output, status.output


def test_the_attention_is_named_bare_where_it_varies_and_not_where_it_does_not():
    from study.config import TrialConfig

    def trial(attention: str, seed: int = 0) -> TrialConfig:
        return TrialConfig(model={"d_model": 32, "n_layers": 2, "n_heads": 2}, optimizer={"name": "adam", "lr": 3e-3},
                           attention=attention, train={"steps": 2}, seed=seed)

    trials = [trial("softmax"), trial("gated"), trial({"name": "clipped", "gamma": -0.1})]
    assert list(labels_for(trials).values()) == ["softmax", "gated", "clipped(zeta=1,gamma=-0.1)"]
    assert list(labels_for([trial("gated", 0), trial("gated", 1)]).values()) == ["seed 0", "seed 1"]


def test_without_a_terminal_progress_is_printed_as_plain_lines_at_most_every_every_s():
    """Under nohup or a batch job rich draws no bar: before, a log showed nothing until the first
    trial ended (18 min at d_model 128); now a line with the trials done and the share of FLOPs."""
    trials = expand(load_spec(SPECS / "laptop.yaml"))[:2]
    lines = {}
    for name, every_s, terminal in (("plain", 0.0, False), ("quiet", 600.0, False), ("bar", 0.0, True)):
        console = Console(file=io.StringIO(), width=200, color_system=None, force_terminal=terminal)
        callback = ProgressCallback(trials, Progress(console=console), every_s=every_s)
        callback.on_trial_start(0, [], _Trial(trials[0].trial_id))
        callback.on_trial_result(0, [], _Trial(trials[0].trial_id), {"step": trials[0].total_steps // 2})
        lines[name] = [line for line in console.file.getvalue().splitlines() if "trials done" in line]
    assert lines["plain"] and re.search(r"^\d\d:\d\d 0/2 trials done · 1 running · \d+% of the FLOPs · about \S+ left at this rate$",
                                        lines["plain"][-1]), lines["plain"]
    flops = [t.flops_per_token * t.total_tokens for t in trials]
    assert lines["plain"][-1].split(" · ")[2] == f"{100 * flops[0] / 2 / sum(flops):.0f}% of the FLOPs"
    assert lines["quiet"] == []  # within every_s of the last line (here: of the start)
    assert lines["bar"] == []    # a terminal has the bar


class _Clock:
    """A fake monotonic clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_left_starts_from_the_plan_and_is_corrected_as_trials_run_and_end():
    """3 trials the plan times at 100 s, 2 at once. Before any step: 200 s (the third waits for a
    slot). They run 1.2x slower than planned: the time left follows, with the factor named."""
    from sweep.progress import Eta

    clock = _Clock()
    eta = Eta({"a": 100.0, "b": 100.0, "c": 100.0}, clock)
    eta.start("a"), eta.start("b")
    assert eta.left({}) == (200.0, None)
    clock.now = 60.0  # half of a and b's steps in 60 s: 1.2 x the plan
    seconds, scale = eta.left({"a": 0.5, "b": 0.5})
    assert scale == pytest.approx(1.2) and seconds == pytest.approx(60 + 120)
    clock.now = 120.0
    eta.end("a", 1.0), eta.end("b", 1.0)
    eta.start("c")
    assert eta.left({}) == (pytest.approx(120.0), pytest.approx(1.2))  # c at the corrected 120 s
    clock.now = 150.0  # c a quarter through in 30 s: on the same pace
    assert eta.left({"c": 0.25})[0] == pytest.approx(90.0)
    assert eta.line({"c": 0.25}) == "about 2min left (the plan's time x 1.20, as the trials so far ran)"


def test_a_trial_that_ends_early_counts_for_the_share_of_steps_it_did_and_a_dropped_one_not_at_all():
    from sweep.progress import Eta

    clock = _Clock()
    eta = Eta({"a": 100.0, "b": 100.0, "c": 50.0}, clock)
    eta.start("a")
    clock.now = 50.0
    eta.end("a", 0.25)  # diverged a quarter through, in 50 s: 2x the plan
    eta.start("b")
    assert eta.left({}) == (pytest.approx(2 * (100 + 50)), pytest.approx(2.0))  # one slot: b, then c
    eta.start("c")
    eta.end("c", 0.0)  # returned at once without training (past the launch deadline)
    eta.drop("c")
    assert eta.left({}) == (pytest.approx(200.0), pytest.approx(2.0))


def test_the_plain_progress_line_gives_the_time_left_each_time_a_trial_ends():
    """Without a terminal a line comes whenever a trial ends (not only every every_s): the plan's
    time left, then the corrected one."""
    clock = _Clock()
    trials = expand(load_spec(SPECS / "first.yaml"))
    assert len(trials) == 3
    console = Console(file=io.StringIO(), width=300, color_system=None)
    callback = ProgressCallback(trials, Progress(console=console), every_s=1e9, clock=clock,
                                planned_s={t.trial_id: 240.0 for t in trials})
    a, b, c = (_Trial(t.trial_id) for t in trials)
    callback.on_trial_start(0, [], a)
    callback.on_trial_start(0, [], b)
    clock.now = 480.0
    for x in (a, b):
        callback.on_trial_result(0, [], x, {"step": trials[0].total_steps, "val_loss": 2.0})
        callback.on_trial_complete(0, [], x)
    lines = [line for line in console.file.getvalue().splitlines() if "trials done" in line]
    assert lines[0].endswith("1/3 trials done · 1 running · 33% of the FLOPs · about 8min left (the plan's time x 2.00, "
                             "as the trials so far ran)"), lines  # b's 480 s beside c's 480 s
    assert lines[1].endswith("2/3 trials done · 0 running · 67% of the FLOPs · about 8min left (the plan's time x 2.00, "
                             "as the trials so far ran)"), lines
    (task,) = callback.progress.tasks
    assert task.description.endswith("about 8min left (the plan's time x 2.00, as the trials so far ran)")


def test_run_report_redraws_the_report_after_trials_end_one_drawing_at_a_time(tmp_path):
    """`sweep run --report`: a trial's end starts `sweep report` in a process of its own; one
    that ends while it draws queues exactly one more, which the run's end waits for."""
    from synthetic_store import Synthetic
    from sweep.progress import ReportCallback

    truth = (Synthetic().trials(sizes=(32, 64), seeds=(0,), optimizers=("adam", "sgd"))
             .rows(steps=(0, 1, 2), quant=False)
             .write(tmp_path))
    console = Console(file=io.StringIO(), width=200, color_system=None)
    callback = ReportCallback(str(truth.path), console)
    for tid in ("a", "b", "c"):  # three trials end at once: one drawing, one queued
        callback.on_trial_complete(0, [], _Trial(tid))
    assert callback.runs == 1 and callback.queued
    callback.on_experiment_end([])
    assert callback.runs == 2 and not callback.queued and callback.proc is None
    report = Path(truth.path) / "report"
    assert (report / "index.html").is_file() and list(report.glob("*.png")), console.file.getvalue()
    assert "warning" not in console.file.getvalue()
    broken = ReportCallback(str(tmp_path / "nowhere"), console)  # a report that fails is named, the run goes on
    broken.on_trial_complete(0, [], _Trial("a"))
    broken.finish()
    assert "warning: the report after a trial failed (exit 2" in console.file.getvalue()
    assert Path(broken.log.name).is_file()  # a failed report's output is kept and named; a good one's is not
    os.unlink(broken.log.name)
