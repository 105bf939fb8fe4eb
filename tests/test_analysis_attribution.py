"""analysis.attribution: persistence, the per-optimiser selection, the ablation band and the token
table, on hand-made frames (exact answers) and on a real sweep trained here (the fixture)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analysis import attribution as A
from analysis import load
from analysis.queries import runs_table
from resultstore.schema import DIMS_SCHEMA

TRIALS = [("adam", 32, 0), ("adam", 32, 1), ("sgd", 32, 0), ("adam", 16, 0)]


@pytest.fixture(scope="session")
def dims_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real sweep store: four tiny trials (adam at two sizes and two seeds, sgd), attributed at
    every eval."""
    from study.config import TrialConfig
    from study.train import train
    from resultstore.writer import ResultsStore

    store = ResultsStore(tmp_path_factory.mktemp("dims"), "dims")
    for name, d, seed in TRIALS:
        optimizer = {"name": "adam", "lr": 3e-3} if name == "adam" else {"name": "sgd", "lr": 0.3, "momentum": 0.9}
        cfg = TrialConfig(model={"d_model": d, "n_layers": 2, "n_heads": 2}, data={"seq_len": 16}, optimizer=optimizer,
                          seed=seed, sweep="dims",
                          train={"steps": 4, "batch_size": 4, "eval_every": 2, "eval_batch": {"sequences": 4},
                                 "checkpoint_every": 0, "invariance_check": False, "attribution_every": 1})
        train(cfg, store.sink(cfg.trial_id))
    return Path(store.path)


def top_rows(sets: dict[tuple[str, int, int], list[int]]) -> pl.DataFrame:
    """dims rows from {(trial, step, layer): top-k dims by max}, site resid."""
    rows = [{"trial_id": t, "step": s, "layer": l, "site": "resid", "dim": d, "rank_max": i + 1}
            for (t, s, l), dims in sets.items() for i, d in enumerate(dims)]
    return pl.DataFrame(rows).with_columns(pl.col("rank_max").cast(pl.Int64))


def test_persistence_across_layers_exactly():
    dims = top_rows({("t", 8, 0): [1, 2, 3, 4], ("t", 8, 1): [1, 2, 5, 6], ("t", 8, 2): [1, 5, 7, 8]})
    p = A.persistence(dims).collect()
    assert p.get_column("overlap_next").to_list() == [0.5, 0.5, None]
    assert p.get_column("overlap_last").to_list() == [0.25, 0.5, 1.0]
    assert p.get_column("k").to_list() == [4, 4, 4]


def test_persistence_over_evals_exactly():
    dims = top_rows({("t", 0, 1): [1, 2], ("t", 4, 1): [2, 3], ("t", 8, 1): [2, 3], ("u", 8, 1): [9, 9]})
    p = A.persistence_over_evals(dims).collect()
    assert p.select("trial_id", "step", "prev_step", "overlap_prev").rows() == [("t", 4, 0, 0.5), ("t", 8, 4, 1.0)]


def test_largest_model_of_each_optimizer_at_its_best_config():
    runs = pl.DataFrame({
        "trial_id": ["a", "b", "c", "d", "e"], "config_id": ["x", "x", "y", "z", "w"], "status": ["done"] * 5,
        "optimizer": ["adam", "adam", "adam", "adam", "sgd"], "params_non_embedding": [100, 100, 100, 50, 10],
        "final_val_loss": [2.0, 2.2, 2.5, 1.0, 3.0], "seed": [0, 1, 0, 0, 0], "d_model": [8, 8, 8, 4, 2],
    })  # fmt: skip
    shown = A.largest_per_optimizer(runs)
    assert shown.get_column("trial_id").to_list() == ["a", "b", "e"]  # y is worse; z is smaller


def test_token_labels():
    assert [A.token_label(t, True) for t in (10, 32, 46, 97, 200)] == ["\\n", "␣", ".", "a", "\\xc8"]
    assert A.token_label(300, False) == "#300" and A.token_label(46, False) == "#46"


def test_views_of_a_real_sweep(dims_sweep: Path):
    r = load(dims_sweep)
    plain = pl.read_parquet(str(dims_sweep / "dims" / "*.parquet"))
    assert plain.height == r.dims.collect().height and dict(r.dims.collect_schema()) == DIMS_SCHEMA
    assert sorted(plain.get_column("step").unique().to_list()) == [0, 2, 4]
    done = runs_table(r.runs.collect()).collect()
    shown = A.largest_per_optimizer(done)
    assert sorted(shown.select("optimizer", "d_model", "seed").rows()) == [("adam", 32, 0), ("adam", 32, 1), ("sgd", 32, 0)]

    m = A.persistence_map(r.dims, shown)
    assert m.get_column("layer").unique().sort().to_list() == [0, 1, 2]
    assert m.filter(pl.col("optimizer") == "adam").get_column("share").is_in([0.5, 1.0]).all()
    per_layer = m.filter(pl.col("optimizer") == "sgd").group_by("layer").len().get_column("len")
    assert per_layer.to_list() == [8, 8, 8]  # one seed: its k = 8 dims per layer

    band = A.ablation_band(r.dims, shown)
    assert band.height == 3 * 8 * 2 and set(band.get_column("n_null")) == {16}
    assert (band.get_column("null_lo") <= band.get_column("null_median")).all()
    assert (band.get_column("null_median") <= band.get_column("null_hi")).all()
    assert ((band.get_column("p") > 0) & (band.get_column("p") <= 1)).all()

    tokens = A.token_table(r.dims, shown)
    assert tokens.group_by("optimizer").len().sort("optimizer").rows() == [("adam", 3), ("sgd", 3)]
    assert set(tokens.get_column("seed")) == {0}
    assert tokens.get_column("top_tokens").str.contains("×").all()
    assert not tokens.get_column("top_tokens").str.contains("#").any()  # bytes of the stdlib corpus, readable
