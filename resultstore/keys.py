"""Each table's primary key, declared once beside the schema (`resultstore.schema`): the columns
no two rows of a sweep share. A copied part, or one written twice under two names, repeats keys;
`duplicates` finds them and names the files, `intruders` says which of those files to set aside.

    runs     one row per trial
    metrics  one value per (eval step, layer, site, basis, metric)
    curves   one row per step
    checks   one value per (check, dtype)
    dims     one row per (step, layer, site, basis, dim, role)
    sae      one row per (layer, basis, SAE optimiser) of a probe's config
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resultstore.layout import PART, trial_file
from resultstore.schema import ARROW

__all__ = ["KEYS", "Duplicate", "duplicates", "intruders"]

KEYS: dict[str, tuple[str, ...]] = {
    "runs": ("trial_id",),
    "metrics": ("trial_id", "step", "layer", "site", "basis", "metric"),
    "curves": ("trial_id", "step"),
    "checks": ("trial_id", "check", "dtype"),
    "dims": ("trial_id", "step", "layer", "site", "basis", "dim", "role"),
    "sae": ("trial_id", "layer", "basis", "sae_optimizer", "sae_config_json"),
}
"""table -> its primary key's columns (every one a column of `ARROW[table]`)."""

assert all(set(k) <= set(ARROW[t].names) for t, k in KEYS.items())


@dataclass(frozen=True)
class Duplicate:
    """Rows of `table` that share their key: how many rows, a key as an example, in which files."""

    table: str
    rows: int
    example: dict
    files: tuple[str, ...]

    def line(self, where: str) -> str:
        key = ", ".join(f"{k}={v}" for k, v in self.example.items())
        names = ", ".join(f"{where}/{self.table}/{f}" for f in self.files)
        return f"{self.rows} rows of {self.table} repeat their key (e.g. {key}) in {names}"


def _keyed(fs: Any, folder: str, table: str, names: list[str]):
    """One frame of every file's key columns, with the file's name (`_file`)."""
    import polars as pl
    import pyarrow.parquet as pq

    frames = []
    for name in names:
        cols = [c for c in KEYS[table] if c in pq.read_schema(f"{folder}/{name}", filesystem=fs).names]
        t = pq.read_table(f"{folder}/{name}", filesystem=fs, columns=cols)
        frame = pl.from_arrow(t) if t.num_rows else pl.DataFrame(schema={c: pl.String for c in cols})
        missing = [c for c in KEYS[table] if c not in cols]
        frames.append(frame.with_columns(*(pl.lit(None).alias(c) for c in missing), pl.lit(name).alias("_file"))
                      .select(*KEYS[table], "_file"))
    return pl.concat(frames, how="vertical_relaxed") if frames else None


def duplicates(fs: Any, folder: str, table: str, names: list[str]) -> list[Duplicate]:
    """Every group of files of `table` (in `folder`, the table's folder) whose rows share a key:
    one Duplicate per set of files. Reads the key columns of every file (raises what pyarrow
    raises for a damaged one: check pages first)."""
    import polars as pl

    if table not in KEYS:  # a table declared without a key (a probe's own) is not checked
        return []
    frame = _keyed(fs, folder, table, names)
    if frame is None or frame.height == 0:
        return []
    key = list(KEYS[table])
    repeated = frame.filter(pl.len().over(key) > 1)
    if repeated.height == 0:
        return []
    groups = (repeated.group_by(key).agg(pl.col("_file").unique().sort().alias("files"), pl.len().alias("n"))
              .with_columns(pl.col("files").list.join("\n").alias("set")))
    out = []
    for _, g in groups.group_by("set", maintain_order=True):
        g = g.sort(key, nulls_last=True)
        out.append(Duplicate(table, int(g["n"].sum()), {k: g[k][0] for k in key}, tuple(g["files"][0])))
    return sorted(out, key=lambda d: d.files)


def _canonical(fs: Any, folder: str, table: str, name: str) -> bool:
    """Is `name` the name the writer gives this file's rows (one trial, its step range)?"""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(f"{folder}/{name}", filesystem=fs, columns=["trial_id"] + (["step"] if "step" in KEYS[table] else []))
    trials = pc.unique(t["trial_id"]).to_pylist()
    if len(trials) != 1 or not isinstance(trials[0], str):
        return False
    if table == "sae":
        return name.startswith(f"{trials[0]}.L")
    if "step" not in KEYS[table]:
        return name == trial_file(table, trials[0]).split("/", 1)[1]
    m = PART.match(name)
    lo, hi = pc.min_max(t["step"]).values()
    return bool(m and m["trial"] == trials[0] and (int(m["first"]), int(m["last"])) == (lo.as_py(), hi.as_py()))


def intruders(fs: Any, folder: str, found: list[Duplicate]) -> list[str]:
    """Which files of the duplicates to set aside (names within `folder`, the table's folder):
    a file the writer would not have named so (a copy under another name) goes; when the
    writer's own files still repeat keys (overlapping parts, or one file repeating itself),
    all of them go and their trials run again."""
    out: set[str] = set()
    for dup in found:
        own = [f for f in dup.files if _canonical(fs, folder, dup.table, f)]
        out |= set(dup.files) - set(own)
        if len(own) > 1 or len(dup.files) == 1:
            out |= set(own)
    return sorted(out)
