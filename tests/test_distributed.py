"""Data-parallel trials on CPU: 2 gloo workers on loopback against 1 worker at the same global batch.

The workers are processes this test starts (spawn) and stops by handle. fp32 throughout: the
two runs differ only in the order gradients are summed (two half-batch means averaged vs one
whole-batch mean), so they agree to ~1e-6 relative per step; BOUND allows for 12 steps of that.
Without the all-reduce each rank trains on half the batch and the losses part by ~1e-2.
"""

import math
import multiprocessing
import os
import pickle
from pathlib import Path

import pytest
import torch

from conftest import kill_one_ray_train_worker, tiny
from study import distributed
from study.config import TrialConfig
from study.train import MemorySink, StopTraining, train

BOUND = 2e-4
"""Largest relative difference allowed between a 2-worker and the 1-worker run (fp32, 12 steps)."""
LONG_BOUND = 1e-3
"""The same over 60 steps (the Ray Train test), where fp32 rounding has compounded: measured
1e-4 at step 100 (curves; metrics 1.4e-5), but 0.65 by step 200 once this tiny model's loss
spikes, so the trial stops well before. A missing all-reduce is off by 30% at step 1."""


class CrashAt(MemorySink):
    """Stops the run right after the checkpoint at `step` is written (a worker dies)."""

    def __init__(self, step: int):
        super().__init__()
        self.crash_step = step

    def checkpoint(self, step: int, directory: Path) -> None:
        if step == self.crash_step:
            raise StopTraining(f"killed after step {step}")


def _worker(rank: int, size: int, rendezvous: str, cfg_json: str, out: str, checkpoint_dir: str | None,
            crash_step: int | None, sharding: str) -> None:
    import study.train

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    sink = CrashAt(crash_step) if crash_step is not None else MemorySink()
    trained: list[tuple[str, str, tuple, tuple]] = []  # what the optimiser steps: (name, type, shape, local shape)
    build = study.train.build_optimizer

    def noting_build(cfg, model):
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            trained.append((name, type(p).__name__, tuple(p.shape), tuple(local.shape)))
        return build(cfg, model)

    study.train.build_optimizer = noting_build
    try:
        summary = train(TrialConfig.model_validate_json(cfg_json), sink,
                        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None, sharding=sharding)
    except StopTraining:
        summary = None
    with open(out, "wb") as f:
        pickle.dump({"sink": sink, "summary": summary, "trained": trained}, f)
    torch.distributed.destroy_process_group()


def run_workers(tmp: Path, cfg: TrialConfig, size: int = 2, checkpoint_dir: Path | None = None,
                crash_step: int | None = None, sharding: str = "ddp") -> list[dict | None]:
    """Run `size` ranks to the end (or rank 0's crash; the others are then stopped by handle)."""
    tmp.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    rendezvous = tmp / "rendezvous"
    rendezvous.unlink(missing_ok=True)
    procs = [ctx.Process(target=_worker, args=(r, size, str(rendezvous), cfg.model_dump_json(), str(tmp / f"rank{r}.pkl"),
                                               str(checkpoint_dir) if checkpoint_dir else None, crash_step, sharding))
             for r in range(size)]
    for p in procs:
        p.start()
    try:
        procs[0].join(timeout=240)
        for p in procs[1:]:
            p.join(timeout=5 if crash_step is not None else 60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert crash_step is not None or all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    results = []
    for r in range(size):
        path = tmp / f"rank{r}.pkl"
        results.append(pickle.loads(path.read_bytes()) if path.exists() else None)
        path.unlink(missing_ok=True)
    return results


def assert_rows_close(got: list[dict], want: list[dict], keys: tuple[str, ...], rel: float = BOUND,
                      abs_: float = 1e-6) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert {k: g[k] for k in g if k not in keys} == {k: w[k] for k in w if k not in keys}
        for k in keys:
            if w[k] is None or (isinstance(w[k], float) and math.isnan(w[k])):
                assert g[k] is None or math.isnan(g[k]), (k, g, w)
            else:
                assert g[k] == pytest.approx(w[k], rel=rel, abs=abs_), (k, g, w)


CURVE_VALUES = ("train_loss", "val_loss", "grad_norm", "tokens_per_s")
METRIC_VALUES = ("value",)


@pytest.fixture(scope="module")
def one_worker():
    sink = MemorySink()
    train(tiny(), sink)
    return sink


@pytest.mark.slow
def test_two_workers_follow_the_one_worker_trajectory_and_only_rank0_writes(tmp_path, one_worker):
    rank0, rank1 = run_workers(tmp_path, tiny())
    sink = rank0["sink"]
    # the same global batch, so the same losses at every step (not just the same shape)
    got = [{**r, "tokens_per_s": None} for r in sink.tables["curves"]]
    want = [{**r, "tokens_per_s": None} for r in one_worker.tables["curves"]]
    assert_rows_close(got, want, CURVE_VALUES)
    assert_rows_close(sink.tables["metrics"], one_worker.tables["metrics"], METRIC_VALUES)
    assert rank0["summary"].final_val_loss == pytest.approx(one_worker.run_row["final_val_loss"], rel=BOUND)
    assert sink.run_row is not None and sink.run_row["steps"] == 12
    # rank 1 trained (it returns the same summary steps) but wrote nothing anywhere
    assert rank1["summary"].steps == 12
    empty = rank1["sink"]
    assert (empty.tables["metrics"], empty.tables["curves"], empty.tables["checks"], empty.run_row, empty.progress_log) == ([], [], [], None, [])


@pytest.mark.slow
def test_a_crashed_two_worker_run_resumes_from_rank0s_checkpoint(tmp_path, one_worker):
    cfg = tiny(train={"checkpoint_every": 4})
    ckpt = tmp_path / "ckpt"
    crashed = run_workers(tmp_path / "a", cfg, checkpoint_dir=ckpt, crash_step=8)[0]
    assert crashed["summary"] is None and (ckpt / "checkpoint.pt").exists()
    assert torch.load(ckpt / "checkpoint.pt", weights_only=False)["step"] == 8
    # the restart: every rank resumes from the checkpoint; rank 0's sink keeps the rows up to step 8
    sink = crashed["sink"]
    ctx_rows = (sink.tables["metrics"], sink.tables["curves"])
    resumed = run_workers(tmp_path / "b", cfg, checkpoint_dir=ckpt)[0]["sink"]
    assert min(r["step"] for r in resumed.tables["curves"]) == 9  # nothing before the checkpoint is repeated
    curves = [r for r in ctx_rows[1] if r["step"] <= 8] + resumed.tables["curves"]
    metrics = [r for r in ctx_rows[0] if r["step"] <= 8] + resumed.tables["metrics"]
    no_speed = lambda rows: [{**r, "tokens_per_s": None} for r in rows]  # noqa: E731
    assert_rows_close(no_speed(curves), no_speed(one_worker.tables["curves"]), CURVE_VALUES)
    assert_rows_close(metrics, one_worker.tables["metrics"], METRIC_VALUES)


# ---- FSDP2: sharded parameters and optimiser state ---------------------------------------------


@pytest.mark.slow
def test_fsdp_workers_train_shards_and_follow_the_one_worker_trajectory(tmp_path, one_worker):
    """Under fsdp each rank's optimiser steps DTensor shards (half of every matrix's rows), yet the
    curves and rank 0's metrics (probed on gathered whole weights) are the one-worker run's
    within BOUND: fp32, and only the order of the gradient sums differs, as under DDP."""
    rank0, rank1 = run_workers(tmp_path, tiny(), sharding="fsdp")
    for r, rank in enumerate((rank0, rank1)):  # dim 0 split as torch.chunk does: ceil(n / 2) rows on rank 0
        assert rank["trained"] and all(kind == "DTensor" for _, kind, _, _ in rank["trained"]), rank["trained"]
        for name, _, shape, local in rank["trained"]:
            assert local == ((shape[0] + 1) // 2 if r == 0 else shape[0] // 2, *shape[1:]), (r, name, shape, local)
    sink = rank0["sink"]
    no_speed = lambda rows: [{**r, "tokens_per_s": None} for r in rows]  # noqa: E731
    assert_rows_close(no_speed(sink.tables["curves"]), no_speed(one_worker.tables["curves"]), CURVE_VALUES)
    assert_rows_close(sink.tables["metrics"], one_worker.tables["metrics"], METRIC_VALUES)
    assert sink.run_row is not None and sink.run_row["steps"] == 12
    final = one_worker.final_state["model"]
    assert sink.final_state["model"].keys() == final.keys()
    for name, value in final.items():
        assert torch.allclose(sink.final_state["model"][name], value, rtol=BOUND, atol=1e-6), name
    empty = rank1["sink"]
    assert (empty.tables["metrics"], empty.tables["curves"], empty.run_row) == ([], [], None)


@pytest.mark.slow
def test_fsdp_without_clipping_reads_the_one_worker_grad_norm(tmp_path):
    """grad_clip 0: the gradient norm is still the whole model's (one reduction over the shards'
    norms), the one-worker run's within BOUND at every step."""
    cfg = tiny(train={"grad_clip": 0.0})
    alone = MemorySink()
    train(cfg, alone)
    sink = run_workers(tmp_path, cfg, sharding="fsdp")[0]["sink"]
    got, want = [r["grad_norm"] for r in sink.tables["curves"]], [r["grad_norm"] for r in alone.tables["curves"]]
    assert len(got) == len(want) == 13 and want[0] is None
    assert got[1:] == pytest.approx(want[1:], rel=BOUND)


@pytest.mark.slow
def test_an_fsdp_checkpoint_is_the_one_worker_format_and_resumes_under_fsdp_and_one_worker(tmp_path, one_worker):
    import shutil

    cfg = tiny(train={"checkpoint_every": 4})
    ckpt = tmp_path / "ckpt"
    crashed = run_workers(tmp_path / "a", cfg, checkpoint_dir=ckpt, crash_step=8, sharding="fsdp")[0]
    assert crashed["summary"] is None
    state = torch.load(ckpt / "checkpoint.pt", weights_only=False)
    single = tmp_path / "single"  # what one worker saves at its step-4 checkpoint
    train(cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 8})}), MemorySink(),
          checkpoint_dir=single)
    reference = torch.load(single / "checkpoint.pt", weights_only=False)
    assert state["step"] == 8 and reference["step"] == 4
    assert state["model"].keys() == reference["model"].keys()
    assert all(not hasattr(v, "to_local") and v.shape == reference["model"][k].shape for k, v in state["model"].items())
    assert state["optimizer"]["state"].keys() == reference["optimizer"]["state"].keys()
    no_lr = lambda groups: [{k: v for k, v in g.items() if k != "lr"} for g in groups]  # noqa: E731 (lr: the schedule's)
    assert no_lr(state["optimizer"]["param_groups"]) == no_lr(reference["optimizer"]["param_groups"])
    for i, moments in reference["optimizer"]["state"].items():
        assert {k: v.shape for k, v in state["optimizer"]["state"][i].items()} == {k: v.shape for k, v in moments.items()}
    shutil.copytree(ckpt, tmp_path / "ckpt1")
    kept = crashed["sink"]
    no_speed = lambda rows: [{**r, "tokens_per_s": None} for r in rows]  # noqa: E731
    one = MemorySink()
    one.tables["metrics"], one.tables["curves"] = list(kept.tables["metrics"]), list(kept.tables["curves"])
    resumed = {"fsdp": run_workers(tmp_path / "b", cfg, checkpoint_dir=ckpt, sharding="fsdp")[0]["sink"],
               "one worker": one}
    train(cfg, one, checkpoint_dir=tmp_path / "ckpt1")  # the same file, resumed by a single process
    for how, sink in resumed.items():
        after = [r for r in sink.tables["curves"] if r["step"] > 8]
        assert min(r["step"] for r in after) == 9, how
        curves = [r for r in kept.tables["curves"] if r["step"] <= 8] + after
        metrics = [r for r in kept.tables["metrics"] if r["step"] <= 8] + [r for r in sink.tables["metrics"] if r["step"] > 8]
        assert_rows_close(no_speed(curves), no_speed(one_worker.tables["curves"]), CURVE_VALUES)
        assert_rows_close(metrics, one_worker.tables["metrics"], METRIC_VALUES)


def test_the_batch_must_split_evenly_over_workers():
    with pytest.raises(ValueError, match="train.batch_size: 6 sequences do not split evenly over 4 workers"):
        distributed.local_rows(6, distributed.World(rank=1, size=4))
    assert distributed.local_rows(8, distributed.World(rank=1, size=4)) == slice(2, 4)
    assert distributed.world() == distributed.World(0, 1)  # no group here: one worker


# ---- a multi-worker trial through Ray Train inside Ray Tune (a local Ray on loopback) -----------

SPEC = {
    "name": "ddp",
    "data": {"seq_len": 16},
    "train": {"steps": 12, "batch_size": 4, "eval_every": 4, "checkpoint_every": 4, "eval_batch": {"sequences": 2},
              "invariance_check": False},
    "grid": {"model": [{"d_model": 32, "n_layers": 2, "n_heads": 2}], "optimizer": [{"name": "adam", "lr": 3e-3}],
             "norm": ["rmsnorm_scalar"], "seed": [0]},
    "resources": {"cpu": 1, "workers": 2},
    "retries": 1,
}


def store_rows(store, table: str, key: list[str]):
    return store.read(table).drop("trial_id").sort(key)


class KillOneTrainWorker:
    """Waits (in a thread) for the trial's first checkpoint, notes the parts already written, then
    SIGKILLs one Ray Train worker: a process of our own local Ray (a descendant of this test's
    process), never anything else on the machine."""

    def __init__(self, trial_dir: Path, curves: Path):
        import threading

        self.trial_dir, self.curves = trial_dir, curves
        self.killed: list[int] = []
        self.kept: dict[str, int] = {}
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        import time

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (self.trial_dir / "checkpoint.pt").exists():
            time.sleep(0.05)
        self.kept = {p.name: p.stat().st_mtime_ns for p in self.curves.glob("*.parquet")}
        pid = kill_one_ray_train_worker()
        if pid is not None:
            self.killed.append(pid)


@pytest.mark.slow
def test_a_two_worker_trial_runs_as_a_torch_trainer_inside_tune_and_resumes_after_a_killed_worker(
        tmp_path, local_ray):
    """resources {workers: 2, cpu: 1}: TorchTrainer(ScalingConfig(num_workers=2)) from the Tune trial.
    One worker is SIGKILLed after the first checkpoint; Tune retries the trial, the retry resumes
    from that checkpoint (the parts written before it are untouched) and the store ends with every
    row once, at the values of the 1-worker trial."""
    from sweep.grid import expand
    from sweep.launch import run_sweep
    from sweep.spec import parse_spec
    from resultstore.writer import ResultsStore
    from sweep.trainable import train_trial

    from ray.tune import Callback

    class Retries(Callback):  # the trials Tune started again after a failure
        def __init__(self):
            self.retried: list[str] = []

        def on_trial_recover(self, iteration, trials, trial, **info):
            self.retried.append(trial.config["point"]["trial_id"])

    # 60 steps: the kill needs a checkpoint (step 20) and steps still to run after it; `retried`
    # fails the test if the kill ever lands after the trial ended
    spec = parse_spec({**SPEC, "train": {**SPEC["train"], "steps": 60, "checkpoint_every": 20, "eval_every": 20}})
    (cfg,) = expand(spec)
    folder = tmp_path / "r" / spec.name
    killer = KillOneTrainWorker(folder / "trials" / cfg.trial_id, folder / "curves")
    retries = Retries()
    outcome = run_sweep(spec, [cfg], ResultsStore(tmp_path / "r", spec.name), on_start=lambda todo: [retries])
    assert len(killer.killed) == 1, "no Ray Train worker was killed"
    assert retries.retried == [cfg.trial_id], "the kill did not fail the running trial (it came too late)"
    assert outcome.failed == [] and outcome.missing == [], outcome
    assert killer.kept and all((folder / "curves" / n).stat().st_mtime_ns == t for n, t in killer.kept.items()), \
        "the retry restarted from step 0 instead of resuming"
    store = ResultsStore(tmp_path / "r", spec.name)
    reference = ResultsStore(tmp_path / "ref", spec.name)
    train_trial(cfg, reference, reference.sink(cfg.trial_id))
    runs = store.read("runs")
    assert runs["status"].to_list() == ["done"] and runs["node"].null_count() == 0
    for table, key in (("metrics", ["step", "layer", "site", "basis", "metric"]), ("curves", ["step"])):
        got, want = store_rows(store, table, key), store_rows(reference, table, key)
        assert got.height == got.unique(key).height == want.height, table  # every row once
        got_rows, want_rows = (t.drop("tokens_per_s", strict=False).to_dicts() for t in (got, want))
        # quant_loss_delta_se is a spread over the eval batch's few sequences of differences that
        # round-to-nearest makes discontinuous in the weights: its row must be there once, its value
        # (2e-4 against 3e-4 here) is not a trajectory check
        for r in (*got_rows, *want_rows):
            if r.get("metric") == "quant_loss_delta_se":
                r["value"] = None
        # 60 fp32 steps in two summation orders drift apart (LONG_BOUND)
        # abs: quant_loss_delta is a difference of two ~5.0 losses (measured 7e-6 apart at step 120)
        assert_rows_close(got_rows, want_rows, ("value",) if table == "metrics" else CURVE_VALUES[:-1], rel=LONG_BOUND,
                          abs_=1e-4)


def test_multi_worker_trials_start_only_as_many_as_the_cluster_can_give_all_their_workers(local_ray):
    from sweep.launch import _bounded_concurrency

    two = {"cpu": 1, "gpu": 0, "workers": 2}
    assert _bounded_concurrency(local_ray, {"a": two, "b": two, "c": {"cpu": 1, "gpu": 0, "workers": 1}}, None) == 1
    assert _bounded_concurrency(local_ray, {"a": {"cpu": 0.5, "gpu": 0, "workers": 2}}, None) == 2
    assert _bounded_concurrency(local_ray, {"a": {"cpu": 0.5, "gpu": 0, "workers": 2}}, 1) == 1
    assert _bounded_concurrency(local_ray, {"a": {"cpu": 1, "gpu": 0, "workers": 1}}, None) is None  # Tune's own rule


# ---- the spec's resources and the plan ------------------------------------------------------------


def test_resources_give_workers_per_size_and_refuse_what_cannot_run(tmp_path):
    from resultstore.writer import ResultsStore
    from sweep.grid import expand
    from sweep.launch import run_sweep
    from sweep.spec import SpecError, parse_spec

    sized = {**SPEC, "resources": {"cpu": 1, "workers": 2,
                                   "by_size": [{"min_params": 10**6, "cpu": 2, "gpu": 1, "workers": 4}]}}
    resources = parse_spec(sized).resources
    assert resources.for_params(10) == {"cpu": 1, "gpu": 0, "workers": 2, "sharding": "ddp"}
    assert resources.for_params(10**6) == {"cpu": 2, "gpu": 1, "workers": 4, "sharding": "ddp"}
    sharded = parse_spec({**SPEC, "resources": {"cpu": 1, "workers": 2, "by_size": [
        {"min_params": 10**6, "cpu": 1, "workers": 4, "sharding": "fsdp"}]}}).resources
    assert sharded.for_params(10)["sharding"] == "ddp" and sharded.for_params(10**6)["sharding"] == "fsdp"
    assert sharded.sharding_at(10**6) == (("by_size", 0, "sharding"), "fsdp")
    assert sharded.sharding_at(10) == (("sharding",), "ddp")
    with pytest.raises(SpecError, match=r"resources.by_size\[0\].workers: train.batch_size 4 does not split evenly "
                                        r"over 3 workers"):
        parse_spec({**SPEC, "resources": {"cpu": 1, "by_size": [{"min_params": 0, "cpu": 1, "workers": 3}]}})
    with pytest.raises(SpecError, match=r"resources.sharding: fsdp needs workers >= 2"):
        parse_spec({**SPEC, "resources": {"cpu": 1, "sharding": "fsdp"}})
    assert parse_spec({**SPEC, "resources": {"cpu": 1, "workers": 2, "sharding": "fsdp"}}).resources.sharding == "fsdp"
    too_big = parse_spec({**SPEC, "resources": {"cpu": 2, "workers": 4}})
    with pytest.raises(SpecError, match=r"needs cpu=8 gpu=0 \(all its workers\), but (this machine|the whole cluster) has cpu=2") as caught:
        run_sweep(too_big, expand(too_big), ResultsStore(tmp_path, too_big.name), num_cpus=2)
    assert caught.value.loc == ("resources", "workers")
    assert not (tmp_path / "ddp" / "runs").exists()


def test_plan_counts_every_worker_and_says_it_assumes_the_scaling():
    from sweep.estimate import DATA_PARALLEL_EFFICIENCY, estimate
    from sweep.grid import expand
    from sweep.spec import parse_spec

    (cfg,) = expand(parse_spec(SPEC))
    one = estimate([cfg], lambda p: {"cpu": 1, "gpu": 1, "workers": 1}, {}, 1e12, True)
    eight = estimate([cfg], lambda p: {"cpu": 1, "gpu": 1, "workers": 8}, {}, 1e12, True)
    assert eight.trial_s[0] == pytest.approx(one.trial_s[0] / (8 * DATA_PARALLEL_EFFICIENCY))
    assert eight.pending_device_hours == pytest.approx(one.pending_device_hours / DATA_PARALLEL_EFFICIENCY)
    assert not one.extrapolating and eight.extrapolating and "data-parallel efficiency" in eight.basis
