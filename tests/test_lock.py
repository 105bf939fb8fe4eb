"""One writer per sweep: resultstore/lock.py's SweepLock, through `sweep run` (no Ray needed: the lock
is taken before anything starts)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from resultstore.lock import LockHeld, SweepLock
from resultstore.writer import ResultsStore
from sweep.cli import app

SMOKE = Path(__file__).parent.parent / "specs" / "smoke.yaml"
runner = CliRunner()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_run_refuses_with_exit_2_naming_the_holder(tmp_path):
    store = ResultsStore(tmp_path, "smoke")
    store.write_run({"trial_id": "earlier", "status": "done"})
    with SweepLock(store):
        result = runner.invoke(app, ["run", str(SMOKE), "--results", str(tmp_path)])
        assert result.exit_code == 2, result.output
        assert "another `sweep run` holds this sweep" in result.output
        assert f"host {socket.gethostname()} pid {os.getpid()}" in result.output
        assert "Traceback" not in result.output
        assert not (tmp_path / "smoke" / "trials").exists()  # nothing started
        assert (tmp_path / "smoke" / "run.lock").exists()    # the holder's lock left alone
        status = runner.invoke(app, ["status", str(tmp_path / "smoke")])
        assert "a run is in progress" in status.output
    assert not (tmp_path / "smoke" / "run.lock").exists()    # released


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path):
    store = ResultsStore(tmp_path, "s")
    (tmp_path / "s").mkdir()
    pid = dead_pid()
    (tmp_path / "s" / "run.lock").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": pid, "start": time.time() - 60, "expires": time.time() + 600}))
    lock = SweepLock(store)
    warning = lock.acquire()
    try:
        assert warning and f"pid {pid}" in warning and "is gone" in warning
        assert SweepLock(store).holder()["pid"] == os.getpid()
        with pytest.raises(LockHeld):
            SweepLock(store).acquire()
    finally:
        lock.release()
    assert SweepLock(store).holder() is None


def test_an_expired_lease_of_another_host_is_stale_a_live_one_is_not(tmp_path):
    store = ResultsStore(tmp_path, "s")
    (tmp_path / "s").mkdir()
    rec = {"host": "elsewhere", "pid": 1, "start": time.time(), "expires": time.time() + 600}
    (tmp_path / "s" / "run.lock").write_text(json.dumps(rec))
    with pytest.raises(LockHeld, match="host elsewhere pid 1"):
        SweepLock(store).acquire()
    (tmp_path / "s" / "run.lock").write_text(json.dumps({**rec, "expires": time.time() - 1}))
    with SweepLock(store) as lock:
        assert "lease expired" in lock.warning


def test_run_releases_the_lock_when_it_ends(tmp_path, monkeypatch):
    """A run with nothing to do (every trial complete) takes and releases the lock; so does one that
    fails inside (the `finally`)."""
    from sweep.cli import load
    from sweep.launch import run_sweep

    spec, trials = load(SMOKE)
    store = ResultsStore(tmp_path, spec.name)
    for t in trials:  # diverged: complete without rows to check (a "done" row with none is incomplete)
        store.write_run({"trial_id": t.trial_id, "status": "diverged"})
    outcome = run_sweep(spec, trials, ResultsStore(tmp_path, spec.name))
    assert outcome.launched == 0 and SweepLock(store).holder() is None
    monkeypatch.setattr(ResultsStore, "completed_ids", lambda self: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_sweep(spec, trials, ResultsStore(tmp_path, spec.name))
    assert SweepLock(store).holder() is None


def test_lock_on_an_object_store_refuses_a_second_holder_and_releases(s3):
    store = ResultsStore("s3://bars/locks", "s")
    with SweepLock(store):
        rec = SweepLock(store).holder()
        assert rec["pid"] == os.getpid() and rec["expires"] > time.time()
        with pytest.raises(LockHeld, match=f"pid {os.getpid()}"):
            SweepLock(store).acquire()
    assert SweepLock(store).holder() is None


@pytest.mark.parametrize("verb", ["train", "probe-sae"])
def test_every_verb_that_writes_trial_rows_takes_the_lock(tmp_path, verb):
    """Issue 34: `sweep train --trial 0` trained the trial a running `sweep run` was training.
    Both writers of trial rows (and `probe sae`) refuse while another holds run.lock: exit 2,
    naming the holder, nothing written."""
    store = ResultsStore(tmp_path, "smoke")
    store.write_run({"trial_id": "earlier", "status": "diverged"})  # complete without rows: a healthy store
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    args = (["train", str(SMOKE), "--trial", "0", "--results", str(tmp_path)] if verb == "train"
            else ["probe", "sae", str(tmp_path / "smoke")])
    with SweepLock(store):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "another `sweep run` holds this sweep" in result.output and "Traceback" not in result.output
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == sorted(before + [Path("smoke/run.lock")])


def test_train_holds_the_lock_while_it_trains(tmp_path, monkeypatch):
    """A `sweep run` started beside a `sweep train` is refused, naming `sweep train`."""
    import sweep.trainable

    seen = []

    def train_and_look(cfg, store, sink, **kw):
        seen.append(SweepLock(store).holder())
        with pytest.raises(LockHeld, match="another `sweep train` holds this sweep"):
            SweepLock(store).acquire()
        raise OSError(28, "No space left on device")  # the trial ends here: the lock must still go

    monkeypatch.setattr(sweep.trainable, "train_trial", train_and_look)
    result = runner.invoke(app, ["train", str(SMOKE), "--trial", "0", "--results", str(tmp_path)])
    assert result.exit_code == 1 and "No space left on device" in result.output, result.output
    assert seen and seen[0]["command"] == "sweep train" and seen[0]["pid"] == os.getpid()
    assert SweepLock(ResultsStore(tmp_path, "smoke")).holder() is None
