"""The writer's side of the store: `ResultsStore`, one sweep's folder of Parquet tables, and
`StoreSink`, study.train's sink writing one trial into it, exactly once.

`sweep run` and `sweep train` write through them, and read through it what a writer must know
(the finished trials, damaged files, rows missing). The layout is in `resultstore.layout`, the
columns in `resultstore.schema`, the one-writer lock in `resultstore.lock`.

One writer per sweep: `sweep run` holds run.lock (host, pid, start, lease expiry, refreshed by
a heartbeat); a second run refuses with LockHeld. Every Parquet file read is verified (footer
and schema); a damaged one raises DamagedFile naming it, and `sweep run` moves it (with its
trial's runs row and checkpoint) to quarantine/ so the trial runs again. Nothing is deleted.

Exactly once: a trial's rows are flushed as parts named by their step range just before each
checkpoint; a (re)start deletes the parts after the step it resumes from, so after any crash,
retry or resume no row is missing or doubled. Every file is written to a temporary name and
then moved into place. Local paths and s3:// or gs:// URIs go through pyarrow filesystems.
"""

from __future__ import annotations

import io
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from resultstore import repair as repair_, uri
from resultstore.ids import canonical_json
from resultstore.layout import (
    CHECKPOINT, FINAL_WEIGHTS, KEPT, PART, DamagedFile, in_parts, kept_files, table_files, trial_file, trial_of,
)
from resultstore.lock import HOLDING_ENV, SweepLock
from resultstore.paths import local_write_problem
from resultstore.schema import ARROW, FINISHED, SCHEMAS, TABLES
from resultstore.stamps import stamp
from resultstore.uri import StorageError, first_line

__all__ = ["ResultsStore", "StoreSink", "StoreStatus"]


def _to_table(name: str, rows: list[dict]) -> pa.Table:
    # a runs file stamps its columns' kinds and roles: any reader knows them (resultstore.stamps)
    schema = ARROW[name].with_metadata(stamp()) if name == "runs" else ARROW[name]
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)


class ResultsStore:
    """One sweep's folder of Parquet tables (local path or s3:// / gs:// URI)."""

    def __init__(self, root: str | Path, sweep: str):
        self.root = uri.normalize(root)
        """The results root (absolute path or URI): what a worker builds its own store from."""
        self.uri = uri.join(self.root, sweep)
        self.sweep = sweep
        self.local = not uri.is_remote(self.uri)
        self.fs, self.path = uri.filesystem(self.uri)
        self.holding: str | None = os.environ.get(HOLDING_ENV) or None
        """The token of the run.lock this writer works under (set while `writing`; in a trial's
        worker, from its driver): every write first checks the lock is still that one (LockLost)."""

    @classmethod
    def at(cls, folder: str | Path) -> ResultsStore:
        """The store of the sweep folder (path or URI) `folder`."""
        text = str(folder)
        return cls(uri.parent(text), uri.name(text))

    def check_writable(self) -> None:
        """StorageError (one line) when the store cannot be reached or written; writes nothing."""
        uri.check_writable(self.uri)
        problem = local_write_problem(self.path) if self.local else None
        if problem is not None:
            raise StorageError(problem)

    # -- low-level ----------------------------------------------------------------------

    def _write_atomic(self, rel: str, table: pa.Table) -> None:
        final = f"{self.path}/{rel}"
        parent = final.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}.parquet"
        buf = io.BytesIO()
        pq.write_table(table, buf, write_page_checksum=True)  # a damaged data page is then found (verify)
        self._put(tmp, final, buf.getvalue())

    def _put(self, tmp: str, final: str, data: bytes) -> None:
        """Write `data` to `tmp`, then move it to `final`; a failed write (a full disk) leaves no
        temporary file behind to hold the space."""
        self.check_held()
        try:
            with self.fs.open_output_stream(tmp) as out:
                out.write(data)
            self.fs.move(tmp, final)
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except OSError:
                pass
            raise

    def check_held(self) -> None:
        """LockLost when this writer works under a run.lock that another has taken over since."""
        if self.holding is not None:
            SweepLock.check(self, self.holding)

    def _list(self, table: str) -> list[str]:
        return table_files(self.fs, f"{self.path}/{table}")

    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type == pafs.FileType.Directory

    # -- writing ------------------------------------------------------------------------

    def write_run(self, row: dict) -> None:
        """A trial's runs row (it carries its trial_id): written last, it marks the trial finished."""
        self._write_atomic(trial_file("runs", row["trial_id"]), _to_table("runs", [row]))

    def write_rows(self, table: str, trial_id: str, rows: list[dict]) -> None:
        """One flushed slice of a trial's rows of `table`: a part named by its step range for a
        table in parts (metrics, curves, dims), else the trial's one file, replaced whole (checks)."""
        if not rows:
            return
        steps = (min(r["step"] for r in rows), max(r["step"] for r in rows)) if in_parts(table) else None
        rows = [{"trial_id": trial_id, **r} for r in rows]
        self._write_atomic(trial_file(table, trial_id, steps), _to_table(table, rows))

    def write_final_weights(self, trial_id: str, data: bytes) -> None:
        """A done trial's torch-saved final weights, atomically, local or remote."""
        self._write_bytes(f"trials/{trial_id}/{FINAL_WEIGHTS}", data)

    def read_final_weights(self, trial_id: str) -> bytes:
        with self.fs.open_input_stream(f"{self.path}/trials/{trial_id}/{FINAL_WEIGHTS}") as f:
            return f.read()

    def has_final_weights(self) -> set[str]:
        """Trials whose final weights are stored."""
        listing = self.fs.get_file_info(pafs.FileSelector(f"{self.path}/trials", allow_not_found=True, recursive=True))
        return {i.path.rsplit("/", 2)[-2] for i in listing
                if i.type == pafs.FileType.File and i.base_name == FINAL_WEIGHTS}

    def write_sae(self, trial_id: str, layer: int, sae_optimizer: str, rows: list[dict], variant: str = "") -> None:
        """One (trial, layer, SAE optimiser, SAE config)'s rows (both bases), atomically: a re-write
        replaces it. `variant`: "" for the default SAE config, else ".<hash>" (sweep.probe.file_variant)."""
        self._write_atomic(f"sae/{trial_id}.L{layer}.{sae_optimizer}{variant}.parquet", _to_table("sae", rows))

    def copy_finished(self, source: ResultsStore, trial_ids: Iterable[str]) -> list[str]:
        """Copy each of `trial_ids` that `source` (another sweep's store) finished, done or diverged
        with rows covering its steps, into this store, so it is not trained again: a trial id is the
        hash of the science config and seed, so the trial is the same one. Every file of the trial's
        rows and its final weights are copied as they are; its runs row, written last as a trial's
        is, names this sweep (the column and config_json's "sweep"). Returns the ids copied, sorted.
        The caller holds this store's lock; `source` is only read."""
        want = set(trial_ids)
        runs = source.read("runs").filter(pl.col("trial_id").is_in(sorted(want)) & pl.col("status").is_in(FINISHED))
        gaps = source.gaps_by_trial(runs)
        runs = runs.filter(~pl.col("trial_id").is_in(sorted(gaps)))
        ids = set(runs["trial_id"].to_list())
        for table in TABLES:
            if table == "runs":
                continue
            for name in source._list(table):
                if name == KEPT:  # a kept store's one file (`sweep keep`): each trial's files split out of it
                    for part, rows in kept_files(source.fs, f"{source.path}/{table}/{name}"):
                        if trial_of(part) in ids:
                            self._write_atomic(f"{table}/{part}", rows)
                elif "/" not in name and trial_of(name) in ids:  # the writer writes flat
                    self._write_bytes(f"{table}/{name}", source._read_bytes(f"{table}/{name}"))
        weights = source.has_final_weights() & ids
        for trial_id in sorted(weights):
            self._write_bytes(f"trials/{trial_id}/{FINAL_WEIGHTS}", source._read_bytes(f"trials/{trial_id}/{FINAL_WEIGHTS}"))
        for row in runs.to_dicts():
            row["config_json"] = canonical_json({**json.loads(row["config_json"]), "sweep": self.sweep})
            self._write_atomic(trial_file("runs", row["trial_id"]), _to_table("runs", [{**row, "sweep": self.sweep}]))
        return sorted(ids)

    def _read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(f"{self.path}/{rel}") as f:
            return f.read()

    def put_checkpoint(self, trial_id: str, directory: Path) -> None:
        """Copy the checkpoint rank 0 just wrote into `directory` to the trial's folder in the store,
        atomically (a temporary name, then a move), streamed: how a remote store keeps what a local
        store's trial folder holds, for a multi-worker trial whose retry may start on any node."""
        self.check_held()
        source = Path(directory) / CHECKPOINT
        final = f"{self.path}/trials/{trial_id}/{CHECKPOINT}"
        if self.local and source.resolve() == Path(final).resolve():
            return
        self.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        tmp = f"{final.rsplit('/', 1)[0]}/.tmp-{uuid.uuid4().hex}"
        with open(source, "rb") as f, self.fs.open_output_stream(tmp) as out:
            while chunk := f.read(1 << 24):
                out.write(chunk)
        self.fs.move(tmp, final)

    def fetch_checkpoint(self, trial_id: str, directory: Path) -> bool:
        """Copy the trial's stored checkpoint into `directory` (False when there is none)."""
        source = f"{self.path}/trials/{trial_id}/{CHECKPOINT}"
        if self.fs.get_file_info(source).type != pafs.FileType.File:
            return False
        Path(directory).mkdir(parents=True, exist_ok=True)
        with self.fs.open_input_stream(source) as f, open(Path(directory) / CHECKPOINT, "wb") as out:
            while chunk := f.read(1 << 24):
                out.write(chunk)
        return True

    def _write_bytes(self, rel: str, data: bytes) -> None:
        final = f"{self.path}/{rel}"
        parent = final.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        self._put(f"{parent}/.tmp-{uuid.uuid4().hex}", final, data)

    def discard(self, trial_id: str, after_step: int | None) -> None:
        """Delete a trial's parts with rows after `after_step` (all of them when None), its other
        files (checks) and, last, its runs row: the state a (re)start from that step must see."""
        self.check_held()
        for table in filter(in_parts, TABLES):
            for name in self._list(table):
                m = PART.match(name)
                if m and m["trial"] == trial_id and (after_step is None or int(m["last"]) > after_step):
                    self.fs.delete_file(f"{self.path}/{table}/{name}")
        whole = [t for t in TABLES if not in_parts(t) and t != "runs"]
        for table in (*whole, "runs"):
            path = f"{self.path}/{trial_file(table, trial_id)}"
            if self.fs.get_file_info(path).type == pafs.FileType.File:
                self.fs.delete_file(path)

    @contextmanager
    def writing(self, command: str, *, repair: bool = True, load_check: repair_.LoadCheck | None = None):
        """Hold run.lock as `command` (LockHeld when another writer holds it); with `repair`, move
        to quarantine/ first: damaged files (every page read), files repeating another's keys,
        checkpoints `load_check` cannot load, then trials left incomplete. Yields the warnings (a
        stale lock taken over, files moved), one line each."""
        lock = SweepLock(self, command)
        warning = lock.acquire()
        self.holding = lock.token
        try:
            notes = [warning] if warning else []
            if repair:
                notes += repair_.quarantine(self) + repair_.quarantine_duplicates(self)
                notes += repair_.quarantine_weights(self, load_check) if load_check else []
                notes += repair_.quarantine_incomplete(self)
            yield notes
        finally:
            self.holding = None
            lock.release()

    def trial_dir(self, trial_id: str) -> Path | None:
        """Local folder for a trial's config and checkpoints (None for remote stores)."""
        return Path(self.path) / "trials" / trial_id if self.local else None

    def sink(self, trial_id: str) -> StoreSink:
        return StoreSink(self, trial_id)

    # -- reading ------------------------------------------------------------------------

    def _read_file(self, table: str, name: str, columns: list[str] | None = None) -> pa.Table:
        path = f"{self.path}/{table}/{name}"
        try:
            return pq.read_table(path, filesystem=self.fs, schema=ARROW[table], columns=columns)
        except (OSError, pa.ArrowException) as exc:
            raise DamagedFile.at(f"{self.uri}/{table}/{name}", first_line(exc)) from None

    def read(self, table: str, columns: list[str] | None = None) -> pl.DataFrame:
        """The whole table (or those columns); DamagedFile names the first file that cannot be read."""
        names = self._list(table)
        if not names:  # not from_arrow: that imports pandas, 0.15 s of `sweep plan`
            return pl.DataFrame(schema={k: v for k, v in SCHEMAS[table].items() if columns is None or k in columns})
        return pl.from_arrow(pa.concat_tables([self._read_file(table, n, columns) for n in names]))

    def statuses(self) -> dict[str, str]:
        """trial_id -> status for every trial with a runs row."""
        runs = self.read("runs")
        return dict(zip(runs["trial_id"].to_list(), runs["status"].to_list()))

    def completed_ids(self) -> set[str]:
        """Trials that need no more work: done or diverged (failed ones are retried)."""
        return {t for t, s in self.statuses().items() if s in FINISHED}

    def damaged(self, pages: bool = False) -> list[tuple[str, str, str]]:
        """(table, file name, reason) for every file whose footer or schema is unreadable or does
        not match the contract; with `pages`, whose data pages cannot all be read too."""
        return repair_.damaged(self, pages=pages)

    def quarantine(self, pages: bool = True) -> list[str]:
        """Move every damaged file (every page read) to quarantine/, with its trial's runs row and
        checkpoint, so the trial runs again from the start. One line per file moved."""
        return repair_.quarantine(self, pages=pages)

    def _move_aside(self, rel: str) -> str:
        """Move `rel` to quarantine/ (never over an earlier one); returns where it went."""
        target = f"{self.path}/quarantine/{rel}"
        if self.fs.get_file_info(target).type != pafs.FileType.NotFound:
            target = f"{target}.{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        self.fs.move(f"{self.path}/{rel}", target)
        return target

    def set_aside_checkpoint(self, trial_id: str, path: Path) -> str | None:
        """Move the trial's checkpoint at `path` (one that cannot be loaded) to quarantine/ when it
        is the store's own; returns where it went, or None for a checkpoint outside the store."""
        rel = f"trials/{trial_id}/{CHECKPOINT}"
        if self.local and Path(path).resolve() == (Path(self.path) / rel).resolve():
            return self._move_aside(rel)
        return None

    def started_ids(self) -> set[str]:
        """Trials that began (a local trial folder exists) — with or without a runs row."""
        listing = self.fs.get_file_info(pafs.FileSelector(f"{self.path}/trials", allow_not_found=True))
        return {i.base_name for i in listing if i.type == pafs.FileType.Directory}

    def status(self, verify: bool = False, pages: bool = False) -> StoreStatus:
        """What `sweep status` shows: the runs, trials started with no result, the lock's holder,
        the damaged files (with `pages`, every page read) and, with verify, the rows missing."""
        damaged = self.damaged(pages)
        runs = self.read("runs") if not any(t == "runs" for t, _, _ in damaged) else _readable(self, "runs")
        unfinished = sorted(self.started_ids() - set(runs["trial_id"].to_list()))
        gaps = self.row_gaps(runs) if verify and not damaged else []  # a damaged file is named once, above
        return StoreStatus(runs, unfinished, damaged, SweepLock(self).holder(), gaps)

    def row_gaps(self, runs: pl.DataFrame) -> list[str]:
        """For each finished trial: every eval step up to its last has metrics rows, every step has
        a curves row, and each eval step has as many metrics rows as the first one."""
        try:
            return [f"{t}: {why}" for t, whys in self.gaps_by_trial(runs).items() for why in whys]
        except DamagedFile as exc:
            return [str(exc)]

    def gaps_by_trial(self, runs: pl.DataFrame) -> dict[str, list[str]]:
        """trial_id -> what its rows miss, for each done trial whose rows do not cover its steps
        (see row_gaps). Reads only the trial_id and step columns; DamagedFile when a file is."""
        gaps: dict[str, list[str]] = {}
        done = runs.filter(pl.col("status") == "done")
        if done.height == 0:
            return gaps
        metrics = self.read("metrics", ["trial_id", "step"]).group_by("trial_id", "step").len().sort("trial_id", "step")
        curves = self.read("curves", ["trial_id", "step"]).unique()
        by_trial = {k[0]: v for k, v in metrics.partition_by("trial_id", as_dict=True).items()}  # one pass, not one per trial
        curve_steps = {k[0]: set(v["step"].to_list()) for k, v in curves.partition_by("trial_id", as_dict=True).items()}
        empty = metrics.clear()
        for row in done.iter_rows(named=True):
            t, steps, why = row["trial_id"], row["steps"] or 0, []
            m = by_trial.get(t, empty)
            if m.height == 0:
                why.append("no metrics rows")
            else:
                # Every eval has the rows of the first (the final one may add end-of-run metrics).
                short = m.filter(pl.col("len") < m["len"][0])["step"].to_list()
                if short:
                    why.append(f"metrics rows short at steps {short[:8]} (expected {m['len'][0]} per eval)")
                found = m["step"].to_list()
                every = _eval_every(row.get("config_json")) or min((b - a for a, b in zip(found, found[1:])), default=steps or 1)
                # The scheduled evals must all be there; a checkpoint step adds an eval of its own
                # (rows at 500 with eval_every 300), which is no gap and does not set the interval.
                missing = sorted(set(range(found[0], steps + 1, every)) - set(found))
                if missing or found[-1] != steps:
                    why.append(f"no metrics rows at eval steps {(missing or [steps])[:8]}")
            have = curve_steps.get(t, set())
            lost = sorted(set(range(1, steps + 1)) - have)
            if lost:
                why.append(f"curves miss {len(lost)} of {steps} steps (first {lost[0]})")
            if why:
                gaps[t] = why
        return gaps

    def quarantine_incomplete(self) -> list[str]:
        """Move what is left of every done trial whose rows do not cover its steps to quarantine/
        (resultstore.repair.quarantine_incomplete). One line per trial."""
        return repair_.quarantine_incomplete(self)


def _readable(store: ResultsStore, table: str) -> pl.DataFrame:
    """The readable files of a table (the damaged ones are reported separately)."""
    parts = []
    for name in store._list(table):
        try:
            parts.append(store._read_file(table, name))
        except DamagedFile:
            pass
    return pl.from_arrow(pa.concat_tables(parts)) if parts else pl.DataFrame(schema=SCHEMAS[table])


@dataclass
class StoreStatus:
    """A sweep's state as stored: what `sweep status` prints."""

    runs: pl.DataFrame
    unfinished: list[str]          # started, no runs row: running or interrupted
    damaged: list[tuple[str, str, str]]
    lock: dict | None              # the current holder of run.lock, if any
    gaps: list[str]                # verify: trials whose rows do not cover their steps

    @property
    def failed(self) -> pl.DataFrame:
        return self.runs.filter(pl.col("status") != "done")

    @property
    def ok(self) -> bool:
        return not (self.failed.height or self.unfinished or self.damaged or self.gaps)


@dataclass
class StoreSink:
    """study.train's Sink writing one trial into a ResultsStore, exactly once."""

    store: ResultsStore
    trial_id: str
    on_progress: Callable[[dict], None] | None = None
    """Called with study.train's live progress after each eval (e.g. `sweep train` prints it)."""
    _rows: dict[str, list[dict]] = field(default_factory=dict)
    """Rows by table: a table in parts holds those not yet flushed; another, every row of this run."""
    _unwritten: set[str] = field(default_factory=set)
    """Tables with rows the next flush writes."""

    def begin(self, resume_step: int | None) -> None:
        self._rows, self._unwritten = {}, set()
        self.store.discard(self.trial_id, resume_step)

    def rows(self, table: str, rows: list[dict]) -> None:
        if table not in TABLES or table == "runs":
            others = ", ".join(t for t in TABLES if t != "runs")
            raise ValueError(f"{table!r}: not a table of trial rows (one of {others}; the runs row goes to run())")
        self._rows.setdefault(table, []).extend(rows)
        if rows:
            self._unwritten.add(table)

    def flush(self, step: int) -> None:
        for table in sorted(self._unwritten, key=TABLES.index):
            self.store.write_rows(table, self.trial_id, self._rows[table])
            if in_parts(table):  # a part per flush; another table's file is rewritten whole
                self._rows[table] = []
        self._unwritten.clear()

    def checkpoint(self, step: int, directory: Path) -> None:
        pass

    def progress(self, info: dict) -> None:
        if self.on_progress is not None:
            self.on_progress(info)

    def final_weights(self, data: bytes) -> None:
        self.store.write_final_weights(self.trial_id, data)

    def run(self, row: dict) -> None:
        self.store.write_run(row)


def _eval_every(config_json: str | None) -> int | None:
    """A trial's train.eval_every from its runs row's config_json (None when the row has none)."""
    if not config_json:
        return None
    try:
        every = json.loads(config_json).get("train", {}).get("eval_every")
    except (ValueError, AttributeError):
        return None
    return every if isinstance(every, int) and every > 0 else None
