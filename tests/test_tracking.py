"""Trackers offline on a real local Ray sweep: W&B offline files, MLflow on sqlite, TensorBoard events."""

import json
import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import invoke
from sweep import tracking
from sweep.grid import expand
from sweep.spec import parse_spec

SPEC = {
    "name": "tracked",
    "data": {"seq_len": 16},
    "train": {"steps": 8, "batch_size": 4, "eval_every": 4, "checkpoint_every": 4, "eval_batch": {"sequences": 2},
              "invariance_check": False},
    "grid": {"model": [{"d_model": 16, "n_layers": 2, "n_heads": 2}],
             "optimizer": [{"name": "adam", "lr": 3e-3}, {"name": "sgd", "lr": 0.1}],
             "norm": ["rmsnorm_scalar"], "seed": [0]},
    "resources": {"cpu": 1},
    "retries": 0,
}
LAYERS = ["kurtosis/resid/L0", "kurtosis/resid/L1", "kurtosis/resid/L2"]


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory) -> dict[str, str]:
    """W&B offline into a temporary folder, set before conftest's local_ray starts Ray (so W&B's
    logging actors inherit it)."""
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path_factory.mktemp("wandb")), "WANDB_SILENT": "true",
            # a loaded CI box can take longer than W&B's default 90 s to start its service and a run
            "WANDB_INIT_TIMEOUT": "600", "WANDB__SERVICE_WAIT": "600"}


@pytest.fixture(scope="module")
def swept(tmp_path_factory, ray_env, local_ray):
    """One sweep of two trials with all three trackers attached."""
    from resultstore.writer import ResultsStore
    from sweep.launch import run_sweep

    tmp = tmp_path_factory.mktemp("tracked")
    spec = parse_spec(SPEC)
    trials = expand(spec)
    targets = {"wandb": tracking.check("wandb", "tests"),
               "mlflow": tracking.check("mlflow", f"sqlite:///{tmp}/mlflow.db"),
               "tensorboard": tracking.check("tensorboard", str(tmp / "tb"))}
    outcome = run_sweep(spec, trials, ResultsStore(tmp / "results", spec.name), on_start=lambda todo: [
        cb for kind, target in targets.items() for cb in tracking.callbacks(kind, target, spec.name, todo)])
    assert outcome.failed == [] and outcome.missing == []
    return Path(ray_env["WANDB_DIR"]), tmp, trials, targets


def wandb_records(path: Path):
    """The records of an offline W&B run file (LevelDB-log framing of wandb_internal Records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf, pos = buf + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


@pytest.mark.slow
def test_wandb_offline_has_one_run_per_trial_with_params_and_series(swept):
    wandb_dir, _, trials, _ = swept
    files = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == len(trials)
    by_id = {}
    for f in files:
        recs = list(wandb_records(f))
        run = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
        config = {i.key: json.loads(i.value_json) for r in recs if r.WhichOneof("record_type") in ("run", "config")
                  for i in (r.run.config.update if r.WhichOneof("record_type") == "run" else r.config.update)}
        history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                   for r in recs if r.WhichOneof("record_type") == "history"]
        by_id[run.run_id] = (run, config, history)
    for cfg in trials:
        run, config, history = by_id[cfg.trial_id]
        assert run.display_name == tracking.trial_label(cfg) and run.run_group == "tracked" and run.project == "tests"
        assert config["optimizer"] == cfg.optimizer.name and config["lr"] == cfg.optimizer.lr
        assert config["config_id"] == cfg.config_id
        evals = [h for h in history if "val_loss" in h]
        assert [h["step"] for h in evals] == [0, 4, 8], history
        assert all(set(LAYERS) <= set(h) for h in evals)


@pytest.mark.slow
def test_mlflow_has_one_experiment_one_run_per_trial_params_and_metric_series(swept):
    import mlflow

    _, _, trials, targets = swept
    client = mlflow.MlflowClient(tracking_uri=targets["mlflow"])
    experiment = client.get_experiment_by_name("tracked")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == len(trials)
    database = Path(targets["mlflow"].removeprefix("sqlite:///"))
    assert experiment.artifact_location == (database.parent / "mlruns" / "tracked").as_uri()
    by_id = {r.data.tags["trial_id"]: r for r in runs}
    for cfg in trials:
        run = by_id[cfg.trial_id]
        assert run.info.run_name == tracking.trial_label(cfg) and run.info.status == "FINISHED"
        assert run.data.params["optimizer"] == cfg.optimizer.name and float(run.data.params["lr"]) == cfg.optimizer.lr
        for key in ["val_loss", *LAYERS]:
            assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [0, 4, 8], key


@pytest.mark.slow
def test_tensorboard_event_files_hold_each_layers_kurtosis_per_eval_and_one_chart(swept):
    _, tmp, trials, _ = swept
    for cfg in trials:
        folders = [p for p in (tmp / "tb" / "tracked").iterdir() if p.name.startswith(f"d16x2_{cfg.optimizer.name}_")]
        assert len(folders) == 1
        scalars, layouts = {}, []
        for event in (e for f in folders[0].glob("events.out.tfevents.*") for e in tensorboard_events(f)):
            for value in event.summary.value:
                if value.tag == "custom_scalars__config__":
                    layouts.append(value.tensor.string_val[0])
                elif value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append(event.step)
        for key in ["val_loss", *LAYERS]:
            assert scalars[f"ray/tune/{key}"] == [0, 4, 8], key
        assert len(layouts) == 1 and b"kurtosis/resid/L" in layouts[0]  # one chart with every layer


def tensorboard_events(path: Path):
    """The Event protos of a TensorBoard event file (TFRecord framing: length, crc, data, crc)."""
    from tensorboardX.proto.event_pb2 import Event

    data, pos = path.read_bytes(), 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        event = Event()
        event.ParseFromString(data[pos + 12:pos + 12 + length])
        pos += 12 + length + 4
        yield event


def test_a_missing_or_unreachable_tracker_is_one_line_and_exit_2_before_anything_trains(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(SPEC))
    env = {**os.environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "WANDB_MODE": "online", "WANDB_API_KEY": ""}
    for args, said in ((["--tracker", "mlflow"], "--tracker mlflow: http://127.0.0.1:9 cannot be reached"),
                       (["--tracker", "neptune"], "--tracker neptune: unknown; one of wandb, mlflow, tensorboard")):
        proc = subprocess.run([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(tmp_path / "r"),
                               *args], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "r" / "tracked" / "runs").exists()


def test_wandb_without_a_key_is_exit_2_with_how_to_log_in_before_any_wandb_call(tmp_path, monkeypatch):
    """Issue 50 item 5: the key check called wandb.Api(), which raises UsageError without a key (a
    traceback). Now the key is looked up where wandb looks (WANDB_API_KEY, the host's netrc entry)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(SPEC))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "NETRC"))}
    env.update(HOME=str(tmp_path), WANDB_MODE="online")
    proc = subprocess.run([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(tmp_path / "r"),
                           "--tracker", "wandb"], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("error: --tracker wandb: no W&B API key: run `wandb login` (or set WANDB_API_KEY), "
                                   "or set WANDB_MODE=offline to log locally and `wandb sync` later")
    assert not (tmp_path / "r").exists()
    for name, value in [("WANDB_API_KEY", None), ("WANDB_BASE_URL", None), ("NETRC", None)]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tracking._wandb_key() is None
    (tmp_path / ".netrc").write_text("machine example.com login u password other\n"
                                     "machine api.wandb.ai login user password k123\n")
    assert tracking._wandb_key() == "k123"  # as `wandb login` writes it
    monkeypatch.setenv("WANDB_BASE_URL", "https://example.com")
    assert tracking._wandb_key() == "other"  # a server of one's own
    (tmp_path / "bad").write_text("machine\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "bad"))
    assert tracking._wandb_key() is None  # a netrc that cannot be parsed: no key, not a traceback
    monkeypatch.setenv("WANDB_API_KEY", "envkey")
    assert tracking._wandb_key() == "envkey"


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the [track] extra were not installed
    with pytest.raises(tracking.TrackerError, match=r"--tracker wandb: the wandb package is not installed "
                                                    r"\(pip install 'privileged-bases-sweep\[track\]'\)"):
        tracking.check("wandb", None)


@pytest.mark.slow
def test_a_tracker_failing_mid_sweep_loses_no_result_row(tmp_path, local_ray):
    """The MLflow database loses its metrics table after the first result: the tracker is switched
    off with a warning and every trial still writes all its rows."""
    from ray.tune import Callback

    from sweep.launch import run_sweep
    from resultstore.writer import ResultsStore

    class BreakTheDatabase(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            with sqlite3.connect(tmp_path / "mlflow.db") as db:
                db.execute("DROP TABLE IF EXISTS metrics")

    spec = parse_spec(SPEC)
    trials = expand(spec)
    target = tracking.check("mlflow", f"sqlite:///{tmp_path}/mlflow.db")
    callbacks = tracking.callbacks("mlflow", target, spec.name, trials)
    outcome = run_sweep(spec, trials, ResultsStore(tmp_path / "r", spec.name), on_start=lambda todo: [BreakTheDatabase(), *callbacks])
    assert callbacks[0].broken, "the tracker never failed: the test tested nothing"
    assert outcome.failed == [] and outcome.missing == []
    store = ResultsStore(tmp_path / "r", spec.name)
    assert set(store.statuses().values()) == {"done"} and len(store.statuses()) == len(trials)
    assert sorted(store.read("curves")["step"].to_list()) == sorted(list(range(9)) * len(trials))


@pytest.fixture(scope="module")
def report_dir(swept):
    """The swept store's report (PNG charts only, to keep the test short)."""
    from analysis.report import write_report

    _, tmp, _, _ = swept
    result = write_report(tmp / "results" / "tracked", out=tmp / "report", formats=("png",))
    pngs = sorted(p.name for p in (tmp / "report").glob("*.png"))
    assert pngs and (tmp / "report" / "index.html").exists()
    return Path(result.out)


@pytest.mark.slow
def test_the_report_is_attached_to_wandb_as_an_artifact_of_the_sweeps_group(swept, report_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # apart from the trials' runs the test above counts
    import wandb

    where = tracking.attach_report("wandb", "tests", "tracked", report_dir)
    # run.finish() can return before W&B's service has flushed the offline file (CI once read it
    # with no run record in it); teardown stops the service, so the file is whole when read
    wandb.teardown()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    recs = list(wandb_records(run_file))
    kinds = [r.WhichOneof("record_type") for r in recs]
    assert "run" in kinds, f"{run_file} ({run_file.stat().st_size} bytes) has no run record: {kinds}"
    run = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    assert run.run_group == "tracked" and run.project == "tests" and run.job_type == "report"
    (artifact,) = [r.artifact for r in recs if r.WhichOneof("record_type") == "artifact"]
    assert artifact.type == "report" and artifact.name in where
    stored = {c.path for c in artifact.manifest.contents}
    assert stored == {p.name for p in report_dir.iterdir()}


@pytest.mark.slow
def test_the_report_is_a_run_of_the_mlflow_experiment_with_the_files_as_artifacts(swept, report_dir, tmp_path):
    import mlflow

    target = tracking.check("mlflow", f"sqlite:///{tmp_path}/mlflow.db")
    tracking.attach_report("mlflow", target, "tracked", report_dir)
    client = mlflow.MlflowClient(tracking_uri=target)
    (run,) = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
    assert run.info.run_name == "report" and run.data.tags["report"] == str(report_dir.resolve())
    stored = {a.path.removeprefix("report/") for a in client.list_artifacts(run.info.run_id, "report")}
    assert stored == {p.name for p in report_dir.iterdir()}
    # the files are beside the database, not in MLflow's ./mlruns of the folder pytest ran in
    assert {p.name for p in (tmp_path / "mlruns" / "tracked").glob(f"{run.info.run_id}/artifacts/report/*")} == stored


@pytest.mark.slow
def test_the_reports_charts_are_tensorboard_images_under_the_sweeps_folder(swept, report_dir, tmp_path):
    tracking.attach_report("tensorboard", str(tmp_path), "tracked", report_dir)
    images, texts = {}, []
    for f in (tmp_path / "tracked" / "report").glob("events.out.tfevents.*"):
        for event in tensorboard_events(f):
            for value in event.summary.value:
                if value.HasField("image"):
                    images[value.tag] = value.image
                elif value.tag.startswith("report"):
                    texts.append(value)
    pngs = sorted(report_dir.glob("*.png"))
    assert sorted(images) == [f"report/{p.stem}" for p in pngs]
    for p in pngs:
        assert images[f"report/{p.stem}"].encoded_image_string == p.read_bytes()
        assert images[f"report/{p.stem}"].width > 100 and images[f"report/{p.stem}"].height > 100
    assert texts, "no text summary naming the report's location"


@pytest.mark.slow
def test_sweep_run_with_a_tracker_attaches_the_report_when_the_sweep_ends(tmp_path, local_ray):
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({**SPEC, "grid": {**SPEC["grid"], "optimizer": [{"name": "adam", "lr": 3e-3}]}}))
    result = invoke("run", spec, "--results", tmp_path / "r", "--tracker", "tensorboard", "--tracker-uri", tmp_path / "tb")
    assert result.exit_code == 0, result.output
    assert "Report attached: TensorBoard" in result.output
    assert (tmp_path / "r" / "tracked" / "report" / "index.html").exists()
    assert list((tmp_path / "tb" / "tracked" / "report").glob("events.out.tfevents.*"))
