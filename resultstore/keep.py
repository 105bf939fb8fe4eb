"""Kept stores (`sweep keep`): a sweep's finished trials, one Parquet file per table.

A store `sweep run` writes holds a file per trial per table (a one-row runs file is mostly
footer); a kept store holds each table's rows in one ``<table>/kept.parquet`` (resultstore.layout)
and a manifest, ``kept.json``: the trial ids, each file's rows and sha256, and every keep that
wrote it (source, time, git sha, trials added). Every verb reads it as any store: its files are
listed by the one listing rule, and `sweep status --verify` checks each sha256.

    keep(source, dest)              add source's finished trials that dest lacks; rewrite dest
    units(store, table)             the writer's files of a table, read from either form
    live_problem(dest)              why dest is not a place to keep into (a live sweep's store)

Keeping again merges: dest's trials stay as they are (a trial kept is finished, so it is the
one kept when the source has it too), the new ones are added, and every file and the manifest
are rewritten. Rows are in the order of the writer's files they came from (by name: trial id,
then step range), each file's as written: the order a reader of those files saw, so every frame
reads back the same, and the same trials give the same bytes. The final weights (trials/<id>/final.pt) are copied as they are.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from resultstore.ids import canonical_json
from resultstore.layout import (
    CHECKPOINT, FINAL_WEIGHTS, KEPT, KEPT_FILES, LOCK_FILE, MANIFEST, kept_files, read_manifest, trial_of,
)
from resultstore.schema import FINISHED, TABLES
from resultstore.stamps import STAMP, declare_stamp, stamp
from resultstore.writer import ResultsStore

__all__ = ["Kept", "keep", "live_problem", "units"]


@dataclass(frozen=True)
class Kept:
    """What a keep did: trials added, those dest already held, those left out (finished, but
    their rows do not cover their steps), and dest's trials, rows per table and bytes after."""

    added: list[str]
    already: list[str]
    short: list[str]
    trials: int
    rows: dict[str, int] = field(default_factory=dict)
    size: int = 0


def units(store: ResultsStore, table: str, trials: set[str] | None = None) -> list[tuple[str, pa.Table]]:
    """(file name, rows) of each of the writer's files of `table`: the store's own (flat, as the
    writer writes them) and those each kept.parquet holds; with `trials`, only theirs."""
    out = []
    for name in store._list(table):
        path = f"{store.path}/{table}/{name}"
        if name == KEPT:
            out += [(n, t) for n, t in kept_files(store.fs, path) if trials is None or trial_of(n) in trials]
        elif "/" not in name and (trials is None or trial_of(name) in trials):
            with store.fs.open_input_file(path) as f:
                out.append((name, pq.read_table(f)))
    return out


def live_problem(dest: ResultsStore) -> str | None:
    """Why `dest` is no place to keep into: it is a live sweep's store (the writer's own files,
    run.lock, a trial's checkpoint or config) or some other folder, not a kept store or a new one."""
    info = dest.fs.get_file_info(dest.path)
    if info.type == pafs.FileType.NotFound:
        return None
    if info.type != pafs.FileType.Directory:
        return "it is a file, not a folder"
    own = [f"{t}/{n}" for t in TABLES for n in dest._list(t) if n != KEPT]
    if own:
        return (f"it is a live sweep's store (it holds the writer's own files, e.g. {own[0]}); keep into a new "
                "folder or into a store `sweep keep` wrote")
    listing = dest.fs.get_file_info(pafs.FileSelector(dest.path, recursive=True))
    live = sorted(i.path[len(dest.path) + 1:] for i in listing if i.type == pafs.FileType.File
                  and (i.base_name in (LOCK_FILE, CHECKPOINT, "config.json")))
    if live:
        return f"it is a live sweep's store (it holds {live[0]}); keep into a new folder or into a store `sweep keep` wrote"
    top = {i.base_name for i in dest.fs.get_file_info(pafs.FileSelector(dest.path))}
    other = sorted(top - {*TABLES, MANIFEST, "trials", "quarantine"})
    if other:
        return f"it holds {other[0]}, which is no part of a kept store; give a new folder or a kept store"
    return None


def _finished(source: ResultsStore, trial_ids: set[str] | None) -> tuple[set[str], set[str]]:
    """(source's finished trials whose rows cover their steps, finished ones whose rows do not)."""
    runs = source.read("runs")
    runs = runs.filter(runs["status"].is_in(list(FINISHED)))
    if trial_ids is not None:
        runs = runs.filter(runs["trial_id"].is_in(sorted(trial_ids)))
    short = set(source.gaps_by_trial(runs))
    return set(runs["trial_id"].to_list()) - short, short


def _renamed(rows: pa.Table, sweep: str) -> pa.Table:
    """A runs file's rows naming `sweep` (the column, and config_json's "sweep"), as
    ResultsStore.copy_finished writes a trial taken from another sweep; unchanged when they do."""
    if "sweep" not in rows.column_names or pc.all(pc.equal(rows["sweep"], sweep)).as_py():
        return rows
    configs = [canonical_json({**json.loads(c), "sweep": sweep}) for c in rows["config_json"].to_pylist()]
    rows = rows.set_column(rows.schema.get_field_index("config_json"), rows.schema.field("config_json"),
                           pa.array(configs, rows.schema.field("config_json").type))
    i = rows.schema.get_field_index("sweep")
    return rows.set_column(i, rows.schema.field(i), pa.array([sweep] * rows.num_rows, rows.schema.field(i).type))


def _kept_file(found: list[tuple[str, pa.Table]]) -> pa.Table:
    """One table of the writer's files `found`: their rows in the order of their names, each
    file's as written (the order a reader of the files read them in); the names and row counts
    in its metadata (layout.kept_files)."""
    meta: dict[bytes, bytes] = {}
    parts = []
    for name, rows in sorted(found, key=lambda u: u[0]):
        meta.update({k: v for k, v in (rows.schema.metadata or {}).items() if k != KEPT_FILES})
        if STAMP in meta:  # runs files: each one's columns declared, the union stamped below
            declare_stamp(rows.schema.metadata, name)
        parts.append(rows.replace_schema_metadata(None))
    listed = [[name, rows.num_rows] for name, rows in sorted(found, key=lambda u: u[0])]
    combined = pa.concat_tables(parts, promote_options="permissive")
    if STAMP in meta:  # every stamped column of every file, not only the last file's
        meta[STAMP] = json.dumps([e for e in json.loads(stamp()[STAMP]) if e[0] in combined.column_names],
                                 separators=(",", ":")).encode()
    return combined.replace_schema_metadata({**meta, KEPT_FILES: json.dumps(listed).encode()})


def keep(source: ResultsStore, dest: ResultsStore, trial_ids: set[str] | None = None, *,
         shown_source: str | None = None, git: str | None = None) -> Kept:
    """Keep `source`'s finished trials (done or diverged, rows covering their steps; with
    `trial_ids`, only those) that `dest` lacks in `dest`, compact. The caller holds dest's lock
    and has checked both stores (sweep.store_health) and that dest is no live store."""
    wanted, short = _finished(source, trial_ids)
    before = read_manifest(dest.fs, dest.path) if dest.exists() else None
    have = set(dest.read("runs")["trial_id"].to_list()) if dest.exists() else set()
    new = wanted - have
    if not new:
        return Kept([], sorted(wanted & have), sorted(short), len(have), size=_size(before))
    for trial_id in sorted(source.has_final_weights() & new):
        rel = f"trials/{trial_id}/{FINAL_WEIGHTS}"
        dest._write_bytes(rel, source._read_bytes(rel))
    tables = {}
    for table in (*[t for t in TABLES if t != "runs"], "runs"):  # runs last: a runs row marks its trial kept
        found = units(dest, table) + units(source, table, new)
        if table == "runs":
            found = [(n, _renamed(rows, dest.sweep)) for n, rows in found]
        if not found:
            continue
        buf = io.BytesIO()
        rows = _kept_file(found)
        pq.write_table(rows, buf, write_page_checksum=True, compression="zstd")
        data = buf.getvalue()
        dest._write_bytes(f"{table}/{KEPT}", data)
        tables[table] = {"file": f"{table}/{KEPT}", "rows": rows.num_rows, "sha256": hashlib.sha256(data).hexdigest(),
                         "bytes": len(data)}
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    history = [*(before or {}).get("keeps", []),
               {"source": shown_source or source.uri, "when": when, "git": git, "added": len(new)}]
    manifest = {"sweep": dest.sweep, "trials": sorted(have | new), "tables": tables, "keeps": history}
    dest._write_bytes(MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return Kept(sorted(new), sorted(wanted & have), sorted(short), len(have | new),
                {t: v["rows"] for t, v in tables.items()}, _size(manifest))


def _size(manifest: dict | None) -> int:
    return sum(v.get("bytes", 0) for v in ((manifest or {}).get("tables") or {}).values())
