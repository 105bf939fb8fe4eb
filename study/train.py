"""train(cfg, sink) -> RunSummary: one trial, top to bottom.

Logging is injected: a `Sink` receives rows shaped like the results store's tables
(`sink.rows(table, rows)` for metrics, curves, checks, dims; `sink.run(row)` for the runs row),
so this module never imports Ray. Exactly-once bookkeeping is the
sink's job; the loop tells it where a run (re)starts (`begin`) and when rows up to a step must
be durable (`flush`, always before the checkpoint that covers them is written).
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
from study.data import eval_batch, load_corpus, sample_batch
from study.device import (
    cpu_model, device_detail, limit_memory, mfu, peak_memory_bytes, reset_peak_memory, should_compile, use_bf16,
)
from study.invariance import loss_change_by_dtype
from study.metrics import ActivationProbe
from study.model import Transformer
from study.optim import build_optimizer
from study.optim.registry import sharding_problem
from study.quant import quant_rows, quantised_delta_se, quantised_losses
from study.rotation import generator_for

if TYPE_CHECKING:  # the runs-table contract; study does not import analysis at run time
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


def lr_at(cfg: TrialConfig, step: int) -> float:
    """Peak lr times warmup (linear from 0) then cosine/linear decay to min_lr_ratio."""
    peak, total, warm = cfg.optimizer.lr, cfg.total_steps, cfg.warmup_steps
    if step < warm:
        return peak * (step + 1) / warm
    if cfg.train.lr_schedule == "constant" or total <= warm:
        return peak
    frac = (step - warm) / max(1, total - warm)
    floor = cfg.train.min_lr_ratio
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if cfg.train.lr_schedule == "cosine" else 1 - frac
    return peak * (floor + (1 - floor) * shape)


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


@dataclass(frozen=True)
class Evaluation:
    """What one eval measured: the rows for the sink and the numbers the loop carries on."""

    val_loss: float
    train_loss: float
    """The last step's training loss; nan at the initial eval (no step before it)."""
    finite: bool
    """The val loss and every training loss since the previous eval are finite."""
    rows: dict[str, list[dict]]
    """Rows by table: curves, metrics and dims (study.attribution's outlier dimensions, at the
    final and every attribution_every-th eval; [] at the others)."""
    progress: dict


def evaluate(cfg: TrialConfig, model: Transformer, probe: ActivationProbe, batch: tuple[torch.Tensor, torch.Tensor],
             history: tuple[torch.Tensor, torch.Tensor], *, since: int, at: int, seconds: float,
             autocast: torch.autocast, attribution: Attribution | None = None) -> Evaluation:
    """Probe the model at step `at` and log the steps (since, at] whose losses and grad norms
    `history` holds (per step, on the device), over `seconds` of training: one host readback."""
    (x_eval, y_eval), (losses, grad_norms) = batch, history
    total, tps, k = cfg.total_steps, cfg.tokens_per_step, cfg.train.quant_every
    new = range(since + 1, at + 1)
    quant = at == total or (k > 0 and at % (k * cfg.train.eval_every) == 0)
    a = cfg.train.attribution_every
    attribute = attribution is not None and (at == total or (a > 0 and at % (a * cfg.train.eval_every) == 0))
    with autocast:  # quantised losses and attribution first, so they ride in the probe's one readback
        q = (quantised_losses(model, x_eval, y_eval), quantised_delta_se(model, x_eval, y_eval)) if quant else ()
        dims = attribution.measure(x_eval, y_eval) if attribute else None
        result = probe.run(x_eval, y_eval, extra=(losses[new.start : new.stop], grad_norms[new.start : new.stop], *q,
                                                  *((dims.values,) if dims else ())))
    train_hist, gn_hist, *q_hist = result.extra[: 2 + len(q)]
    val_loss = result.val_loss
    tokens_per_s = len(new) * tps / seconds if len(new) and seconds > 0 else 0.0
    curves = [
        {"step": s, "tokens": s * tps, "train_loss": l, "val_loss": None, "lr": lr_at(cfg, s - 1),
         "grad_norm": g, "tokens_per_s": tokens_per_s}
        for s, l, g in zip(new, train_hist, gn_hist)
    ]
    if curves:
        curves[-1]["val_loss"] = val_loss
    else:  # the initial eval: a curve point with only the val loss
        curves = [{"step": at, "tokens": at * tps, "train_loss": None, "val_loss": val_loss,
                   "lr": lr_at(cfg, at), "grad_norm": None, "tokens_per_s": None}]
    model_rows = result.rows + (quant_rows(q_hist[0], val_loss, standard_errors=q_hist[1]) if q_hist else [])
    train_loss = train_hist[-1] if train_hist else float("nan")
    resid = [r["value"] for r in result.rows
             if r["site"] == "resid" and r["basis"] == "stored" and r["metric"] == "kurtosis" and r["value"] is not None]
    return Evaluation(
        val_loss=val_loss, train_loss=train_loss,
        finite=all(math.isfinite(v) for v in train_hist + [val_loss]),
        rows={
            "curves": curves,
            "metrics": [{"step": at, "tokens": at * tps, **r} for r in model_rows],
            "dims": [{"step": at, "tokens": at * tps, **r} for r in dims.rows(result.extra[-1])] if dims else [],
        },
        progress={"step": at, "total_steps": total, "train_loss": train_loss, "val_loss": val_loss,
                  "resid_kurtosis_mean": sum(resid) / max(1, len(resid)), "tokens_per_s": tokens_per_s},
    )


# ---- the loop --------------------------------------------------------------------------------


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
    ranks = distributed.world()
    if sharding not in ("ddp", "fsdp"):
        raise ValueError(f"resources.sharding: {sharding!r} is not one of 'ddp', 'fsdp'")
    sharded = sharding == "fsdp" and ranks.size > 1
    if sharded and (problem := sharding_problem(cfg.optimizer.name)):
        raise ValueError(f"optimizer.name: {problem}")
    t_start = time.perf_counter()

    # -- setup: threads, device, precision
    if cfg.runtime.num_threads:
        torch.set_num_threads(cfg.runtime.num_threads)
    device = distributed.device_for(resolve_device(cfg.runtime.device), ranks)
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        limit_memory(cfg.runtime.gpu_fraction, device)  # before the first allocation
        reset_peak_memory(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16(cfg.runtime.precision, device))

    # -- data, model, optimiser, probe
    corpus = load_corpus(cfg.data)
    x_eval, y_eval = eval_batch(corpus, cfg.train.eval_batch.sequences, cfg.eval_seq_len, device)
    model = Transformer.from_config(cfg).to(device)
    rows = distributed.local_rows(cfg.train.batch_size, ranks)
    # fsdp: every rank's parameters become shards, and rank 0 evaluates a whole copy (eval_model)
    # into which each eval gathers the weights; otherwise the model evaluated is the one trained
    parallel_model = distributed.shard(model, ranks) if sharded else distributed.wrap(model, device, ranks)
    eval_model = Transformer.from_config(cfg).to(device) if sharded and ranks.main else model
    optimizer = build_optimizer(cfg, model)  # on the shards, under fsdp
    step_model = torch.compile(parallel_model) if should_compile(cfg.runtime.compile, device, cfg.params) else parallel_model
    probe = ActivationProbe(eval_model, cfg.seed)
    attribution = Attribution(eval_model, corpus_token_info(corpus), cfg.seed)
    data_gen = generator_for(cfg.seed, "data")

    # -- resume
    step, wall_before, initial_loss = 0, 0.0, None
    ckpt = find_checkpoint(resume_from if resume_from is not None else checkpoint_dir)
    if ckpt is not None:
        try:  # truncated, random bytes, another torch's pickle: UnreadableCheckpoint names the file
            state = torch.load(ckpt, map_location=device, weights_only=False)
            if state["trial_id"] != cfg.trial_id:
                raise ValueError(f"checkpoint {ckpt} belongs to trial {state['trial_id']}, not {cfg.trial_id}")
            if sharded:
                distributed.load_full_state(model, optimizer, state["model"], state["optimizer"])
            else:
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
            data_gen.set_state(state["data_rng"])
            step, wall_before, initial_loss = state["step"], state["wall_s"], state["initial_loss"]
        except Exception as exc:
            raise UnreadableCheckpoint(ckpt, exc) from exc
    if ranks.main:
        sink.begin(step if ckpt is not None else None)

    start_step, total, tps = step, cfg.total_steps, cfg.tokens_per_step
    status, train_loss, val_loss = "done", float("nan"), float("nan")
    losses = torch.zeros(total + 1, device=device)  # per-step, read back once per eval
    grad_norms = torch.zeros(total + 1, device=device)
    last_eval, train_time, interval_start = step, 0.0, time.perf_counter()

    # -- the loop: eval and checkpoint where due, then one step (no host sync inside a step)
    model.train()
    while True:
        scheduled = step % cfg.train.eval_every == 0 or step == total
        checkpoint_due = (checkpoint_dir is not None and cfg.train.checkpoint_every > 0
                          and step % cfg.train.checkpoint_every == 0 and start_step < step < total)
        # step 0 is the initial eval; a checkpoint needs the rows up to its step first
        if step == 0 or (step > last_eval and (scheduled or checkpoint_due)):
            diverged = False
            if on_cuda:  # the queued steps belong to this interval: without it tokens/s reads high
                torch.cuda.synchronize(device)
            interval = time.perf_counter() - interval_start
            train_time += interval
            if sharded:  # a collective: every rank sends its shards, rank 0 gets the whole weights
                full = distributed.full_model_state(model)
                if ranks.main:
                    eval_model.load_state_dict(full)
            if ranks.main:  # the probe and every row: rank 0 alone, on the full eval batch
                ev = evaluate(cfg, eval_model, probe, (x_eval, y_eval), (losses, grad_norms), since=last_eval, at=step,
                              seconds=interval, autocast=autocast, attribution=attribution)
                for table, new_rows in ev.rows.items():
                    sink.rows(table, new_rows)
                sink.progress(ev.progress)
                train_loss, val_loss = ev.train_loss, ev.val_loss
                initial_loss = val_loss if initial_loss is None else initial_loss
                # divergence ends the run only at scheduled evals after a step, as it always has
                diverged = step > start_step and scheduled and (
                    not ev.finite or val_loss > cfg.train.diverge_factor * initial_loss)
            last_eval = step
            if distributed.rank0_decides(diverged, device, ranks):
                status = "diverged"
                break
            interval_start = time.perf_counter()
        if checkpoint_due:
            # under fsdp every rank joins the gathers; the file is the one-worker format either way
            model_state = distributed.full_model_state(model) if sharded else model.state_dict()
            optimizer_state = distributed.full_optimizer_state(model, optimizer) if sharded else optimizer.state_dict()
        if checkpoint_due and ranks.main:
            sink.flush(step)
            save_checkpoint(Path(checkpoint_dir), {
                "trial_id": cfg.trial_id, "step": step, "model": model_state,
                "optimizer": optimizer_state, "data_rng": data_gen.get_state(),
                "wall_s": wall_before + time.perf_counter() - t_start, "initial_loss": initial_loss,
            })
            sink.checkpoint(step, Path(checkpoint_dir))
        if step == total:
            break

        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        x, y = sample_batch(corpus.train, cfg.train.batch_size, cfg.data.seq_len, data_gen, device)
        x, y = x[rows], y[rows]  # the whole global batch is drawn on every rank: the same data order
        with autocast:
            _, loss = step_model(x, y)
        loss.backward()
        if cfg.train.grad_clip > 0:
            norm = distributed.whole(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip))
        else:  # one norm of the per-tensor norms: under fsdp one all-reduce, not one per parameter
            norm = distributed.whole(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        losses[step] = distributed.mean_across(loss.detach(), ranks)
        grad_norms[step] = norm.detach()

    # -- the end: invariance check, runs row
    # eval_model holds the final weights: the last eval was at the final step
    if ranks.main and status == "done" and cfg.train.invariance_check:
        sink.rows("checks", loss_change_by_dtype(eval_model, x_eval, y_eval, cfg.seed))
    if ranks.main:
        sink.flush(step)
    wall = wall_before + time.perf_counter() - t_start
    throughput = (step - start_step) * tps / train_time if train_time > 0 else 0.0
    summary = RunSummary(
        trial_id=cfg.trial_id, status=status, steps=step, tokens=step * tps,
        final_train_loss=train_loss, final_val_loss=val_loss, tokens_per_s=throughput, wall_s=wall,
        mfu=mfu(cfg.flops_per_token, throughput, device_name(device)), peak_memory_bytes=peak_memory_bytes(device),
    )
    if ranks.main:
        if status == "done":
            buf = io.BytesIO()
            torch.save({"trial_id": cfg.trial_id, "model": eval_model.state_dict()}, buf)
            sink.final_weights(buf.getvalue())
        sink.run(run_row(cfg, summary, device, corpus.fingerprint))
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
