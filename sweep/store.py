"""The results store: one folder per sweep, Parquet only (DESIGN.md "The results store").

    <root>/<sweep>/runs/<trial_id>.parquet                    one row, written last
    <root>/<sweep>/metrics/<trial_id>.<first>-<last>.parquet  long format, one part per flush
    <root>/<sweep>/curves/<trial_id>.<first>-<last>.parquet
    <root>/<sweep>/checks/<trial_id>.parquet
    <root>/<sweep>/trials/<trial_id>/config.json, checkpoint.pt (local stores)

Exactly once: a trial's rows are flushed as parts named by their step range just before each
checkpoint; a (re)start deletes the parts after the step it resumes from, so after any crash,
retry or resume no row is missing or doubled. Every file is written to a temporary name and
then moved into place. Local paths and s3:// or gs:// URIs go through pyarrow filesystems.
"""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from analysis import storage
from analysis.schema import ARROW, FINISHED, TABLES

SCHEMAS: dict[str, pa.Schema] = ARROW  # the contract: analysis/schema.py
_PART = re.compile(r"^(?P<trial>.+)\.(?P<first>\d+)-(?P<last>\d+)\.parquet$")


def _to_table(name: str, rows: list[dict]) -> pa.Table:
    schema = SCHEMAS[name]
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)


class ResultsStore:
    """One sweep's folder of Parquet tables (local path or s3:// / gs:// URI)."""

    def __init__(self, root: str | Path, sweep: str):
        self.uri = storage.join(storage.normalize(root), sweep)
        self.sweep = sweep
        self.local = not storage.is_remote(self.uri)
        self.fs, self.path = storage.filesystem(self.uri)

    def check_writable(self) -> None:
        """StorageError (one line) when the store cannot be reached or written; writes nothing."""
        storage.check_writable(self.uri)

    # -- low-level ----------------------------------------------------------------------

    def _write_atomic(self, rel: str, table: pa.Table) -> None:
        final = f"{self.path}/{rel}"
        parent = final.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}.parquet"
        buf = io.BytesIO()
        pq.write_table(table, buf)
        with self.fs.open_output_stream(tmp) as out:
            out.write(buf.getvalue())
        self.fs.move(tmp, final)

    def _list(self, table: str) -> list[str]:
        selector = pafs.FileSelector(f"{self.path}/{table}", allow_not_found=True)
        return sorted(i.base_name for i in self.fs.get_file_info(selector)
                      if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                      and not i.base_name.startswith("."))

    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type == pafs.FileType.Directory

    # -- writing ------------------------------------------------------------------------

    def write_run(self, row: dict) -> None:
        self._write_atomic(f"runs/{row['trial_id']}.parquet", _to_table("runs", [row]))

    def write_checks(self, trial_id: str, rows: list[dict]) -> None:
        rows = [{"trial_id": trial_id, **r} for r in rows]
        self._write_atomic(f"checks/{trial_id}.parquet", _to_table("checks", rows))

    def write_part(self, table: str, trial_id: str, rows: list[dict]) -> None:
        """One flushed slice of a trial's metrics or curves, named by its step range."""
        if not rows:
            return
        steps = [r["step"] for r in rows]
        rows = [{"trial_id": trial_id, **r} for r in rows]
        self._write_atomic(f"{table}/{trial_id}.{min(steps):09d}-{max(steps):09d}.parquet",
                           _to_table(table, rows))

    def discard(self, trial_id: str, after_step: int | None) -> None:
        """Delete a trial's parts with rows after `after_step` (all of them when None), its checks
        and its runs row: the state a (re)start from that step must see."""
        for table in ("metrics", "curves"):
            for name in self._list(table):
                m = _PART.match(name)
                if m and m["trial"] == trial_id and (after_step is None or int(m["last"]) > after_step):
                    self.fs.delete_file(f"{self.path}/{table}/{name}")
        for table in ("checks", "runs"):
            path = f"{self.path}/{table}/{trial_id}.parquet"
            if self.fs.get_file_info(path).type == pafs.FileType.File:
                self.fs.delete_file(path)

    def trial_dir(self, trial_id: str) -> Path | None:
        """Local folder for a trial's config and checkpoints (None for remote stores)."""
        return Path(self.path) / "trials" / trial_id if self.local else None

    def sink(self, trial_id: str) -> StoreSink:
        return StoreSink(self, trial_id)

    # -- reading ------------------------------------------------------------------------

    def read(self, table: str) -> pl.DataFrame:
        names = self._list(table)
        if not names:
            return pl.from_arrow(SCHEMAS[table].empty_table())
        tables = [pq.read_table(f"{self.path}/{table}/{n}", filesystem=self.fs, schema=SCHEMAS[table])
                  for n in names]
        return pl.from_arrow(pa.concat_tables(tables))

    def statuses(self) -> dict[str, str]:
        """trial_id -> status for every trial with a runs row."""
        runs = self.read("runs")
        return dict(zip(runs["trial_id"].to_list(), runs["status"].to_list()))

    def completed_ids(self) -> set[str]:
        """Trials that need no more work: done or diverged (failed ones are retried)."""
        return {t for t, s in self.statuses().items() if s in FINISHED}


@dataclass
class StoreSink:
    """study.train's Sink writing one trial into a ResultsStore, exactly once."""

    store: ResultsStore
    trial_id: str
    on_progress: Callable[[dict], None] | None = None
    """Called with study.train's live progress after each eval (e.g. `sweep train` prints it)."""
    _metrics: list[dict] = field(default_factory=list)
    _curves: list[dict] = field(default_factory=list)
    _checks: list[dict] = field(default_factory=list)

    def begin(self, resume_step: int | None) -> None:
        self._metrics, self._curves, self._checks = [], [], []
        self.store.discard(self.trial_id, resume_step)

    def metrics(self, rows: list[dict]) -> None:
        self._metrics += rows

    def curves(self, rows: list[dict]) -> None:
        self._curves += rows

    def checks(self, rows: list[dict]) -> None:
        self._checks += rows

    def flush(self, step: int) -> None:
        self.store.write_part("metrics", self.trial_id, self._metrics)
        self.store.write_part("curves", self.trial_id, self._curves)
        if self._checks:
            self.store.write_checks(self.trial_id, self._checks)
        self._metrics, self._curves, self._checks = [], [], []

    def checkpoint(self, step: int, directory: Path) -> None:
        pass

    def progress(self, info: dict) -> None:
        if self.on_progress is not None:
            self.on_progress(info)

    def run(self, row: dict) -> None:
        self.store.write_run(row)
