"""The `sweep` command: run, plan, status, train, report, query. Thin: each command parses,
calls one function elsewhere, and prints. Exit codes: 0 all done, 1 a trial failed or
diverged, 2 bad input (a message, no traceback, nothing written)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Scaling-study sweeps: why residual streams grow basis-aligned outliers.")
out = Console(width=None if sys.stdout.isatty() else 160)  # piped output keeps whole tables
err = Console(stderr=True)

SpecArg = Annotated[Path, typer.Argument(help="Sweep spec YAML (see specs/).", show_default=False)]
ResultsOpt = Annotated[str, typer.Option("--results", "-r", help="Results root, a folder or s3:// / gs:// URI; "
                                         "the sweep writes <results>/<spec name>/. A custom S3 endpoint comes "
                                         "from AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3).")]
SweepArg = Annotated[str, typer.Argument(help="A sweep's results folder or URI (results/<name>, s3://bucket/study/<name>).",
                                         show_default=False)]
ASSUMED_FLOPS = {"cpu": 1.5e10, "cuda": 2e14}  # sustained training FLOP/s when the store has no runs yet


def bad_input(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def load(spec_path: Path):
    """Spec + grid, or exit 2 with the located message."""
    from sweep.grid import expand
    from sweep.spec import SpecError, load_spec

    try:
        spec = load_spec(spec_path)
        return spec, expand(spec)
    except SpecError as exc:
        raise bad_input(str(exc)) from None


def human(n: float, unit: str = "") -> str:
    for suffix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}{unit}"
    return f"{n:.3g}{unit}"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:,.0f}d"


def sweep_folder(results: str) -> str:
    """A sweep folder or URI, or a results root holding exactly one sweep -> the sweep's path/URI."""
    from analysis.load import NoSweepError, find_sweep

    try:
        return find_sweep(results)
    except (NoSweepError, OSError) as exc:  # StorageError is a ValueError like NoSweepError
        raise bad_input(str(exc).splitlines()[0]) from None


def open_store(results: str, sweep: str):
    """The ResultsStore at results/sweep, or exit 2 when it cannot be reached or written."""
    from analysis.storage import StorageError
    from sweep.store import ResultsStore

    try:
        store = ResultsStore(results, sweep)
        store.check_writable()
        return store
    except StorageError as exc:
        raise bad_input(str(exc)) from None


# ---- plan ------------------------------------------------------------------------------------


@app.command()
def plan(
    spec_path: SpecArg,
    results: ResultsOpt = "results",
    all_rows: Annotated[bool, typer.Option("--all", help="List every trial, not the first 40.")] = False,
) -> None:
    """List the grid: trial ids, shapes, parameters, tokens, FLOPs, estimated time, done or not."""
    spec, trials = load(spec_path)
    store = open_store(results, spec.name)
    runs = store.read("runs")  # once: statuses and measured throughput both come from it
    statuses = dict(zip(runs["trial_id"].to_list(), runs["status"].to_list()))
    flops_per_s = None
    if runs.height:
        done = runs.filter(runs["status"] == "done")
        if done.height:  # measured throughput of this machine/cluster, FLOP/s, median over runs
            flops_per_s = float((done["flops_per_token"] * done["tokens_per_s"]).median())
    table = Table(title=f"{spec.name}: {len(trials)} trials", show_lines=False)
    for col in ("#", "trial", "model (d×L×h)", "optimizer", "norm", "rotation", "seed", "params",
                "tokens", "FLOPs", "est.", "status"):
        table.add_column(col, justify="right" if col in ("#", "seed", "params", "tokens", "FLOPs", "est.") else "left")
    total_flops = pending_s = 0.0
    device = "cuda" if spec.resources.gpu > 0 or spec.device.startswith("cuda") else "cpu"
    rate = flops_per_s or ASSUMED_FLOPS[device]
    for i, t in enumerate(trials):
        flops = t.flops_per_token * t.total_tokens
        total_flops += flops
        status = statuses.get(t.trial_id, "pending")
        if status not in ("done", "diverged"):
            pending_s += flops / rate
        if all_rows or i < 40:
            m = t.model
            table.add_row(str(i), t.trial_id, f"{m.d_model}×{m.n_layers}×{m.n_heads}", t.optimizer.name,
                          t.norm, t.rotation.label, str(t.seed), human(t.params), human(t.total_tokens),
                          human(flops), duration(flops / rate), status)
    out.print(table)
    if not all_rows and len(trials) > 40:
        out.print(f"... {len(trials) - 40} more (--all lists them)")
    done_n = sum(statuses.get(t.trial_id) in ("done", "diverged") for t in trials)
    basis = "measured from finished runs" if flops_per_s else f"assuming {human(rate, 'FLOP/s')} per trial"
    out.print(f"{done_n}/{len(trials)} done · {human(total_flops, 'FLOP')} in all · "
              f"~{duration(pending_s)} of trial time left ({basis}) · results: {store.uri}")


# ---- run -------------------------------------------------------------------------------------


@app.command()
def run(
    spec_path: SpecArg,
    results: ResultsOpt = "results",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address (default: RAY_ADDRESS, else a local Ray).")] = None,
    max_concurrent: Annotated[Optional[int], typer.Option("--max-concurrent", min=1, help="Most trials at once.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate and show what would run; start nothing.")] = False,
) -> None:
    """Run every trial of the spec not yet complete in the store."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from analysis import storage
    from sweep.launch import run_sweep
    from sweep.spec import SpecError

    spec, trials = load(spec_path)
    if dry_run:
        plan(spec_path, results)
        return
    open_store(results, spec.name)  # exit 2 before Ray starts when the store is unreachable
    folder = storage.join(storage.normalize(results), spec.name)

    def on_start(todo):
        skipped = len(trials) - len(todo)
        out.print(f"[bold]{spec.name}[/]: {len(trials)} trials, {skipped} already complete, {len(todo)} to run"
                  f" → {folder}")
        from sweep.progress import ProgressCallback

        return [ProgressCallback(todo, progress)] if todo else None

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=out)
    try:
        with progress:
            outcome = run_sweep(spec, trials, results, address=address, max_concurrent=max_concurrent,
                                on_start=on_start)
    except (SpecError, storage.StorageError) as exc:
        raise bad_input(str(exc)) from None
    out.print(f"{outcome.launched} trials run, {outcome.skipped} skipped, in {duration(outcome.wall_s)}. "
              f"Results: [bold]{folder}[/]")
    if outcome.launched:
        out.print(f"  sweep status {folder}\n  sweep report {folder}\n"
                  f"  sweep query {folder} \"SELECT optimizer, avg(value) FROM metrics JOIN runs USING (trial_id) "
                  "WHERE metric = 'kurtosis' AND site = 'resid' AND basis = 'stored' GROUP BY optimizer\"")
    bad = outcome.failed + outcome.missing
    if bad:
        err.print(f"[red]{len(bad)} trial(s) failed, diverged or did not finish[/]: {', '.join(bad)}")
        raise typer.Exit(1)


# ---- status ----------------------------------------------------------------------------------


@app.command()
def status(results: SweepArg) -> None:
    """Counts of done / failed / diverged / started trials, and each failure's error line."""
    import pyarrow.fs as pafs

    from analysis import storage
    from sweep.store import ResultsStore

    folder = sweep_folder(results)
    store = ResultsStore(storage.parent(folder), storage.name(folder))
    runs = store.read("runs")
    counts = runs.group_by("status").len().sort("status")
    listing = store.fs.get_file_info(pafs.FileSelector(f"{store.path}/trials", allow_not_found=True))
    started = {i.base_name for i in listing if i.type == pafs.FileType.Directory}
    unfinished = started - set(runs["trial_id"].to_list())
    table = Table(title=f"{store.sweep}: {runs.height} trials with a result")
    table.add_column("status")
    table.add_column("trials", justify="right")
    for s, n in counts.iter_rows():
        table.add_row(s, str(n))
    if unfinished:
        table.add_row("started, no result (running or interrupted)", str(len(unfinished)))
    out.print(table)
    failed = runs.filter(runs["status"] != "done")
    for row in failed.iter_rows(named=True):
        line = (row["error"] or "").strip().splitlines()[-1:] or [f"at step {row['steps']}"]
        out.print(f"[red]{row['status']}[/] {row['trial_id']} {row['optimizer']} {row['norm']} "
                  f"{row['rotation_label']} d={row['d_model']} seed={row['seed']}: {line[0]}", highlight=False)
    if failed.height:
        raise typer.Exit(1)


# ---- train -----------------------------------------------------------------------------------


@app.command("train")
def train_one(
    spec_path: SpecArg,
    trial: Annotated[str, typer.Option("--trial", "-t", help="Trial id (or unique prefix) or 0-based grid index.")],
    results: ResultsOpt = "results",
) -> None:
    """Run one trial in-process, without Ray (debugging, benchmarks); writes the store."""
    from sweep.grid import select
    from sweep.spec import SpecError
    from sweep.store import ResultsStore
    from sweep.trainable import train_trial

    spec, trials = load(spec_path)
    try:
        cfg = select(trials, trial)
    except SpecError as exc:
        raise bad_input(str(exc)) from None
    store = open_store(results, spec.name)
    m = cfg.model
    out.print(f"trial {cfg.trial_id}: d_model {m.d_model}, {m.n_layers} layers, {cfg.norm}, "
              f"{cfg.rotation.label}, {cfg.optimizer.name} lr {cfg.optimizer.lr:g}, seed {cfg.seed}; "
              f"{human(cfg.params)} params, {cfg.total_steps} steps → {store.uri}")
    sink = store.sink(cfg.trial_id)
    t0 = time.perf_counter()

    def show(info: dict) -> None:
        out.print(f"  step {info['step']:>6}/{info['total_steps']}  val loss {info['val_loss']:.4f}  "
                  f"resid kurtosis {info['resid_kurtosis_mean']:.2f}  "
                  f"{human(info['tokens_per_s'] or 0, ' tok/s')}  {duration(time.perf_counter() - t0)}",
                  highlight=False)

    sink.progress = show  # type: ignore[method-assign]
    summary = train_trial(cfg, store, sink)
    out.print(f"{summary.status}: val loss {summary.final_val_loss:.4f} after {summary.steps} steps "
              f"in {duration(summary.wall_s)}. Results: [bold]{store.uri}[/]")
    if summary.status != "done":
        raise typer.Exit(1)


# ---- report, query ---------------------------------------------------------------------------


@app.command()
def report(
    results: SweepArg,
    out_dir: Annotated[Optional[str], typer.Option("--out", "-o", help="Output folder or URI (default <results>/report).")] = None,
    formats: Annotated[str, typer.Option("--format", "-f", help="Comma-separated: svg,png,pdf,html.")] = "svg,png",
) -> None:
    """Fit power laws and write paper-ready charts, tables and an index.html."""
    from analysis.report import write_report

    fmts = tuple(f.strip() for f in formats.split(",") if f.strip())
    unknown = set(fmts) - {"svg", "png", "pdf", "html"}
    if unknown:
        raise bad_input(f"--format: unknown {', '.join(sorted(unknown))} (choose from svg, png, pdf, html)")
    folder = sweep_folder(results)
    try:
        result = write_report(folder, out=out_dir, formats=fmts, on_progress=lambda m: out.print(f"  {m}"))
    except (ValueError, OSError) as exc:
        raise bad_input(str(exc).splitlines()[0]) from None
    out.print(f"Report: [bold]{getattr(result, 'index', None) or out_dir or folder + '/report'}[/]")


@app.command()
def query(
    results: SweepArg,
    sql: Annotated[str, typer.Argument(help="Polars SQL over the tables runs, metrics, curves, checks.")],
    out_file: Annotated[Optional[str], typer.Option("--out", "-o", help="Write to .csv or .parquet (a path or URI) instead of printing.")] = None,
    limit: Annotated[int, typer.Option(help="Rows to print.")] = 50,
) -> None:
    """Run SQL over the results and print a table (or write it with --out)."""
    import io

    import polars as pl

    from analysis import storage
    from analysis.load import load as load_results
    from analysis.queries import sql as run_sql

    folder = sweep_folder(results)
    if out_file is not None and not out_file.endswith((".csv", ".parquet")):
        raise bad_input(f"--out: {out_file} must end in .csv or .parquet")
    try:
        frame = run_sql(load_results(folder), sql)
    except (pl.exceptions.PolarsError, ValueError, OSError) as exc:
        raise bad_input(f"query: {str(exc).splitlines()[0]}") from None
    if out_file is not None:
        buf = io.BytesIO()
        frame.write_csv(buf) if out_file.endswith(".csv") else frame.write_parquet(buf)
        try:  # a local folder that does not exist yet is created; a URI is written through pyarrow
            fs, path = storage.filesystem(out_file)
            fs.create_dir(storage.parent(path), recursive=True)
            with fs.open_output_stream(path) as f:
                f.write(buf.getvalue())
        except (OSError, ValueError) as exc:
            raise bad_input(f"--out: {out_file}: {str(exc).splitlines()[0]}") from None
        out.print(f"{frame.height} rows → {out_file}")
        return
    with pl.Config(tbl_rows=limit, tbl_cols=-1, tbl_width_chars=200, fmt_str_lengths=60):
        out.print(frame, highlight=False)


if __name__ == "__main__":
    app()
