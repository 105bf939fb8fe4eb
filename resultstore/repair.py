"""What is wrong with a sweep's store, and setting it aside (`ResultsStore.writing` repairs under
the lock; `sweep verify` names the same things). Nothing is deleted: every file goes to
quarantine/, and a trial left short runs again from its start.

    damaged       a file whose footer, schema or (with pages) any data page cannot be read
    duplicates    rows sharing their table's primary key (resultstore.keys), by file
    weights       a checkpoint.pt or final.pt the caller's loader cannot load
    incomplete    a done trial whose rows do not cover its steps (ResultsStore.gaps_by_trial)
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from resultstore.keys import KEYS, Duplicate, duplicates as find_duplicates, intruders
from resultstore.layout import CHECKPOINT, FINAL_WEIGHTS, KEPT, kept_sha_error, page_error, read_manifest, trial_of
from resultstore.schema import ARROW, TABLES
from resultstore.stamps import declare_stamp
from resultstore.uri import first_line

__all__ = ["LoadCheck", "damaged", "duplicates", "quarantine", "quarantine_duplicates", "quarantine_incomplete",
           "quarantine_weights", "weights"]

LoadCheck = Callable[[bytes, str], "str | None"]
"""(a checkpoint's bytes, its trial id) -> why it cannot be loaded as that trial's, or None."""


def damaged(store, *, pages: bool = False) -> list[tuple[str, str, str]]:
    """(table, file name, reason) for every file whose footer or schema is unreadable or does not
    match the contract; with `pages`, also every file with a data page that cannot be read, and
    every kept.parquet whose sha256 is not the one its store's manifest records."""
    bad = []
    try:
        manifest = read_manifest(store.fs, store.path) if pages else None
    except (OSError, ValueError):
        manifest = None  # sweep.store_health names an unreadable manifest
    for table in TABLES:
        want = ARROW[table]
        for name in store._list(table):
            path = f"{store.path}/{table}/{name}"
            try:
                with store.fs.open_input_file(path) as f:
                    footer = pq.ParquetFile(f)
                    schema = footer.schema_arrow
                if table == "runs":  # a column another process declared is known from its stamp
                    declare_stamp(footer.metadata.metadata, path)
                    want = ARROW[table]
                if table == "runs" and name != KEPT and footer.metadata.num_rows != 1:  # e.g. a copy of the table put there
                    raise ValueError(f"holds {footer.metadata.num_rows} rows; a runs file holds its trial's one "
                                     "row, written by `sweep run`")
                # a file of another table (a sweep nested in this one's metrics/) lacks its keys
                missing = [c for c in KEYS[table] if c not in schema.names]
                missing += [f"unknown {c}" for c in schema.names if c not in want.names]  # another table's, or none
                clash = [c for c in schema.names if c in want.names and schema.field(c).type != want.field(c).type
                         and not pa.types.is_null(schema.field(c).type)]
                if missing or clash:
                    raise ValueError(f"schema: missing {missing} / wrong type {clash} (the {table} table's "
                                     f"columns are resultstore/schema.py's)")
                why = page_error(store.fs, path) if pages else None
                if why is not None:
                    raise ValueError(f"data page: {why}")
                why = kept_sha_error(store.fs, store.path, table, manifest) if pages and name == KEPT else None
                if why is not None:
                    raise ValueError(why)
            except (OSError, ValueError, pa.ArrowException) as exc:
                bad.append((table, name, first_line(exc)))
    return bad


def _set_aside_trial(store, trial: str) -> None:
    """Move every file of the trial's rows, its runs row and its checkpoints to quarantine/."""
    for table in TABLES:
        for name in store._list(table):
            if trial_of(name) == trial:
                store._move_aside(f"{table}/{name}")
    for kept in (CHECKPOINT, FINAL_WEIGHTS):
        if store.fs.get_file_info(f"{store.path}/trials/{trial}/{kept}").type == pafs.FileType.File:
            store._move_aside(f"trials/{trial}/{kept}")


def quarantine(store, *, pages: bool = True) -> list[str]:
    """Move every damaged file to quarantine/, with its trial's runs row and checkpoint, so the
    trial is incomplete and runs again from the start. One line per file moved."""
    moved = []
    for table, name, reason in damaged(store, pages=pages):
        trial = trial_of(name)
        store._move_aside(f"{table}/{name}")
        moved.append(f"{store.uri}/{table}/{name}: damaged ({reason}); moved to "
                     f"{store.uri}/quarantine/{table}/ and trial {trial} will run again")
        if table != "runs" and store.fs.get_file_info(f"{store.path}/runs/{trial}.parquet").type == pafs.FileType.File:
            store._move_aside(f"runs/{trial}.parquet")
        if store.fs.get_file_info(f"{store.path}/trials/{trial}/{CHECKPOINT}").type == pafs.FileType.File:
            store._move_aside(f"trials/{trial}/{CHECKPOINT}")
    return moved


def duplicates(store) -> list[Duplicate]:
    """Every set of files whose rows share a primary key, table by table (call on a store with
    no damaged file: it reads every file's key columns)."""
    return [d for t in TABLES for d in find_duplicates(store.fs, f"{store.path}/{t}", t, store._list(t))]


def quarantine_duplicates(store) -> list[str]:
    """Move each file that repeats another's keys to quarantine/ (`resultstore.keys.intruders`):
    a copy goes alone; the writer's own overlapping files go with their trial's runs row, so the
    trial is left short and quarantine_incomplete sets it aside to run again. One line per file."""
    moved = []
    for table in TABLES:
        found = find_duplicates(store.fs, f"{store.path}/{table}", table, store._list(table))
        for name in intruders(store.fs, f"{store.path}/{table}", found):
            store._move_aside(f"{table}/{name}")
            moved.append(f"{store.uri}/{table}/{name}: repeats the keys of rows in another file; moved to "
                         f"{store.uri}/quarantine/{table}/ (a trial left short by it runs again)")
    return moved


def weights(store, load_check: LoadCheck) -> list[tuple[str, str]]:
    """(trials/<id>/<file>, reason) for every checkpoint.pt and final.pt `load_check` refuses."""
    listing = store.fs.get_file_info(pafs.FileSelector(f"{store.path}/trials", allow_not_found=True, recursive=True))
    bad = []
    for info in sorted(listing, key=lambda i: i.path):
        if info.type != pafs.FileType.File or info.base_name not in (CHECKPOINT, FINAL_WEIGHTS):
            continue
        trial = info.path.rsplit("/", 2)[-2]
        try:
            with store.fs.open_input_stream(info.path) as f:
                why = load_check(f.read(), trial)
        except OSError as exc:
            why = first_line(exc)
        if why is not None:
            bad.append((f"trials/{trial}/{info.base_name}", why))
    return bad


def quarantine_weights(store, load_check: LoadCheck) -> list[str]:
    """Set aside each checkpoint that cannot be loaded: a bad checkpoint.pt alone (its trial starts
    over if it is not finished), a bad final.pt with its whole trial, which runs again."""
    moved = []
    for rel, why in weights(store, load_check):
        trial = rel.split("/")[1]
        if rel.endswith(FINAL_WEIGHTS):
            _set_aside_trial(store, trial)
            moved.append(f"{store.uri}/{rel}: cannot be loaded ({why}); moved trial {trial} to "
                         f"{store.uri}/quarantine/ and it will run again")
        elif store.fs.get_file_info(f"{store.path}/{rel}").type == pafs.FileType.File:
            store._move_aside(rel)
            moved.append(f"checkpoint {store.uri}/{rel} cannot be loaded ({why}); moved to {store.uri}/quarantine/; "
                         "its trial, if not finished, restarts from step 0")
    return moved


def quarantine_incomplete(store) -> list[str]:
    """Move what is left of every done trial whose rows do not cover its steps (its runs row, parts,
    checks and checkpoints) to quarantine/, so it runs again from the start. Call after
    quarantine(): reads every file. One line per trial."""
    moved = []
    for trial, why in store.gaps_by_trial(store.read("runs")).items():
        _set_aside_trial(store, trial)
        moved.append(f"{store.uri}: trial {trial} is incomplete ({'; '.join(why)}); moved what is left of it "
                     f"to {store.uri}/quarantine/ and it will run again")
    return moved
