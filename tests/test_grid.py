import pytest

from sweep.grid import expand, select, trial_config
from study.config import TrialConfig
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


def test_each_seed_equals_its_point_validated_from_scratch():
    # expand validates a combination once and copies it per seed: the copies must be the trials
    spec = parse_spec({**SPEC, "grid": {**SPEC["grid"], "seed": [0, 3, 7]}})
    for t in expand(spec):
        fresh = trial_config(spec, {"model": t.model, "optimizer": t.optimizer, "norm": t.norm, "attention": t.attention,
                                     "rotation": t.rotation, "seed": t.seed})
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


SIZES = {
    "name": "sized", "data": {"corpus": "stdlib", "seq_len": 16},
    "train": {"tokens_per_param": 2, "batch_size": 8, "eval_batch": {"sequences": 2}},
    "grid": {"model": [{"d_model": 32, "n_layers": 2, "n_heads": 2}, {"d_model": 128, "n_layers": 2, "n_heads": 2}],
             "optimizer": [{"name": "adam", "lr": 1e-3}, {"name": "sgd", "lr": [0.1, 0.3]}]},
}


def _with(optimizer_rule=None, **train):
    spec = {**SIZES, "train": {**SIZES["train"], **train},
            "grid": {**SIZES["grid"], "optimizer": [dict(o) for o in SIZES["grid"]["optimizer"]]}}
    if optimizer_rule:
        spec["grid"]["optimizer"][0]["lr_scaling"] = optimizer_rule
    return expand(parse_spec(spec))


def test_lr_scaling_sets_each_sizes_lr_from_the_fitted_rule():
    plain = _with()
    n0 = plain[0].params_non_embedding
    sized = _with({"reference_params": n0, "exponent": "-1/3"})
    assert {type(t.optimizer).__name__ for t in sized} == {"AdamConfig", "SGDConfig"}  # the configs, no rule
    for p, s in zip(plain, sized, strict=True):
        if p.optimizer.name == "adam":
            assert s.optimizer.lr == pytest.approx(1e-3 * (p.params_non_embedding / n0) ** (-1 / 3), rel=1e-12)
        else:  # the sgd entry has no rule: its trials are the very same
            assert s.trial_id == p.trial_id
    assert sized[0].trial_id == plain[0].trial_id  # at N0 the rule gives the written lr: the same trial
    big = next(t for t in sized if t.model.d_model == 128 and t.optimizer.name == "adam")
    assert big.optimizer.lr < 1e-3 / 2 and "lr_scaling" not in big.config_json()


def test_batch_scaling_rounds_to_a_multiple_and_warmup_follows_tokens_per_param():
    plain = _with()
    n0 = plain[0].params_non_embedding
    sized = _with(batch_scaling={"reference_params": n0, "exponent": "2/3"}, warmup_tokens_per_param=1)
    for p, s in zip(plain, sized, strict=True):
        n = p.params_non_embedding
        want = max(8, round(8 * (n / n0) ** (2 / 3) / 8) * 8)
        assert s.train.batch_size == want and s.train.batch_size % 8 == 0
        assert s.train.warmup == max(1, -(-n // (want * 16)))  # ceil(N tokens / tokens per step) steps
        assert s.total_steps <= p.total_steps  # the same tokens in fewer, larger steps
        assert type(s.train).__name__ == "TrainConfig" and "batch_scaling" not in s.config_json()
    assert {t.train.batch_size for t in sized} == {8, 8 * round((sized[-1].params_non_embedding / n0) ** (2 / 3))}


def test_specs_without_size_rules_keep_their_ids():
    """The spec's optimizer entries and train section gained the rules' fields (at None): the
    trials they build hash as before (ids from the code before them)."""
    golden = ["ddcb080f6b50", "a2a6ebf202fb", "74cf01b22fa8", "db8b0cb1f0eb", "b1755c22b8b2", "2b22f133814c"]
    trials = expand(parse_spec(SIZES))
    assert [t.trial_id for t in trials] == golden
    for t in trials:
        direct = TrialConfig(model=t.model, norm=t.norm, rotation=t.rotation, optimizer=t.optimizer.model_dump(),
                             data=t.data, train=t.train.model_dump(), seed=t.seed, sweep=t.sweep)
        assert direct.science_json() == t.science_json()


def test_batch_scaling_stops_at_its_cap():
    n0 = _with()[0].params_non_embedding
    sized = _with(batch_scaling={"reference_params": n0, "exponent": 1, "max_batch_size": 24})
    assert [t.train.batch_size for t in sized] == [8, 8, 8, 24, 24, 24]  # 8 at N0; 8 x ~13 = 104 capped


# ---- the attention axis (issue 36): expanded, and bad input located and refused with exit 2 ------


ATTENTION_SPEC = """name: attn
data: {corpus: stdlib, seq_len: 32}
train: {steps: 4, batch_size: 4, eval_every: 2, eval_batch: {sequences: 2}}
grid:
  model: [{d_model: 32, n_layers: 2, n_heads: 2}]
  optimizer: [{name: adam, lr: 1.0e-3}]
  attention: ATTENTION
"""


def test_a_spec_expands_the_attention_axis(tmp_path):
    from sweep.spec import load_spec

    path = tmp_path / "a.yaml"
    path.write_text(ATTENTION_SPEC.replace("ATTENTION", "[softmax, gated, {name: clipped, gamma: -0.1}]"))
    trials = expand(load_spec(path))
    assert [t.attention.label for t in trials] == ["softmax", "gated", "clipped(zeta=1,gamma=-0.1)"]
    plain = tmp_path / "b.yaml"
    plain.write_text(ATTENTION_SPEC.replace("  attention: ATTENTION\n", ""))
    assert expand(load_spec(plain))[0].trial_id == trials[0].trial_id  # no axis: softmax, the same trial


@pytest.mark.parametrize("value, message", [
    ("[softmax, softmax2]", "grid.attention[1].name: Input should be 'softmax', 'softmax1', 'gated', 'clipped' or "
                            "'kv_bias', got 'softmax2' (line 7)"),
    ("[softmax, {name: clipped, gamma: 0.1}]", "grid.attention[1].gamma: Input should be less than or equal to 0, "
                                               "got 0.1 (line 7)"),
    ("[{name: gated, zeta: 1.1}]", "grid.attention[0].zeta: zeta applies to attention clipped only, not gated, "
                                   "got 1.1 (line 7)"),
    ("[gated, {name: gated}]", "grid.attention[1]: the same grid point as grid.attention[0] (line 7)"),
    ("[]", "grid.attention: List should have at least 1 item"),
])
def test_bad_attention_entries_exit_2_naming_their_place(tmp_path, value, message):
    from typer.testing import CliRunner

    from sweep.cli import app

    path = tmp_path / "bad.yaml"
    path.write_text(ATTENTION_SPEC.replace("ATTENTION", value))
    result = CliRunner().invoke(app, ["plan", str(path), "--results", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
