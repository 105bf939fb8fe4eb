"""The reader's side of the store: a sweep's tables as lazy Polars frames.

    >>> r = load("results/scaling")
    >>> r.runs.filter(pl.col("status") == "done").collect()

A sweep folder holds Parquet files only, one folder per table (``runs/``, ``metrics/``,
``curves/``, ``checks/``, ...; any may be missing) and possibly other, non-table folders
(``ray/``, ``trials/``), which are ignored; a table's files are those of the one listing rule
(``resultstore.layout.table_files``), the writer's too. Nothing is read here but directory
listings and every file's Parquet footer (a damaged file raises ``DamagedFile`` naming it);
every table is a ``pl.LazyFrame`` whose columns are cast to the contract's types
(``RUNS_SCHEMA`` and friends), so files written with a narrower integer type or an all-null
column still stack. ``analysis.load`` is this ``load``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import field, make_dataclass
from typing import Any

import polars as pl

from resultstore import layout, uri
from resultstore.schema import SCHEMAS, TABLES
from resultstore.stamps import declare_stored

__all__ = ["Results", "find_sweep", "load", "verify_footers"]

_CAST = pl.ScanCastOptions(
    integer_cast="upcast", float_cast="upcast", categorical_to_string="allow"
)


class _Tables:
    """What a Results does beyond holding its tables (see Results)."""

    path: str
    files: Mapping[str, tuple[str, ...]]

    @property
    def name(self) -> str:
        """The sweep's name: its folder's name."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def tables(self) -> dict[str, pl.LazyFrame]:
        """Every table by name, in ``TABLES`` order: ``{"runs": ..., "metrics": ..., ...}``."""
        return {t: getattr(self, t) for t in TABLES}

    def done_runs(self) -> pl.LazyFrame:
        """Runs whose status is ``done`` (failed and diverged trials excluded)."""
        return self.runs.filter(pl.col("status") == "done")  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        counts = ", ".join(f"{t}={len(self.files.get(t, ()))}" for t in TABLES)
        return f"Results({self.path!r}, files: {counts})"


def _empty(table: str) -> Callable[[], pl.LazyFrame]:
    return lambda: pl.LazyFrame(schema=SCHEMAS[table])


Results = make_dataclass(
    "Results",
    [("path", str),
     *[(t, pl.LazyFrame, field(default_factory=_empty(t))) for t in TABLES],
     ("files", Mapping[str, tuple[str, ...]], field(default_factory=dict))],
    bases=(_Tables,), frozen=True, eq=False, repr=False,  # _Tables.__repr__: the file counts
)
Results.__module__ = __name__  # for pickle (make_dataclass's module= is Python 3.12's)
Results.__doc__ = """One sweep's tables, lazily: a field per table of ``TABLES`` (``r.runs``, ``r.metrics``,
``r.dims``, ...), so a table declared in resultstore.schema is read with no line here. An empty
frame (with the contract's schema) stands in for a table that has no files (``dims`` and
``sae`` in sweeps that predate them). ``files`` lists the Parquet files behind each table."""


def load(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> Results:
    """Open the sweep at ``path`` (a local folder, or ``s3://`` / ``gs://``).

    ``path`` is the sweep folder (one holding ``runs/``, ``metrics/``, ``curves/`` or
    ``checks/``), or a results folder holding exactly one sweep folder. Raises
    ``NoSweepError`` (a ``ValueError``) when it holds none, or several (listing them).
    ``storage_options`` go to ``pl.scan_parquet`` for remote paths (default: derived by
    ``resultstore.uri`` from the environment, e.g. ``AWS_ENDPOINT_URL``); listing uses the
    same pyarrow filesystem as the writer.
    """
    fs, root, prefix = _filesystem(path)
    sweep = layout.find_sweep(fs, root, display=str(path))
    opts = dict(storage_options) if storage_options else uri.storage_options(path)
    tables: dict[str, pl.LazyFrame] = {}
    files: dict[str, tuple[str, ...]] = {}
    for table in TABLES:
        found = [f"{sweep}/{table}/{rel}" for rel in layout.table_files(fs, f"{sweep}/{table}")]
        verify_footers(fs, found, prefix)
        if table == "runs":  # the columns its files stamp, before the contract is read (resultstore.stamps)
            declare_stored(fs, found, prefix)
        files[table] = tuple(prefix + f for f in found)
        tables[table] = _scan(fs, found, files[table], SCHEMAS[table], opts)
    return Results(path=prefix + sweep, files=files, **tables)


def verify_footers(fs: Any, found: list[str], prefix: str = "") -> None:
    """Read every file's footer: a truncated or damaged file is named here, not deep in a query.
    Sixteen at a time (I/O: one request per file on an object store); the first damaged file
    in ``found`` order is named."""
    from concurrent.futures import ThreadPoolExecutor

    if not found:
        return
    with ThreadPoolExecutor(max_workers=min(16, len(found))) as pool:
        for path, reason in zip(found, pool.map(lambda p: layout.footer_error(fs, p), found)):
            if reason is not None:
                raise layout.DamagedFile.at(f"{prefix}{path}", reason)


def find_sweep(path: str | os.PathLike[str], *, started: bool = False) -> str:
    """The sweep folder (path or URI) at ``path``: itself, or the one sweep inside it.
    Raises ``NoSweepError`` like ``load``. ``started``: a sweep with no rows yet counts."""
    fs, root, prefix = _filesystem(path)
    return prefix + layout.find_sweep(fs, root, display=str(path), started=started)


def _filesystem(path: str | os.PathLike[str]) -> tuple[Any, str, str]:
    """(pyarrow filesystem, root path within it, URI prefix to put back for polars)."""
    fs, root = uri.filesystem(path)
    s = uri.scheme(path)
    return fs, root.rstrip("/") or root, f"{s}://" if s else ""


def _scan(
    fs: Any,
    found: list[str],
    uris: tuple[str, ...],
    contract: dict[str, pl.DataType],
    storage_options: dict[str, Any] | None,
) -> pl.LazyFrame:
    """Scan ``uris`` as one frame: the contract's columns with the contract's types (missing
    ones inserted as nulls), plus any extra columns the first file has (new grid axes)."""
    if not found:
        return pl.LazyFrame(schema=contract)
    if uri.scheme(uris[0]) is None:
        first = pl.read_parquet_schema(uris[0])  # local: polars reads the footer directly
    else:
        import pyarrow.parquet as pq

        first = pl.from_arrow(pq.read_schema(found[0], filesystem=fs).empty_table()).schema
    schema = dict(contract)
    schema.update({k: v for k, v in first.items() if k not in contract and v != pl.Null})
    return pl.scan_parquet(
        list(uris),
        schema=schema,
        missing_columns="insert",
        extra_columns="ignore",
        cast_options=_CAST,
        storage_options=storage_options,
    )
