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

from study import distributed
from study.config import TrialConfig
from study.train import MemorySink, StopTraining, train

BOUND = 2e-4
"""Largest relative difference allowed between a 2-worker and the 1-worker run (fp32)."""


def tiny(**train_kw) -> TrialConfig:
    train_cfg = {"steps": 12, "batch_size": 4, "eval_every": 4, "eval_batch": {"sequences": 2},
                 "checkpoint_every": 0, "invariance_check": False, **train_kw}
    return TrialConfig(model={"d_model": 32, "n_layers": 2, "n_heads": 2}, data={"seq_len": 16},
                       optimizer={"name": "adam", "lr": 3e-3}, train=train_cfg)


class CrashAt(MemorySink):
    """Stops the run right after the checkpoint at `step` is written (a worker dies)."""

    def __init__(self, step: int):
        super().__init__()
        self.crash_step = step

    def checkpoint(self, step: int, directory: Path) -> None:
        if step == self.crash_step:
            raise StopTraining(f"killed after step {step}")


def _worker(rank: int, size: int, rendezvous: str, cfg_json: str, out: str, checkpoint_dir: str | None,
            crash_step: int | None) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    sink = CrashAt(crash_step) if crash_step is not None else MemorySink()
    try:
        summary = train(TrialConfig.model_validate_json(cfg_json), sink,
                        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None)
    except StopTraining:
        summary = None
    with open(out, "wb") as f:
        pickle.dump({"sink": sink, "summary": summary}, f)
    torch.distributed.destroy_process_group()


def run_workers(tmp: Path, cfg: TrialConfig, size: int = 2, checkpoint_dir: Path | None = None,
                crash_step: int | None = None) -> list[dict | None]:
    """Run `size` ranks to the end (or rank 0's crash; the others are then stopped by handle)."""
    tmp.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    rendezvous = tmp / "rendezvous"
    rendezvous.unlink(missing_ok=True)
    procs = [ctx.Process(target=_worker, args=(r, size, str(rendezvous), cfg.model_dump_json(), str(tmp / f"rank{r}.pkl"),
                                               str(checkpoint_dir) if checkpoint_dir else None, crash_step))
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


def assert_rows_close(got: list[dict], want: list[dict], keys: tuple[str, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert {k: g[k] for k in g if k not in keys} == {k: w[k] for k in w if k not in keys}
        for k in keys:
            if w[k] is None or (isinstance(w[k], float) and math.isnan(w[k])):
                assert g[k] is None or math.isnan(g[k]), (k, g, w)
            else:
                assert g[k] == pytest.approx(w[k], rel=BOUND, abs=1e-6), (k, g, w)


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
    got = [{**r, "tokens_per_s": None} for r in sink.curve_rows]
    want = [{**r, "tokens_per_s": None} for r in one_worker.curve_rows]
    assert_rows_close(got, want, CURVE_VALUES)
    assert_rows_close(sink.metric_rows, one_worker.metric_rows, METRIC_VALUES)
    assert rank0["summary"].final_val_loss == pytest.approx(one_worker.run_row["final_val_loss"], rel=BOUND)
    assert sink.run_row is not None and sink.run_row["steps"] == 12
    # rank 1 trained (it returns the same summary steps) but wrote nothing anywhere
    assert rank1["summary"].steps == 12
    empty = rank1["sink"]
    assert (empty.metric_rows, empty.curve_rows, empty.check_rows, empty.run_row, empty.progress_log) == ([], [], [], None, [])


@pytest.mark.slow
def test_a_crashed_two_worker_run_resumes_from_rank0s_checkpoint(tmp_path, one_worker):
    cfg = tiny(checkpoint_every=4)
    ckpt = tmp_path / "ckpt"
    crashed = run_workers(tmp_path / "a", cfg, checkpoint_dir=ckpt, crash_step=8)[0]
    assert crashed["summary"] is None and (ckpt / "checkpoint.pt").exists()
    assert torch.load(ckpt / "checkpoint.pt", weights_only=False)["step"] == 8
    # the restart: every rank resumes from the checkpoint; rank 0's sink keeps the rows up to step 8
    sink = crashed["sink"]
    ctx_rows = (sink.metric_rows, sink.curve_rows)
    resumed = run_workers(tmp_path / "b", cfg, checkpoint_dir=ckpt)[0]["sink"]
    assert min(r["step"] for r in resumed.curve_rows) == 9  # nothing before the checkpoint is repeated
    curves = [r for r in ctx_rows[1] if r["step"] <= 8] + resumed.curve_rows
    metrics = [r for r in ctx_rows[0] if r["step"] <= 8] + resumed.metric_rows
    no_speed = lambda rows: [{**r, "tokens_per_s": None} for r in rows]  # noqa: E731
    assert_rows_close(no_speed(curves), no_speed(one_worker.curve_rows), CURVE_VALUES)
    assert_rows_close(metrics, one_worker.metric_rows, METRIC_VALUES)


def test_the_batch_must_split_evenly_over_workers():
    with pytest.raises(ValueError, match="train.batch_size: 6 sequences do not split evenly over 4 workers"):
        distributed.local_rows(6, distributed.World(rank=1, size=4))
    assert distributed.local_rows(8, distributed.World(rank=1, size=4)) == slice(2, 4)
    assert distributed.world() == distributed.World(0, 1)  # no group here: one worker
