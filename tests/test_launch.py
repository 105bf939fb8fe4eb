"""End to end on a real local Ray: spec -> grid -> Tune -> store. Few trials, tiny models."""

import polars as pl
import pytest
from conftest import kill_own_worker

from resultstore.writer import ResultsStore
from sweep.grid import expand
from sweep.launch import run_sweep
from sweep.spec import SpecError, parse_spec
from sweep.trainable import train_trial

SPEC = {
    "name": "e2e",
    "data": {"seq_len": 16},
    "train": {"steps": 8, "batch_size": 4, "eval_every": 4, "checkpoint_every": 4, "eval_batch": {"sequences": 2}},
    "grid": {"model": [{"d_model": 16, "n_layers": 2, "n_heads": 2}],
             "optimizer": [{"name": "adam", "lr": 3e-3}, {"name": "rotated_adam", "lr": 3e-3}],
             "norm": ["rmsnorm_scalar"], "seed": [0]},
    "resources": {"cpu": 1},
    "retries": 0,
}


def snapshot(store):
    return {t: store.read(t).sort(store.read(t).columns[:3]) for t in ("runs", "metrics", "curves", "checks")}


def files(folder):
    return {p: p.stat().st_mtime_ns for t in ("runs", "metrics", "curves", "checks") for p in (folder / t).glob("*")}


@pytest.mark.slow
def test_sweep_end_to_end_rerun_and_new_seed(tmp_path, local_ray):
    spec = parse_spec(SPEC)
    trials = expand(spec)
    outcome = run_sweep(spec, trials, ResultsStore(tmp_path, spec.name))
    assert outcome.launched == 2 and outcome.failed == [] and outcome.missing == []
    folder = tmp_path / "e2e"
    runs = pl.scan_parquet(str(folder / "runs" / "*.parquet")).collect()
    assert sorted(runs["trial_id"]) == sorted(t.trial_id for t in trials)
    assert set(runs["status"]) == {"done"}
    metrics = pl.scan_parquet(str(folder / "metrics" / "*.parquet")).collect()
    key = ["trial_id", "step", "layer", "site", "basis", "metric"]
    assert metrics.height == metrics.unique(key).height > 0
    assert sorted(metrics["step"].unique()) == [0, 4, 8]
    assert pl.read_parquet(folder / "checks" / "*.parquet").height == 2 * 3
    assert all((folder / "trials" / t.trial_id / "config.json").exists() for t in trials)

    before = files(folder)
    again = run_sweep(spec, trials, ResultsStore(tmp_path, spec.name))
    assert again.launched == 0 and again.skipped == 2
    assert files(folder) == before  # nothing rewritten

    more = parse_spec({**SPEC, "grid": {**SPEC["grid"], "seed": [0, 1]}})
    grown = run_sweep(more, expand(more), ResultsStore(tmp_path, more.name))
    assert grown.launched == 2 and grown.skipped == 2
    assert {p: m for p, m in files(folder).items() if p in before} == before
    assert ResultsStore(tmp_path, "e2e").read("runs").height == 4


@pytest.mark.slow
def test_sweep_train_and_sweep_run_give_the_same_rows(tmp_path, local_ray):
    spec = parse_spec({**SPEC, "grid": {**SPEC["grid"], "optimizer": [{"name": "sgd", "lr": 0.1}]}})
    (cfg,) = expand(spec)
    in_process = ResultsStore(tmp_path / "a", spec.name)
    train_trial(cfg, in_process, in_process.sink(cfg.trial_id))
    run_sweep(spec, [cfg], ResultsStore(tmp_path / "b", spec.name))
    via_ray = ResultsStore(tmp_path / "b", spec.name)
    for table, drop in (("metrics", []), ("curves", ["tokens_per_s"]), ("checks", [])):
        a, b = in_process.read(table).drop(drop), via_ray.read(table).drop(drop)
        assert a.sort(a.columns).equals(b.sort(b.columns)), table
    # measured or placed, not results; git_sha is read at each run, so a commit between the two runs moves it
    volatile = ["tokens_per_s", "wall_s", "device", "node", "mfu", "peak_memory_bytes", "git_sha"]
    assert in_process.read("runs").drop(volatile).equals(via_ray.read("runs").drop(volatile))


@pytest.mark.slow
def test_a_failing_trial_is_recorded_and_reported(tmp_path, local_ray):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world, " * 200)
    spec = parse_spec({**SPEC, "data": {"text": str(corpus), "seq_len": 16},
                       "grid": {**SPEC["grid"], "optimizer": [{"name": "adam", "lr": 3e-3}]}})
    corpus.unlink()  # validated, then gone by the time the trial starts
    outcome = run_sweep(spec, expand(spec), ResultsStore(tmp_path / "r", spec.name))
    assert len(outcome.failed) == 1
    runs = ResultsStore(tmp_path / "r", spec.name).read("runs")
    assert runs["status"].to_list() == ["failed"]
    assert "corpus.txt" in runs["error"][0]


@pytest.mark.slow
def test_relative_data_paths_mean_what_they_meant_where_sweep_run_started(tmp_path, local_ray, monkeypatch):
    (tmp_path / "corpus.txt").write_text("hello world, " * 2000)
    monkeypatch.chdir(tmp_path)  # the driver's cwd; Tune starts each trial in a folder of its own
    spec = parse_spec({**SPEC, "data": {"text": "corpus.txt", "seq_len": 16},
                       "grid": {**SPEC["grid"], "optimizer": [{"name": "adam", "lr": 3e-3}]}})
    outcome = run_sweep(spec, expand(spec), ResultsStore("r", spec.name))
    assert outcome.failed == [] and outcome.missing == []
    assert ResultsStore(tmp_path / "r", spec.name).read("runs")["status"].to_list() == ["done"]


@pytest.mark.slow
def test_trials_whose_turn_comes_after_the_launch_deadline_do_not_start(tmp_path, local_ray):
    import time

    spec = parse_spec(SPEC)
    trials = expand(spec)
    outcome = run_sweep(spec, trials, ResultsStore(tmp_path, spec.name), launch_deadline=time.time())
    assert outcome.launched == 2 and outcome.not_started == {t.trial_id for t in trials}
    assert outcome.missing == [] and outcome.unexpected == []  # not started is not a failure: exit 0
    assert not (tmp_path / spec.name / "runs").exists() or not list((tmp_path / spec.name / "runs").glob("*"))
    assert not (tmp_path / spec.name / "trials").exists()  # nothing of either trial began
    later = run_sweep(spec, trials, ResultsStore(tmp_path, spec.name), launch_deadline=time.time() + 3600)
    assert later.not_started == frozenset() and set(later.statuses.values()) == {"done"}


LADDER_SPEC = {**SPEC, "train": {**SPEC["train"], "steps": 3, "eval_every": 3, "checkpoint_every": 0},
               "grid": {**SPEC["grid"], "optimizer": [{"name": "sgd", "lr": [0.3, 1e3], "momentum": 0.9}]}}
# lr 1e3, not 1e9: at 1e9 one step saturates the model on some CPUs (gradient 0, the loss stuck at
# ln 256 = 5.545, "done"), on others it overflows to NaN; at 1e3 the loss grows past 4x its start
# (332k by step 3) on every CPU seen


@pytest.mark.slow
def test_sweep_run_exits_0_when_only_the_top_of_an_lr_ladder_diverges_and_1_when_nothing_of_it_finished(
        tmp_path, local_ray):
    import yaml
    from typer.testing import CliRunner

    from sweep.cli import app

    spec = tmp_path / "ladder.yaml"
    spec.write_text(yaml.safe_dump(LADDER_SPEC))
    r = CliRunner().invoke(app, ["run", str(spec), "--results", str(tmp_path / "a")])
    top = expand(parse_spec(LADDER_SPEC))[1]  # lr 1e3: diverges, beside lr 0.3, which finishes
    assert r.exit_code == 0, r.output
    assert f"1 diverged (ladder): {top.trial_id}" in r.output, r.output
    alone = {**LADDER_SPEC, "grid": {**LADDER_SPEC["grid"], "optimizer": [{"name": "sgd", "lr": 1e3, "momentum": 0.9}]}}
    spec.write_text(yaml.safe_dump(alone))  # the same diverging trial with no lr of its ladder done
    r = CliRunner().invoke(app, ["run", str(spec), "--results", str(tmp_path / "b")])
    assert r.exit_code == 1, r.output
    assert "diverged outside an lr ladder" in r.output and top.trial_id in r.output and "(ladder)" not in r.output


def test_resources_no_node_has_are_refused_before_anything_starts(tmp_path, local_ray):
    spec = parse_spec({**SPEC, "resources": {"cpu": 64}})
    with pytest.raises(SpecError, match=r"needs cpu=64 gpu=0, but the largest node has cpu=2"):
        run_sweep(spec, expand(spec), ResultsStore(tmp_path, spec.name))
    assert not (tmp_path / "e2e").exists()


@pytest.mark.slow
def test_a_killed_worker_is_retried_from_its_checkpoint_exactly_once(tmp_path, local_ray):
    """SIGKILL the trial's own worker after its first checkpoint: Tune retries it, the retry resumes
    from the checkpoint, and the store ends with every row once and the uninterrupted values."""
    # the kill comes at the eval after the step-50 checkpoint, 125 steps before the end
    spec = parse_spec({**SPEC, "train": {**SPEC["train"], "steps": 200, "checkpoint_every": 50, "eval_every": 25},
                       "grid": {**SPEC["grid"], "optimizer": [{"name": "adam", "lr": 3e-3}]}, "retries": 1})
    (cfg,) = expand(spec)
    killer = kill_own_worker()
    outcome = run_sweep(spec, [cfg], ResultsStore(tmp_path / "r", spec.name), on_start=lambda todo: [killer])
    assert len(killer.killed) == 1, "the trial's worker was never killed"
    assert outcome.failed == [] and outcome.missing == []
    assert killer.after and min(killer.after) > killer.saved[0], f"the retry restarted: steps {killer.after}"

    reference = ResultsStore(tmp_path / "ref", spec.name)
    train_trial(cfg, reference, reference.sink(cfg.trial_id))
    store = ResultsStore(tmp_path / "r", spec.name)
    assert store.read("runs")["node"].null_count() == 0
    for table, key in (("metrics", ["step", "layer", "site", "basis", "metric"]), ("curves", ["step"])):
        got, want = store.read(table), reference.read(table)
        assert got.height == got.unique(key).height == want.height, table
        drop = ["tokens_per_s"] if table == "curves" else []
        assert got.drop(drop).sort(key).equals(want.drop(drop).sort(key)), table


def loopback(ip: str) -> bool:
    import ipaddress

    addr = ipaddress.ip_address(ip)
    return addr.is_loopback or bool(getattr(addr, "ipv4_mapped", None) and addr.ipv4_mapped.is_loopback)


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live descendant of `root` (from /proc)."""
    import os

    kids = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
        except OSError:
            pass
    out, stack = {}, [root]
    while stack:
        for pid in kids.get(stack.pop(), ()):
            out[pid] = _cmdline(pid)
            stack.append(pid)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_local_ray_listens_on_loopback_only_and_a_sigkilled_driver_takes_it_along(tmp_path):
    """`sweep run` without --address starts a private Ray: every port its processes (the ones this
    driver started) listen on is loopback, and once its trial runs (Ray's agents up), SIGKILL the
    driver: every process it started, by pid, is gone within 10 s (Ray's own health checks took
    ~63 s). One driver for both checks (they were two tests, each starting its own Ray)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil
    import yaml

    spec = tmp_path / "long.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "train": {**SPEC["train"], "steps": 100000, "checkpoint_every": 0},
                                    "grid": {**SPEC["grid"], "optimizer": [{"name": "adam", "lr": 3e-3}]}}))
    # nothing of this process's own local Ray (conftest's local_ray sets loopback-only): the CLI must do it itself
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    env["PYTHONPATH"] = str(Path(__file__).parent.parent)
    proc = subprocess.Popen([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(tmp_path / "r")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    started: dict[int, str] = {}
    try:
        deadline = time.time() + 240
        while not list((tmp_path / "r" / "e2e" / "trials").glob("*/config.json")) or not (
                any("RuntimeEnvAgent" in c or "DashboardAgent" in c for c in started.values())
                and any("raylet" in c for c in started.values())):  # the trial is running, Ray's agents are up
            assert time.time() < deadline and proc.poll() is None, "the trial never started"
            started.update(_descendants(proc.pid))
            time.sleep(0.2)
        started.update(_descendants(proc.pid))
        driver = psutil.Process(proc.pid)
        ours = [driver, *driver.children(recursive=True)]
        listening = [(p.name(), c.laddr) for p in ours for c in p.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert any(name.startswith("gcs_server") for name, _ in listening), listening  # we saw Ray's ports
        assert all(loopback(addr.ip) for _, addr in listening), listening
        assert any("Agent" in c for c in started.values()), started
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: its Ray must follow by itself
        proc.wait()
        killed_at = time.time()
        while time.time() < killed_at + 10 and any(_alive(p) for p in started):
            time.sleep(0.2)
        left = {p: c[:80] for p, c in started.items() if _alive(p)}
        assert not left, f"still alive {time.time() - killed_at:.0f} s after the driver's SIGKILL: {left}"
    finally:
        for pid in started:  # on failure: stop what this test started, by pid
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
