"""Runs columns described at rest: the writer stamps every runs file's Arrow schema metadata with
the kind and role of each column beyond the core (`resultstore.schema.declared_columns`: the
optimisers' own hyper-parameters), and reading a store declares every column its files stamp.
So a process that never imports study (a report, a query) knows an optimiser's column, labels,
selects and charts it by its role, from the store alone.

A runs file without a stamp was written before stamps: it is read as stamped with
`LEGACY_COLUMNS` (declared at import, so such a file reads as it always has).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow.parquet as pq

from resultstore.schema import LEGACY_COLUMNS, Role, declare_runs_column, declared_columns

__all__ = ["STAMP", "declare_stamp", "declare_stored", "stamp"]

STAMP = b"resultstore.runs_columns"
"""The runs file's schema metadata key: JSON [[name, kind, role], ...] in file order."""


def stamp() -> dict[bytes, bytes]:
    """The schema metadata a runs file is written with: every declared column's kind and role."""
    return {STAMP: json.dumps([[c, k, r.value] for c, k, r in declared_columns()], separators=(",", ":")).encode()}


def declare_stamp(metadata: Mapping[bytes, bytes] | None, where: str) -> None:
    """Declare the columns one runs file's schema metadata stamps (LEGACY_COLUMNS where it has
    none). A stamp the process cannot hold (unreadable, or a column of another kind or role than
    declared here) is a ValueError naming `where` (the file)."""
    if not metadata or STAMP not in metadata:
        entries: Any = LEGACY_COLUMNS
    else:
        try:
            entries = [(c, k, Role(r)) for c, k, r in json.loads(metadata[STAMP])]
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: unreadable runs column stamp ({exc})") from None
    for name, kind, role in entries:
        try:
            declare_runs_column(name, kind, role)
        except ValueError as exc:
            raise ValueError(f"{where}: stamped {exc}") from None


def declare_stored(fs: Any, paths: list[str], prefix: str = "") -> None:
    """Declare the columns stamped in these runs files (paths within the pyarrow filesystem `fs`;
    `prefix` puts a URI's scheme back in a message). Footers are read one by one on a local disk
    (parsing them holds the GIL), sixteen at a time from an object store (a request each)."""
    from concurrent.futures import ThreadPoolExecutor

    def metadata(path: str) -> dict[bytes, bytes] | None:
        with fs.open_input_file(path) as f:
            return pq.ParquetFile(f).metadata.metadata

    if not paths:
        return
    if prefix:
        with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
            found = list(pool.map(metadata, paths))
    else:
        found = [metadata(p) for p in paths]
    for path, meta in zip(paths, found):
        declare_stamp(meta, f"{prefix}{path}")
