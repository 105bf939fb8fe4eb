"""resultstore/uri.py and every verb on an object store, against a real S3 API (moto's server on
loopback, started by tests/conftest.py)."""

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.fs as pafs
import pytest
from conftest import S3_ENV, free_port, invoke, kill_own_worker, start_moto

from analysis.load import load
from resultstore import uri as storage

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "specs" / "smoke.yaml"
TINY = """name: tiny
data: {corpus: stdlib, seq_len: 16}
train: {steps: 8, batch_size: 4, eval_every: 4, checkpoint_every: 4, eval_batch: {sequences: 2}}
grid:
  model: [{d_model: 16, n_layers: 2, n_heads: 2}]
  optimizer: [{name: adam, lr: 3.0e-3}, {name: sgd, lr: 0.1}]
  norm: [rmsnorm_scalar]
  seed: [SEEDS]
resources: {cpu: 1}
retries: 0
"""


def objects(prefix: str) -> list[str]:
    fs, path = storage.filesystem(prefix)
    return sorted(i.path for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=True))
                  if i.type == pafs.FileType.File)


# ---- the one place that decides local vs remote ----------------------------------------------


def test_uris_are_never_folded_into_local_paths(tmp_path, monkeypatch):
    assert storage.is_remote("s3://bars/study") and storage.is_remote("gs://b/x")
    assert not storage.is_remote("results") and not storage.is_remote(f"file://{tmp_path}")
    assert storage.join("s3://bars/study/", "tiny") == "s3://bars/study/tiny"
    assert storage.normalize("s3://bars/study/") == "s3://bars/study"
    monkeypatch.chdir(tmp_path)
    assert storage.normalize("results") == str(tmp_path / "results")
    assert storage.normalize(f"file://{tmp_path}/r") == str(tmp_path / "r")


def test_endpoint_comes_from_the_standard_environment(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert storage.storage_options("s3://b/x") is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert storage.storage_options("s3://b/x") == {"aws_endpoint_url": "http://127.0.0.1:9000",
                                                   "aws_region": "eu-west-1", "aws_allow_http": "true"}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://minio.example:9000")  # the S3-specific one wins
    assert storage.storage_options("s3://b/x")["aws_endpoint_url"] == "https://minio.example:9000"
    assert storage.storage_options("/local/x") is None
    assert storage.env_for_workers()["AWS_ENDPOINT_URL_S3"] == "https://minio.example:9000"
    assert "AWS_SECRET_ACCESS_KEY" not in storage.env_for_workers()  # credentials never travel


# ---- bad input: exit 2, one line, before Ray starts, nothing written ------------------------


def assert_refused(result, tmp_path, words):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and words in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "s3:").exists()


def test_missing_bucket_is_refused_before_anything_starts(s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", SMOKE, "--results", "s3://no-such-bucket/study")
    assert_refused(result, tmp_path, "bucket 'no-such-bucket' does not exist")
    import ray

    assert not ray.is_initialized()
    for verb in (("plan", SMOKE, "--results", "s3://no-such-bucket/study"), ("status", "s3://no-such-bucket/s")):
        assert invoke(*verb).exit_code == 2


def test_unreachable_endpoint_is_refused_in_seconds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
    result = invoke("run", SMOKE, "--results", "s3://bars/study")
    assert_refused(result, tmp_path, "cannot access the results store")
    assert "connection failed" in result.output


def test_bad_credentials_are_refused(tmp_path, monkeypatch):
    proc, url = start_moto(INITIAL_NO_AUTH_ACTION_COUNT="2")  # unauthenticated: creating the bucket
    try:
        for k, v in S3_ENV.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        pafs.S3FileSystem(endpoint_override=url, region="us-east-1", allow_bucket_creation=True).create_dir("bars")
        monkeypatch.chdir(tmp_path)
        result = invoke("run", SMOKE, "--results", "s3://bars/study")
        assert_refused(result, tmp_path, "access denied")
    finally:
        proc.kill()
        proc.wait()


# ---- every verb on the URI -------------------------------------------------------------------


def sweep_cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "sweep.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_every_verb_works_on_an_s3_uri(s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY.replace("SEEDS", "0"))
    first = sweep_cli("run", spec, "--results", "s3://bars/study")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "s3://bars/study/tiny" in first.stdout
    assert not (tmp_path / "s3:").exists()  # the old bug: a local folder named `s3:`
    uri = "s3://bars/study/tiny"
    keys = objects(uri)
    assert sum("/runs/" in k for k in keys) == 2 and any("/metrics/" in k for k in keys)

    again = sweep_cli("run", spec, "--results", "s3://bars/study")
    assert again.returncode == 0 and "0 trials launched, 2 skipped" in again.stdout, again.stdout + again.stderr
    assert objects(uri) == keys

    spec.write_text(TINY.replace("SEEDS", "0, 1"))
    plan = invoke("plan", spec, "--results", "s3://bars/study")
    assert plan.exit_code == 0 and "2/4 done" in plan.output, plan.output
    grown = sweep_cli("run", spec, "--results", "s3://bars/study")
    assert grown.returncode == 0 and "2 trials launched, 2 skipped" in grown.stdout, grown.stdout + grown.stderr

    results = load("s3://bars/study")  # a results root holding one sweep
    runs = results.runs.collect()
    assert runs.height == 4 and set(runs["status"]) == {"done"} and runs["node"].null_count() == 0
    metrics = results.metrics.collect()
    key = ["trial_id", "step", "layer", "site", "basis", "metric"]
    assert metrics.height == metrics.unique(key).height > 0

    status = invoke("status", uri)
    assert status.exit_code == 0 and "done" in status.output and "4" in status.output, status.output
    q = invoke("query", uri, "SELECT optimizer, count(*) AS n FROM runs GROUP BY optimizer ORDER BY optimizer",
               "--out", tmp_path / "new" / "folder" / "q.csv")
    assert q.exit_code == 0, q.output
    assert pl.read_csv(tmp_path / "new" / "folder" / "q.csv")["n"].to_list() == [2, 2]
    shown = invoke("query", uri, "SELECT count(*) AS n FROM metrics")
    assert shown.exit_code == 0 and str(metrics.height) in shown.output
    rep = invoke("report", uri, "--format", "svg")
    assert rep.exit_code == 0, rep.output
    written = objects(f"{uri}/report")
    assert any(k.endswith("index.html") for k in written) and any(k.endswith(".svg") for k in written)


@pytest.mark.slow
def test_a_killed_worker_resumes_from_its_tune_checkpoint_on_s3(s3, tmp_path):
    """The remote path of sweep/trainable.py: no trial folder; the retry restores Tune's checkpoint
    from the bucket and goes on from its step. Every row once, equal to an uninterrupted run."""
    import ray
    from resultstore.writer import ResultsStore
    from sweep.grid import expand
    from sweep.launch import run_sweep
    from sweep.spec import parse_spec
    from sweep.trainable import train_trial

    spec = parse_spec({"name": "kill", "data": {"seq_len": 16},
                       "train": {"steps": 300, "batch_size": 4, "eval_every": 50, "checkpoint_every": 100,
                                 "eval_batch": {"sequences": 2}},
                       "grid": {"model": [{"d_model": 16, "n_layers": 2, "n_heads": 2}],
                                "optimizer": [{"name": "adam", "lr": 3e-3}], "norm": ["rmsnorm_scalar"], "seed": [0]},
                       "resources": {"cpu": 1}, "retries": 1})
    (cfg,) = expand(spec)
    killer = kill_own_worker()
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    try:
        outcome = run_sweep(spec, [cfg], ResultsStore("s3://bars/killed", spec.name), on_start=lambda todo: [killer])
    finally:
        ray.shutdown()
    assert len(killer.killed) == 1, "the trial's worker was never killed"
    assert outcome.failed == [] and outcome.missing == []
    assert killer.after and min(killer.after) > killer.saved[0], f"the retry restarted: steps {killer.after}"
    assert any("/kill/ray/" in k and "checkpoint" in k for k in objects("s3://bars/killed"))

    reference = ResultsStore(tmp_path / "ref", spec.name)
    train_trial(cfg, reference, reference.sink(cfg.trial_id))
    store = ResultsStore("s3://bars/killed", spec.name)
    for table, key in (("metrics", ["step", "layer", "site", "basis", "metric"]), ("curves", ["step"])):
        got, want = store.read(table), reference.read(table)
        assert got.height == got.unique(key).height == want.height, table
        drop = ["tokens_per_s"] if table == "curves" else []
        assert got.drop(drop).sort(key).equals(want.drop(drop).sort(key)), table
