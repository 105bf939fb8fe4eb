"""`sweep probe sae`: TopK SAEs over a sweep's finished trials (sweep.probe does the work)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape

from sweep.cli_store import SweepArg, open_store, sweep_folder
from sweep.console import bad_input, duration, err, out, refuse

__all__ = ["probe_app"]  # its typer app; sweep.cli adds it

probe_app = typer.Typer(no_args_is_help=True, help="Probes over finished trials' final weights.")


@probe_app.command("sae")
def probe_sae(
    results: SweepArg,
    where: Annotated[Optional[str], typer.Option(help="SQL condition on the runs table, e.g. \"optimizer = 'adam'\".")] = None,
    layers: Annotated[Optional[str], typer.Option(help="Comma-separated residual layers (0 = embeddings); "
                                                  "default: each trial's middle and last.")] = None,
    tokens: Annotated[int, typer.Option(help="Held-out tokens per trial (3/4 train the SAEs, 1/4 measure them).")] = 16384,
    k: Annotated[int, typer.Option(help="Active latents per token (TopK).")] = 8,
    expansion: Annotated[int, typer.Option(help="Latents per residual dimension.")] = 8,
    steps: Annotated[int, typer.Option(help="SAE optimiser steps.")] = 2000,
    sae_optimizers: Annotated[str, typer.Option("--sae-optimizers", help="adam (per-coordinate), sgd (equivariant control).")] = "adam,sgd",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address (default: RAY_ADDRESS, else a local Ray).")] = None,
    cpus: Annotated[float, typer.Option(help="CPUs per task.")] = 1.0,
    gpus: Annotated[float, typer.Option(help="GPUs per task.")] = 0.0,
) -> None:
    """Train TopK SAEs on done trials' residual streams, in the stored and a random basis, by Adam
    and by SGD; rows go to the sweep's `sae` table. Finished units are skipped."""
    from pydantic import ValidationError

    from resultstore.uri import StorageError
    from study.sae import SAEConfig
    from sweep.launch import address_problem
    from sweep.probe import ProbeInputError, plan_probe, refuse_where
    from sweep.store_health import check as check_store

    folder = sweep_folder(results)
    try:
        layer_list = [int(v) for v in layers.split(",")] if layers else None
    except ValueError:
        raise bad_input(f"--layers: {layers!r} is not a comma-separated list of integers") from None
    try:
        sae_json = SAEConfig(k=k, expansion=expansion, steps=steps).model_dump_json()
    except ValidationError as exc:
        e = exc.errors()[0]
        raise bad_input(f"--{'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    if cpus <= 0 or gpus < 0:
        raise bad_input("--cpus must be > 0 and --gpus >= 0")
    refuse(address_problem(address))
    try:  # parsed before the store is read: one SELECT over the runs table
        refuse_where(where) if where else None
    except ProbeInputError as exc:
        raise bad_input(str(exc)) from None
    store = open_store(*folder.rstrip("/").rsplit("/", 1))
    refuse(check_store(store).refusal("probe sae", store.uri))  # SAEs on a damaged trial would be wrong
    try:
        with store.writing("sweep probe sae", repair=False):  # one writer of the sweep's rows at a time
            plan = plan_probe(store, where=where, layers=layer_list, tokens=tokens,
                              sae_optimizers=tuple(o.strip() for o in sae_optimizers.split(",")), sae_json=sae_json)
            run_planned_probe(plan, folder, address, cpus, gpus)
    except (ProbeInputError, StorageError) as exc:
        raise bad_input(str(exc)) from None


def run_planned_probe(plan, folder: str, address: str | None, cpus: float, gpus: float) -> None:
    """Run a probe plan with a progress bar; exit 1 when a task failed or Ray did not start."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from sweep.probe import RayUnavailable, run_probe

    units = sum(len(t.sae_optimizers) for t in plan.tasks)
    out.print(f"{plan.trials} trials: {units} (trial, layer, SAE optimiser) to train, {plan.done} already done",
              highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=False) as bar:
        tick = bar.add_task("SAE probe tasks", total=len(plan.tasks) or 1, completed=0 if plan.tasks else 1)

        def on_task(done: int, total: int, error: str | None) -> None:
            bar.update(tick, completed=done)
            if error:
                bar.console.print(f"[red]failed[/] {escape(error)}", highlight=False)

        try:
            outcome = run_probe(plan, address=address, cpus=cpus, gpus=gpus, on_task=on_task)
        except RayUnavailable as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
    out.print(f"{outcome.written} rows written to {folder}/sae/ in {duration(outcome.wall_s)}", highlight=False)
    if outcome.failed:
        raise typer.Exit(1)


