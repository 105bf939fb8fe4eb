"""The results store: the bottom layer that `sweep` writes through and `analysis` reads through.

    schema   the tables' columns and types (Arrow for the writer, Polars for the reader)
    uri      local paths and s3:// / gs:// URIs: filesystems, endpoints, check_writable
    ids      trial_id / config_id: hashes of a config's canonical JSON (the one implementation)
    layout   where the files are; the one listing rule; DamagedFile, NoSweepError
    writer   ResultsStore: one sweep's folder, written atomically, verified, quarantined
    lock     SweepLock: one writer per sweep
    reader   load(): a sweep's tables as lazy Polars frames (what analysis.load is)

It imports nothing from study, sweep or analysis, nor torch or ray (tests/test_resultstore.py).
Names are importable from the package (`from resultstore import ResultsStore`); a submodule is
imported on first use of one of its names, so `import resultstore` alone is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "ARROW": "schema", "SCHEMAS": "schema", "TABLES": "schema", "FINISHED": "schema",
    "UNSUCCESSFUL": "schema", "STATUSES": "schema", "Status": "schema",
    "StorageError": "uri",
    "canonical_json": "ids", "digest": "ids", "science_hash": "ids",
    "DamagedFile": "layout", "NoSweepError": "layout", "FINAL_WEIGHTS": "layout", "table_files": "layout",
    "ResultsStore": "writer", "StoreStatus": "writer",
    "LockHeld": "lock", "SweepLock": "lock",
    "Results": "reader", "load": "reader",
}  # fmt: skip

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'resultstore' has no attribute {name!r}")
    return getattr(importlib.import_module(f"resultstore.{_HOME[name]}"), name)
