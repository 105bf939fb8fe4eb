"""Trackers: a sweep watched live in W&B, MLflow or TensorBoard, through Ray Tune's own logger callbacks.

One group (W&B) / experiment (MLflow) / folder (TensorBoard) per sweep, one run per trial named
by its label, the trial's config columns (`TrialConfig.flat`) as parameters, and each eval's
numbers as series at the training step: losses, tokens/s and the residual kurtosis of every
layer under `kurtosis/resid/L<l>` (one section; TensorBoard also gets one chart of all layers).

After the sweep, `attach_report` puts `sweep report`'s folder where the sweep's runs are: a W&B
artifact (type "report") logged by one more run of the group, an MLflow run "report" of the
experiment holding the files as artifacts, or the report's PNG charts as TensorBoard images (with
the report's location as text) under <folder>/<sweep>/report.

`check` runs before anything trains: a missing package or an unreachable tracker is one line
(TrackerError, exit 2). A tracker that fails mid-sweep is switched off with one warning: the
results store never depends on it, so no result row is lost.
"""

from __future__ import annotations

import math
import netrc
import os
import re
import sys
import urllib.parse
from pathlib import Path

from study.config import TrialConfig
from sweep.extras import need

__all__ = ["TRACKERS", "TrackerError", "check", "callbacks", "trial_label", "series", "attach_report"]

TRACKERS = ("wandb", "mlflow", "tensorboard")
DEFAULT_MLFLOW_URI = "sqlite:///mlflow.db"
DEFAULT_TENSORBOARD_DIR = "tensorboard"
DEFAULT_WANDB_PROJECT = "privileged-bases"
SERIES = ("train_loss", "val_loss", "resid_kurtosis_mean", "tokens_per_s")
"""The progress numbers each eval reports that become series (besides kurtosis/...)."""


class TrackerError(ValueError):
    """The tracker cannot be used: a missing extra, no credentials, an unreachable server."""


def trial_label(cfg: TrialConfig) -> str:
    """A run's name: the grid point in words (distinct for distinct points of one sweep)."""
    return (f"d{cfg.model.d_model}x{cfg.model.n_layers} {cfg.optimizer.name} lr {cfg.optimizer.lr:g} {cfg.norm} "
            f"{cfg.rotation.label} seed {cfg.seed}")


def series(result: dict) -> dict:
    """The numbers of one Tune result worth a series, with the training step as `timesteps_total`
    and `training_iteration` (the steps Ray's MLflow and TensorBoard callbacks log at: the first
    when truthy, else the second); {} for results that are not evals (the trial's final report
    repeats the last eval)."""
    if "step" not in result or "val_loss" not in result or result.get("finished"):
        return {}
    out = {k: result[k] for k in SERIES if isinstance(result.get(k), (int, float)) and math.isfinite(result[k])}
    out.update({k: v for k, v in result.items() if k.startswith("kurtosis/") and math.isfinite(v)})
    return {**out, "step": result["step"], "timesteps_total": result["step"], "training_iteration": result["step"]}


def check(kind: str, target: str | None) -> str:
    """Fail fast (TrackerError) unless the tracker can be written to; returns the resolved target:
    the W&B project, the MLflow tracking URI, or the TensorBoard folder."""
    if kind not in TRACKERS:
        raise TrackerError(f"--tracker {kind}: unknown; one of {', '.join(TRACKERS)}")
    if kind == "tensorboard":
        need("tensorboardX", "track", TrackerError, f"--tracker {kind}: ")
        folder = Path(target or DEFAULT_TENSORBOARD_DIR)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise TrackerError(f"--tracker tensorboard: cannot write to {folder}: {exc.strerror or exc}") from None
        return str(folder.resolve())
    if kind == "mlflow":
        mlflow = need("mlflow", "track", TrackerError, f"--tracker {kind}: ")
        uri = target or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_MLFLOW_URI
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail in seconds, not minutes
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        try:
            mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as exc:
            raise TrackerError(f"--tracker mlflow: {uri} cannot be reached: {_first_line(exc)}") from None
        return uri
    wandb = need("wandb", "track", TrackerError, f"--tracker {kind}: ")
    project = target or os.environ.get("WANDB_PROJECT") or DEFAULT_WANDB_PROJECT
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return project
    if not _wandb_key():  # before any call: wandb.Api() itself raises without a key
        raise TrackerError("--tracker wandb: no W&B API key: run `wandb login` (or set WANDB_API_KEY), "
                           "or set WANDB_MODE=offline to log locally and `wandb sync` later")
    try:
        wandb.Api(timeout=10).viewer  # noqa: B018 - one authenticated request
    except Exception as exc:  # a key that is refused, a server that does not answer
        raise TrackerError(f"--tracker wandb: the W&B server cannot be reached: {_first_line(exc)}") from None
    return project


def _wandb_key() -> str | None:
    """The W&B API key where wandb looks for one (WANDB_API_KEY, then the netrc entry of the W&B
    host that `wandb login` writes), read without wandb; None where there is none or the netrc
    cannot be read."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    home = Path("~").expanduser()
    path = os.environ.get("NETRC") or next((str(home / n) for n in (".netrc", "_netrc") if (home / n).exists()), None)
    try:
        auth = netrc.netrc(path).authenticators(host or "") if path else None
    except (OSError, netrc.NetrcParseError, ValueError):
        return None
    return auth[2] if auth and auth[2] else None


def _mlflow_experiment(uri: str, sweep: str) -> str:
    """The sweep's MLflow experiment id, created when missing. Under a sqlite store its artifacts
    go beside the database (<db folder>/mlruns/<sweep>), not into MLflow's default ./mlruns of
    whatever folder the command happened to run in."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(sweep)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        database = Path(uri.removeprefix("sqlite:///")).resolve()
        location = (database.parent / "mlruns" / re.sub(r"[^\w.-]+", "-", sweep)).as_uri()
    return client.create_experiment(sweep, artifact_location=location)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def callbacks(kind: str, target: str, sweep: str, trials: list[TrialConfig]) -> list:
    """The Ray Tune callback for `kind` (after `check`), knowing each trial's label and parameters."""
    runs = {t.trial_id: (trial_label(t), {k: v for k, v in t.flat().items() if v is not None}) for t in trials}
    if kind == "wandb":
        return [_wandb_callback()(runs, project=target, group=sweep)]
    if kind == "mlflow":
        _mlflow_experiment(target, sweep)
        return [_mlflow_callback()(runs, tracking_uri=target, experiment_name=sweep)]
    return [_tensorboard_callback()(runs, Path(target) / sweep)]


def attach_report(kind: str, target: str, sweep: str, report_dir: Path, location: str | None = None) -> str:
    """Attach the report in `report_dir` (a local folder) to the sweep's place in the tracker;
    `location` is where the report is kept (named in the tracker). Returns where it went."""
    report_dir = Path(report_dir)
    location = location or str(report_dir.resolve())
    files = sorted(p for p in report_dir.rglob("*") if p.is_file())
    if kind == "wandb":
        import wandb

        run = wandb.init(project=target, group=sweep, job_type="report", name=f"{sweep}: report",
                         id=re.sub(r"[^\w-]+", "-", f"{sweep}-report"), resume="allow", reinit=True)
        try:
            artifact = wandb.Artifact(re.sub(r"[^\w.-]+", "-", f"{sweep}-report"), type="report",
                                      metadata={"location": location})
            artifact.add_dir(str(report_dir))
            run.log_artifact(artifact)
            run.summary["report"] = location
        finally:
            run.finish()
        return f"W&B project {target}, group {sweep}: artifact {artifact.name}"
    if kind == "mlflow":
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=target)
        run = client.create_run(_mlflow_experiment(target, sweep), run_name="report",
                                tags={"kind": "report", "report": location})
        try:
            client.log_artifacts(run.info.run_id, str(report_dir), artifact_path="report")
        finally:
            client.set_terminated(run.info.run_id)
        return f"MLflow {target}, experiment {sweep}: run {run.info.run_id} (artifacts under report/)"
    from tensorboardX import SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary

    folder = Path(target) / sweep / "report"
    writer = SummaryWriter(str(folder))
    try:
        writer.add_text("report", f"The sweep's report: `{location}` ({len(files)} files)")
        for png in (p for p in files if p.suffix == ".png"):
            data = png.read_bytes()
            width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # IHDR
            image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=data)
            writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=f"report/{png.stem}",
                                                                               image=image)]), 0)
    finally:
        writer.close()
    return f"TensorBoard {folder}: {sum(p.suffix == '.png' for p in files)} charts as images"


class _Guarded:
    """Shared by the three callbacks: our trial's label and parameters, results reduced to the
    series, and any tracker error switching the tracker off (one warning) instead of ending Tune."""

    name = "tracker"

    def __init__(self, runs: dict[str, tuple[str, dict]], *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runs = runs
        self.broken: str | None = None

    def run_of(self, trial) -> tuple[str, str, dict]:
        trial_id = trial.config["point"]["trial_id"]
        label, params = self.runs[trial_id]
        return trial_id, label, params

    def _guard(self, method, *args) -> None:
        if self.broken is not None:
            return
        try:
            method(*args)
        except Exception as exc:
            self.broken = _first_line(exc)
            print(f"warning: the {self.name} tracker failed and is off for the rest of this sweep "
                  f"({self.broken}); the results store is unaffected", file=sys.stderr)

    def setup(self, *args, **kwargs):
        self._guard(lambda: super(_Guarded, self).setup(*args, **kwargs))

    def log_trial_start(self, trial):
        self._guard(self.start_run, trial)

    def log_trial_result(self, iteration, trial, result):
        numbers = series(result)
        if numbers:
            self._guard(super().log_trial_result, iteration, trial, numbers)

    def log_trial_end(self, trial, failed=False):
        self._guard(super().log_trial_end, trial, failed)

    def on_experiment_end(self, trials, **info):
        self._guard(lambda: super(_Guarded, self).on_experiment_end(trials, **info))

    def start_run(self, trial) -> None:
        raise NotImplementedError


def _wandb_callback():
    from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

    class FlushingActor(_WandbLoggingActor):
        """Ray's W&B logging actor, waiting for W&B's service to write the run before it returns.
        Ray kills the actor as soon as run() returns, and wandb.finish() can return before the
        service has written anything: measured, 2 of 6 offline runs were left as a bare 7-byte
        header with Ray's actor, 0 of 6 with this one."""

        def run(self):
            super().run()
            self._wandb.teardown()

    class WandbCallback(_Guarded, WandbLoggerCallback):
        """W&B: project = target, group = the sweep, one run per trial (id = trial_id)."""

        name = "wandb"
        _logger_actor_cls = FlushingActor

        def start_run(self, trial) -> None:
            trial_id, label, params = self.run_of(trial)
            self._start_logging_actor(
                trial, [*self._exclude_results, *self.excludes, "config"], id=trial_id, name=label,
                resume="allow", reinit=True, allow_val_change=True, group=self.group, project=self.project,
                config=params, **self.kwargs)

    return WandbCallback


def _mlflow_callback():
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class MLflowCallback(_Guarded, MLflowLoggerCallback):
        """MLflow: experiment = the sweep, one run per trial (tag trial_id), params = config columns."""

        name = "mlflow"

        def start_run(self, trial) -> None:
            if trial in self._trial_runs:  # a retried trial continues its run
                return
            trial_id, label, params = self.run_of(trial)
            run = self.mlflow_util.start_run(tags={**self.tags, "trial_id": trial_id}, run_name=label)
            self._trial_runs[trial] = run.info.run_id
            self.mlflow_util.log_params(run_id=run.info.run_id, params_to_log=params)

    return MLflowCallback


def _tensorboard_callback():
    from ray.tune.logger import TBXLoggerCallback

    class TensorBoardCallback(_Guarded, TBXLoggerCallback):
        """TensorBoard: <folder>/<sweep>/<label>/ per trial, plus one chart of every layer's kurtosis."""

        name = "tensorboard"

        def __init__(self, runs, folder: Path):
            super().__init__(runs)
            self.folder = folder

        def start_run(self, trial) -> None:
            if trial in self._trial_writer:
                self._trial_writer[trial].close()
            _, label, params = self.run_of(trial)
            writer = self._summary_writer_cls(str(self.folder / re.sub(r"[^\w.=-]+", "_", label)), flush_secs=30)
            writer.add_custom_scalars_multilinechart([r"ray/tune/kurtosis/resid/L\d+"], category="kurtosis",
                                                     title="residual kurtosis, every layer")
            writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in params.items()))
            self._trial_writer[trial] = writer
            self._trial_result[trial] = {}

        def log_trial_end(self, trial, failed=False):  # Ray's hparams logging wants Tune's own config
            if trial in self._trial_writer:
                self._guard(self._trial_writer.pop(trial).close)

    return TensorBoardCallback
