import pytest

from sweep.grid import expand, select
from sweep.spec import SpecError, parse_spec, trial_config

SPEC = {
    "name": "t",
    "train": {"steps": 5},
    "grid": {
        "model": [{"d_model": 32, "n_layers": 2, "n_heads": 2}, {"depth": 1}],
        "optimizer": [{"name": "adam", "lr": 1e-3}, {"name": "sgd", "lr": 0.1}],
        "norm": ["layernorm", "rmsnorm_scalar"],
        "rotation": ["none", {"mode": "partial", "group_size": 1}],
        "seed": [0, 1],
    },
}


def test_expand_is_the_cartesian_product_with_stable_unique_ids():
    trials = expand(parse_spec(SPEC))
    assert len(trials) == 2 * 2 * 2 * 2 * 2
    ids = [t.trial_id for t in trials]
    assert len(set(ids)) == len(ids)
    assert ids == [t.trial_id for t in expand(parse_spec(SPEC))]
    assert all(t.sweep == "t" for t in trials)


def test_each_seed_equals_its_point_validated_from_scratch():
    # expand validates a combination once and copies it per seed: the copies must be the trials
    spec = parse_spec({**SPEC, "grid": {**SPEC["grid"], "seed": [0, 3, 7]}})
    for t in expand(spec):
        fresh = trial_config(spec, t.model, t.optimizer, t.norm, t.rotation, t.seed)
        assert t == fresh and t.runtime == fresh.runtime
        assert (t.trial_id, t.config_id, t.science_json()) == (fresh.trial_id, fresh.config_id, fresh.science_json())


def test_adding_a_seed_keeps_existing_ids():
    before = {t.trial_id for t in expand(parse_spec(SPEC))}
    more = {**SPEC, "grid": {**SPEC["grid"], "seed": [0, 1, 2]}}
    after = {t.trial_id for t in expand(parse_spec(more))}
    assert before < after and len(after - before) == len(before) // 2


def test_resources_do_not_change_ids():
    a = expand(parse_spec(SPEC))
    b = expand(parse_spec({**SPEC, "resources": {"cpu": 2}}))
    assert [t.trial_id for t in a] == [t.trial_id for t in b]
    assert b[0].runtime.num_threads == 2


def test_duplicate_points_are_an_error():
    dup = {**SPEC, "grid": {**SPEC["grid"], "norm": ["layernorm", "layernorm"]}}
    with pytest.raises(SpecError, match=r"grid.norm\[1\]: the same grid point as grid.norm\[0\]"):
        parse_spec(dup)


def test_select_by_index_and_id_prefix():
    trials = expand(parse_spec(SPEC))
    assert select(trials, "3") is trials[3]
    assert select(trials, trials[5].trial_id[:8]) is trials[5]
    with pytest.raises(SpecError, match="indices 0..31"):
        select(trials, "99")
    with pytest.raises(SpecError, match="no trial"):
        select(trials, "zzzzzzzz")


def optimizers(*entries):
    return {**SPEC, "grid": {**SPEC["grid"], "model": [{"depth": 1}], "norm": ["layernorm"], "rotation": ["none"],
                             "seed": [0], "optimizer": list(entries)}}


def test_a_ladder_is_one_point_per_value():
    trials = expand(parse_spec(optimizers({"name": "sgd", "lr": [0.1, 0.3, 1.0], "momentum": 0.9},
                                          {"name": "adam", "lr": 1e-3, "eps": [1e-8, 1e-6]})))
    assert [(t.optimizer.name, t.optimizer.lr, t.optimizer.momentum) for t in trials[:3]] == [
        ("sgd", 0.1, 0.9), ("sgd", 0.3, 0.9), ("sgd", 1.0, 0.9)]
    assert [t.optimizer.eps for t in trials[3:]] == [1e-8, 1e-6]
    assert len({t.trial_id for t in trials}) == 5


def test_tuple_fields_take_a_list_of_tuples_and_ladders_multiply():
    spec = parse_spec(optimizers({"name": "adam", "lr": [1e-3, 3e-3], "betas": [[0.9, 0.95], [0.9, 0.99]]},
                                 {"name": "rotated_adam", "lr": 1e-3, "betas": [0.8, 0.9]}))  # one pair: no ladder
    assert [(o.lr, o.betas) for o in spec.grid.optimizer] == [
        (1e-3, (0.9, 0.95)), (1e-3, (0.9, 0.99)), (3e-3, (0.9, 0.95)), (3e-3, (0.9, 0.99)), (1e-3, (0.8, 0.9))]


def test_a_ladder_point_equal_to_another_entry_names_both():
    with pytest.raises(SpecError, match=r"grid.optimizer\[1\]: the same grid point as grid.optimizer\[0\].lr\[1\]"):
        parse_spec(optimizers({"name": "sgd", "lr": [0.1, 0.3]}, {"name": "sgd", "lr": 0.3}))
    with pytest.raises(SpecError, match=r"grid.optimizer\[0\].lr\[2\]: the same grid point as grid.optimizer\[0\].lr\[0\]"):
        parse_spec(optimizers({"name": "sgd", "lr": [0.1, 0.3, 0.1]}))
