"""What a verb reads or writes: a spec loaded, `--results` and a sweep folder argument resolved
into a ResultsStore once, at the CLI, or exit 2 naming why not (nothing written, nothing started)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sweep.console import bad_input, refuse

__all__ = ["ResultsOpt", "SpecArg", "SweepArg", "config_problem", "load", "open_store", "refuse_damaged", "sweep_folder",
           "sweep_store"]

SpecArg = Annotated[Path, typer.Argument(help="Sweep spec YAML (see specs/).", show_default=False)]
ResultsOpt = Annotated[str, typer.Option("--results", "-r", help="Results root, a folder or s3:// / gs:// URI; "
                                         "the sweep writes <results>/<spec name>/. A custom S3 endpoint comes "
                                         "from AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3).")]


def load(spec_path: Path, *, unprepared_ok: bool = False):
    """Spec + grid, or exit 2 with the located message."""
    from sweep.grid import expand
    from sweep.spec import SpecError, load_spec

    try:
        spec = load_spec(spec_path, unprepared_ok=unprepared_ok)
        return spec, expand(spec)
    except SpecError as exc:
        raise bad_input(str(exc)) from None


SweepArg = Annotated[str, typer.Argument(help="A sweep's results folder or URI (results/<name>, s3://bucket/study/<name>).",
                                         show_default=False)]


def sweep_folder(results: str, *, started: bool = False) -> str:
    """A sweep folder or URI, or a results root holding exactly one sweep -> the sweep's path/URI.
    ``started``: a sweep whose run began and wrote no rows yet counts (for `sweep status`)."""
    from resultstore.layout import NoSweepError
    from resultstore.reader import find_sweep
    from resultstore.uri import StorageError

    try:
        return find_sweep(results, started=started)
    except (NoSweepError, StorageError, OSError) as exc:
        raise bad_input(str(exc).splitlines()[0]) from None


def open_store(results: str, sweep: str):
    """The ResultsStore at results/sweep, or exit 2 when `results` names nothing, cannot be
    reached or written, or resolves to inside another sweep's tables (their readers would take
    its files for rows of theirs)."""
    from resultstore.paths import output_problem, writes_into_a_sweep
    from resultstore.uri import StorageError
    from resultstore.writer import ResultsStore

    refuse(output_problem("--results", results) if not str(results).strip() else None)
    try:
        store = ResultsStore(results, sweep)  # the one place `--results` becomes a store
    except StorageError as exc:
        raise bad_input(str(exc)) from None
    why = writes_into_a_sweep(store.uri)
    if why is not None:
        raise bad_input(f"--results {results}: the sweep's folder {sweep}/ there would be {why.removeprefix('it is ')}")
    try:
        store.check_writable()
        return store
    except StorageError as exc:
        raise bad_input(str(exc)) from None


def sweep_store(folder: str):
    """The ResultsStore of the sweep folder `folder` (what sweep_folder resolved), to read."""
    import study.optim  # noqa: F401  (torch-free: each optimiser declares its own runs columns' roles)
    from resultstore.writer import ResultsStore

    return ResultsStore.at(folder)


def refuse_damaged(store, verb: str, *, rows: bool = True, pages: bool | None = None) -> None:
    """Exit 2 naming every problem of the store's health check (damaged files, keys repeated;
    with `rows`, incomplete trials too): `verb` would read damaged, doubled or incomplete data."""
    from sweep.store_health import check

    refuse(check(store, rows=rows, pages=pages).refusal(verb, store.uri))


def config_problem(store, trial_ids: list[str]) -> str | None:
    """Why a runs row `--reuse` would copy holds a config_json that is not a JSON object of that
    trial (it is rewritten for this sweep on the copy), or None."""
    import json

    import polars as pl

    runs = store.read("runs").filter(pl.col("trial_id").is_in(trial_ids)).select("trial_id", "config_json")
    for tid, text in runs.iter_rows():
        try:
            ok = isinstance(json.loads(text or ""), dict)
        except ValueError:
            ok = False
        if not ok:
            return (f"{store.uri}/runs: trial {tid}'s config_json is not a JSON object ({(text or '')[:40]!r}); "
                    "that store's runs row is damaged: re-run that trial there, or leave --reuse out")
    return None
