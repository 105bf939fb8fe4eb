"""resultstore: the bottom layer. It loads nothing above it, and its one listing rule, one
damaged-file error and one config-id hash serve the writer, the reader and the study alike."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import resultstore
from resultstore.ids import science_hash
from resultstore.layout import DamagedFile, table_files
from resultstore.reader import load
from resultstore.schema import ARROW
from resultstore.writer import ResultsStore

REPO = Path(__file__).resolve().parent.parent
ABOVE = ("study", "sweep", "analysis", "torch", "ray")


def test_importing_the_store_loads_nothing_above_it() -> None:
    modules = sorted(f"resultstore.{m.name}" for m in pkgutil.iter_modules(resultstore.__path__))
    assert {"resultstore.writer", "resultstore.reader", "resultstore.lock"} <= set(modules)
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "import resultstore\n"
        "[getattr(resultstore, n) for n in resultstore.__all__]\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ABOVE!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_package_names_resolve_to_their_modules() -> None:
    assert resultstore.ResultsStore is ResultsStore and resultstore.load is load
    with pytest.raises(AttributeError):
        resultstore.nope  # noqa: B018


def test_one_listing_rule_for_the_writer_and_the_reader(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path, "s")
    store.write_rows("curves", "t1", [{"step": 1, "train_loss": 1.0}])
    store.write_rows("curves", "t1", [{"step": 2, "train_loss": 2.0}])
    curves = tmp_path / "s" / "curves"
    (curves / "trial=t2").mkdir()
    rows = pa.Table.from_pylist([{"trial_id": "t2", "step": 1, "train_loss": 3.0}], schema=ARROW["curves"])
    pq.write_table(rows, curves / "trial=t2" / "p.parquet")  # a layout for plain pl.scan_parquet globs
    (curves / ".tmp-inflight.parquet").write_bytes(b"half")  # a write in flight
    (curves / "_hidden").mkdir()
    (curves / "_hidden" / "x.parquet").write_bytes(b"not read")
    (curves / "notes.txt").write_text("not a table file")
    import pyarrow.fs as pafs

    files = table_files(pafs.LocalFileSystem(), str(curves))
    assert files == ["t1.000000001-000000001.parquet", "t1.000000002-000000002.parquet", "trial=t2/p.parquet"]
    eager = store.read("curves").sort("trial_id", "step")["train_loss"].to_list()
    lazy = load(tmp_path / "s").curves.collect().sort("trial_id", "step")["train_loss"].to_list()
    assert eager == lazy == [1.0, 2.0, 3.0]
    assert store.damaged() == []


def test_one_damaged_file_error_with_one_message(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path, "s")
    store.write_rows("curves", "t1", [{"step": 1, "train_loss": 1.0}])
    part = tmp_path / "s" / "curves" / "t1.000000001-000000001.parquet"
    part.write_bytes(part.read_bytes()[:-20])
    with pytest.raises(DamagedFile) as by_writer:
        store.read("curves")
    with pytest.raises(DamagedFile) as by_reader:
        load(tmp_path / "s")
    tail = "damaged Parquet file ("
    for exc in (by_writer.value, by_reader.value):
        text = str(exc)
        assert text.startswith(f"{part}: {tail}") and text.endswith(
            "); `sweep run` moves it to quarantine/ and re-runs its trial"), text
        assert isinstance(exc, ValueError)


def test_config_id_is_the_science_hash_of_config_json() -> None:
    from study.config import TrialConfig

    cfg = TrialConfig.model_validate({
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2},
        "optimizer": {"name": "adam", "lr": 1e-3},
        "train": {"steps": 10, "batch_size": 2},
        "seed": 3, "sweep": "x",
    })
    config = json.loads(cfg.config_json())
    assert cfg.config_id == science_hash(config)
    assert cfg.model_copy(update={"seed": 4}).config_id == cfg.config_id
    assert cfg.model_copy(update={"seed": 4}).trial_id != cfg.trial_id
    assert science_hash(config, drop=("optimizer.lr",)) == science_hash(
        {**config, "optimizer": {**config["optimizer"], "lr": 9.0}}, drop=("optimizer.lr",))


def test_a_checkpoint_goes_into_the_trial_folder_and_comes_back_byte_for_byte(tmp_path: Path) -> None:
    """put_checkpoint / fetch_checkpoint: what a remote store keeps for a multi-worker trial's retry
    (the same calls on a local store, through the same pyarrow filesystem)."""
    store = ResultsStore(tmp_path / "r", "s")
    assert store.fetch_checkpoint("abc", tmp_path / "none") is False
    written = tmp_path / "rank0"
    written.mkdir()
    data = os.urandom(3 << 20)
    (written / "checkpoint.pt").write_bytes(data)
    store.put_checkpoint("abc", written)
    assert (tmp_path / "r" / "s" / "trials" / "abc" / "checkpoint.pt").read_bytes() == data
    assert not [p for p in (tmp_path / "r" / "s" / "trials" / "abc").iterdir() if p.name.startswith(".tmp")]
    assert store.fetch_checkpoint("abc", tmp_path / "retry") is True
    assert (tmp_path / "retry" / "checkpoint.pt").read_bytes() == data
    store.put_checkpoint("abc", tmp_path / "r" / "s" / "trials" / "abc")  # already there: nothing to copy
    assert (tmp_path / "r" / "s" / "trials" / "abc" / "checkpoint.pt").read_bytes() == data
