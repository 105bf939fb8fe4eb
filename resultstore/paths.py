"""Where a verb may write, judged on the real path: every local path is resolved (symlinks
followed, `..` folded) before it is compared with a sweep's folders, so a link into a sweep's
tables is caught as surely as the tables' own path.

    output_problem(option, target)   why `--results` / `--out` must not be written, or None
    writes_into_a_sweep(target)      why `target` lies inside a sweep's tables, or None
    local_write_problem(path)        why a local folder cannot be created or written, or None

Only the store's writer (`sweep run`, `sweep train`, `sweep probe sae`) writes inside a sweep's
folders; `query --out`, `report --out` and `data prepare --out` never do.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from resultstore import uri
from resultstore.inputs import file_kind
from resultstore.layout import LOCK_FILE, MANIFEST, STORE_FOLDERS, is_sweep_folder

__all__ = ["local_write_problem", "output_problem", "resolved", "writes_into_a_sweep"]


def resolved(target: str | os.PathLike[str]) -> str:
    """A URI as it is; a local path absolute with every symlink of its existing part followed."""
    text = uri.normalize(target)
    return text if uri.is_remote(text) else os.path.realpath(text)


def output_problem(option: str, target: str | None, *, whole_folder: bool = False) -> str | None:
    """`option target: why` when writing `target` would be wrong (it names nothing, or lies
    inside a sweep's tables), else None. `whole_folder`: see writes_into_a_sweep."""
    if target is None:
        return None
    if not str(target).strip():
        return f"{option} {target!r}: names no folder or URI (give one; '.' is the current folder)"
    why = uri.location_problem(target) or _local_target_problem(str(target))
    if why is None:
        why = writes_into_a_sweep(target, whole_folder=whole_folder)
    return f"{option} {target}: {why}" if why is not None else None


def _local_target_problem(text: str) -> str | None:
    """Why a local output path (file or folder) is no place to write: under /proc, /sys or /dev,
    something that exists and is neither a regular file nor a folder (a FIFO would block the
    writer for ever), or a new path whose first existing ancestor refuses a new entry."""
    if uri.is_remote(text):
        return None
    real = os.path.realpath(os.path.expanduser(text))
    system = next((d for d in ("/proc", "/sys", "/dev") if real == d or real.startswith(d + "/")), None)
    if system is not None:
        return f"it resolves to {real}, under {system}: not a place for output"
    kind = file_kind(real)
    if kind == "missing":
        problem = local_write_problem(os.path.dirname(real))
        return problem.split(": ", 1)[1] if problem else None
    return None if kind in ("a file", "a folder") else f"it is {kind}, not a regular file or folder"


def writes_into_a_sweep(target: Any, *, whole_folder: bool = False) -> str | None:
    """Why writing `target` (an output file or folder, path or URI) would write inside a sweep's
    tables, or None when it would not. `whole_folder`: `target` is a folder the writer may
    replace (`data prepare --force`), so it must not be a sweep folder or hold one either."""
    import pyarrow.fs as pafs

    try:
        real = resolved(target)
        fs, path = uri.filesystem(real)
    except (OSError, ValueError):
        return None  # unreachable: the writer's own error says so
    shown = "" if real == uri.normalize(target) else f" (it resolves to {real})"
    parts = path.rstrip("/").split("/")
    for i in range(len(parts) - 1, 0, -1):
        folder, sub = "/".join(parts[:i]), parts[i]
        if (sub in STORE_FOLDERS or sub in (LOCK_FILE, MANIFEST)) and folder and is_sweep_folder(fs, folder):
            return f"it is inside {folder}/{sub}/, a sweep's own folder that only `sweep run` writes{shown}"
    if whole_folder:
        here = path.rstrip("/") or "/"
        if is_sweep_folder(fs, here):
            return f"it is a sweep's folder ({here}); choose a new folder"
        try:
            children = fs.get_file_info(pafs.FileSelector(here, allow_not_found=True))
        except OSError:
            return None
        held = [c.path for c in children if c.type == pafs.FileType.Directory and is_sweep_folder(fs, c.path)]
        if held:
            return f"it holds a sweep ({held[0]}); choose a new folder"
    return None


def local_write_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the local folder `path` cannot be created and written (its first existing ancestor is
    not a folder, or refuses a new entry: /proc, a read-only mount), or None. Tries for real: a
    temporary folder is made in that ancestor and removed at once; nothing is left."""
    ancestor = Path(os.path.realpath(path))
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    kind = file_kind(ancestor)
    if kind != "a folder":
        return f"{path}: {ancestor} is {kind}, not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".sweep-write-check-", dir=ancestor))
    except OSError as exc:
        return f"{path}: cannot create folders in {ancestor} ({exc.strerror or exc})"
    return None
