"""train(cfg, sink) -> RunSummary: one trial, top to bottom.

Logging is injected: a `Sink` receives rows shaped like the results store's tables
(`sink.rows(table, rows)` for metrics, curves, checks, dims; `sink.run(row)` for the runs row),
so this module never imports Ray. Exactly-once bookkeeping is the sink's job; the loop tells it
where a run (re)starts (`begin`) and when rows up to a step must be durable (`flush`, always
before the checkpoint that covers them is written). What one eval measures is study.evaluation;
the lr schedule, study.schedule.
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from study import distributed
from study.attribution import Attribution, corpus_token_info
from study.config import TrialConfig
from study.data import Corpus, eval_batch, load_corpus, sample_batch
from study.device import (
    cpu_model, device_detail, limit_memory, mfu, peak_memory_bytes, reset_peak_memory, should_compile, use_bf16,
    use_tf32,
)
from study.evaluation import Evaluation, evaluate
from study.invariance import loss_change_by_dtype
from study.metrics import ActivationProbe
from study.model import Transformer
from study.optim import build_optimizer
from study.optim.registry import sharding_problem
from study.rotation import generator_for
from study.schedule import lr_at, set_lr

if TYPE_CHECKING:  # the runs table's statuses (resultstore.schema)
    from resultstore.schema import Status

__all__ = [
    "CHECKPOINT_FILE", "Sink", "MemorySink", "RunSummary", "StopTraining", "resolve_device",
    "lr_at", "code_version", "device_name", "save_checkpoint", "find_checkpoint", "UnreadableCheckpoint", "Evaluation",
    "evaluate", "train", "run_row",
]

CHECKPOINT_FILE = "checkpoint.pt"


class Sink(Protocol):
    """Where a trial's rows go. Rows carry no trial_id; the sink adds it."""

    def begin(self, resume_step: int | None) -> None:
        """A run starts fresh (None: drop every earlier row) or resumes after `resume_step`
        (drop rows with a larger step)."""

    def rows(self, table: str, rows: list[dict]) -> None:
        """Rows of `table` (a table of resultstore.schema other than runs), shaped like it."""

    def flush(self, step: int) -> None:
        """Make every row so far durable (called before each checkpoint and at the end)."""

    def checkpoint(self, step: int, directory: Path) -> None:
        """A checkpoint covering steps <= `step` now lies in `directory`."""

    def progress(self, info: dict) -> None:
        """Live progress after each eval (step, loss, kurtosis, ...)."""

    def run(self, row: dict) -> None:
        """The runs row, written last: it marks the trial finished."""

    def final_weights(self, data: bytes) -> None:
        """A done trial's final model, torch.save bytes of {"trial_id", "model": state_dict}, just
        before its runs row (probes such as `sweep probe sae` read it). Bytes: the store below
        does not import torch."""


@dataclass
class MemorySink:
    """Keeps every row in memory: for tests, notebooks and `sweep train --no-store`."""

    tables: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    """Rows by table (`sink.tables["metrics"]`); a table without rows reads as []."""
    run_row: dict | None = None
    final_state: dict | None = None
    progress_log: list[dict] = field(default_factory=list)

    def begin(self, resume_step: int | None) -> None:
        """Keep the rows up to `resume_step` (rows without a step, such as checks, go)."""
        for rows in self.tables.values():
            rows[:] = [r for r in rows if resume_step is not None and r.get("step", math.inf) <= resume_step]
        self.run_row = None

    def rows(self, table: str, rows: list[dict]) -> None:
        self.tables[table] += rows

    def flush(self, step: int) -> None:
        pass

    def checkpoint(self, step: int, directory: Path) -> None:
        pass

    def progress(self, info: dict) -> None:
        self.progress_log.append(info)

    def final_weights(self, data: bytes) -> None:
        self.final_state = torch.load(io.BytesIO(data), weights_only=False)

    def run(self, row: dict) -> None:
        self.run_row = row


@dataclass(frozen=True)
class RunSummary:
    trial_id: str
    status: Status  # "done" or "diverged" here; a worker that fails writes "failed"
    steps: int
    tokens: int
    final_train_loss: float
    final_val_loss: float
    tokens_per_s: float
    wall_s: float
    mfu: float | None = None
    """flops_per_token x tokens_per_s / the device's peak (study.device); None where no peak is known."""
    peak_memory_bytes: int | None = None
    """Peak CUDA tensor memory, or the process's peak RSS on CPU (study.device.peak_memory_bytes)."""


class StopTraining(Exception):
    """Raised by a sink (e.g. a test simulating a crash, or a stopped Ray trial) to end early."""


# ---- helpers ---------------------------------------------------------------------------------


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


@cache
def code_version() -> tuple[str, str]:
    """(package version, git sha or '') of the code that ran."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("privileged-bases-sweep")
    except PackageNotFoundError:
        pkg = "unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent,
            capture_output=True, text=True, timeout=30,  # a loaded machine can take seconds
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return pkg, sha


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({cpu_model()}, {torch.get_num_threads()} threads)"


def save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    """Atomic: write a temp file, then rename over the previous checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (CHECKPOINT_FILE + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, directory / CHECKPOINT_FILE)
    finally:  # a full disk: no half-written temporary file keeps the space
        tmp.unlink(missing_ok=True)


class UnreadableCheckpoint(ValueError):
    """A checkpoint that cannot be loaded (`path` names it): the caller sets it aside and starts over."""

    def __init__(self, path: Path, cause: BaseException):
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
        super().__init__(f"checkpoint {path} cannot be loaded ({type(cause).__name__}: {reason})")
        self.path = Path(path)


def find_checkpoint(directory: Path | None) -> Path | None:
    if directory is None:
        return None
    path = Path(directory) / CHECKPOINT_FILE
    return path if path.exists() else None


# ---- the loop --------------------------------------------------------------------------------


@dataclass
class _Setup:
    """What a trial trains and measures with, built once (`_build`)."""

    cfg: TrialConfig
    ranks: distributed.World
    sharded: bool
    """fsdp over several ranks: parameters are shards and rank 0 evaluates a whole copy."""
    device: torch.device
    autocast: torch.autocast
    corpus: Corpus
    eval_batch: tuple[torch.Tensor, torch.Tensor]
    model: Transformer
    """The model trained (its parameters are shards under fsdp)."""
    eval_model: Transformer
    """The model evaluated: `model` itself, or under fsdp rank 0's whole copy, loaded at each eval."""
    step_model: torch.nn.Module
    """`model` wrapped for the group (DDP / FSDP) and compiled where that pays."""
    optimizer: torch.optim.Optimizer
    probe: ActivationProbe
    attribution: Attribution
    data_gen: torch.Generator
    rows: slice
    """This rank's rows of each global batch."""


@dataclass
class _Loop:
    """What the loop carries from step to step."""

    step: int
    start_step: int
    initial_loss: float | None
    losses: torch.Tensor
    """Per-step training losses on the device, read back once per eval."""
    grad_norms: torch.Tensor
    last_eval: int
    wall_before: float
    """Seconds the run took before this (re)start."""
    t_start: float = field(default_factory=time.perf_counter)
    train_time: float = 0.0
    interval_start: float = field(default_factory=time.perf_counter)
    train_loss: float = float("nan")
    val_loss: float = float("nan")

    def wall(self) -> float:
        """Seconds the run has taken, earlier starts included."""
        return self.wall_before + time.perf_counter() - self.t_start


def train(
    cfg: TrialConfig,
    sink: Sink | None = None,
    *,
    checkpoint_dir: Path | None = None,
    resume_from: Path | None = None,
    sharding: str = "ddp",
) -> RunSummary:
    """Train one trial. Checkpoints go to `checkpoint_dir`; `resume_from` (a directory holding
    a checkpoint; defaults to checkpoint_dir) continues an interrupted run exactly. Inside a
    torch.distributed group every rank calls this; the probe, rows and checkpoints are rank 0's
    alone (study.distributed): the other ranks' sinks are never called. `sharding` ("ddp" or
    "fsdp") is how a group of several ranks splits the model; one worker ignores it."""
    sink = sink if sink is not None else MemorySink()
    t_start = time.perf_counter()  # the wall time includes building and resuming
    run = _build(cfg, sharding)
    ckpt = find_checkpoint(resume_from if resume_from is not None else checkpoint_dir)
    step, wall_before, initial_loss = _resume(run, ckpt) if ckpt is not None else (0, 0.0, None)
    if run.ranks.main:
        sink.begin(step if ckpt is not None else None)
    total = cfg.total_steps
    loop = _Loop(step=step, start_step=step, initial_loss=initial_loss, last_eval=step, wall_before=wall_before,
                 t_start=t_start, losses=torch.zeros(total + 1, device=run.device), grad_norms=torch.zeros(total + 1, device=run.device))
    status: Status = "done"

    # eval and checkpoint where due, then one step (no host sync inside a step)
    run.model.train()
    while True:
        scheduled = loop.step % cfg.train.eval_every == 0 or loop.step == total
        checkpoint_due = (checkpoint_dir is not None and cfg.train.checkpoint_every > 0
                          and loop.step % cfg.train.checkpoint_every == 0 and loop.start_step < loop.step < total)
        # step 0 is the initial eval; a checkpoint needs the rows up to its step first
        if loop.step == 0 or (loop.step > loop.last_eval and (scheduled or checkpoint_due)):
            if _evaluate_and_log(run, loop, sink, scheduled):
                status = "diverged"
                break
        if checkpoint_due:
            _checkpoint(run, loop, sink, Path(checkpoint_dir))
        if loop.step == total:
            break
        _train_step(run, loop)

    return _finish(run, loop, sink, status)


def _build(cfg: TrialConfig, sharding: str) -> _Setup:
    """Threads, device and precision; then the data, model, optimiser and probes of one trial."""
    ranks = distributed.world()
    if sharding not in ("ddp", "fsdp"):
        raise ValueError(f"resources.sharding: {sharding!r} is not one of 'ddp', 'fsdp'")
    sharded = sharding == "fsdp" and ranks.size > 1
    if sharded and (problem := sharding_problem(cfg.optimizer.name)):
        raise ValueError(f"optimizer.name: {problem}")
    if cfg.runtime.num_threads:
        torch.set_num_threads(cfg.runtime.num_threads)
    device = distributed.device_for(resolve_device(cfg.runtime.device), ranks)
    if device.type == "cuda":
        tf32 = use_tf32(cfg.runtime.precision, device)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        limit_memory(cfg.runtime.gpu_fraction, device)  # before the first allocation
        reset_peak_memory(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16(cfg.runtime.precision, device))

    corpus = load_corpus(cfg.data)
    eval_batch_ = eval_batch(corpus, cfg.train.eval_batch.sequences, cfg.eval_seq_len, device)
    model = Transformer.from_config(cfg).to(device)
    # fsdp: every rank's parameters become shards, and rank 0 evaluates a whole copy (eval_model)
    # into which each eval gathers the weights; otherwise the model evaluated is the one trained
    parallel_model = distributed.shard(model, ranks) if sharded else distributed.wrap(model, device, ranks)
    eval_model = Transformer.from_config(cfg).to(device) if sharded and ranks.main else model
    optimizer = build_optimizer(cfg, model)  # on the shards, under fsdp
    if cfg.model.parametrization == "mup" and any("lr_scale" not in g for g in optimizer.param_groups):
        raise ValueError(f"model.parametrization: {cfg.optimizer.name}'s builder gave param groups without muP's "
                         "lr_scale (build them with study.optim.rules.groups.decay_groups(..., mup_scales(cfg), lr))")
    step_model = torch.compile(parallel_model) if should_compile(cfg.runtime.compile, device, cfg.params) else parallel_model
    tokens = corpus_token_info(corpus)  # delimiters from the corpus's counts (a BPE vocabulary), not one eval batch's
    return _Setup(
        cfg=cfg, ranks=ranks, sharded=sharded, device=device, autocast=autocast, corpus=corpus, eval_batch=eval_batch_,
        model=model, eval_model=eval_model, step_model=step_model, optimizer=optimizer,
        probe=ActivationProbe(eval_model, cfg.seed, delimiter=tokens.delimiter),
        attribution=Attribution(eval_model, tokens, cfg.seed),
        data_gen=generator_for(cfg.seed, "data"), rows=distributed.local_rows(cfg.train.batch_size, ranks),
    )


def _resume(run: _Setup, ckpt: Path) -> tuple[int, float, float | None]:
    """Load the checkpoint at `ckpt` into the model, optimiser and data order; returns its (step,
    wall seconds so far, initial loss). UnreadableCheckpoint names a file that cannot be loaded
    (truncated, random bytes, another torch's pickle, another trial's)."""
    cfg = run.cfg
    try:
        state = torch.load(ckpt, map_location=run.device, weights_only=False)
        if state["trial_id"] != cfg.trial_id:
            raise ValueError(f"checkpoint {ckpt} belongs to trial {state['trial_id']}, not {cfg.trial_id}")
        if run.sharded:
            distributed.load_full_state(run.model, run.optimizer, state["model"], state["optimizer"])
        else:
            run.model.load_state_dict(state["model"])
            run.optimizer.load_state_dict(state["optimizer"])
        run.data_gen.set_state(state["data_rng"])
        return state["step"], state["wall_s"], state["initial_loss"]
    except Exception as exc:
        raise UnreadableCheckpoint(ckpt, exc) from exc


def _evaluate_and_log(run: _Setup, loop: _Loop, sink: Sink, scheduled: bool) -> bool:
    """The eval at loop.step: its rows and progress to the sink (rank 0); whether the run
    diverged, decided by rank 0 for every rank."""
    cfg, ranks = run.cfg, run.ranks
    diverged = False
    if run.device.type == "cuda":  # the queued steps belong to this interval: without it tokens/s reads high
        torch.cuda.synchronize(run.device)
    interval = time.perf_counter() - loop.interval_start
    loop.train_time += interval
    if run.sharded:  # a collective: every rank sends its shards, rank 0 gets the whole weights
        full = distributed.full_model_state(run.model)
        if ranks.main:
            run.eval_model.load_state_dict(full)
    if ranks.main:  # the probe and every row: rank 0 alone, on the full eval batch
        ev = evaluate(cfg, run.eval_model, run.probe, run.eval_batch, (loop.losses, loop.grad_norms),
                      since=loop.last_eval, at=loop.step, seconds=interval, autocast=run.autocast,
                      attribution=run.attribution)
        for table, rows in ev.rows.items():
            sink.rows(table, rows)
        sink.progress(ev.progress)
        loop.train_loss, loop.val_loss = ev.train_loss, ev.val_loss
        loop.initial_loss = ev.val_loss if loop.initial_loss is None else loop.initial_loss
        # divergence ends the run only at scheduled evals after a step, as it always has
        diverged = loop.step > loop.start_step and scheduled and (
            not ev.finite or ev.val_loss > cfg.train.diverge_factor * loop.initial_loss)
    loop.last_eval = loop.step
    stop = distributed.rank0_decides(diverged, run.device, ranks)
    loop.interval_start = time.perf_counter()
    return stop


def _checkpoint(run: _Setup, loop: _Loop, sink: Sink, directory: Path) -> None:
    """The rows so far made durable, then the checkpoint at loop.step (rank 0 writes both)."""
    # under fsdp every rank joins the gathers; the file is the one-worker format either way
    model, optimizer = run.model, run.optimizer
    model_state = distributed.full_model_state(model) if run.sharded else model.state_dict()
    optimizer_state = distributed.full_optimizer_state(model, optimizer) if run.sharded else optimizer.state_dict()
    if run.ranks.main:
        sink.flush(loop.step)
        save_checkpoint(directory, {
            "trial_id": run.cfg.trial_id, "step": loop.step, "model": model_state,
            "optimizer": optimizer_state, "data_rng": run.data_gen.get_state(),
            "wall_s": loop.wall(), "initial_loss": loop.initial_loss,
        })
        sink.checkpoint(loop.step, directory)


def _train_step(run: _Setup, loop: _Loop) -> None:
    """One optimiser step; its loss and gradient norm stay on the device (loop.losses, .grad_norms)."""
    cfg, model, optimizer = run.cfg, run.model, run.optimizer
    set_lr(cfg, optimizer.param_groups, loop.step)
    x, y = sample_batch(run.corpus.train, cfg.train.batch_size, cfg.data.seq_len, run.data_gen, run.device)
    x, y = x[run.rows], y[run.rows]  # the whole global batch is drawn on every rank: the same data order
    with run.autocast:
        _, loss = run.step_model(x, y)
    loss.backward()
    if cfg.train.grad_clip > 0:
        norm = distributed.whole(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip))
    else:  # one norm of the per-tensor norms: under fsdp one all-reduce, not one per parameter
        norm = distributed.whole(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loop.step += 1
    loop.losses[loop.step] = distributed.mean_across(loss.detach(), run.ranks)
    loop.grad_norms[loop.step] = norm.detach()


def _finish(run: _Setup, loop: _Loop, sink: Sink, status: Status) -> RunSummary:
    """The invariance check, the last flush, the final weights and the runs row (rank 0's)."""
    cfg, ranks, device = run.cfg, run.ranks, run.device
    # eval_model holds the final weights: the last eval was at the final step
    if ranks.main and status == "done" and cfg.train.invariance_check:
        x_eval, y_eval = run.eval_batch
        sink.rows("checks", loss_change_by_dtype(run.eval_model, x_eval, y_eval, cfg.seed))
    if ranks.main:
        sink.flush(loop.step)
    wall, tps = loop.wall(), cfg.tokens_per_step
    throughput = (loop.step - loop.start_step) * tps / loop.train_time if loop.train_time > 0 else 0.0
    summary = RunSummary(
        trial_id=cfg.trial_id, status=status, steps=loop.step, tokens=loop.step * tps,
        final_train_loss=loop.train_loss, final_val_loss=loop.val_loss, tokens_per_s=throughput, wall_s=wall,
        mfu=mfu(cfg.flops_per_token, throughput, device_name(device)), peak_memory_bytes=peak_memory_bytes(device),
    )
    if ranks.main:
        if status == "done":
            buf = io.BytesIO()
            torch.save({"trial_id": cfg.trial_id, "model": run.eval_model.state_dict()}, buf)
            sink.final_weights(buf.getvalue())
        sink.run(run_row(cfg, summary, device, run.corpus.fingerprint))
    return summary


def run_row(cfg: TrialConfig, summary: RunSummary, device: torch.device | str, fingerprint: str,
            error: str | None = None) -> dict:
    """The runs-table row: identity, every grid axis flat, results, environment."""
    pkg, sha = code_version()
    return {
        "trial_id": cfg.trial_id, "sweep": cfg.sweep, **cfg.flat(), **asdict(summary),
        "device": device_name(device) if isinstance(device, torch.device) else device,
        "device_detail": device_detail(device) if isinstance(device, torch.device) else None,
        "torch_version": torch.__version__, "version": pkg, "git_sha": sha,
        "corpus_fingerprint": fingerprint, "error": error, "config_json": cfg.config_json(),
    }
