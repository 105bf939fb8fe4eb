"""Open a sweep's results store as lazy Polars tables.

    >>> r = load("results/scaling")
    >>> r.runs.filter(pl.col("status") == "done").collect()

A sweep folder holds Parquet files only, one folder per table (``runs/``, ``metrics/``,
``curves/``, ``checks/``; any may be missing) and possibly other, non-table folders
(``ray/``, ``trials/``), which are ignored. Nothing is read here but directory listings
and one Parquet footer per table; every table is a ``pl.LazyFrame`` whose columns are
cast to the contract's types (``RUNS_SCHEMA`` and friends), so files written with a
narrower integer type or an all-null column still stack.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analysis import storage
from analysis.schema import (  # re-exported: the contract lives in schema.py
    CHECKS_SCHEMA,
    CURVES_SCHEMA,
    DIMS_SCHEMA,
    METRICS_SCHEMA,
    RUNS_SCHEMA,
    SAE_SCHEMA,
    SCHEMAS,
    TABLES,
)

__all__ = [
    "CHECKS_SCHEMA",
    "CONFIG_ID",
    "CURVES_SCHEMA",
    "DIMS_SCHEMA",
    "LABEL_COLUMNS",
    "METRICS_SCHEMA",
    "RUNS_SCHEMA",
    "SAE_SCHEMA",
    "SIZE_COLUMNS",
    "TABLES",
    "NoSweepError",
    "Results",
    "config_label",
    "find_sweep",
    "load",
    "rotation_label",
]

# A config is a trial's science config without its seed: the runs column ``config_id`` (a hash
# written by the study, see analysis.identity). Seeds are its replicates; every seed aggregate
# groups by it, never by a hand-picked list of columns, so two configs that differ in any
# hyper-parameter (momentum, eps, rotation groups, ...) are never averaged together.
CONFIG_ID = "config_id"
SIZE_COLUMNS = ("d_model", "n_layers", "n_heads", "d_mlp", "params", "params_non_embedding")
LABEL_COLUMNS = (
    "optimizer", "optimizer_family", "lr", "momentum", "nesterov", "weight_decay", "eps",
    "beta1", "beta2", "rotate", "norm", "rotation", "group_size", "rotation_groups",
    "rotation_label", "precondition_frequency", "muon_ends",
)  # fmt: skip
"""Run columns that are functions of ``config_id``: carried along aggregates as labels (the
first value per config), never grouped by."""

_CAST = pl.ScanCastOptions(
    integer_cast="upcast", float_cast="upcast", categorical_to_string="allow"
)


class NoSweepError(ValueError):
    """The path holds no sweep (or several, and it is unclear which one was meant)."""


@dataclass(frozen=True, eq=False)
class Results:
    """One sweep's tables, lazily. Empty frames (with the contract's schema) stand in for
    tables that have no files. ``files`` lists the Parquet files behind each table."""

    path: str
    runs: pl.LazyFrame = field(repr=False)
    metrics: pl.LazyFrame = field(repr=False)
    curves: pl.LazyFrame = field(repr=False)
    checks: pl.LazyFrame = field(repr=False)
    dims: pl.LazyFrame = field(default_factory=lambda: pl.LazyFrame(schema=DIMS_SCHEMA), repr=False)
    """Outlier-dimension attribution (empty for sweeps that predate the table)."""
    sae: pl.LazyFrame = field(default_factory=lambda: pl.LazyFrame(schema=SAE_SCHEMA), repr=False)
    """`sweep probe sae`'s rows (empty when the probe never ran)."""
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        """The sweep's name: its folder's name."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def tables(self) -> dict[str, pl.LazyFrame]:
        """``{"runs": ..., "metrics": ..., "curves": ..., "checks": ..., "dims": ..., "sae": ...}``."""
        return {t: getattr(self, t) for t in TABLES}

    def done_runs(self) -> pl.LazyFrame:
        """Runs whose status is ``done`` (failed and diverged trials excluded)."""
        return self.runs.filter(pl.col("status") == "done")

    def __repr__(self) -> str:
        counts = ", ".join(f"{t}={len(self.files.get(t, ()))}" for t in TABLES)
        return f"Results({self.path!r}, files: {counts})"


def load(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> Results:
    """Open the sweep at ``path`` (a local folder, or ``s3://`` / ``gs://``).

    ``path`` is the sweep folder (one holding ``runs/``, ``metrics/``, ``curves/`` or
    ``checks/``), or a results folder holding exactly one sweep folder. Raises
    ``NoSweepError`` (a ``ValueError``) when it holds none, or several (listing them).
    ``storage_options`` go to ``pl.scan_parquet`` for remote paths (default: derived by
    ``analysis.storage`` from the environment, e.g. ``AWS_ENDPOINT_URL``); listing uses the
    same pyarrow filesystem as the writer.
    """
    fs, root, prefix = _filesystem(path)
    sweep = _find_sweep(fs, root, display=str(path))
    opts = dict(storage_options) if storage_options else storage.storage_options(path)
    tables: dict[str, pl.LazyFrame] = {}
    files: dict[str, tuple[str, ...]] = {}
    for table in TABLES:
        found = _parquet_files(fs, f"{sweep}/{table}")
        verify_footers(fs, found, prefix)
        files[table] = tuple(prefix + f for f in found)
        tables[table] = _scan(fs, found, files[table], SCHEMAS[table], opts)
    return Results(path=prefix + sweep, files=files, **tables)


class DamagedFileError(ValueError):
    """A Parquet file of the sweep cannot be read (one line, naming it)."""


def verify_footers(fs: Any, found: list[str], prefix: str = "") -> None:
    """Read every file's footer: a truncated or damaged file is named here, not deep in a query.
    Sixteen at a time (I/O: one request per file on an object store); the first damaged file
    in ``found`` order is named."""
    from concurrent.futures import ThreadPoolExecutor

    if not found:
        return
    with ThreadPoolExecutor(max_workers=min(16, len(found))) as pool:
        for path, reason in zip(found, pool.map(lambda p: _footer_error(fs, p), found)):
            if reason is not None:
                raise DamagedFileError(f"{prefix}{path}: damaged Parquet file ({reason}); "
                                       "`sweep run` moves it to quarantine/ and re-runs its trial")


def _footer_error(fs: Any, path: str) -> str | None:
    import pyarrow.parquet as pq

    try:
        with fs.open_input_file(path) as f:
            pq.ParquetFile(f).schema_arrow
    except Exception as exc:  # pyarrow raises OSError / ArrowInvalid for a bad footer
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return None


def rotation_label() -> pl.Expr:
    """The stored ``rotation_label`` (``none``, ``partial(2)``, ``groups[[0,1],[2]]``, ...);
    for rows written before that column existed, ``rotation`` with ``(k)`` for a partial
    plan's group size. The one place a label is derived."""
    gs = pl.col("group_size")
    derived = (
        pl.when((pl.col("rotation") == "partial") & gs.is_not_null())
        .then(pl.format("partial({})", gs))
        .otherwise(pl.col("rotation"))
    )
    return pl.coalesce(pl.col("rotation_label"), derived).alias("rotation_label")


def find_sweep(path: str | os.PathLike[str]) -> str:
    """The sweep folder (path or URI) at ``path``: itself, or the one sweep inside it.
    Raises ``NoSweepError`` like ``load``."""
    fs, root, prefix = _filesystem(path)
    return prefix + _find_sweep(fs, root, display=str(path))


def config_label(
    parts: Sequence[str] = ("optimizer", "norm", "rotation"), *, sep: str = " · "
) -> pl.Expr:
    """A readable label for a config, as an expression over run columns.

    ``rotation`` reads the stored ``rotation_label`` (see ``rotation_label``), e.g.
    ``"adam · layernorm · shared"`` or ``"sgd · rmsnorm_scalar · partial(2)"``.
    Nulls read ``?``. Use it with ``.with_columns(label=config_label())``."""
    exprs = []
    for p in parts:
        e = rotation_label() if p == "rotation" else pl.col(p)
        exprs.append(e.cast(pl.String).fill_null("?"))
    return pl.concat_str(exprs, separator=sep).alias("config")


# ---------------------------------------------------------------- internals


def _filesystem(path: str | os.PathLike[str]) -> tuple[Any, str, str]:
    """(pyarrow filesystem, root path within it, URI prefix to put back for polars)."""
    fs, root = storage.filesystem(path)
    s = storage.scheme(path)
    return fs, root.rstrip("/") or root, f"{s}://" if s else ""


def _info(fs: Any, path: str) -> Any:
    return fs.get_file_info(path)


def _is_sweep(fs: Any, folder: str) -> bool:
    from pyarrow import fs as pafs

    infos = fs.get_file_info([f"{folder}/{t}" for t in TABLES])
    return any(i.type == pafs.FileType.Directory for i in infos)


def _find_sweep(fs: Any, root: str, display: str) -> str:
    from pyarrow import fs as pafs

    expected = (
        "expected a sweep folder holding runs/, metrics/, curves/ or checks/ Parquet folders, "
        "or a results folder holding exactly one such sweep folder"
    )
    kind = _info(fs, root).type
    if kind == pafs.FileType.NotFound:
        raise NoSweepError(f"{display}: no such folder ({expected})")
    if kind != pafs.FileType.Directory:
        raise NoSweepError(f"{display}: not a folder ({expected})")
    if _is_sweep(fs, root):
        return root
    children = sorted(
        i.path
        for i in fs.get_file_info(pafs.FileSelector(root))
        if i.type == pafs.FileType.Directory and not i.base_name.startswith((".", "_"))
    )
    sweeps = [c for c in children if _is_sweep(fs, c)]
    if len(sweeps) == 1:
        return sweeps[0]
    if sweeps:
        names = ", ".join(s.rsplit("/", 1)[-1] for s in sweeps)
        raise NoSweepError(
            f"{display}: holds {len(sweeps)} sweeps ({names}); pass one of them, "
            f"e.g. {display.rstrip('/')}/{sweeps[0].rsplit('/', 1)[-1]}"
        )
    raise NoSweepError(f"{display}: no sweep found ({expected})")


def _parquet_files(fs: Any, folder: str) -> list[str]:
    """Every ``*.parquet`` under ``folder`` (recursively), skipping hidden and temporary
    files (names starting with ``.`` or ``_``: in-flight atomic writes)."""
    from pyarrow import fs as pafs

    selector = pafs.FileSelector(folder, allow_not_found=True, recursive=True)
    out = []
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
            continue
        rel = info.path[len(folder) :].strip("/")
        if any(part.startswith((".", "_")) for part in rel.split("/")):
            continue
        out.append(info.path)
    return sorted(out)


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
    if storage.scheme(uris[0]) is None:
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
