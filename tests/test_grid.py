import pytest

from sweep.grid import expand, select
from sweep.spec import SpecError, parse_spec

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
    with pytest.raises(SpecError, match="same trial"):
        expand(parse_spec(dup))


def test_select_by_index_and_id_prefix():
    trials = expand(parse_spec(SPEC))
    assert select(trials, "3") is trials[3]
    assert select(trials, trials[5].trial_id[:8]) is trials[5]
    with pytest.raises(SpecError, match="indices 0..31"):
        select(trials, "99")
    with pytest.raises(SpecError, match="no trial"):
        select(trials, "zzzzzzzz")
