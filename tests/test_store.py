from pathlib import Path

import polars as pl
import pytest

from resultstore.schema import ARROW
from resultstore.writer import ResultsStore


def metric_rows(steps):
    return [{"step": s, "tokens": 10 * s, "layer": l, "site": "resid", "basis": "stored", "metric": "kurtosis",
             "value": 3.0 + s} for s in steps for l in range(2)]


def curve_rows(steps):
    return [{"step": s, "tokens": 10 * s, "train_loss": 1.0, "val_loss": None, "lr": 0.1, "grad_norm": 1.0,
             "tokens_per_s": 5.0} for s in steps]


def test_parts_are_plain_parquet_globs(tmp_path):
    store = ResultsStore(tmp_path, "s")
    sink = store.sink("abc123")
    sink.begin(None)
    sink.rows("metrics", metric_rows([0, 10]))
    sink.rows("curves", curve_rows(range(1, 11)))
    sink.flush(10)
    sink.rows("metrics", metric_rows([20]))
    sink.flush(20)
    sink.rows("checks", [{"check": "rotate_residual_basis", "dtype": "float64", "value": 1e-12}])
    sink.flush(20)
    sink.run({"trial_id": "abc123", "sweep": "s", "status": "done", "d_model": 8})
    metrics = pl.scan_parquet(str(tmp_path / "s" / "metrics" / "*.parquet")).collect()
    assert metrics.height == 6 and metrics["trial_id"].unique().to_list() == ["abc123"]
    assert set(metrics.columns) == set(ARROW["metrics"].names)
    curves = pl.read_parquet(tmp_path / "s" / "curves" / "*.parquet")
    assert curves["val_loss"].dtype == pl.Float64 and curves["val_loss"].null_count() == 10
    assert store.read("checks")["value"].to_list() == [1e-12]
    assert store.completed_ids() == {"abc123"}
    assert not list((tmp_path / "s").rglob(".tmp-*"))


def test_resume_discards_rows_after_the_checkpoint_exactly_once(tmp_path):
    store = ResultsStore(tmp_path, "s")
    sink = store.sink("t1")
    sink.begin(None)
    sink.rows("metrics", metric_rows([0, 10]))
    sink.flush(10)                       # checkpoint at 10
    sink.rows("metrics", metric_rows([20]))
    sink.flush(20)                       # crash after the rows of 20, before its checkpoint
    resumed = store.sink("t1")
    resumed.begin(10)                    # restart from the checkpoint at 10
    resumed.rows("metrics", metric_rows([20, 30]))
    resumed.flush(30)
    steps = store.read("metrics").group_by("step").len().sort("step")
    assert steps.to_dicts() == [{"step": s, "len": 2} for s in (0, 10, 20, 30)]
    fresh = store.sink("t1")
    fresh.begin(None)                    # a restart from scratch drops everything
    assert store.read("metrics").height == 0


def test_failed_trials_are_not_complete_and_statuses(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_run({"trial_id": "a", "status": "done"})
    store.write_run({"trial_id": "b", "status": "failed", "error": "boom"})
    store.write_run({"trial_id": "c", "status": "diverged"})
    assert store.completed_ids() == {"a", "c"}
    assert store.statuses()["b"] == "failed"
    store.write_run({"trial_id": "b", "status": "done"})  # a retry overwrites, never doubles
    assert store.read("runs").height == 3


def test_file_uri_is_the_local_folder(tmp_path):
    store = ResultsStore(f"file://{tmp_path}", "remote")
    assert store.local and store.trial_dir("x") == tmp_path / "remote" / "trials" / "x"
    store.write_rows("metrics", "x", metric_rows([0]))
    store.write_run({"trial_id": "x", "status": "done"})
    assert ResultsStore(tmp_path, "remote").read("metrics").height == 2
    assert store.completed_ids() == {"x"}


def test_empty_store_reads_typed_empty_tables(tmp_path):
    store = ResultsStore(tmp_path, "none")
    assert not store.exists()
    assert store.read("runs").schema["trial_id"] == pl.String
    assert store.completed_ids() == set()


def test_a_runs_file_with_other_than_one_row_is_damaged(tmp_path):
    """A copy of the runs table dropped into runs/ (by hand: the CLI refuses to write there) would
    count every trial twice: it is named as damaged, and `sweep run` moves it to quarantine/."""
    store = ResultsStore(tmp_path, "s")
    store.write_run({"trial_id": "a", "status": "done"})
    store.write_run({"trial_id": "b", "status": "done"})
    store.read("runs").write_parquet(tmp_path / "s" / "runs" / "copy.parquet")
    assert [(t, n) for t, n, _ in store.damaged()] == [("runs", "copy.parquet")]
    assert "holds 2 rows" in store.damaged()[0][2]
    store.quarantine()
    assert (tmp_path / "s" / "quarantine" / "runs" / "copy.parquet").exists()
    assert sorted(store.statuses()) == ["a", "b"] and store.damaged() == []


def test_a_sweep_nested_in_a_table_folder_is_named_damaged_not_a_crash(tmp_path):
    """Issue 34: a sweep written inside another's metrics/ (through a link, before paths were
    resolved) made verify crash with a TypeError; its files lack the table's keys and are named."""
    import sys

    from typer.testing import CliRunner

    from sweep.cli import app

    sys.path.insert(0, str(Path(__file__).parent))
    from synthetic_store import Synthetic

    Synthetic("S").trials(sizes=(32,), seeds=(0,), optimizers=("adam",)).rows(steps=(0, 10)).write(tmp_path)
    Synthetic("inner").trials(sizes=(32,), seeds=(1,), optimizers=("adam",)).rows(steps=(0, 10)).write(
        tmp_path / "S" / "metrics")
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "S")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "metrics/inner/runs/" in result.output and "missing ['step'" in result.output, result.output


NEW_TABLE = """
import sys
import pyarrow as pa
import resultstore.schema as schema

# a table declared the way a new one is: its schema entry (TABLES, ARROW), nothing else
schema.ARROW["probe"] = pa.schema([("trial_id", pa.string()), ("step", pa.int64()), ("value", pa.float64())])
schema.TABLES = (*schema.TABLES, "probe")
schema.SCHEMAS["probe"] = schema._polars(schema.ARROW["probe"])

from resultstore.reader import load
from resultstore.writer import ResultsStore
from study.train import MemorySink

root = sys.argv[1]
store = ResultsStore(root, "s")
sink = store.sink("t")
sink.begin(None)
for step in (1, 2):
    sink.rows("probe", [{"step": step, "value": float(step)}])
    sink.flush(step)
store.sink("t").begin(1)  # a resume after step 1 drops the part of step 2
store.write_run({"trial_id": "t", "status": "done"})
assert load(f"{root}/s").probe.collect()["value"].to_list() == [1.0]
memory = MemorySink()
memory.rows("probe", [{"step": 1, "value": 1.0}, {"step": 2, "value": 2.0}])
memory.begin(1)
assert memory.tables["probe"] == [{"step": 1, "value": 1.0}]
print("ok")
"""


def test_a_new_table_is_its_schema_entry_and_its_producer(tmp_path):
    """Issue 35: the sink, the writer (parts, discard on resume) and the reader loop over the
    schema's tables, so a table declared there is written, resumed exactly once and read with
    no other line (its producer here: the rows this test hands the sink)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", NEW_TABLE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("where", ["local", "s3"])
def test_copy_finished_copies_whole_trials_renamed_to_this_sweep_and_skips_one_with_a_gap(tmp_path, request, where):
    """`sweep run --reuse`: another sweep's finished trials are copied file for file (rows equal),
    the runs row naming the new sweep; a trial whose rows miss an eval is left to be trained. Into
    a local folder, and from it into a bucket (moto's S3 server on loopback)."""
    import json

    source = ResultsStore(tmp_path / "a", "families")
    ids = ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    for t in ids:  # two finished trials of 4 steps, an eval at steps 0 and 4, as a trial writes them
        for first, last in ((0, 2), (3, 4)):
            source.write_rows("curves", t, [{"step": s, "tokens": 8 * s, "train_loss": 1.0} for s in range(first, last + 1)])
            source.write_rows("metrics", t, [{"step": s, "metric": "kurtosis", "site": "resid", "basis": "stored",
                                              "layer": 0, "value": 3.0 + s} for s in (first, last) if s % 4 == 0])
        source.write_rows("checks", t, [{"check": "invariance", "value": 0.0}])
        source.write_run({"trial_id": t, "status": "done", "steps": 4, "sweep": "families",
                          "config_json": json.dumps({"seed": 0, "sweep": "families"})})
    assert source.status(verify=True).ok
    gapped = ids[1]
    (Path(source.path) / "metrics" / f"{gapped}.000000004-000000004.parquet").unlink()  # its last eval's rows
    source.write_final_weights(ids[0], b"weights")
    if where == "s3":
        request.getfixturevalue("s3")  # the server, and the environment pointing at it
    target = ResultsStore(tmp_path / "b" if where == "local" else f"s3://bars/{tmp_path.name}", "attention")
    assert target.copy_finished(source, [*ids, "000000000000"]) == [ids[0]]
    assert target.completed_ids() == {ids[0]}
    run = target.read("runs").row(0, named=True)
    assert run["sweep"] == "attention" and json.loads(run["config_json"])["sweep"] == "attention"
    before = source.read("runs").filter(pl.col("trial_id") == ids[0]).row(0, named=True)
    assert {k: v for k, v in run.items() if k not in ("sweep", "config_json")} == {
        k: v for k, v in before.items() if k not in ("sweep", "config_json")}
    for table in ("metrics", "curves", "checks"):
        mine = source.read(table).filter(pl.col("trial_id") == ids[0])
        assert mine.height and target.read(table).sort(mine.columns).equals(mine.sort(mine.columns)), table
    assert target.read_final_weights(ids[0]) == b"weights" and target.status(verify=True).ok
