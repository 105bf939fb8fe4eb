"""Where a sweep's files are, and which files are its tables' rows.

    <root>/<sweep>/runs/<trial_id>.parquet                    one row, written last
    <root>/<sweep>/metrics/<trial_id>.<first>-<last>.parquet  long format, one part per flush
    <root>/<sweep>/curves/<trial_id>.<first>-<last>.parquet
    <root>/<sweep>/checks/<trial_id>.parquet
    <root>/<sweep>/dims/<trial_id>.<first>-<last>.parquet     outlier-dimension attribution, like metrics
    <root>/<sweep>/sae/<trial_id>.L<layer>.<sae optimiser>.parquet  `sweep probe sae` rows
    <root>/<sweep>/trials/<trial_id>/config.json (local stores)
    <root>/<sweep>/trials/<trial_id>/checkpoint.pt            the newest checkpoint (local stores; remote
                                                              ones for multi-worker trials)
    <root>/<sweep>/trials/<trial_id>/final.pt                 a done trial's weights (any store)
    <root>/<sweep>/run.lock                                   the one writer (resultstore.lock)
    <root>/<sweep>/quarantine/<table>/<file>                  damaged files, moved aside

A kept store (`sweep keep`, resultstore.keep) holds each table's rows in one file instead, and a
manifest of them:

    <root>/<sweep>/<table>/kept.parquet    every kept trial's rows, its files' rows one after another
    <root>/<sweep>/kept.json               trial ids, rows and sha256 of each kept.parquet, provenance

The one listing rule (`table_files`), for the writer and the reader alike: a table's rows are
every ``*.parquet`` file under its folder, sub-folders included, except those with a path part
starting with ``.`` or ``_``. The writer writes each file flat in its table's folder under a
name starting with a trial id (hex), through a temporary ``.tmp-*`` name; so every file it
writes is read, no file it is still writing is, and a folder laid out for plain
``pl.scan_parquet`` globs (``metrics/trial=abc/part.parquet``) reads the same.
"""

from __future__ import annotations

import re
from typing import Any

from resultstore.schema import ARROW, TABLES
from resultstore.uri import StorageError, first_line

__all__ = [
    "CHECKPOINT",
    "FINAL_WEIGHTS",
    "KEPT",
    "KEPT_FILES",
    "LOCK_FILE",
    "MANIFEST",
    "PART",
    "STORE_FOLDERS",
    "DamagedFile",
    "NoSweepError",
    "find_sweep",
    "footer_error",
    "page_error",
    "in_parts",
    "is_sweep_folder",
    "kept_files",
    "kept_sha_error",
    "read_manifest",
    "table_files",
    "trial_file",
    "trial_of",
]

CHECKPOINT = "checkpoint.pt"
FINAL_WEIGHTS = "final.pt"
LOCK_FILE = "run.lock"
KEPT = "kept.parquet"
"""A kept store's one file of a table (`sweep keep`)."""
KEPT_FILES = b"sweep.kept_files"
"""A kept.parquet's Parquet metadata key: JSON [[writer's file name, rows], ...] in row order."""
MANIFEST = "kept.json"
"""A kept store's manifest, in its sweep folder."""
PART = re.compile(r"^(?P<trial>.+)\.(?P<first>\d+)-(?P<last>\d+)\.parquet$")
"""A flushed part's name: <trial_id>.<first step>-<last step>.parquet."""
STORE_FOLDERS = (*TABLES, "quarantine", "trials", "ray")
"""A sweep folder's sub-folders that only the store's writer (`sweep run`, `sweep train`) writes
(resultstore.paths judges an output path against them)."""


def in_parts(table: str) -> bool:
    """Whether a trial writes `table` in parts named by their step range: the tables with a step
    column (metrics, curves, dims). A table without one holds one file per trial (runs, checks)
    or, written by a probe, files of its own naming (sae)."""
    return "step" in ARROW[table].names


def trial_file(table: str, trial_id: str, steps: tuple[int, int] | None = None) -> str:
    """A trial's file of `table`, relative to the sweep folder: the part holding steps
    (first, last) of a table in parts, else the trial's one file."""
    if steps is None:
        return f"{table}/{trial_id}.parquet"
    return f"{table}/{trial_id}.{steps[0]:09d}-{steps[1]:09d}.parquet"


class NoSweepError(ValueError):
    """The path holds no sweep (or several, and it is unclear which one was meant)."""


class DamagedFile(StorageError):
    """A Parquet file of the store cannot be read (one line, naming the file)."""

    @classmethod
    def at(cls, where: str, reason: str) -> DamagedFile:
        """The error for the file at `where` (path or URI), unreadable for `reason`."""
        return cls(f"{where}: damaged Parquet file ({reason}); "
                   "`sweep run` moves it to quarantine/ and re-runs its trial")


def table_files(fs: Any, folder: str) -> list[str]:
    """The files holding a table's rows: paths relative to ``folder``, sorted (the listing rule
    above). A missing folder holds none."""
    import pyarrow.fs as pafs

    out = []
    for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True, recursive=True)):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
            continue
        rel = info.path[len(folder):].strip("/")
        if not any(part.startswith((".", "_")) for part in rel.split("/")):
            out.append(rel)
    return sorted(out)


def footer_error(fs: Any, path: str) -> str | None:
    """Why the Parquet file at ``path`` cannot be opened (its footer), or None when it can."""
    import pyarrow.parquet as pq

    try:
        with fs.open_input_file(path) as f:
            pq.ParquetFile(f).schema_arrow
    except Exception as exc:  # pyarrow raises OSError / ArrowInvalid for a bad footer
        return first_line(exc)
    return None


def page_error(fs: Any, path: str) -> str | None:
    """Why the Parquet file at ``path`` cannot be read whole (its footer, or any data page: each
    decoded, and checked against its CRC where the writer stored one), or None when it can."""
    import pyarrow.parquet as pq

    try:
        with fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f, page_checksum_verification=True)
            for i in range(pf.num_row_groups):
                pf.read_row_group(i)
    except Exception as exc:  # OSError / ArrowInvalid / ArrowNotImplementedError for a bad page
        return first_line(exc)
    return None


def trial_of(name: str) -> str:
    """The trial a table file belongs to, from its name."""
    m = PART.match(name)
    return m["trial"] if m else name.removesuffix(".parquet")


def is_sweep_folder(fs: Any, folder: str, *, started: bool = False) -> bool:
    """Does ``folder`` hold at least one table folder? With ``started``, a sweep whose run began
    but wrote no rows yet counts too: it holds run.lock or trials/ (the trials' configs)."""
    import pyarrow.fs as pafs

    infos = fs.get_file_info([f"{folder}/{t}" for t in TABLES])
    if any(i.type == pafs.FileType.Directory for i in infos):
        return True
    if not started:
        return False
    lock, trials = fs.get_file_info([f"{folder}/{LOCK_FILE}", f"{folder}/trials"])
    return lock.type == pafs.FileType.File or trials.type == pafs.FileType.Directory


def find_sweep(fs: Any, root: str, display: str, *, started: bool = False) -> str:
    """The sweep folder at ``root`` (a path within ``fs``): itself, or the one sweep inside it.
    NoSweepError, naming ``display``, when it holds none or several. ``started``: a sweep that
    has begun and written no rows yet counts (``is_sweep_folder``), for `sweep status`."""
    import pyarrow.fs as pafs

    expected = (
        "expected a sweep folder holding runs/, metrics/, curves/ or checks/ Parquet folders, "
        "or a results folder holding exactly one such sweep folder"
    )
    kind = fs.get_file_info(root).type
    if kind == pafs.FileType.NotFound:
        raise NoSweepError(f"{display}: no such folder ({expected})")
    if kind != pafs.FileType.Directory:
        raise NoSweepError(f"{display}: not a folder ({expected})")
    if is_sweep_folder(fs, root, started=started):
        return root
    children = sorted(
        i.path
        for i in fs.get_file_info(pafs.FileSelector(root))
        if i.type == pafs.FileType.Directory and not i.base_name.startswith((".", "_"))
    )
    sweeps = [c for c in children if is_sweep_folder(fs, c, started=started)]
    if len(sweeps) == 1:
        return sweeps[0]
    if sweeps:
        names = ", ".join(s.rsplit("/", 1)[-1] for s in sweeps)
        raise NoSweepError(
            f"{display}: holds {len(sweeps)} sweeps ({names}); pass one of them, "
            f"e.g. {display.rstrip('/')}/{sweeps[0].rsplit('/', 1)[-1]}"
        )
    raise NoSweepError(f"{display}: no sweep found ({expected})")


def kept_files(fs: Any, path: str) -> list[tuple[str, Any]]:
    """The writer's files a kept.parquet at ``path`` holds: (file name, its rows as a pyarrow
    Table), in the order kept; every row is in exactly one. Raises ValueError when the file does
    not say (not written by `sweep keep`) or its rows do not add up."""
    import json

    import pyarrow.parquet as pq

    with fs.open_input_file(path) as f:
        table = pq.read_table(f)
    listed = json.loads((table.schema.metadata or {}).get(KEPT_FILES, b"null"))
    if not isinstance(listed, list) or sum(int(n) for _, n in listed) != table.num_rows:
        raise ValueError(f"{path}: its metadata does not list the files of its {table.num_rows} rows "
                         "(a kept.parquet is written by `sweep keep`)")
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != KEPT_FILES}
    table = table.replace_schema_metadata(meta or None)
    out, start = [], 0
    for name, rows in listed:
        out.append((str(name), table.slice(start, int(rows))))
        start += int(rows)
    return out


def read_manifest(fs: Any, sweep: str) -> dict | None:
    """The kept store's manifest (kept.json in the sweep folder), or None when it has none."""
    import json

    import pyarrow.fs as pafs

    path = f"{sweep}/{MANIFEST}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read())


def kept_sha_error(fs: Any, sweep: str, table: str, manifest: dict | None) -> str | None:
    """Why the kept.parquet of ``table`` differs from what the manifest recorded (its sha256),
    or None when it is the file kept (or the manifest does not list it)."""
    import hashlib

    want = ((manifest or {}).get("tables") or {}).get(table, {}).get("sha256")
    if want is None:
        return None
    digest = hashlib.sha256()
    with fs.open_input_stream(f"{sweep}/{table}/{KEPT}") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    if digest.hexdigest() != want:
        return f"sha256 {digest.hexdigest()[:16]}..., not {want[:16]}... as {MANIFEST} records"
    return None
