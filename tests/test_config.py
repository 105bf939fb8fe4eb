import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from study.config import ModelConfig, RotationConfig, TrialConfig


def make(**kw):
    base = dict(model={"d_model": 64, "n_layers": 2, "n_heads": 2}, optimizer={"name": "adam", "lr": 1e-3},
                train={"steps": 10})
    base.update(kw)
    return TrialConfig(**base)


def test_depth_shorthand():
    m = ModelConfig(depth=3)
    assert (m.d_model, m.n_layers, m.n_heads, m.d_mlp) == (192, 3, 3, 768)


def test_json_round_trip_and_frozen():
    cfg = make(rotation={"mode": "partial", "group_size": 2}, norm="rmsnorm_scalar")
    again = TrialConfig.model_validate_json(cfg.model_dump_json())
    assert again == cfg and again.trial_id == cfg.trial_id
    with pytest.raises(ValidationError):
        cfg.seed = 3


def test_trial_id_ignores_runtime_and_sweep_but_not_science():
    cfg = make()
    assert make(runtime={"device": "cpu", "num_threads": 4}, sweep="x").trial_id == cfg.trial_id
    assert make(seed=1).trial_id != cfg.trial_id
    assert make(optimizer={"name": "adam", "lr": 2e-3}).trial_id != cfg.trial_id


def test_ids_of_a_copy_follow_its_fields():
    # the ids are cached on first use; a copy with other science must not inherit them
    cfg = make()
    ids = (cfg.trial_id, cfg.config_id)
    other = cfg.model_copy(update={"seed": 1, "norm": "rmsnorm"})
    assert (other.trial_id, other.config_id) == (make(seed=1, norm="rmsnorm").trial_id, make(norm="rmsnorm").config_id)
    assert other.trial_id != ids[0] and other.config_id != ids[1]
    assert cfg.model_copy(update={"sweep": "y"}).trial_id == ids[0]


@pytest.mark.parametrize("norm,per_norm", [("layernorm", 128), ("rmsnorm", 64), ("rmsnorm_scalar", 1)])
def test_param_count_formula(norm, per_norm):
    cfg = make(norm=norm)
    d, f, L, V, T = 64, 256, 2, 256, cfg.data.seq_len
    non_emb = L * (2 * per_norm + 4 * d * d + 2 * d * f) + per_norm
    assert cfg.params_non_embedding == non_emb
    assert cfg.params == non_emb + 2 * V * d + T * d


def test_steps_from_tokens_per_param():
    cfg = make(train={"tokens_per_param": 20, "batch_size": 4})
    assert cfg.total_steps == -(-20 * cfg.params_non_embedding // (4 * cfg.data.seq_len))


@pytest.mark.parametrize("bad,field", [
    (dict(model={"d_model": 30, "n_layers": 2, "n_heads": 4}), "model"),
    (dict(optimizer={"name": "adam", "lr": 0}), "optimizer.lr"),
    (dict(optimizer={"name": "adamw", "lr": 1e-3}), "optimizer.name"),
    (dict(norm="batchnorm"), "norm"),
    (dict(rotation={"mode": "partial"}), "rotation"),
    (dict(rotation={"mode": "partial", "group_size": 3}), "rotation.group_size"),
    (dict(train={"steps": 10, "tokens": 100}), "train"),
    (dict(train={"steps": 10, "learning_rate": 1}), "train.learning_rate"),
    (dict(optimizer={"name": "soap", "lr": 1e-3, "precondition_frequency": 0}), "optimizer.precondition_frequency"),
    (dict(optimizer={"name": "muon", "lr": 1e-3, "muon_exclude": ["*emb*", "blocks.*"]}), "optimizer.muon_exclude"),
])
def test_bad_configs_name_the_field(bad, field):
    with pytest.raises(ValidationError) as info:
        make(**bad)
    text = str(info.value)
    assert field.split(".")[0] in text
    if "." in field and "group_size" not in field:
        assert field in text


def test_rotation_string_shorthand_and_label():
    assert RotationConfig.model_validate("shared").mode == "shared"
    assert RotationConfig(mode="partial", group_size=2).label == "partial(2)"


@pytest.mark.parametrize("bad,field,message", [
    (dict(train={"steps": True}), "train.steps", "not a boolean"),
    (dict(optimizer={"name": "adam", "lr": float("inf")}), "optimizer.lr", "finite"),
    (dict(optimizer={"name": "adam", "lr": float("nan")}), "optimizer.lr", "finite"),
    (dict(optimizer={"name": "adam", "lr": 1e-3, "betas": [0.9, float("nan")]}), "optimizer.betas.1", "finite"),
    (dict(train={"steps": 10, "diverge_factor": float("inf")}), "train.diverge_factor", "finite"),
    (dict(seed=2**70), "seed", "64-bit"),
    (dict(rotation={"mode": "groups", "groups": [[], [0]]}), "rotation", "at least one block"),
    (dict(runtime={"device": "tpu"}), "runtime.device", "pattern"),
])
def test_configs_are_strict(bad, field, message):
    with pytest.raises(ValidationError) as info:
        make(**bad)
    assert field in str(info.value) and message in str(info.value)


def test_bools_stay_bools_and_ints_fit_int64():
    cfg = make(optimizer={"name": "sgd", "lr": 0.1, "nesterov": True}, seed=2**63 - 1, runtime={"compile": True})
    assert cfg.optimizer.nesterov is True and cfg.seed == 2**63 - 1


def test_cross_field_errors_name_their_field():
    with pytest.raises(ValidationError) as info:
        make(train={"steps": 10, "eval_batch": {"seq_len": 999}})
    (err,) = info.value.errors()
    assert err["ctx"]["error"].loc == ("train", "eval_batch", "seq_len")


def test_every_optimizer_has_a_family_and_muon_exclude_is_muons_alone():
    from typing import get_args

    from study.config import OptimizerConfig, OptimizerName
    from study.optim import OPTIMIZER_FAMILY
    from study.optim.muon import MUON_ENDS_FAMILY
    from study.optim.registry import FAMILIES
    assert set(OPTIMIZER_FAMILY) == set(get_args(OptimizerName))
    assert set(OPTIMIZER_FAMILY.values()) | set(MUON_ENDS_FAMILY.values()) | {"mixed"} == set(FAMILIES)
    assert set(FAMILIES) == {"per_coordinate", "rotation_equivariant", "fixed_random_basis", "adaptive_basis", "mixed"}
    with pytest.raises(ValidationError) as info:  # not adam's: refused at its place, not ignored
        make(optimizer={"name": "adam", "lr": 1e-3, "muon_exclude": ["*"]})
    (err,) = info.value.errors()
    assert err["loc"] == ("optimizer", "muon_exclude") and err["msg"].startswith("muon_exclude does not apply to adam")
    muon = OptimizerConfig.model_validate({"name": "muon", "lr": 1e-3, "muon_exclude": ["blocks.*.attn.*"]})
    assert muon.name == "muon"  # MLPs remain


def test_each_optimizer_takes_its_own_fields_and_reads_stored_configs_back():
    """A field another optimiser has is refused by name; the old flat config's fields at the
    value every stored config_json holds are read and dropped, and written back into the JSON."""
    with pytest.raises(ValidationError) as info:
        make(optimizer={"name": "sgd", "lr": 0.1, "betas": [0.8, 0.9], "lrr": 1})
    assert [(e["loc"], e["msg"].split(" (")[0]) for e in info.value.errors()] == [
        (("optimizer", "betas"), "betas does not apply to sgd"), (("optimizer", "lrr"), "unknown key")]
    assert "(expected one of: name, lr, weight_decay, momentum, nesterov)" in info.value.errors()[0]["msg"]
    adam = make(optimizer={"name": "adam", "lr": 1e-3, "momentum": 0.9, "muon_ends": "adamw"})  # old defaults
    assert adam == make() and not hasattr(adam.optimizer, "momentum")
    assert json.loads(adam.config_json())["optimizer"]["momentum"] == 0.9
    assert TrialConfig.model_validate_json(adam.config_json()) == adam

def test_ids_are_golden():
    # Stored trials keep their ids: a new config field must be listed in its class's
    # `id_optional` (left out of the ids while at its default), or these change.
    cfg = make()
    assert (cfg.trial_id, cfg.config_id) == ("2937e358547a", "02fea6c04727")
    cfg = TrialConfig(model={"d_model": 128, "n_layers": 4, "n_heads": 4}, optimizer={"name": "muon", "lr": 3e-3},
                      norm="rmsnorm_scalar", rotation={"mode": "partial", "group_size": 2}, train={"steps": 1500}, seed=2)
    assert (cfg.trial_id, cfg.config_id) == ("a7422d2bd6c8", "f18179541042")


def test_a_new_field_at_its_default_leaves_the_ids_alone(monkeypatch):
    from study.optim.adam import AdamConfig
    from study.optim.registry import ID_FIELDS

    cfg = make(optimizer={"name": "adam", "lr": 1e-3, "eps": 1e-6})
    ids = (cfg.trial_id, cfg.config_id)
    monkeypatch.setattr(AdamConfig, "id_optional", (*AdamConfig.id_optional, "eps"))
    monkeypatch.setattr(AdamConfig, "id_fill", {k: v for k, v in ID_FIELDS.items() if k != "eps"})
    at_default = make()
    assert make(optimizer={"name": "adam", "lr": 1e-3, "eps": 1e-6}).trial_id == ids[0]  # not at its default: hashed
    assert '"eps"' not in at_default.science_json() and '"eps"' not in at_default.config_json()
    assert TrialConfig.model_validate_json(at_default.config_json()) == at_default


@pytest.mark.parametrize("optimizer, norm, family", [
    ({"name": "muon", "lr": 1e-3}, "rmsnorm_scalar", "mixed"),  # AdamW trains its embeddings per coordinate
    ({"name": "muon", "lr": 1e-3, "muon_ends": "adamw"}, "layernorm", "mixed"),
    ({"name": "muon", "lr": 1e-3, "muon_ends": "sgd", "muon_ends_lr_ratio": 30}, "rmsnorm_scalar", "rotation_equivariant"),
    ({"name": "muon", "lr": 1e-3, "muon_ends": "rotated_adam"}, "rmsnorm", "fixed_random_basis"),
    ({"name": "soap", "lr": 1e-3}, "rmsnorm_scalar", "adaptive_basis"),
    ({"name": "soap", "lr": 1e-3}, "layernorm", "mixed"),  # its gain and bias vectors get plain Adam
    ({"name": "soap", "lr": 1e-3}, "rmsnorm", "mixed"),
    ({"name": "soap", "lr": 1e-3, "soap_vectors": "shampoo"}, "layernorm", "adaptive_basis"),
    ({"name": "sgd", "lr": 1e-1}, "layernorm", "rotation_equivariant"),
    ({"name": "rotated_adam", "lr": 1e-3}, "layernorm", "fixed_random_basis"),
    ({"name": "adam", "lr": 1e-3}, "rmsnorm_scalar", "per_coordinate"),
])
def test_family_says_what_trains_every_residual_basis_parameter(optimizer, norm, family):
    row = make(optimizer=optimizer, norm=norm).flat()
    assert row["optimizer_family"] == family
    assert row["muon_ends"] == (optimizer.get("muon_ends", "adamw") if optimizer["name"] == "muon" else None)


def test_muon_ends_fields_keep_old_ids_and_change_new_ones():
    base = make(optimizer={"name": "muon", "lr": 3e-3})
    explicit = make(optimizer={"name": "muon", "lr": 3e-3, "muon_ends": "adamw", "muon_ends_lr_ratio": 1.0})
    assert explicit.trial_id == base.trial_id and '"muon_ends"' not in base.config_json()
    pure = make(optimizer={"name": "muon", "lr": 3e-3, "muon_ends": "sgd"})
    scaled = make(optimizer={"name": "muon", "lr": 3e-3, "muon_ends": "sgd", "muon_ends_lr_ratio": 30})
    assert len({base.trial_id, pure.trial_id, scaled.trial_id}) == 3
    assert TrialConfig.model_validate_json(scaled.config_json()) == scaled
    with pytest.raises(ValidationError):
        make(optimizer={"name": "muon", "lr": 3e-3, "muon_ends": "lion"})
    with pytest.raises(ValidationError):
        make(optimizer={"name": "muon", "lr": 3e-3, "muon_ends_lr_ratio": 0})


def test_a_written_entry_is_refused_a_field_its_optimizer_lacks_at_any_value_a_stored_one_is_not():
    """Item 9 of issue 50: a spec's `{name: adam, momentum: 0.9}` was dropped without a word because
    0.9 is the old flat config's default; read with context WRITTEN it is refused, while every
    config_json of the kept stores (which carries those fields at their defaults) reads back to
    its own trial id."""
    import glob

    import pyarrow.parquet as pq

    from study.optim.registry import ID_FIELDS, WRITTEN, OptimizerConfig

    for key, value in [("momentum", 0.9), ("rotate", "residual"), ("muon_ends", "adamw"), ("betas", [0.9, 0.95])]:
        name = "sgd" if key == "betas" else "adam"
        entry = {"name": name, "lr": 1e-3, key: value}
        assert OptimizerConfig.model_validate(entry).name == name  # stored: read and dropped
        with pytest.raises(ValidationError) as info:
            OptimizerConfig.model_validate(entry, context=WRITTEN)
        assert [(e["loc"], e["msg"].split(" (")[0]) for e in info.value.errors()] == [
            ((key,), f"{key} does not apply to {name}")]
    with pytest.raises(ValidationError):  # through a whole trial too (a nested model keeps the context)
        TrialConfig.model_validate({**json.loads(make().config_json()), "optimizer": {
            "name": "adam", "lr": 1e-3, "momentum": 0.9}}, context=WRITTEN)
    root = Path(__file__).parent.parent / "docs" / "stores"
    rows = [r for f in sorted(glob.glob(str(root / "*" / "runs" / "*.parquet")))
            for r in pq.read_table(f, columns=["trial_id", "config_json"]).to_pylist()]
    assert len(rows) > 100
    for row in rows:
        stored = json.loads(row["config_json"])
        assert set(ID_FIELDS) <= set(stored["optimizer"])  # the flat config's fields, at their defaults
        assert TrialConfig.model_validate_json(row["config_json"]).trial_id == row["trial_id"]
