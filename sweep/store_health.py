"""One health check of a sweep's store, which every verb that reads it goes through: `plan`,
`status` / `verify`, `query`, `report` and `probe sae` refuse a damaged store (exit 2, each
problem named); `run` and `train` repair it under the lock (ResultsStore.writing).

A problem is a Parquet file whose footer, schema or a data page cannot be read ("damaged"),
rows repeating a table's primary key ("duplicated"), a checkpoint that cannot be loaded, or,
when rows are checked, a done trial whose rows do not cover its steps ("incomplete").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["REPAIR", "Health", "check", "load_error", "tune_errors"]

REPAIR = ("`sweep run` moves damaged files, files repeating another's rows and incomplete trials to quarantine/ "
          "and re-runs the trials left short; `sweep verify` names every problem")


@dataclass(frozen=True)
class Health:
    """A store as read: its status, each trial at fault, and one line per problem."""

    status: Any
    """resultstore.writer.StoreStatus (None when the sweep folder does not exist yet)."""
    trials: dict[str, str] = field(default_factory=dict)
    """trial_id -> "damaged" | "incomplete"."""
    problems: list[str] = field(default_factory=list)
    gaps: dict[str, list[str]] = field(default_factory=dict)
    """trial_id -> what its rows miss (checked rows only)."""
    damage: int = 0
    """How many of `problems` are damage (files unreadable, keys repeated, checkpoints that cannot
    be loaded) rather than trials incomplete."""

    @property
    def runs(self):
        """The readable runs rows (empty, with the contract's columns, for a new sweep)."""
        if self.status is None:
            import polars as pl

            from resultstore.schema import SCHEMAS

            return pl.DataFrame(schema=SCHEMAS["runs"])
        return self.status.runs

    @property
    def damaged(self) -> bool:
        """Files unreadable, keys repeated or checkpoints that cannot be loaded."""
        return bool(self.status is not None and (self.status.damaged or self.damage))

    def refusal(self, verb: str, uri: str) -> str | None:
        """Why `verb` must not read the store as it is (one line, then the problems), or None."""
        if not self.problems:
            return None
        return f"{verb}: {len(self.problems)} problem(s) in {uri}; {REPAIR}:\n" + "\n".join("  " + p for p in self.problems)


def check(store, *, rows: bool = True, pages: bool | None = None, weights: bool = False) -> Health:
    """The store's health: every file's footer and schema; with `pages` (default: `rows`) every
    data page and every primary key (resultstore.keys: a copied part repeats them); with `rows`
    every done trial's rows against its steps (what `sweep run` re-runs); with `weights` every
    checkpoint.pt and final.pt loaded. A missing sweep folder is healthy."""
    from resultstore import repair
    from resultstore.layout import DamagedFile, trial_of

    if not store.exists():
        return Health(None)
    pages = rows if pages is None else pages
    st = store.status(pages=pages)
    trials = {trial_of(name): "damaged" for _, name, _ in st.damaged}
    problems = [f"{store.uri}/{table}/{name}: damaged Parquet file ({why})" for table, name, why in st.damaged]
    manifest = _manifest_problem(store) if pages else []
    problems += manifest
    gaps: dict[str, list[str]] = {}
    for rel, why in repair.weights(store, load_error) if weights else []:
        trials[rel.split("/")[1]] = "damaged"
        problems.append(f"{store.uri}/{rel}: cannot be loaded ({why})")
    if st.damaged or manifest:  # a damaged file would be named twice
        return Health(st, trials, problems, gaps, damage=len(problems))
    dups = repair.duplicates(store) if pages else []
    for dup in dups:
        trials.update({trial_of(f): "duplicated" for f in dup.files})
        problems.append(dup.line(store.uri))
    if rows and not dups:  # repeated rows would read as rows present
        try:
            gaps = store.gaps_by_trial(st.runs)
        except DamagedFile as exc:
            problems.append(str(exc))
        trials.update({t: "incomplete" for t in gaps})
        problems += [f"trial {t}: incomplete ({'; '.join(why)})" for t, why in gaps.items()]
    return Health(st, trials, problems, gaps, damage=len(problems) - len(gaps))


def _manifest_problem(store) -> list[str]:
    """A kept store's manifest that cannot be read (its files' sha256 are checked with them)."""
    from resultstore.layout import MANIFEST, read_manifest
    from resultstore.uri import first_line

    try:
        found = read_manifest(store.fs, store.path)
    except (OSError, ValueError) as exc:
        return [f"{store.uri}/{MANIFEST}: unreadable ({first_line(exc)}); `git checkout` it, or keep the store again"]
    if found is not None and not isinstance(found.get("tables"), dict):
        return [f"{store.uri}/{MANIFEST}: no \"tables\" object (a kept store's manifest is written by `sweep keep`)"]
    return []


def load_error(data: bytes, trial_id: str) -> str | None:
    """Why a trial's checkpoint.pt / final.pt bytes cannot be loaded as its own (torch.load with
    weights_only: tensors and plain containers only), or None."""
    import io

    import torch

    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or "model" not in state:
            return "not a checkpoint: no model state"
        if state.get("trial_id") != trial_id:
            return f"holds trial {state.get('trial_id')!r}, not {trial_id}"
    except Exception as exc:  # pickle, zip and torch errors alike: the file is unusable
        from resultstore.uri import first_line

        why = first_line(exc)
        if why.startswith("Weights only load failed"):  # torch's advice to unpickle anything: not ours to take
            return "not a torch file of tensors (torch.load with weights_only refused it)"
        return why[:200]
    return None


def tune_errors(store, trial_ids) -> dict[str, str]:
    """trial_id -> the error line of its newest Ray Tune error.txt under ray/, for trials that
    started and left no runs row (a full disk: the failed row could not be written either)."""
    import re

    import pyarrow.fs as pafs

    found: dict[str, str] = {}
    runs = sorted((i.path for i in store.fs.get_file_info(pafs.FileSelector(f"{store.path}/ray", allow_not_found=True))
                   if i.type == pafs.FileType.Directory), reverse=True)  # run-YYYYmmdd-HHMMSS: newest first
    for trial_id in trial_ids:
        for run in runs:
            try:
                with store.fs.open_input_file(f"{run}/{trial_id}/error.txt") as f:
                    size = f.size()
                    f.seek(max(0, size - 8192))
                    text = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            lines = [l.strip() for l in text.splitlines() if l.strip()]
            errors = [l for l in lines if re.match(r"^[\w.]+(Error|Exception)\b", l)]
            if errors or lines:
                found[trial_id] = (errors or lines)[-1][:300]
                break
    return found
