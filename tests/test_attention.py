"""The attention axis's config (study/attention.py): names, the clipped stretch, labels, sizes,
and ids that leave every trial before the axis alone (the grid axis: tests/test_grid.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from study.attention import ATTENTION_NAMES, AttentionConfig
from study.config import TrialConfig


def trial(attention=None, **kw) -> TrialConfig:
    base = dict(model={"d_model": 64, "n_layers": 2, "n_heads": 2}, optimizer={"name": "adam", "lr": 1e-3},
                train={"steps": 10}, norm="rmsnorm_scalar")
    if attention is not None:
        base["attention"] = attention
    return TrialConfig(**{**base, **kw})


def test_names_and_the_string_shorthand():
    assert ATTENTION_NAMES == ("softmax", "softmax1", "gated", "clipped", "kv_bias")
    assert AttentionConfig.model_validate("gated") == AttentionConfig(name="gated")
    assert trial().attention == AttentionConfig() and trial().attention.name == "softmax"


def test_clipped_gets_the_papers_stretch_and_only_clipped_takes_one():
    clipped = AttentionConfig(name="clipped")
    assert (clipped.zeta, clipped.gamma) == (1.0, -0.03)  # Bondarenko et al.'s Table 1 best
    assert clipped.label == "clipped"
    assert AttentionConfig(name="clipped", gamma=-0.1).label == "clipped(zeta=1,gamma=-0.1)"
    assert (AttentionConfig(name="gated").zeta, AttentionConfig(name="gated").gamma) == (None, None)
    with pytest.raises(ValidationError, match="gamma applies to attention clipped only"):
        AttentionConfig(name="softmax1", gamma=-0.03)
    for bad in ({"name": "clipped", "gamma": 0.1}, {"name": "clipped", "zeta": 0.9}, {"name": "softmax2"},
                {"name": "gated", "bias": 1.0}):
        with pytest.raises(ValidationError):
            AttentionConfig.model_validate(bad)


def test_the_default_leaves_every_id_as_it_was_and_a_variant_changes_it():
    """The trial of specs/families/families.yaml (adam, d_model 128, seed 0): its ids as computed before
    the attention axis existed (pinned on the commit before it)."""
    spec_like = dict(model={"d_model": 128, "n_layers": 4, "n_heads": 4}, optimizer={"name": "adam", "lr": 3e-3},
                     norm="rmsnorm_scalar", data={"corpus": "stdlib", "seq_len": 128},
                     train={"steps": 1500, "batch_size": 32, "lr_schedule": "cosine", "warmup": 0.05, "eval_every": 300,
                            "eval_batch": {"sequences": 16}, "checkpoint_every": 500})
    for cfg in (TrialConfig(**spec_like), TrialConfig(**spec_like, attention="softmax"),
                TrialConfig(**spec_like, attention={"name": "softmax"})):
        assert (cfg.trial_id, cfg.config_id) == ("20e7dc8cb1b5", "df76fc2f50ce")
        assert "attention" not in cfg.science_json() and "attention" not in cfg.config_json()
        assert (cfg.params, cfg.flops_per_token) == (868361, 5308470.0)  # as stored in results/families
    ids = {TrialConfig(**spec_like, attention=name).trial_id for name in ATTENTION_NAMES}
    assert len(ids) == len(ATTENTION_NAMES)
    gated = TrialConfig(**spec_like, attention="gated")
    assert '"attention":{"name":"gated"}' in gated.science_json()  # no stretch fields outside clipped
    assert TrialConfig.model_validate_json(gated.config_json()) == gated
    clipped = TrialConfig(**spec_like, attention="clipped")
    assert '"attention":{"gamma":-0.03,"name":"clipped","zeta":1.0}' in clipped.science_json()
    assert TrialConfig(**spec_like, attention={"name": "clipped", "gamma": -0.03, "zeta": 1}).trial_id == clipped.trial_id


@pytest.mark.parametrize("name, extra_params, extra_keys", [
    ("softmax", 0, 0), ("softmax1", 0, 1), ("clipped", 0, 0), ("gated", 64 * 64, 0), ("kv_bias", 2 * 64, 1),
])
def test_sizes_count_the_variants_own_parameters_and_keys(name, extra_params, extra_keys):
    base, cfg = trial(), trial(name)
    assert cfg.params_non_embedding - base.params_non_embedding == 2 * extra_params  # 2 blocks
    assert cfg.params - base.params == 2 * extra_params
    L, d, V = 2, 64, 256
    assert cfg.flops_per_token - base.flops_per_token == 6 * 2 * extra_params + 6 * L * extra_keys * d
    assert cfg.flat()["attention"] == name


def test_the_runs_column_is_the_label():
    assert trial({"name": "clipped", "zeta": 1.03}).flat()["attention"] == "clipped(zeta=1.03,gamma=-0.03)"
    assert trial().flat()["attention"] == "softmax"
