"""The `sweep` command: run, plan, status, train, report, query. Thin: each command parses,
calls one function elsewhere, and prints. Exit codes (EXIT_CODES): 0 every trial done, or
diverged inside an lr ladder; 1 a trial failed, diverged outside a ladder or did not finish;
2 bad input (a message, no traceback, nothing written)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from sweep.cli_store import (ResultsOpt, SpecArg, SweepArg, config_problem, load, open_store, refuse_damaged, sweep_folder,
                             sweep_store)
from sweep.console import bad_input, duration, err, human, launch_deadline, out, q, reason, refuse

if TYPE_CHECKING:
    from resultstore.writer import ResultsStore

__all__ = ["app"]  # the typer app (the `sweep` console script); the rest serves its commands

EXIT_CODES = ("Exit codes: 0 every trial done, or diverged inside an lr ladder (its config differs from a done "
              "trial's only in the lr: the ladder's top bounds the lr, an expected outcome); 1 a trial failed, "
              "diverged outside a ladder or did not finish; 2 bad input.")
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Scaling-study sweeps: why residual streams grow basis-aligned outliers.\n\n" + EXIT_CODES)


# ---- plan ------------------------------------------------------------------------------------


@app.command()
def plan(
    spec_path: SpecArg,
    results: ResultsOpt = "results",
    all_rows: Annotated[bool, typer.Option("--all", help="List every trial, not the first 40.")] = False,
    device: Annotated[Optional[str], typer.Option(help="Device to estimate for (a sweep/throughput.json row or a "
                                                       "GPU name); default: cpu, or NVIDIA H200 for GPU specs.")] = None,
) -> None:
    """List the grid: trial ids, shapes, parameters, tokens, FLOPs, estimated time, done or not."""
    from resultstore.schema import FINISHED
    from sweep.axes import axis, point_axes, replicate
    from sweep.estimate import estimate, measured_flops_per_s
    from sweep.prepare.corpora import prepare_command
    from sweep.spec import unprepared
    from sweep.store_health import REPAIR, check as check_store

    spec, trials = load(spec_path, unprepared_ok=True)  # plan before `sweep data prepare` has run
    if unprepared(spec):
        out.print(f"[yellow]note:[/] data.tokens {q(str(spec.data.tokens))} is not prepared yet: sizes use its stated "
                  f"vocab_size {spec.data.vocab_size}; `sweep run` refuses until it exists. Prepare it with\n"
                  f"  {prepare_command(spec.data.tokens)}", highlight=False, soft_wrap=True)
    store = open_store(results, spec.name)
    # once: statuses and measured throughput both come from it. Footers and rows, not every page and
    # key (2.5x the time on docs/stores/families): plan is a quick look; run and verify read them all
    health = check_store(store, pages=False)
    if not health.damaged:  # incomplete trials are re-run like pending ones: named, not refused
        for line in health.problems:
            err.print(f"[yellow]warning:[/] {q(line)}", highlight=False, soft_wrap=True)
        if health.problems:
            err.print(REPAIR, highlight=False)
    runs = health.runs
    statuses = dict(zip(runs["trial_id"].to_list(), runs["status"].to_list()))
    if health.status is not None:  # running now, or interrupted: `sweep status` says which
        statuses.update({t: "started" for t in health.status.unfinished if t not in statuses})
    statuses.update(health.trials)
    gpu = spec.resources.gpu > 0 or any(o.gpu > 0 for o in spec.resources.by_size) or spec.device.startswith("cuda")
    try:
        est = estimate(trials, spec.resources.for_params, statuses, measured_flops_per_s(runs, gpu), gpu, device)
    except ValueError as exc:
        raise bad_input(str(exc)) from None
    table = Table(title=f"{spec.name}: {len(trials)} trials", show_lines=False)
    seed, shown = replicate(), [a for a in point_axes() if a.key not in ("model", "optimizer") and (  # the other axes:
        a.plan_always or any(a.value(t) != a.default[0] for t in trials))]  # always, or where one is off its default
    for col in ("#", "trial", "model (d×L×h)", "optimizer", "lr", *(a.key for a in shown), seed.key, "params", "tokens",
                "FLOPs", "est.", "status"):
        table.add_column(col, justify="right" if col in ("#", "lr", seed.key, "params", "tokens", "FLOPs", "est.") else "left")
    for i, t in enumerate(trials[:None if all_rows else 40]):
        table.add_row(str(i), t.trial_id, axis("model").label(t.model), t.optimizer.name, f"{t.optimizer.lr:g}",
                      *(a.label(a.value(t)) for a in shown), seed.label(seed.value(t)), human(t.params),
                      human(t.total_tokens), human(t.flops_per_token * t.total_tokens), duration(est.trial_s[i]),
                      statuses.get(t.trial_id, "pending"))
    out.print(table)
    if not all_rows and len(trials) > 40:
        out.print(f"... {len(trials) - 40} more (--all lists them)")
    done_n = sum(statuses.get(t.trial_id) in FINISHED for t in trials) if statuses else 0  # ids hash on first use
    unit = f"{est.device.removeprefix('NVIDIA ')}-hours" if gpu else "CPU-thread-hours"
    out.print(f"{done_n}/{len(trials)} done · {human(est.total_flops, 'FLOP')} in all · "
              f"~{duration(est.pending_s)} of trial time left · {est.pending_device_hours:,.0f} {unit} "
              f"({est.basis}) · results: {q(store.uri)}", highlight=False)
    if est.extrapolating:
        out.print("[yellow]note:[/] extrapolating: run benchmarks/bench_throughput.py on the target device "
                  "(GPU: benchmarks/gpu_check.sh) to measure its row of sweep/throughput.json")
    if health.damaged:  # unreadable files: what plan says of their trials may be wrong
        refuse(health.refusal("plan", store.uri))


# ---- run -------------------------------------------------------------------------------------


@app.command()
def run(
    spec_path: SpecArg,
    results: ResultsOpt = "results",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address (default: RAY_ADDRESS, else a local Ray).")] = None,
    max_concurrent: Annotated[Optional[int], typer.Option("--max-concurrent", min=1, help="Most trials at once.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate and show what would run; start nothing.")] = False,
    tracker: Annotated[Optional[str], typer.Option(help="Also log to wandb, mlflow or tensorboard (sweep/tracking.py).")] = None,
    tracker_uri: Annotated[Optional[str], typer.Option(
        help="W&B project, MLflow tracking URI or TensorBoard folder (defaults: privileged-bases, "
             "MLFLOW_TRACKING_URI or sqlite:///mlflow.db, ./tensorboard).")] = None,
    reuse: Annotated[Optional[str], typer.Option(
        help="Another sweep's folder or URI (results/<name>): each trial of this spec it finished (same trial id: "
             "the same science config and seed) is copied into this sweep's store, not trained again.")] = None,
    stop_launching_at: Annotated[Optional[str], typer.Option(
        "--stop-launching-at", help="Start no trial after this time: HH:MM today, a date and time "
        "(2026-12-05T09:30) or +DURATION from now (+2h30m). Trials running then finish; the rest wait for "
        "the next run (a job's walltime, a machine lent until a set hour).")] = None,
    report_each: Annotated[bool, typer.Option("--report", help="Redraw <results>/report/ (`sweep report`) after each "
                                         "trial that ends, in a process beside the run.")] = False,
) -> None:
    """Run every trial of the spec not yet complete in the store.

    Exit 0 when every trial it ran is done or diverged inside an lr ladder ("diverged (ladder)":
    its config differs from a done trial's only in the lr); 1 when one failed, diverged outside
    a ladder or left no result; 2 on bad input."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from resultstore.uri import StorageError
    from sweep.launch import address_problem, run_sweep
    from sweep.spec import SpecError, line_in

    spec, trials = load(spec_path)
    deadline = launch_deadline(stop_launching_at) if stop_launching_at is not None else None
    source = reused_store(reuse, results, spec.name, trials) if reuse is not None else None
    if dry_run:
        plan(spec_path, results)
        return
    refuse(address_problem(address))  # in seconds: Ray's own connect retries for minutes, silently
    store = open_store(results, spec.name)  # exit 2 before Ray starts when the store is unreachable
    if tracker is not None:  # a missing extra or an unreachable tracker: exit 2 before anything trains
        from sweep import tracking

        try:
            tracker_uri = tracking.check(tracker, tracker_uri)
        except tracking.TrackerError as exc:
            raise bad_input(str(exc)) from None
    folder = store.uri

    def on_start(todo):
        skipped = len(trials) - len(todo)
        statuses, running = store.statuses(), {t.trial_id for t in todo}
        diverged = [t.trial_id for t in trials if statuses.get(t.trial_id) == "diverged" and t.trial_id not in running]
        note = (f" ({len(diverged)} of them diverged: {', '.join(diverged[:5])}{' ...' if len(diverged) > 5 else ''};"
                " `sweep status` shows where)") if diverged else ""
        out.print(f"[bold]{spec.name}[/]: {len(trials)} trials, {skipped} already complete{note}, {len(todo)} to run"
                  f" → {q(folder)}")
        from sweep.estimate import planned_seconds
        from sweep.progress import ProgressCallback, ReportCallback

        if not todo:
            return None
        trackers = tracking.callbacks(tracker, tracker_uri, spec.name, todo) if tracker is not None else []
        trackers += [ReportCallback(folder, progress.console)] if report_each else []
        return [ProgressCallback(todo, progress, sweep_trials=trials, planned_s=planned_seconds(spec, todo)), *trackers]

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                        TimeElapsedColumn(), console=out)  # the time left is in the description (sweep.progress.Eta)
    try:
        with progress:
            outcome = run_sweep(spec, trials, store, address=address, max_concurrent=max_concurrent,
                                on_start=on_start, reuse=source, launch_deadline=deadline)
    except (SpecError, StorageError) as exc:
        loc = getattr(exc, "loc", None)  # a resource no node has: point at the spec's line
        line = line_in(spec_path, loc) if loc else None
        raise bad_input(f"{spec_path}: {exc}" + (f" (line {line})" if line else "") if loc else str(exc)) from None
    out.print(f"{run_summary(outcome)} Results: [bold]{q(folder)}[/]")
    if outcome.launched:
        out.print(f"  sweep status {q(folder)}\n  sweep report {q(folder)}\n"
                  f"  sweep query {q(folder)} \"SELECT optimizer, avg(value) FROM metrics JOIN runs USING (trial_id) "
                  "WHERE metric = 'kurtosis' AND site = 'resid' AND basis = 'stored' GROUP BY optimizer\"")
    if tracker is not None and outcome.launched:
        report_to_tracker(tracker, tracker_uri, store)
    if outcome.ladder:
        ladder = sorted(outcome.ladder)
        out.print(f"[yellow]{len(ladder)} diverged (ladder)[/]: {', '.join(ladder)}: each differs from a done trial "
                  "only in its lr, so it bounds that lr ladder from above (expected; `sweep report` picks the best "
                  "lr that finished)", highlight=False)
    bad = [t for t in outcome.failed if t not in outcome.ladder]
    if bad:
        err.print(f"[red]{len(bad)} trial(s) failed or diverged outside an lr ladder[/]: {', '.join(bad)}")
    if outcome.missing:
        err.print(f"[red]{len(outcome.missing)} trial(s) did not finish[/] (interrupted or killed; running the spec "
                  f"again resumes each from its last checkpoint): {', '.join(outcome.missing)}")
    if outcome.not_started:
        out.print(f"[yellow]{len(outcome.not_started)} trial(s) not started[/]: their turn came after "
                  f"--stop-launching-at {q(stop_launching_at or '')}; running the spec again runs them", highlight=False)
    if outcome.unexpected:
        raise typer.Exit(1)


def reused_store(reuse: str, results: str, name: str, trials) -> ResultsStore:
    """`--reuse`'s store, read-only: exit 2 when it names no sweep or this one; says how many of
    the spec's trials it finished (what `sweep run` will copy, less any already here)."""
    from resultstore import uri
    from resultstore.schema import FINISHED

    folder = sweep_folder(reuse)
    if uri.normalize(folder) == uri.join(uri.normalize(results), name):
        raise bad_input(f"--reuse {reuse}: that is this sweep's own store ({q(folder)}); name another sweep's")
    source = sweep_store(folder)
    refuse_damaged(source, "reuse")
    statuses = source.statuses()
    wanted = [t.trial_id for t in trials if statuses.get(t.trial_id) in FINISHED]
    if problem := config_problem(source, wanted):
        raise bad_input(f"--reuse {reuse}: {problem}")
    out.print(f"--reuse {q(source.uri)}: {len(wanted)} of the spec's {len(trials)} trials finished there",
              highlight=False)
    return source



def run_summary(outcome) -> str:
    """One line for the end of `sweep run`: what was launched, skipped, and how each launched trial ended.
    An interrupted run says so rather than counting its unfinished trials as run."""
    from resultstore.schema import STATUSES

    statuses = [s if t not in outcome.not_started else "not started" for t, s in outcome.statuses.items()]
    ended = [(status, statuses.count(status)) for status in (*STATUSES, "missing", "not started")]
    how = ", ".join(f"{n} {'unfinished' if status == 'missing' else status}" for status, n in ended if n)
    return (f"{outcome.launched} trials launched, {outcome.skipped} skipped, in {duration(outcome.wall_s)}"
            + (f": {how}." if how else "."))


def report_to_tracker(tracker: str, target: str, store) -> None:
    """The sweep's report (as `sweep report` writes it), attached where the tracker keeps the sweep.
    A remote store's report is built in a local temporary folder for the upload (`sweep report`
    writes it into the bucket). A failure here is a warning: every result row is already stored."""
    import shutil
    import tempfile

    from analysis.report import write_report
    from sweep import tracking

    scratch = None if store.local else tempfile.mkdtemp(prefix="sweep-report-")
    try:
        result = write_report(store.uri, out=scratch, formats=("svg", "png"))
        where = tracking.attach_report(tracker, target, store.sweep, Path(result.out),
                                       location=None if scratch else result.out)
        out.print(f"Report attached: {escape(where)}")
    except Exception as exc:
        err.print(f"warning: the report was not attached to {tracker} ({escape(reason(exc))}); "
                  f"the results are unaffected: sweep report {q(store.uri)}")
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


# ---- status ----------------------------------------------------------------------------------


@app.command()
def status(
    results: SweepArg,
    verify: Annotated[bool, typer.Option("--verify", help="Also check every trial's rows cover its steps.")] = False,
) -> None:
    """Counts of done / failed / diverged / started trials, each failure's error line, damaged files.

    Exit 0 when every started trial is done or diverged inside an lr ladder ("diverged (ladder)":
    its config differs from a done trial's only in the lr); 1 when one failed, diverged outside a
    ladder or has no result; 2 when a file is damaged."""
    import polars as pl

    from resultstore.lock import SweepLock
    from sweep.launch import ladder_divergences, store_full
    from sweep.store_health import REPAIR, check, tune_errors

    store = sweep_store(sweep_folder(results, started=True))
    health = check(store, rows=verify, weights=verify)
    st = health.status
    damage, gaps = health.problems[:health.damage], health.problems[health.damage:]
    if st.damaged:  # named below, each with its reason; a checkpoint that cannot be loaded is named here
        damage = [p for p in damage if "damaged Parquet file" not in p]
    runs = st.runs
    ladder = ladder_divergences(runs)
    shown = runs.with_columns(pl.when(pl.col("trial_id").is_in(sorted(ladder))).then(pl.lit("diverged (ladder)"))
                              .otherwise(pl.col("status")).alias("status"))
    table = Table(title=f"{q(store.sweep)}: {runs.height} trials with a result")
    table.add_column("status")
    table.add_column("trials", justify="right")
    for s, n in shown.group_by("status").len().sort("status").iter_rows():
        table.add_row(s, str(n))
    if st.unfinished:
        table.add_row("started, no result (running or interrupted)", str(len(st.unfinished)))
    out.print(table)
    if st.lock is not None:
        why = SweepLock.stale(st.lock)
        out.print(f"run.lock: {'stale, ' + why if why else 'a run is in progress'} ({SweepLock.describe(st.lock)})",
                  highlight=False, markup=False)
    from analysis.labels import trial_labels  # names what varies among the store's trials

    labels = {}
    if st.failed.height:
        labels = dict(zip(runs["trial_id"].to_list(), trial_labels(runs.to_dicts()), strict=True))
    for row in st.failed.iter_rows(named=True):
        line = (row["error"] or "").strip().splitlines()[-1:] or [f"at step {row['steps']}"]
        label = labels.get(row["trial_id"])
        status = "[yellow]diverged (ladder)[/]" if row["trial_id"] in ladder else f"[red]{row['status']}[/]"
        out.print(f"{status} {row['trial_id']}" + (f" ({q(label)})" if label else "") + f": {q(line[0])}",
                  highlight=False)
    errors = tune_errors(store, st.unfinished) if st.unfinished else {}
    full = store_full(store) if st.unfinished or st.failed.height else None
    if full:  # the likeliest reason a started trial left no runs row, or only the driver's failed one
        err.print(f"[bold red]error:[/] {q(full)}", highlight=False, soft_wrap=True)
    for trial_id in st.unfinished:  # an error Tune recorded says why it has no runs row (a full disk)
        why = f"failed: {q(errors[trial_id])}" if trial_id in errors else "running, or interrupted"
        out.print(f"[yellow]started, no result[/] {trial_id}: {why} (`sweep run` re-runs it)", highlight=False)
    for gap in gaps:
        out.print(f"[red]incomplete rows[/] {q(gap)}", highlight=False)
    for line in damage:  # keys repeated, checkpoints that cannot be loaded: the rows read are wrong
        err.print(f"[bold red]error:[/] {q(line)}", highlight=False, soft_wrap=True)
    if damage and not st.damaged:
        err.print(REPAIR, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    if verify and not gaps and not st.damaged:
        out.print(f"verified: every file readable (every page), no key repeated, every checkpoint loads, rows of {runs.filter(runs['status'] == 'done').height} done "
                  "trials cover their steps", highlight=False)
    if st.damaged:
        for table_name, name, why in st.damaged:
            err.print(f"[bold red]error:[/] {q(store.uri)}/{q(table_name)}/{q(name)}: damaged Parquet file ({q(why)})",
                      highlight=False, soft_wrap=True)
        err.print("`sweep run` moves damaged files to quarantine/ and re-runs their trials", highlight=False)
        raise typer.Exit(2)
    if ladder:
        out.print(f"diverged (ladder): {len(ladder)} trial(s) differ from a done trial only in the lr; the top of an "
                  "lr ladder bounds it from above, an expected outcome (exit 0 when nothing else is wrong)",
                  highlight=False)
    if st.failed.filter(~pl.col("trial_id").is_in(sorted(ladder))).height or st.unfinished or gaps:
        raise typer.Exit(1)


@app.command()
def verify(results: SweepArg) -> None:
    """Check every file and every trial's rows (same as `sweep status --verify`)."""
    status(results, verify=True)


# ---- train -----------------------------------------------------------------------------------


@app.command("train")
def train_one(
    spec_path: SpecArg,
    trial: Annotated[str, typer.Option("--trial", "-t", help="Trial id (or unique prefix) or 0-based grid index.")],
    results: ResultsOpt = "results",
) -> None:
    """Run one trial in-process, without Ray (debugging, benchmarks); writes the store."""
    from resultstore.uri import StorageError
    from resultstore.writer import StoreSink
    from sweep.grid import select
    from sweep.spec import SpecError
    from sweep.store_health import load_error
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
              f"{human(cfg.params)} params, {cfg.total_steps} steps → {q(store.uri)}")
    t0 = time.perf_counter()

    def show(info: dict) -> None:
        out.print(f"  step {info['step']:>6}/{info['total_steps']}  val loss {info['val_loss']:.4f}  "
                  f"resid kurtosis {info['resid_kurtosis_mean']:.2f}  "
                  f"{human(info['tokens_per_s'] or 0, ' tok/s')}  {duration(time.perf_counter() - t0)}",
                  highlight=False)

    try:
        with store.writing("sweep train", load_check=load_error) as notes:  # LockHeld (exit 2) beside a running `sweep run`
            for note in notes:
                err.print(f"[yellow]warning:[/] {q(note)}", highlight=False, soft_wrap=True)
            summary = train_trial(cfg, store, StoreSink(store, cfg.trial_id, on_progress=show))
    except StorageError as exc:  # the lock: held by another writer, or not writable
        raise bad_input(str(exc)) from None
    except OSError as exc:  # a full disk, a store gone read-only: the trial failed, the store is not corrupt
        err.print(f"[red]trial {cfg.trial_id} failed[/]: cannot write {q(store.uri)}: {q(reason(exc))}; "
                  "the next `sweep train` or `sweep run` of it starts it again", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    out.print(f"{summary.status}: val loss {summary.final_val_loss:.4f} after {summary.steps} steps "
              f"in {duration(summary.wall_s)}. Results: [bold]{q(store.uri)}[/]")
    if summary.status != "done":
        raise typer.Exit(1)


# ---- report, query ---------------------------------------------------------------------------


@app.command()
def report(
    results: SweepArg,
    out_dir: Annotated[Optional[str], typer.Option("--out", "-o", help="Output folder or URI (default <results>/report).")] = None,
    formats: Annotated[str, typer.Option("--format", "-f", help="Comma-separated: svg,png,pdf,html.")] = "svg,png",
    primary: Annotated[str, typer.Option("--primary", help="The one contrast declared before the run: "
                       "FAMILY[:AGAINST+AGAINST...][@FIT] (default per_coordinate against every other family "
                       "pooled, in the first fit), or 'none'. Every other p-value is Holm-adjusted.")] = "per_coordinate",
) -> None:
    """Fit power laws and write paper-ready charts, tables and an index.html."""
    from analysis.multiplicity import parse_primary
    from analysis.report import write_report
    from resultstore.paths import output_problem

    fmts = tuple(f.strip() for f in formats.split(",") if f.strip())
    unknown = set(fmts) - {"svg", "png", "pdf", "html"}
    if not fmts:
        raise bad_input(f"--format {formats!r}: names no format (choose from svg, png, pdf, html)")
    if unknown:
        raise bad_input(f"--format: unknown {', '.join(sorted(unknown))} (choose from svg, png, pdf, html)")
    try:  # the declared contrast is checked before the store is touched
        contrast = parse_primary(primary)
    except ValueError as exc:
        raise bad_input(f"--primary: {exc}") from None
    folder = sweep_folder(results)
    refuse(output_problem("--out", out_dir))
    refuse_damaged(sweep_store(folder), "report")
    try:
        result = write_report(folder, out=out_dir, formats=fmts, primary=contrast,
                              on_progress=lambda m: out.print(f"  {m}", markup=False))
    except (ValueError, OSError) as exc:
        raise bad_input(str(exc).splitlines()[0]) from None
    out.print(f"Report: [bold]{q(str(getattr(result, 'index', None) or out_dir or folder + '/report'))}[/]")


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

    from resultstore import uri as storage
    from resultstore.paths import output_problem
    from resultstore.reader import load as load_results
    from resultstore.schema import TABLES
    from analysis.queries import sql as run_sql
    from sweep.sql_guard import SqlRefused, check_select

    if out_file is not None and not out_file.endswith((".csv", ".parquet")):
        raise bad_input(f"--out: {out_file} must end in .csv or .parquet")
    try:  # parsed, before the store is touched: one SELECT over the sweep's tables
        check_select(sql, (*TABLES, "done_runs"))
    except SqlRefused as exc:
        raise bad_input(f"query: {exc}") from None
    folder = sweep_folder(results)
    refuse(output_problem("--out", out_file))
    refuse_damaged(sweep_store(folder), "query", rows=False, pages=True)  # readable but incomplete: fair to query
    try:
        frame = run_sql(load_results(folder), sql)
    except (pl.exceptions.PolarsError, ValueError, OSError) as exc:
        raise bad_input(f"query: {reason(exc)}") from None
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
        out.print(f"{frame.height} rows → {out_file}", markup=False, highlight=False)
        return
    with pl.Config(tbl_rows=limit, tbl_cols=-1, tbl_width_chars=200, fmt_str_lengths=60):
        out.print(frame, highlight=False)


from sweep.cli_data import data_app  # noqa: E402  (commands of their own modules, on this app)
from sweep.cli_keep import keep  # noqa: E402
from sweep.cli_next import next_ladders  # noqa: E402
from sweep.cli_probe import probe_app  # noqa: E402

app.command("next")(next_ladders)
app.command("keep")(keep)
app.add_typer(data_app, name="data")
app.add_typer(probe_app, name="probe")

if __name__ == "__main__":
    app()
