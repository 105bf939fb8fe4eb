"""The Ray Tune function trainable: rebuild the TrialConfig, train it into the store.

A trial with several workers (resources.workers > 1) is a light Tune driver that runs Ray
Train's TorchTrainer: each worker runs study.train in the process group Ray Train sets up
(DDP, study.distributed) and rank 0 writes the rows and checkpoints into the trial's folder. A
failed worker fails the fit; Tune retries the trial, which resumes from that checkpoint (kept in
the trial's folder of the store, local or remote). Rank 0's evals reach Tune live through a Ray
queue the driver drains, so the progress bar and the trackers see every eval as it happens.
Ray is imported where it is used, so train_trial runs where Ray is not installed (a lent GPU
machine: tools/one_gpu.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from resultstore.lock import HOLDING_ENV
from resultstore.writer import ResultsStore, StoreSink
from study.config import TrialConfig
from study.data import check_corpus
from study.train import RunSummary, UnreadableCheckpoint, run_row, train


__all__ = [
    "node_label", "layer_kurtosis", "TuneSink", "failed_row", "train_trial", "WorkerSink", "train_worker",
    "train_workers", "run_trial",
]


def node_label() -> str:
    """Where this trial runs: host name and Ray node id (short)."""
    import ray

    return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:12]}"


def layer_kurtosis(rows: list[dict]) -> dict[str, float]:
    """Every layer's residual kurtosis of one eval, as the progress keys trackers chart."""
    return {f"kurtosis/resid/L{r['layer']}": r["value"] for r in rows
            if (r["site"], r["basis"], r["metric"]) == ("resid", "stored", "kurtosis")}


class _RaySink(StoreSink):
    """Rows to the store, each runs row naming its node; keeps each eval's per-layer kurtosis for
    the progress report that follows it (the trackers chart it)."""

    layer_kurtosis: dict[str, float] = {}

    def run(self, row: dict) -> None:
        super().run({**row, "node": node_label()})

    def rows(self, table: str, rows: list[dict]) -> None:
        super().rows(table, rows)
        if table == "metrics":
            self.layer_kurtosis = layer_kurtosis(rows)


class TuneSink(_RaySink):
    """A StoreSink that also reports progress and checkpoints to Ray Tune."""

    def progress(self, info: dict) -> None:
        from ray import tune

        tune.report({"trial_id": self.trial_id, **info, **self.layer_kurtosis})

    def checkpoint(self, step: int, directory: Path) -> None:
        from ray import tune

        tune.report({"trial_id": self.trial_id, "step": step, "checkpoint_step": step},
                    checkpoint=tune.Checkpoint.from_directory(str(directory)))


def failed_row(cfg: TrialConfig, error: str) -> dict:
    nan = float("nan")
    summary = RunSummary(trial_id=cfg.trial_id, status="failed", steps=0, tokens=0, final_train_loss=nan,
                         final_val_loss=nan, tokens_per_s=nan, wall_s=nan)
    return run_row(cfg, summary, "unknown", "", error=error)


def train_trial(cfg: TrialConfig, store: ResultsStore, sink: StoreSink, resume_from: Path | None = None,
                checkpoint_dir: Path | None = None, warn: Callable[[str], None] | None = None) -> RunSummary:
    """Train one trial into the store; on an exception write a `failed` runs row (with the error's
    last line) and re-raise, so a retry (which resumes and overwrites it) or the user sees it.
    A checkpoint that cannot be loaded is moved to quarantine/ and the trial starts again from
    step 0, with a warning naming the file (to `warn`, default stderr)."""
    trial_dir = store.trial_dir(cfg.trial_id)
    if trial_dir is not None:
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
        checkpoint_dir = checkpoint_dir or trial_dir
    try:
        try:
            return train(cfg, sink, checkpoint_dir=checkpoint_dir, resume_from=resume_from)
        except UnreadableCheckpoint as exc:
            moved = store.set_aside_checkpoint(cfg.trial_id, exc.path)
            (warn or _to_stderr)(f"trial {cfg.trial_id}: {exc}; " + (f"moved to {moved}; " if moved else "")
                                 + "the trial restarts from step 0")
            return train(cfg, sink, checkpoint_dir=checkpoint_dir, resume_from=None)
    except Exception as exc:
        lines = traceback.format_exception_only(exc)
        try:
            store.write_run(failed_row(cfg, "".join(lines).strip()))
        except Exception as write_exc:  # full disk, lost bucket: the driver writes it from Tune's error
            exc.add_note(f"(the failed row could not be written: {str(write_exc).splitlines()[0][:200]})")
        raise


def _to_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


class WorkerSink(_RaySink):
    """Rank 0's sink inside a Ray Train worker: rows to the store; each eval's progress to the
    trial's Tune driver through a Ray queue (the driver reports it, so the progress bar and the
    trackers see a multi-worker trial live); with a remote store, each checkpoint into the
    trial's folder in the bucket (a retry may start on any node)."""

    def __init__(self, store: ResultsStore, trial_id: str, progress_queue=None):
        super().__init__(store, trial_id)
        self.progress_queue = progress_queue

    def progress(self, info: dict) -> None:
        if self.progress_queue is not None:
            self.progress_queue.put({"trial_id": self.trial_id, **info, **self.layer_kurtosis})

    def checkpoint(self, step: int, directory: Path) -> None:
        self.store.put_checkpoint(self.trial_id, directory)


def train_worker(config: dict) -> None:
    """One Ray Train worker of a multi-worker trial (every rank calls study.train; rank 0 writes).
    A local store's trial folder holds the checkpoint every rank resumes from; with a remote
    store each rank copies the stored checkpoint (if any) into a scratch folder of its own."""
    cwd = config.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    if config.get("lock_token"):  # each write checks the driver still holds the sweep (as run_holding)
        os.environ[HOLDING_ENV] = config["lock_token"]
    try:
        _train_worker(config)
    finally:
        os.environ.pop(HOLDING_ENV, None)


def _train_worker(config: dict) -> None:
    cfg = TrialConfig.model_validate_json(config["trial"])
    check_corpus(cfg.data)  # this worker's view of the corpus the driver checked
    store = ResultsStore(config["results"], cfg.sweep)
    sharding = config.get("sharding", "ddp")
    sink = WorkerSink(store, cfg.trial_id, config.get("progress"))
    if store.local:
        train(cfg, sink, checkpoint_dir=store.trial_dir(cfg.trial_id), sharding=sharding)
        return
    scratch = Path(tempfile.mkdtemp(prefix=f"sweep-{cfg.trial_id}-"))
    try:
        store.fetch_checkpoint(cfg.trial_id, scratch)
        train(cfg, sink, checkpoint_dir=scratch, sharding=sharding)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def train_workers(cfg: TrialConfig, store: ResultsStore, want: dict, config: dict) -> dict:
    """Run a multi-worker trial with TorchTrainer; returns its runs row (rank 0 wrote it). Rank 0's
    progress reaches Tune as it happens: the fit runs in a thread while this one reports what
    the queue brings. On a failed fit write a `failed` runs row and re-raise, as train_trial
    does (Tune's retry resumes from the stored checkpoint)."""
    import threading

    from ray import tune
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Empty, Queue

    trial_dir = store.trial_dir(cfg.trial_id)
    if trial_dir is not None:
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    per_worker = {"CPU": want["cpu"], **({"GPU": want["gpu"]} if want["gpu"] else {})}
    progress = Queue(actor_options={"num_cpus": 0})
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"trial": cfg.model_dump_json(), "results": config["results"], "cwd": config.get("cwd"),
                           "progress": progress, "sharding": want.get("sharding", "ddp"),
                           "lock_token": config.get("lock_token")},
        torch_config=TorchConfig(backend="nccl" if want["gpu"] else "gloo"),
        scaling_config=ScalingConfig(num_workers=int(want["workers"]), use_gpu=bool(want["gpu"]),
                                     resources_per_worker=per_worker),
        run_config=RunConfig(name=f"train-{cfg.trial_id}", storage_path=f"{store.path}/ray",
                             storage_filesystem=None if store.local else store.fs,
                             failure_config=FailureConfig(max_failures=0)),  # Tune retries the whole trial
    )
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # re-raised below, in the trial's own thread
            failure.append(exc)

    fitting = threading.Thread(target=fit, name=f"fit-{cfg.trial_id}", daemon=True)
    fitting.start()
    try:
        while fitting.is_alive() or not progress.empty():
            try:
                tune.report(progress.get(timeout=1.0))
            except Empty:
                pass
    finally:
        fitting.join()
        progress.shutdown()
    if failure:
        exc = failure[0]
        try:
            store.write_run(failed_row(cfg, f"{type(exc).__name__}: {str(exc).strip()[-2000:]}"))
        except Exception as write_exc:
            exc.add_note(f"(the failed row could not be written: {str(write_exc).splitlines()[0][:200]})")
        raise exc
    runs = store.read("runs")
    return next((r for r in runs.to_dicts() if r["trial_id"] == cfg.trial_id), {"status": "missing"})


def run_trial(config: dict) -> None:
    """Ray Tune entry point. `config` = {"results": root, "point": {"trial": TrialConfig JSON, ...}}."""
    from ray import tune

    cwd = config.get("cwd")
    if cwd and os.path.isdir(cwd):  # Tune starts a trial in its own folder; the spec's paths are the driver's
        os.chdir(cwd)
    cfg = TrialConfig.model_validate_json(config["point"]["trial"])
    deadline = config.get("launch_deadline")
    if deadline is not None and time.time() > deadline:  # `sweep run --stop-launching-at`: not this run
        tune.report({"trial_id": cfg.trial_id, "not_started": True, "finished": True})
        return
    check_corpus(cfg.data)  # this node's view of the corpus the driver checked
    store = ResultsStore(config["results"], cfg.sweep)
    sink = TuneSink(store, cfg.trial_id)
    checkpoint = tune.get_checkpoint()
    want = config["point"].get("resources", {})
    if want.get("workers", 1) > 1:
        row = train_workers(cfg, store, want, config)
        tune.report({"trial_id": cfg.trial_id, "status": row["status"], "step": row.get("steps"),
                     "total_steps": cfg.total_steps, "val_loss": row.get("final_val_loss"), "finished": True})
        return
    def warn(message: str) -> None:  # the driver's WarningRelay prints it (worker logs stay on the node)
        _to_stderr(message)
        tune.report({"trial_id": cfg.trial_id, "warning": message})

    if store.local:
        # A local (shared) store keeps the newest checkpoint in the trial folder: resume from it.
        summary = train_trial(cfg, store, sink, warn=warn)
    else:
        # An object store: checkpoints travel as Tune checkpoints under <results>/<sweep>/ray/. The
        # scratch folder is fresh on every (re)start, so a retry on another node resumes from the
        # bucket, never from a disk it may not have.
        scratch = Path(tempfile.mkdtemp(prefix=f"sweep-{cfg.trial_id}-"))
        try:
            if checkpoint is None:
                summary = train_trial(cfg, store, sink, checkpoint_dir=scratch, warn=warn)
            else:
                with checkpoint.as_directory() as restored:
                    summary = train_trial(cfg, store, sink, resume_from=Path(restored), checkpoint_dir=scratch,
                                          warn=warn)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    tune.report({"trial_id": cfg.trial_id, "status": summary.status, "step": summary.steps,
                 "total_steps": cfg.total_steps, "val_loss": summary.final_val_loss, "finished": True})
