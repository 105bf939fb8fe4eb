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


# ---- issue 50: a live holder keeps its lock; a holder that lost it writes nothing more ---------

HOLD = """
import sys, time
from resultstore.lock import SweepLock
from resultstore.writer import ResultsStore
lock = SweepLock(ResultsStore(sys.argv[1], "s"))
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_holder_stopped_past_its_lease_on_this_host_keeps_the_lock(tmp_path, monkeypatch):
    """SIGSTOP for three leases: its pid is alive on this host, so the lock is still its own."""
    import signal

    monkeypatch.setenv("SWEEP_LOCK_LEASE_S", "1")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)
        time.sleep(3.5)  # the lease (1 s) lapsed three times over, no heartbeat meanwhile
        rec = SweepLock(ResultsStore(tmp_path, "s")).holder()
        assert rec["pid"] == holder.pid and rec["expires"] < time.time()
        assert SweepLock.stale(rec) is None
        with pytest.raises(LockHeld, match=f"pid {holder.pid}"):
            SweepLock(ResultsStore(tmp_path, "s")).acquire()
        status = runner.invoke(app, ["status", str(tmp_path / "s")])
        assert "a run is in progress" in status.output, status.output
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()
    assert "is gone" in SweepLock.stale(SweepLock(ResultsStore(tmp_path, "s")).holder())


def test_a_lock_whose_pid_now_belongs_to_a_later_process_is_stale(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "run.lock").write_text(json.dumps(  # our pid, but a lock taken long before we started
        {"host": socket.gethostname(), "pid": os.getpid(), "start": 1.0e9, "expires": time.time() + 600}))
    assert "later process" in SweepLock.stale(SweepLock(ResultsStore(tmp_path, "s")).holder())


def test_a_holder_whose_lock_is_taken_stops_before_its_next_write_and_says_why(tmp_path, monkeypatch, capfd):
    """Another host judged the lease expired and took the lock: the heartbeat sees it and says so;
    the driver's store and a worker's (given the driver's token) refuse to write from then on."""
    from resultstore.lock import HOLDING_ENV, LockLost

    monkeypatch.setenv("SWEEP_LOCK_LEASE_S", "1")
    store = ResultsStore(tmp_path, "s")
    with store.writing("sweep run") as notes:
        assert notes == []
        token = store.holding
        monkeypatch.setenv(HOLDING_ENV, token)
        worker = ResultsStore(tmp_path, "s")  # a trial's worker, under the driver's lock
        worker.write_rows("curves", "abc", [{"step": 1, "tokens": 8}])
        (tmp_path / "s" / "run.lock").write_text(json.dumps(
            {"host": "elsewhere", "pid": 7, "start": time.time(), "expires": time.time() + 600, "token": "theirs"}))
        time.sleep(1.0)  # a heartbeat (every lease / 3)
        assert "was taken over by sweep run: host elsewhere pid 7" in capfd.readouterr().err
        for writer in (store, worker):
            with pytest.raises(LockLost, match="host elsewhere pid 7"):
                writer.write_rows("curves", "abc", [{"step": 2, "tokens": 16}])
            with pytest.raises(LockLost):
                writer.write_run({"trial_id": "abc", "status": "failed"})
    assert sorted(p.name for p in (tmp_path / "s").rglob("*.parquet")) == ["abc.000000001-000000001.parquet"]
    assert json.loads((tmp_path / "s" / "run.lock").read_text())["token"] == "theirs"  # theirs, not released


def test_an_s3_endpoint_that_dies_mid_run_does_not_hide_the_first_error(monkeypatch):
    """Issue 50 item 5 (seen once): the endpoint gone, the lock's release raised (botocore's
    EndpointConnectionError) from `finally` and replaced the error that ended the run. Now the
    first error is what the run ends with; the lease expires on its own."""
    from conftest import S3_ENV, start_moto

    proc, url = start_moto()
    try:
        for k, v in {**S3_ENV, "AWS_ENDPOINT_URL": url}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        import pyarrow.fs as pafs

        pafs.S3FileSystem(endpoint_override=url, region="us-east-1", allow_bucket_creation=True).create_dir("gone")
        store = ResultsStore("s3://gone/run", "s")
        with pytest.raises(RuntimeError, match="the first error"):
            with store.writing("sweep run", repair=False):
                assert SweepLock(store).holder()["token"] == store.holding
                proc.kill()
                proc.wait()
                raise RuntimeError("the first error")
        assert store.holding is None
        lock = SweepLock(store)
        lock._version = "an-etag"  # as if held: release reaches the dead endpoint and says nothing
        lock.release()
    finally:
        proc.kill()
        proc.wait()
