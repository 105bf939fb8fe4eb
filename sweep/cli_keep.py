"""`sweep keep SOURCE DEST`: a sweep's finished trials kept compact in DEST (resultstore.keep),
one Parquet file per table and a manifest, merged into what DEST already keeps. Run it while a
sweep runs: a lost machine then loses only the trials running."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sweep.cli_store import SweepArg, load, refuse_damaged, sweep_folder, sweep_store
from sweep.console import bad_input, human, out, q, refuse

__all__ = ["keep"]  # sweep.cli adds it as `sweep keep`


def keep(
    source: SweepArg,
    dest: Annotated[str, typer.Argument(help="The kept store: a folder named after the sweep (docs/stores/<sweep>), "
                                             "new or written by `sweep keep`.", show_default=False)],
    spec: Annotated[Optional[Path], typer.Option("--spec", help="Keep only this spec's trials, named for its "
                                                 "sweep (DEST's name): how another study's trials join a store.")] = None,
) -> None:
    """Keep SOURCE's finished trials (done or diverged, rows covering their steps) that DEST lacks
    in DEST: one Parquet file per table, kept.json listing trials, rows, sha256 and each keep.
    Every verb reads DEST (`status --verify`, `report`, `query`, `run --reuse`). Exit 2 on bad
    input, with nothing written."""
    from resultstore import keep as keeping, uri
    from resultstore.lock import LockHeld
    from resultstore.paths import output_problem, resolved
    from resultstore.uri import StorageError
    from resultstore.writer import ResultsStore

    folder = sweep_folder(source)
    refuse(output_problem("DEST", dest))
    target = ResultsStore.at(uri.normalize(dest))
    trials = None
    if spec is not None:
        named, grid = load(spec)
        if named.name != target.sweep:
            raise bad_input(f"--spec {spec}: its sweep is {named.name}, DEST's {target.sweep} (name DEST after it)")
        trials = {t.trial_id for t in grid}
    elif target.sweep != uri.name(folder):
        raise bad_input(f"DEST {dest}: name it after the sweep ({uri.name(folder)}), e.g. "
                        f"{uri.join(uri.parent(uri.normalize(dest)), uri.name(folder))}, or give --spec")
    if resolved(folder) == resolved(target.uri):
        raise bad_input(f"DEST {dest}: that is SOURCE itself; keep into another folder")
    refuse(f"DEST {dest}: {why}" if (why := keeping.live_problem(target)) else None)
    store = sweep_store(folder)
    refuse_damaged(store, "keep", rows=False, pages=True)  # incomplete trials are left out, not refused
    if target.exists():
        refuse_damaged(target, "keep", rows=False, pages=True)
    try:
        target.check_writable()
        with target.writing("sweep keep", repair=False):
            kept = keeping.keep(store, target, trials, shown_source=source, git=_git_sha())
    except (LockHeld, StorageError) as exc:
        raise bad_input(str(exc).splitlines()[0]) from None
    note = f"; {len(kept.already)} already there" if kept.already else ""
    out.print(f"kept {len(kept.added)} trial(s) of {q(folder)} in {q(target.uri)}{note}: {kept.trials} in all, "
              f"{human(kept.size)}B", highlight=False, soft_wrap=True)  # unfolded: its paths copy whole
    if kept.short:
        out.print(f"[yellow]{len(kept.short)} finished trial(s) left out[/]: their rows do not cover their steps "
                  f"(`sweep status {q(folder)} --verify` says where): {', '.join(kept.short[:5])}", highlight=False, soft_wrap=True)


def _git_sha() -> str | None:
    """The commit of the code that keeps (the manifest records it), or None outside a checkout."""
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None
