from pathlib import Path

import pytest
from typer.testing import CliRunner

from sweep.cli import app

SMOKE = Path(__file__).parent.parent / "specs" / "smoke.yaml"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


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
    assert "1/2 done" in plan.output and "measured from finished runs" in plan.output


def test_unknown_trial_and_missing_results_exit_2(tmp_path):
    assert invoke("train", SMOKE, "--trial", "7", "--results", tmp_path).exit_code == 2
    result = invoke("status", tmp_path)
    assert result.exit_code == 2 and "no sweep found" in result.output


def test_bad_query_exits_2(tmp_path):
    invoke("train", SMOKE, "--trial", "0", "--results", tmp_path)
    result = invoke("query", tmp_path / "smoke", "SELEKT nonsense")
    assert result.exit_code == 2 and "Traceback" not in result.output
