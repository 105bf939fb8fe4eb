"""Old against new: what two checkouts read from their kept stores, ids and specs (issue 47's proof
that moving the house changed no behaviour, id or stored value).

For each checkout, in a subprocess importing that checkout's code: every table of every store in its
docs/stores (sorted, hashed), every runs row's trial id re-derived from its config_json, and the
trial ids every spec in its specs/ expands to (matched by spec name and `name:`, so a moved spec is
still compared). Then, with --report, `sweep report -f html` of every store by each, and their CSVs
and index.html (less its line naming the path and time) compared byte for byte. Prints what differs; exits 1 if anything does.

    python tools/tree_diff.py OLD_CHECKOUT NEW_CHECKOUT [--report] [--stores families,width]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_DUMP = r"""
import hashlib, json, sys
from pathlib import Path
import polars as pl
from resultstore.reader import load
from resultstore.schema import TABLES
from study.config import TrialConfig
from sweep.grid import expand
from sweep.spec import load_spec

root, stores = Path.cwd(), sys.argv[1].split(",") if sys.argv[1] else None
out = {"tables": {}, "ids": {}, "specs": {}}
for folder in sorted((root / "docs/stores").iterdir()):
    if not folder.is_dir() or (stores and folder.name not in stores):
        continue
    results = load(folder)
    for table in TABLES:
        frame = getattr(results, table).collect()
        frame = frame.select(sorted(frame.columns))
        frame = frame.sort(frame.columns, nulls_last=True)
        out["tables"][f"{folder.name}/{table}"] = [frame.height, hashlib.sha256(frame.write_csv().encode()).hexdigest()]
    runs = results.runs.collect()
    bad = [r["trial_id"] for r in runs.iter_rows(named=True)
           if TrialConfig.model_validate_json(r["config_json"]).trial_id != r["trial_id"]]
    out["ids"][folder.name] = [runs.height, bad]
for path in sorted((root / "specs").rglob("*.yaml")):
    try:
        out["specs"][path.name] = sorted(t.trial_id for t in expand(load_spec(path)))
    except Exception as exc:  # a corpus not prepared here: compare the message, not ids
        out["specs"][path.name] = ["cannot expand: " + str(exc).splitlines()[-1]]
print(json.dumps(out))
"""


def _dump(tree: Path, stores: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _DUMP, stores], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{tree}: the dump failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


_STAMPED = re.compile(rb"<p class='muted'>[^<]* \xc2\xb7 generated [^<]*</p>")
"""index.html's line naming the store's path and the time it was generated: all that may differ."""


def _same(a: Path, b: Path) -> bool:
    if a.name == "index.html":
        return _STAMPED.sub(b"", a.read_bytes()) == _STAMPED.sub(b"", b.read_bytes())
    return filecmp.cmp(a, b, shallow=False)


def _reports(old: Path, new: Path, stores: list[str]) -> list[str]:
    differ = []
    with tempfile.TemporaryDirectory() as tmp:
        for store in stores:
            outs = []
            for tree in (old, new):
                out = Path(tmp) / f"{tree.name}-{store}"
                env = {**os.environ, "PYTHONPATH": str(tree)}
                subprocess.run([sys.executable, "-m", "sweep.cli", "report", f"docs/stores/{store}", "--out", str(out),
                                "-f", "html"], cwd=tree, env=env, capture_output=True, check=False)
                outs.append(out)
            names = sorted({p.relative_to(o).as_posix() for o in outs for p in o.rglob("*")
                            if p.suffix in (".csv",) or p.name == "index.html"})
            for name in names:
                a, b = (o / name for o in outs)
                if not (a.exists() and b.exists() and _same(a, b)):
                    differ.append(f"report {store}/{name}")
            print(f"report {store}: {len(names)} files compared", file=sys.stderr)
    return differ


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--report", action="store_true", help="also compare `sweep report`'s CSVs and index.html")
    ap.add_argument("--stores", default="", help="comma-separated store names (default: every one)")
    args = ap.parse_args()
    old, new = _dump(args.old.resolve(), args.stores), _dump(args.new.resolve(), args.stores)
    differ = [f"table {k}: {old['tables'].get(k)} -> {new['tables'].get(k)}"
              for k in sorted(old["tables"].keys() | new["tables"].keys()) if old["tables"].get(k) != new["tables"].get(k)]
    differ += [f"ids {k}: {old['ids'].get(k)} -> {new['ids'].get(k)}"
               for k in sorted(old["ids"].keys() | new["ids"].keys()) if old["ids"].get(k) != new["ids"].get(k)]
    differ += [f"spec {k}: {len(old['specs'].get(k) or [])} -> {len(new['specs'].get(k) or [])} trial ids, not the same"
               for k in sorted(old["specs"].keys() | new["specs"].keys()) if old["specs"].get(k) != new["specs"].get(k)]
    rows = sum(v[0] for v in old["tables"].values())
    print(f"{len(old['tables'])} tables ({rows:,} rows), {sum(v[0] for v in old['ids'].values())} runs rows' ids, "
          f"{len(old['specs'])} specs ({sum(map(len, old['specs'].values())):,} trial ids) compared")
    if args.report:
        differ += _reports(args.old.resolve(), args.new.resolve(), sorted(k.split("/")[0] for k in old["ids"]))
    print("\n".join(differ) if differ else "no difference")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
