"""analysis.identity: which trials are one ladder, one line across sizes."""

from __future__ import annotations

import polars as pl
from analysis.identity import with_ids
from study.config import TrialConfig


def _row(d_model: int, lr: float, parametrization: str = "sp", seed: int = 0, optimizer: str = "adam") -> dict:
    cfg = TrialConfig(model={"d_model": d_model, "n_layers": 2, "n_heads": 2, "parametrization": parametrization},
                      optimizer={"name": optimizer, "lr": lr}, train={"steps": 10}, seed=seed)
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
