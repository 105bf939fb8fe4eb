"""The store contract: one declaration, every column the trainer writes is in it, and
config_id separates configs that differ in any science field but the seed."""

import polars as pl
import pyarrow as pa

from analysis.load import RUNS_SCHEMA as LOAD_RUNS
from resultstore.schema import ARROW, SCHEMAS, TABLES
from resultstore.writer import ResultsStore
from study.config import TrialConfig
from study.train import RunSummary, run_row

BASE = {
    "model": {"d_model": 16, "n_layers": 2, "n_heads": 2},
    "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
    "train": {"steps": 4},
}


def cfg(**changes) -> TrialConfig:
    return TrialConfig.model_validate({**BASE, **changes})


def test_store_and_analysis_share_one_declaration(tmp_path):
    assert LOAD_RUNS == SCHEMAS["runs"]
    store = ResultsStore(str(tmp_path), "s")
    for t in TABLES:  # an empty table reads with the contract's columns and types
        assert dict(store.read(t).schema) == SCHEMAS[t]
    for t in TABLES:
        assert list(SCHEMAS[t]) == ARROW[t].names
        # The polars view round-trips to the same arrow types (no silent widening).
        empty = pl.DataFrame(schema=SCHEMAS[t]).to_arrow()
        assert [f.type for f in empty.schema] == [
            pa.large_string() if f.type == pa.string() else f.type for f in ARROW[t]
        ]


def test_every_column_the_trainer_writes_is_declared():
    c = cfg()
    summary = RunSummary(trial_id=c.trial_id, status="done", steps=4, tokens=64, final_train_loss=1.0,
                         final_val_loss=1.0, tokens_per_s=1.0, wall_s=1.0)
    row = run_row(c, summary, "cpu", "fp")
    assert set(row) <= set(ARROW["runs"].names), set(row) - set(ARROW["runs"].names)
    assert row["config_id"] == c.config_id and row["optimizer_family"] == "rotation_equivariant"


def test_config_id_ignores_only_the_seed():
    a = cfg(seed=0)
    assert cfg(seed=1).config_id == a.config_id and cfg(seed=1).trial_id != a.trial_id
    for other in (
        cfg(optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.5}),
        cfg(optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}),
        cfg(optimizer={"name": "sgd", "lr": 0.3, "momentum": 0.9}),
        cfg(rotation={"mode": "groups", "groups": [[0]]}),
        cfg(norm="rmsnorm_scalar"),
    ):
        assert other.config_id != a.config_id
    g1 = cfg(rotation={"mode": "groups", "groups": [[0]]})
    g2 = cfg(rotation={"mode": "groups", "groups": [[1]]})
    assert g1.config_id != g2.config_id
    assert g1.flat()["rotation_groups"] == "[[0]]" and g2.flat()["rotation_groups"] == "[[1]]"
