"""sweep/trainable.py: a two-worker trial (Ray Train inside Ray Tune, gloo on loopback) writing to
a real S3 API (moto's server, started and stopped by the conftest fixture), resuming from the
checkpoint it keeps in the bucket after one of its workers is killed, and reporting every eval
to Tune while it trains."""

import os
import threading
import time

import pytest

from conftest import kill_one_ray_train_worker

SPEC = {
    "name": "ddp_s3",
    "data": {"seq_len": 16},
    "train": {"steps": 120, "batch_size": 4, "eval_every": 40, "checkpoint_every": 40,
              "eval_batch": {"sequences": 2}, "invariance_check": False},
    "grid": {"model": [{"d_model": 32, "n_layers": 2, "n_heads": 2}], "optimizer": [{"name": "adam", "lr": 3e-3}],
             "norm": ["rmsnorm_scalar"], "seed": [0]},
    "resources": {"cpu": 1, "workers": 2},
    "retries": 1,
}


@pytest.fixture(scope="module")
def ray_env(s3) -> dict[str, str]:
    """Nothing to add: asking for s3 starts it (AWS_ENDPOINT_URL set) before conftest's local_ray,
    so the local Ray's workers inherit the endpoint."""
    return {}


class KillOneTrainWorkerAfterTheStoredCheckpoint:
    """Waits (in a thread) until the trial's checkpoint is in the bucket, then SIGKILLs one Ray
    Train worker: a process of our own local Ray (a descendant of this test), nothing else."""

    def __init__(self, fs, checkpoint: str):
        self.fs, self.checkpoint = fs, checkpoint
        self.killed: list[int] = []
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        import pyarrow.fs as pafs

        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and self.fs.get_file_info(self.checkpoint).type != pafs.FileType.File:
            time.sleep(0.1)
        pid = kill_one_ray_train_worker()
        if pid is not None:
            self.killed.append(pid)


def recorder():
    """A Tune callback keeping every result a trial reports, in order, and counting the retries
    Tune schedules (a trial failed and was started again)."""
    from ray.tune import Callback

    class Recorder(Callback):
        def __init__(self):
            self.results: list[dict] = []
            self.retried: list[str] = []

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.results.append({**result, "ours": trial.config["point"]["trial_id"]})

        def on_trial_recover(self, iteration, trials, trial, **info):
            self.retried.append(trial.config["point"]["trial_id"])

    return Recorder()


@pytest.mark.slow
def test_a_two_worker_trial_writes_to_s3_resumes_from_the_bucket_and_reports_each_eval_live(
        tmp_path, s3, local_ray):
    import pyarrow.fs as pafs

    from resultstore.writer import ResultsStore
    from sweep.grid import expand
    from sweep.launch import run_sweep
    from sweep.spec import parse_spec
    from sweep.trainable import train_trial

    spec = parse_spec(SPEC)
    (cfg,) = expand(spec)
    root = "s3://bars/ddp"
    fs = pafs.S3FileSystem(endpoint_override=s3, region="us-east-1")
    killer = KillOneTrainWorkerAfterTheStoredCheckpoint(fs, f"bars/ddp/{spec.name}/trials/{cfg.trial_id}/checkpoint.pt")
    seen = recorder()
    outcome = run_sweep(spec, [cfg], ResultsStore(root, spec.name), on_start=lambda todo: [seen])
    assert len(killer.killed) == 1, "no Ray Train worker was killed"
    assert seen.retried == [cfg.trial_id], "the kill did not fail the running trial (it came too late)"
    assert outcome.failed == [] and outcome.missing == [], outcome

    store = ResultsStore(root, spec.name)
    runs = store.read("runs")
    assert runs["status"].to_list() == ["done"] and runs["steps"].to_list() == [120]

    # live: every eval reached Tune while the trial ran, with its loss and each layer's kurtosis;
    # the retry resumed from the bucket's checkpoint, so step 0 was evaluated (and reported) once
    evals = [r for r in seen.results if "val_loss" in r and not r.get("finished")]
    assert [r["step"] for r in evals if r["step"] == 0] == [0], [r["step"] for r in evals]
    assert {r["step"] for r in evals} == {0, 40, 80, 120}
    assert all({"kurtosis/resid/L0", "kurtosis/resid/L1", "kurtosis/resid/L2"} <= set(r) for r in evals)
    assert seen.results[-1].get("finished") and seen.results.index(evals[-1]) < len(seen.results) - 1

    # exactly once, at the 1-worker trial's values (fp32, two summation orders: 1e-3 over 120 steps)
    reference = ResultsStore(tmp_path / "ref", spec.name)
    train_trial(cfg, reference, reference.sink(cfg.trial_id))
    for table, key in (("metrics", ["step", "layer", "site", "basis", "metric"]), ("curves", ["step"])):
        got, want = store.read(table).sort(key), reference.read(table).sort(key)
        assert got.height == got.unique(key).height == want.height, table
    got = store.read("curves").drop_nulls("val_loss").sort("step")
    want = reference.read("curves").drop_nulls("val_loss").sort("step")
    assert got["step"].to_list() == want["step"].to_list() == [0, 40, 80, 120]
    assert got["val_loss"].to_list() == pytest.approx(want["val_loss"].to_list(), rel=1e-3)
    live = {r["step"]: r["val_loss"] for r in evals}
    assert [live[s] for s in (0, 40, 80, 120)] == pytest.approx(got["val_loss"].to_list(), rel=1e-9)


@pytest.mark.slow
def test_a_two_worker_fsdp_trial_runs_through_ray_train_to_the_one_worker_values(tmp_path, local_ray):
    """resources {workers: 2, sharding: fsdp}: the same path as DDP (TorchTrainer inside the Tune
    trial), each rank holding half of every parameter; the rows match the 1-worker trial's."""
    import polars as pl

    from resultstore.writer import ResultsStore
    from sweep.grid import expand
    from sweep.launch import run_sweep
    from sweep.spec import parse_spec
    from sweep.trainable import train_trial

    spec = parse_spec({**SPEC, "name": "fsdp", "train": {**SPEC["train"], "steps": 12, "eval_every": 4,
                                                         "checkpoint_every": 4},
                       "resources": {"cpu": 1, "workers": 2, "sharding": "fsdp"},
                       "retries": 0})  # the soap trial fails by design: no retry (a third Ray Train fit)
    (cfg,) = expand(spec)
    # the sharding reaches every worker's train(): soap (whole-matrix preconditioner), which the spec
    # check refuses under fsdp, is built here without it and fails inside the workers
    (soap,) = expand(parse_spec({**SPEC, "name": "fsdp", "grid": {**SPEC["grid"], "optimizer": [{"name": "soap",
                                                                                                  "lr": 3e-3}]}}))
    seen = recorder()
    outcome = run_sweep(spec, [cfg, soap], ResultsStore(tmp_path / "r", spec.name), on_start=lambda todo: [seen])
    assert outcome.failed == [soap.trial_id] and outcome.missing == [], outcome
    errors = dict(ResultsStore(tmp_path / "r", spec.name).read("runs").select("trial_id", "error").iter_rows())
    assert "soap cannot train sharded" in errors[soap.trial_id]
    evals = [r for r in seen.results if r["ours"] == cfg.trial_id and "val_loss" in r and not r.get("finished")]
    assert [r["step"] for r in evals] == [0, 4, 8, 12]
    store = ResultsStore(tmp_path / "r", spec.name)
    reference = ResultsStore(tmp_path / "ref", spec.name)
    train_trial(cfg, reference, reference.sink(cfg.trial_id))
    key = ["step", "layer", "site", "basis", "metric"]
    got = store.read("metrics").filter(pl.col("trial_id") == cfg.trial_id).sort(key)
    want = reference.read("metrics").sort(key)
    assert got.height == got.unique(key).height == want.height
    got = store.read("curves").filter(pl.col("trial_id") == cfg.trial_id).drop_nulls("val_loss")
    got = got.sort("step")["val_loss"].to_list()
    want = reference.read("curves").drop_nulls("val_loss").sort("step")["val_loss"].to_list()
    assert got == pytest.approx(want, rel=2e-4)  # fp32, two summation orders over 12 steps


@pytest.mark.parametrize("damage", ["truncated", "random-bytes"])
def test_sweep_train_sets_a_checkpoint_that_cannot_be_loaded_aside_and_starts_over(tmp_path, damage):
    """Issue 34: random bytes in checkpoint.pt gave a UnicodeDecodeError naming no file, on every
    re-run. Now the file goes to quarantine/, a warning names it, the trial runs from step 0 and
    writes exactly the rows an uninterrupted run writes."""
    import os
    from pathlib import Path

    from typer.testing import CliRunner

    from resultstore.writer import ResultsStore
    from sweep.cli import app

    smoke = Path(__file__).parent.parent / "specs" / "smoke.yaml"
    args = ["train", str(smoke), "--trial", "0", "--results", str(tmp_path)]
    assert CliRunner().invoke(app, args).exit_code == 0
    store = ResultsStore(tmp_path, "smoke")
    keys = {"metrics": ["trial_id", "step", "layer", "site", "basis", "metric"], "curves": ["trial_id", "step"]}
    want = {t: store.read(t).select(k).sort(k) for t, k in keys.items()}
    (trial,) = store.completed_ids()
    checkpoint = tmp_path / "smoke" / "trials" / trial / "checkpoint.pt"
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[: len(data) // 3] if damage == "truncated" else os.urandom(len(data)))
    (tmp_path / "smoke" / "runs" / f"{trial}.parquet").unlink()  # interrupted after its last checkpoint
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"checkpoint {checkpoint} cannot be loaded" in said and "restarts from step 0" in said, result.output
    assert (tmp_path / "smoke" / "quarantine" / "trials" / trial / "checkpoint.pt").exists()
    assert all(store.read(t).select(k).sort(k).equals(want[t]) for t, k in keys.items())


def test_a_ray_train_worker_writes_only_while_the_driver_holds_the_sweep(tmp_path, monkeypatch):
    """Issue 50: multi-worker trials did not get the driver's lock token (launch.run_holding gave
    it to one-worker trials only), so a worker of a driver paused past its lease and taken over
    kept writing. train_worker (what each Ray Train worker runs), called here as rank 0 alone:
    with a token that is not the lock's it writes nothing; with the holder's it trains and writes."""
    from resultstore.lock import HOLDING_ENV, LockLost, SweepLock
    from resultstore.writer import ResultsStore
    from study.config import TrialConfig
    from sweep.trainable import train_worker

    monkeypatch.delenv(HOLDING_ENV, raising=False)
    cfg = TrialConfig(model={"d_model": 16, "n_layers": 1, "n_heads": 2}, optimizer={"name": "adam", "lr": 1e-3},
                      train={"steps": 4, "batch_size": 2, "eval_every": 4, "eval_batch": {"sequences": 1},
                             "invariance_check": False}, data={"seq_len": 8}, sweep="held")
    store = ResultsStore(tmp_path, "held")
    with SweepLock(store) as lock:
        config = {"trial": cfg.model_dump_json(), "results": str(tmp_path), "lock_token": "not-the-holders"}
        with pytest.raises(LockLost, match="is no longer this run's"):
            train_worker(config)
        assert HOLDING_ENV not in os.environ  # the worker process is left as it was
        assert not list((tmp_path / "held").glob("runs/*.parquet"))
        train_worker({**config, "lock_token": lock.token})
    assert len(list((tmp_path / "held").glob("runs/*.parquet"))) >= 1
