"""resultstore.stamps: every runs file stamps the kind and role of each column beyond the core, and
reading a store declares them, so a process knows a column's role from the store alone (issue 47).
A file written before stamps (every kept store's) reads as it always has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import resultstore.schema as schema
from resultstore.schema import LEGACY_COLUMNS, Role
from resultstore.stamps import STAMP, declare_stamp
from resultstore.writer import ResultsStore

REPO = Path(__file__).resolve().parents[1]

RUNS_BEFORE_STAMPS = [
    "trial_id", "config_id", "sweep", "status", "d_model", "n_layers", "n_heads", "d_mlp", "params",
    "params_non_embedding", "flops_per_token", "optimizer", "optimizer_family", "lr", "weight_decay", "momentum", "eps",
    "beta1", "beta2", "nesterov", "rotate", "precondition_frequency", "muon_ends", "norm", "attention", "rotation",
    "group_size", "rotation_groups", "rotation_label", "rotate_embeddings", "parametrization", "mup_base_width", "seed",
    "corpus", "seq_len", "batch_size", "tokens", "steps", "final_train_loss", "final_val_loss", "tokens_per_s", "wall_s",
    "mfu", "peak_memory_bytes", "device", "node", "torch_version", "version", "git_sha", "corpus_fingerprint", "error",
    "config_json", "device_detail",
]  # fmt: skip
"""The runs table's columns, in file order, before stamps (main at 1e15317): what every kept store reads as."""


def _fresh(code: str, *args: str) -> list:
    """Run ``code`` in a new interpreter that imports neither study nor torch; it prints one JSON value."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code += "\nassert 'study' not in sys.modules and 'torch' not in sys.modules, 'study was imported'"
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _row(trial_id: str, **extra) -> dict:
    return {"trial_id": trial_id, "config_id": "c", "sweep": "s", "status": "done", "optimizer": "adam"} | extra


READ = """
import json, sys
from analysis.labels import trial_labels
from analysis.load import load
from resultstore.schema import RUNS_SCHEMA, role_of
before = list(RUNS_SCHEMA)
runs = load(sys.argv[1]).runs.collect().sort("trial_id")
print(json.dumps([before, runs.columns, {c: [str(t), str(role_of(c))] for c, t in runs.schema.items()},
                  trial_labels(runs.to_dicts())]))
"""


def test_a_process_that_never_imports_study_reads_a_kept_store_as_before_stamps():
    """Kept stores have no stamps: they read as stamped with LEGACY_COLUMNS, which every process
    knows from the start, in their places after weight_decay."""
    before, columns, kinds, _ = _fresh(READ, str(REPO / "docs" / "stores" / "english"))
    assert before == columns == RUNS_BEFORE_STAMPS
    assert [c for c, (_, role) in kinds.items() if role == "hyper"] == [
        "lr", "weight_decay", *(c for c, _, _ in LEGACY_COLUMNS)]
    assert kinds["nesterov"] == ["Boolean", "hyper"] and kinds["precondition_frequency"] == ["Int64", "hyper"]


def test_a_runs_file_stamps_its_declared_columns_and_a_fresh_reader_declares_them(tmp_path, declared):
    declared("probe_rank", "int", Role.HYPER)
    declared("mlp_kind", "string", Role.AXIS)
    store = ResultsStore(tmp_path, "stamped")
    store.write_run(_row("t1", probe_rank=3, mlp_kind="glu"))
    store.write_run(_row("t2", probe_rank=5, mlp_kind="gelu"))
    file = pq.read_schema(next((tmp_path / "stamped" / "runs").glob("*.parquet")))
    assert file.names == [*RUNS_BEFORE_STAMPS, "probe_rank", "mlp_kind"]  # earlier columns keep their places
    assert json.loads(file.metadata[STAMP]) == [*([c, k, r.value] for c, k, r in LEGACY_COLUMNS),
                                                ["probe_rank", "int", "hyper"], ["mlp_kind", "string", "axis"]]
    before, columns, kinds, labels = _fresh(READ, str(tmp_path / "stamped"))
    assert before == RUNS_BEFORE_STAMPS and columns == [*RUNS_BEFORE_STAMPS, "probe_rank", "mlp_kind"]
    assert kinds["probe_rank"] == ["Int64", "hyper"] and kinds["mlp_kind"] == ["String", "axis"]
    assert labels == ["probe_rank 3 · glu", "probe_rank 5 · gelu"]  # an axis names itself, a hyper-parameter its name


def test_only_the_runs_table_is_stamped(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_rows("checks", "t1", [{"check": "x", "dtype": "float32", "value": 1.0}])
    assert pq.read_schema(next((tmp_path / "s" / "checks").glob("*.parquet"))).metadata in (None, {})


def test_a_stamp_the_process_cannot_hold_is_refused_naming_its_file(declared):
    with pytest.raises(ValueError, match=r"runs/t9.parquet: stamped runs column 'momentum' is declared already "
                                         r"\(hyper, float\), not as hyper, int"):
        declare_stamp({STAMP: b'[["momentum","int","hyper"]]'}, "runs/t9.parquet")
    with pytest.raises(ValueError, match=r"runs/t9.parquet: unreadable runs column stamp"):
        declare_stamp({STAMP: b'[["momentum","float"]]'}, "runs/t9.parquet")
    with pytest.raises(ValueError, match="unreadable runs column stamp"):
        declare_stamp({STAMP: b'[["x","float","outlier"]]'}, "runs/t9.parquet")
    declare_stamp({b"other": b"1"}, "runs/t9.parquet")  # no stamp: LEGACY_COLUMNS, declared already
    assert list(schema.RUNS_SCHEMA) == RUNS_BEFORE_STAMPS


def test_load_refuses_a_store_whose_stamp_contradicts_a_declared_column(tmp_path):
    runs = tmp_path / "bad" / "runs"
    runs.mkdir(parents=True)
    table = pa.Table.from_pylist([_row("t1")], schema=schema.ARROW["runs"])
    pq.write_table(table.replace_schema_metadata({STAMP: b'[["eps","string","hyper"]]'}), runs / "t1.parquet")
    code = ("import json, sys\nfrom analysis.load import load\n"
            "try:\n    load(sys.argv[1])\nexcept ValueError as e:\n    print(json.dumps(str(e)))\n")
    message = _fresh(code, str(tmp_path / "bad"))
    assert message.startswith(str(runs / "t1.parquet")) and "'eps' is declared already (hyper, float)" in message


CHECK_AND_KEEP = """
import json, sys
import pyarrow.parquet as pq
from resultstore.keep import keep
from resultstore.repair import damaged
from resultstore.stamps import STAMP
from resultstore.writer import ResultsStore
source = ResultsStore(sys.argv[1], "stamped")
bad = damaged(source, pages=True)
keep(source, ResultsStore(sys.argv[2], "stamped"))
kept = pq.read_schema(sys.argv[2] + "/stamped/runs/kept.parquet")
print(json.dumps([bad, [e[0] for e in json.loads(kept.metadata[STAMP])][-2:]]))
"""


def test_a_stamped_column_is_no_damage_and_its_stamp_survives_a_keep(tmp_path, declared):
    """A process that never declared a column (it never imported the optimiser's module) finds a
    runs file with it sound (the stamp says what it is: no quarantine), and `sweep keep` stamps the
    kept runs file with every file's columns, not only the last one's (diverged trials: finished,
    with no rows to cover)."""
    declared("probe_rank", "int", Role.HYPER)
    store = ResultsStore(tmp_path / "src", "stamped")
    store.write_run(_row("t2", probe_rank=5, status="diverged", sweep="stamped"))  # last by name, fewer columns
    declared("mlp_kind", "string", Role.AXIS)
    store.write_run(_row("t1", probe_rank=3, mlp_kind="glu", status="diverged", sweep="stamped"))
    bad, stamped = _fresh(CHECK_AND_KEEP, str(tmp_path / "src"), str(tmp_path / "kept"))
    assert bad == []
    assert stamped == ["probe_rank", "mlp_kind"]
