"""`sweep probe sae`: TopK SAEs on finished trials' residual streams, as Ray tasks.

    plan_probe(store, ...)      -> ProbePlan   checks everything, reads only the store; no Ray
    run_probe(plan, ...)        -> ProbeOutcome  one Ray task per (trial, layer) still to do

For each selected done trial (its final weights in trials/<id>/final.pt), each chosen layer and
each SAE optimiser, a task trains the SAE on the held-out split's residual activations in the
stored basis and in a fixed random one (study.sae.probe_layer) and writes the two rows as one
file, sae/<trial>.L<layer>.<optimiser>.parquet (with .<hash of the SAE config> before .parquet
when the config is not the default), atomically. A re-run skips every (trial, layer, SAE
optimiser, SAE config) whose rows are there in both bases, so it is a no-op once everything is
there; an interrupted run redoes only what has no file; another config (--k, --expansion, ...) is
another unit, trained beside the first. The config is each row's sae_config_json (--tokens is not
in it: a second probe at another --tokens alone is done).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

import polars as pl

from resultstore.layout import FINAL_WEIGHTS
from resultstore.writer import ResultsStore
from sweep.sql_guard import SqlRefused, check_select

__all__ = ["ProbeInputError", "RayUnavailable", "ProbeOutcome", "ProbePlan", "ProbeTask", "plan_probe", "probe_task", "random_basis", "refuse_where",
           "run_probe"]

BASES = ("stored", "random")


class ProbeInputError(ValueError):
    """Bad probe input (one line naming the option or trial); nothing was written or started."""


class RayUnavailable(RuntimeError):
    """Ray could not be started or reached (one line); nothing was written."""


@dataclass(frozen=True)
class ProbeTask:
    """One (trial, layer): the SAE optimisers still to train there."""

    trial_id: str
    config_json: str
    layer: int
    sae_optimizers: tuple[str, ...]


@dataclass(frozen=True)
class ProbePlan:
    uri: str
    """The sweep folder (path or URI)."""
    tasks: tuple[ProbeTask, ...]
    trials: int
    """Trials selected."""
    done: int
    """(trial, layer, SAE optimiser) units already in the table (skipped)."""
    tokens: int
    sae_json: str
    """The study.sae.SAEConfig (optimiser set per unit)."""


@dataclass(frozen=True)
class ProbeOutcome:
    written: int
    """Rows written by this run."""
    failed: tuple[str, ...]
    """One line per task that raised."""
    wall_s: float


def plan_probe(store: ResultsStore, *, where: str | None = None, layers: list[int] | None = None, tokens: int = 16384,
               sae_optimizers: tuple[str, ...] = ("adam", "sgd"), sae_json: str | None = None) -> ProbePlan:
    """What `sweep probe sae` will do, or ProbeInputError naming the first problem. `store`: the
    sweep's ResultsStore (`sweep probe sae` opens it once, at the CLI). `layers` None: each
    trial's middle and last layer. Reads the store's runs and sae tables, nothing else."""
    from study.config import TrialConfig
    from study.sae import SAE_OPTIMIZERS, SAEConfig

    sae = SAEConfig.model_validate_json(sae_json) if sae_json else SAEConfig()
    if tokens < 4 * 8:
        raise ProbeInputError(f"--tokens: {tokens} is too few (at least 32)")
    bad = [o for o in sae_optimizers if o not in SAE_OPTIMIZERS]
    if bad or not sae_optimizers:
        raise ProbeInputError(f"--sae-optimizers: {', '.join(bad) or 'none given'}: choose from {', '.join(SAE_OPTIMIZERS)}")
    uri = store.uri
    runs = store.read("runs").filter(pl.col("status") == "done")
    if where:
        refuse_where(where)
        try:
            ids = pl.SQLContext(runs=runs).execute(f"SELECT trial_id FROM runs WHERE {where}", eager=True)
        except Exception as exc:  # polars raises several kinds for bad SQL
            raise ProbeInputError(f"--where: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from None
        runs = runs.filter(pl.col("trial_id").is_in(ids["trial_id"].implode()))
    if runs.height == 0:
        raise ProbeInputError(f"{uri}: no done trial" + (f" matches --where {where!r}" if where else ""))
    with_weights = store.has_final_weights()
    done = _done_units(store)
    tasks, skipped = [], 0
    for row in runs.sort("trial_id").iter_rows(named=True):
        tid = row["trial_id"]
        if tid not in with_weights:
            raise ProbeInputError(f"trial {tid}: no final weights ({uri}/trials/{tid}/{FINAL_WEIGHTS}); trials "
                                  "trained before the probe existed need `sweep run` again (delete their runs row)")
        cfg = TrialConfig.model_validate_json(row["config_json"])
        latents = sae.expansion * cfg.model.d_model
        if sae.k > latents:
            raise ProbeInputError(f"--k: {sae.k} is more than the {latents} latents of trial {tid}'s SAEs "
                                  f"(--expansion {sae.expansion} x d_model {cfg.model.d_model})")
        n = cfg.model.n_layers
        for layer in (layers if layers is not None else sorted({n // 2, n})):
            if not 0 <= layer <= n:
                raise ProbeInputError(f"--layers: layer {layer} is out of range for trial {tid} "
                                      f"(0 = embeddings .. {n} = last block)")
            todo = tuple(o for o in sae_optimizers if (tid, layer, o, config_json(sae, o)) not in done)
            skipped += len(sae_optimizers) - len(todo)
            if todo:
                tasks.append(ProbeTask(tid, row["config_json"], layer, todo))
    return ProbePlan(uri, tuple(tasks), runs.height, skipped, tokens, sae.model_dump_json())


def refuse_where(where: str) -> None:
    """ProbeInputError unless `--where` makes one SELECT over the runs table (sweep.sql_guard)."""
    try:
        check_select(f"SELECT trial_id FROM runs WHERE {where}", ["runs"])
    except SqlRefused as exc:
        raise ProbeInputError(f"--where: {exc}") from None


def _done_units(store: ResultsStore) -> set[tuple[str, int, str, str]]:
    """(trial, layer, SAE optimiser, sae_config_json) with a row in every basis."""
    rows = store.read("sae")
    have = rows.group_by("trial_id", "layer", "sae_optimizer", "sae_config_json").agg(pl.col("basis").unique())
    return {(r["trial_id"], r["layer"], r["sae_optimizer"], r["sae_config_json"]) for r in have.iter_rows(named=True)
            if set(BASES) <= set(r["basis"])}


def config_json(sae: Any, optimizer: str) -> str:
    """The sae_config_json a unit's rows carry: the probe's SAE config with this optimiser."""
    return sae.model_copy(update={"optimizer": optimizer}).model_dump_json()


def file_variant(sae: Any) -> str:
    """"" for the default SAE config (the file names of every store before configs were told
    apart), else "." and 8 hex digits of its JSON's sha256 (its optimiser left out)."""
    import hashlib

    from study.sae import SAEConfig

    plain = sae.model_copy(update={"optimizer": "adam"})
    if plain == SAEConfig():
        return ""
    return "." + hashlib.sha256(plain.model_dump_json().encode()).hexdigest()[:8]


def random_basis(seed: int, layer: int, d_model: int):
    """The fixed Haar basis a probe's rotated SAEs see: one draw per (trial seed, layer). A single
    basis for every trial is one draw whose offset from the null (~0.03 in decoder kurtosis)
    every trial would inherit; one per seed and layer averages it out over seeds."""
    from study.rotation import generator_for, random_orthogonal

    return random_orthogonal(d_model, generator_for(seed, "sae", "random basis", d_model, layer))


def probe_task(uri: str, task: ProbeTask, tokens: int, sae_json: str, threads: int = 1) -> int:
    """One task, in any process: load the trial's weights, collect activations over `tokens`
    held-out tokens, train and measure, write one file per SAE optimiser. Returns rows written."""
    import io

    import torch

    from study.config import TrialConfig
    from study.data import check_corpus, eval_batch, load_corpus
    from study.model import Transformer
    from study.sae import SAEConfig, probe_layer

    torch.set_num_threads(max(1, threads))
    store = ResultsStore.at(uri)
    cfg = TrialConfig.model_validate_json(task.config_json)
    check_corpus(cfg.data)  # this process's view of the corpus the trial trained on
    state = torch.load(io.BytesIO(store.read_final_weights(task.trial_id)), map_location="cpu", weights_only=False)
    model = Transformer.from_config(cfg)
    model.load_state_dict(state["model"])
    model.eval()
    seq_len = cfg.data.seq_len
    x, y = eval_batch(load_corpus(cfg.data), max(4, math.ceil(tokens / seq_len)), seq_len, "cpu")
    basis = random_basis(cfg.seed, task.layer, cfg.model.d_model)
    written = 0
    for optimizer in task.sae_optimizers:
        sae_cfg = SAEConfig.model_validate_json(sae_json).model_copy(update={"optimizer": optimizer})
        rows = [{"trial_id": task.trial_id, **r} for r in probe_layer(model, x, y, task.layer, sae_cfg, basis)]
        store.write_sae(task.trial_id, task.layer, optimizer, rows, variant=file_variant(sae_cfg))
        written += len(rows)
    return written


def run_probe(plan: ProbePlan, *, address: str | None = None, cpus: float = 1, gpus: float = 0,
              num_cpus: int | None = None, on_task: Callable[[int, int, str | None], None] | None = None) -> ProbeOutcome:
    """Run the plan's tasks as Ray tasks ({cpus, gpus} each) on `address` or a private local Ray
    (loopback, shut down at the end). on_task(done, total, error) after each task."""
    t0 = time.perf_counter()
    if not plan.tasks:
        return ProbeOutcome(0, (), 0.0)
    from sweep.launch import _init_ray, _ray_initialized

    started_here = not (address or os.environ.get("RAY_ADDRESS")) and not _ray_initialized()
    try:
        ray = _init_ray(address, num_cpus)
    except Exception as exc:  # ray raises plain Exceptions, e.g. a node that timed out starting
        where = f"at {address}" if address else "(local)"
        raise RayUnavailable(f"Ray {where} did not start: {(str(exc).strip().splitlines() or ['?'])[0]}") from None
    try:
        remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=1)(probe_task)
        threads = max(1, int(cpus))
        pending = {remote.remote(plan.uri, t, plan.tokens, plan.sae_json, threads): t for t in plan.tasks}
        written, failed, finished = 0, [], 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            task = pending.pop(ready[0])
            error = None
            try:
                written += ray.get(ready[0])
            except Exception as exc:  # a task's error is reported, the others carry on
                error = f"trial {task.trial_id} layer {task.layer}: {(str(exc).strip().splitlines() or ['error'])[-1][:300]}"
                failed.append(error)
            finished += 1
            if on_task is not None:
                on_task(finished, len(plan.tasks), error)
        return ProbeOutcome(written, tuple(failed), time.perf_counter() - t0)
    finally:
        if started_here:
            ray.shutdown()
