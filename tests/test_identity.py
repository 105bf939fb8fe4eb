"""analysis.identity: which trials are one ladder, one line across sizes."""

from __future__ import annotations

import polars as pl
from analysis.identity import with_ids
from study.config import TrialConfig


def _row(d_model: int, lr: float, parametrization: str = "sp", seed: int = 0, optimizer: str = "adam",
         batch_size: int = 32) -> dict:
    cfg = TrialConfig(model={"d_model": d_model, "n_layers": 2, "n_heads": 2, "parametrization": parametrization},
                      optimizer={"name": optimizer, "lr": lr}, train={"steps": 10, "batch_size": batch_size}, seed=seed)
    return {"trial_id": cfg.trial_id, "config_id": cfg.config_id, "config_json": cfg.config_json()}


def _ids(rows: list[dict]) -> pl.DataFrame:
    return with_ids(pl.DataFrame(rows)).collect()


def test_a_line_spans_widths_and_lrs_but_not_parametrizations() -> None:
    """The width study's SP and muP ladders are two lines: a slope across widths never mixes them."""
    ids = _ids([_row(64, 1e-3), _row(128, 3e-3), _row(64, 1e-3, "mup"), _row(128, 3e-3, "mup")])
    tuned = ids.get_column("tuned_line_id").to_list()
    assert tuned[0] == tuned[1] and tuned[2] == tuned[3] and tuned[0] != tuned[2]
    lines = ids.get_column("line_id").to_list()
    assert lines[0] != lines[1]  # line_id keeps the lr
    assert lines[0] == _ids([_row(128, 1e-3)]).get_column("line_id")[0]


def test_a_ladder_is_one_width_one_parametrization_and_every_lr() -> None:
    ids = _ids([_row(64, 1e-3), _row(64, 3e-3, seed=1), _row(128, 1e-3), _row(64, 1e-3, "mup")])
    tuning = ids.get_column("tuning_id").to_list()
    assert tuning[0] == tuning[1] and len(set(tuning)) == 3
    assert ids.get_column("config_id").to_list()[1] != ids.get_column("config_id").to_list()[0]


def test_the_optimiser_is_part_of_every_id() -> None:
    ids = _ids([_row(64, 1e-3), _row(64, 1e-3, optimizer="rotated_adam")])
    for column in ("config_id", "tuning_id", "line_id", "tuned_line_id"):
        assert ids.get_column(column).n_unique() == 2, column


def test_a_batch_set_per_size_stays_on_one_line() -> None:
    """A spec's batch_scaling resolves each size's batch into its config: the sizes are still one
    line (else no fit spans them), while a ladder (one size) keeps its batch."""
    ids = _ids([_row(64, 1e-3, batch_size=32), _row(128, 1e-3, batch_size=128), _row(64, 1e-3, batch_size=128)])
    for column in ("line_id", "tuned_line_id"):
        assert ids.get_column(column).n_unique() == 1, column
    tuning = ids.get_column("tuning_id").to_list()
    assert len(set(tuning)) == 3


def test_the_fixed_steps_arm_is_one_line_across_its_widths() -> None:
    """specs/width/width_fixed_steps.yaml: batch in proportion to N (32 at d 64, 128 at d 128),
    expanded as `sweep run` does; each optimiser's two widths share a line."""
    import json
    from pathlib import Path

    from sweep.grid import expand
    from sweep.spec import load_spec

    cfgs = expand(load_spec(Path(__file__).parents[1] / "specs/width/width_fixed_steps.yaml"))
    assert {c.train.batch_size for c in cfgs} == {32, 128}
    rows = [{"trial_id": c.trial_id, "config_id": c.config_id, "config_json": c.config_json(),
             "optimizer": c.optimizer.name} for c in cfgs]
    ids = _ids(rows)
    lines = ids.group_by("optimizer").agg(pl.col("tuned_line_id").n_unique().alias("n"), pl.len())
    assert lines.get_column("n").to_list() == [1, 1] and json.loads(rows[0]["config_json"])["train"]["batch_size"] == 32
