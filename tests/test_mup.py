"""muP (model.parametrization: mup): the coordinate check (activations flat across widths under muP,
growing under SP), muP at the base width is SP exactly, the per-role lr multipliers reach every
group and survive the schedule, the refusals, and the ids of every SP trial unchanged."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import polars as pl
import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from study.config import TrialConfig
from study.data import load_corpus, sample_batch
from study.model import Transformer
from study.optim import build_optimizer
from study.optim.registry import OPTIMIZERS, optimizer_names
from study.optim.rules.groups import MUP_ROLES, mup_role
from study.rotation import generator_for
from study.schedule import lr_at, set_lr
from sweep.cli import app

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (64, 128, 256, 512)
MUP_FLAT = 0.6
"""Under muP, every layer's activation RMS after a few steps has |log-slope| against log width
below this. Measured here: <= 0.44 for adam (attn0's: the first block's attention output falls a
little with width, 1/D attention staying flatter at larger D in the first steps), <= 0.15 for sgd;
under SP every block's >= 1.4 and the logits' 0.62 (adam), 0.98 (sgd). Without the hidden lr / m
adam's attn0 reads 1.70; without the output multiplier adam's block1 reads -0.78, sgd's attn0 3.4."""
RULED = [n for n in optimizer_names() if OPTIMIZERS[n].mup is not None]
SPEC_LR = {"sgd": 0.1}


def trial(width: int, param: str = "mup", name: str = "adam", lr: float | None = None, **kw) -> TrialConfig:
    model = {"d_model": width, "n_layers": 2, "n_heads": 4, "parametrization": param, **kw.pop("model", {})}
    return TrialConfig(model=model, optimizer={"name": name, "lr": lr or SPEC_LR.get(name, 1e-3), **kw.pop("optimizer", {})},
                       data={"seq_len": 32}, train={"steps": 3, "batch_size": 8, "lr_schedule": "constant", "warmup": 0,
                                                     "grad_clip": 0}, **kw)


corpus = functools.cache(load_corpus)


def train_steps(cfg: TrialConfig, model: Transformer, steps: int) -> torch.optim.Optimizer:
    """`steps` optimiser steps at the schedule's lrs (set_lr, as study.train does) on the stdlib corpus."""
    optimizer, gen = build_optimizer(cfg, model), generator_for(cfg.seed, "data")
    data = corpus(cfg.data).train
    for step in range(steps):
        set_lr(cfg, optimizer.param_groups, step)
        x, y = sample_batch(data, cfg.train.batch_size, cfg.data.seq_len, gen, torch.device("cpu"))
        model(x, y)[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return optimizer


def activation_rms(cfg: TrialConfig, steps: int = 3) -> dict[str, float]:
    """RMS of each layer's output after `steps` steps, on a fresh training batch: the embedding
    (block 0's input), each block's attention and MLP output and the block's output, the logits."""
    torch.manual_seed(0)
    model = Transformer.from_config(cfg)
    train_steps(cfg, model, steps)
    acts: dict[str, torch.Tensor] = {}
    hooks = [model.blocks[0].register_forward_pre_hook(lambda m, a: acts.__setitem__("emb", a[0]))]
    for i, b in enumerate(model.blocks):
        for site, module in (("attn", b.attn), ("mlp", b.mlp), ("block", b)):
            hooks.append(module.register_forward_hook(lambda m, a, o, k=f"{site}{i}": acts.__setitem__(k, o)))
    x, y = sample_batch(corpus(cfg.data).train, 8, cfg.data.seq_len, generator_for(99, "data"), torch.device("cpu"))
    with torch.no_grad():
        acts["logits"] = model(x, y)[0]
    for h in hooks:
        h.remove()
    return {k: v.pow(2).mean().sqrt().item() for k, v in acts.items()}


def log_slopes(param: str, name: str = "adam", lr: float | None = None) -> dict[str, float]:
    """Each layer's least-squares slope of log RMS against log width over WIDTHS."""
    rms = {w: activation_rms(trial(w, param, name, lr)) for w in WIDTHS}
    xs = [math.log(w) for w in WIDTHS]
    mx = sum(xs) / len(xs)
    out = {}
    for layer in rms[WIDTHS[0]]:
        ys = [math.log(rms[w][layer]) for w in WIDTHS]
        my = sum(ys) / len(ys)
        out[layer] = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
    return out


@pytest.mark.parametrize("name, lr", [("adam", 1e-2), ("sgd", 0.3)])
def test_coordinate_check_flat_under_mup_growing_under_sp(name, lr):
    """The standard coordinate check (TP5 Fig. 5): 3 steps at one lr, widths 64 to 512."""
    mup, sp = log_slopes("mup", name, lr), log_slopes("sp", name, lr)
    assert max(abs(s) for s in mup.values()) < MUP_FLAT, mup
    assert sp["logits"] > 0.4 and min(sp[f"block{i}"] for i in range(2)) > 1.0, sp


@pytest.mark.parametrize("name", RULED)
def test_mup_at_the_base_width_is_sp_exactly(name):
    """float64: at d_model = mup_base_width every multiplier is exactly 1, so three steps of muP
    leave the very weights SP's do (each optimiser with a rule)."""
    states = []
    for param in ("sp", "mup"):
        cfg = trial(64, param, name)
        model = Transformer.from_config(cfg, dtype=torch.float64)
        train_steps(cfg, model, 3)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.parametrize("name", RULED)
def test_every_group_carries_its_roles_multiplier_through_the_schedule(name):
    """muP at m = 4: every group holds one role, its lr_scale is the rule's, and set_lr writes
    lr_at x lr_scale at every step; SP's groups have no lr_scale and get lr_at itself."""
    cfg = TrialConfig(model={"d_model": 256, "n_layers": 2, "n_heads": 4, "parametrization": "mup"},
                      optimizer={"name": name, "lr": 1e-3}, train={"steps": 10, "warmup": 3})
    model = Transformer.from_config(cfg)
    groups = build_optimizer(cfg, model).param_groups
    for g in groups:
        roles = {mup_role(n, p) for n, p in zip(g["param_names"], g["params"])}
        assert len(roles) == 1 and roles <= set(MUP_ROLES)
        role = roles.pop()
        if name == "adam" and role == "hidden":
            assert g["lr_scale"] == 0.25
        if name == "sgd":
            assert g["lr_scale"] == {"hidden": 1.0, "scalar": 1.0}.get(role, 4.0)
        for step in (0, 2, 5, 9):
            set_lr(cfg, groups, step)
            assert g["lr"] == lr_at(cfg, step) * g["lr_scale"]
    sp = cfg.model_copy(update={"model": cfg.model.model_copy(update={"parametrization": "sp"})})
    sp_groups = build_optimizer(sp, Transformer.from_config(sp)).param_groups
    assert all("lr_scale" not in g for g in sp_groups)
    set_lr(sp, sp_groups, 4)
    assert all(g["lr"] == lr_at(sp, 4) for g in sp_groups)


def test_sp_builds_what_it_always_built():
    """SP: every optimiser's groups are the two of before (ndim >= 2 with weight decay, the rest
    without; named, in the model's order; no lr_scale), the attention calls SDPA at its own
    scale and the logits take no multiplier."""
    cfg = trial(128, "sp")
    model = Transformer.from_config(cfg)
    named = [(n, p) for n, p in model.named_parameters()]
    want = [[n for n, p in named if p.ndim >= 2], [n for n, p in named if p.ndim < 2]]
    for name in ("adam", "sgd", "adafactor", "lion", "signsgd", "rotated_adam", "soap"):
        c = trial(128, "sp", name, optimizer={"weight_decay": 0.1})
        groups = build_optimizer(c, model).param_groups
        assert [g["param_names"] for g in groups] == want and [g["weight_decay"] for g in groups] == [0.1, 0.0]
        assert all("lr_scale" not in g and g["lr"] == c.optimizer.lr for g in groups)
    assert model.output_mult == 1.0 and all(b.attn.logit_mult == 1.0 and b.attn.scale(torch.zeros(1, 1, 1, 32)) is None
                                            for b in model.blocks)


def test_mup_init_attention_and_output():
    """At m = 4: hidden matrices drawn at SP's std / 2 (the same draws, scaled), the rest as SP;
    attention logits scaled sqrt(D0 / D) = 1/2 (1/D matched at D0 = 16); logits / 4."""
    sp, mup = (Transformer.from_config(trial(256, p), dtype=torch.float64) for p in ("sp", "mup"))
    for (n, a), b in zip(sp.named_parameters(), mup.parameters()):
        assert torch.equal(b, a / 2 if mup_role(n, a) == "hidden" else a), n
    assert mup.output_mult == 0.25 and all(b.attn.logit_mult == 0.5 for b in mup.blocks)
    q, k = torch.randn(2, 4, 5, 64, dtype=torch.float64), torch.randn(2, 4, 5, 64, dtype=torch.float64)
    att = mup.blocks[0].attn
    torch.testing.assert_close(att.scores(q, k), sp.blocks[0].attn.scores(q, k) / 2, rtol=1e-12, atol=0)
    torch.testing.assert_close(att.pattern(q, k) @ k, att.mix(q, k, k), rtol=1e-10, atol=1e-12)  # SDPA's scale = pattern's


@pytest.mark.parametrize("name, ends", [("muon", "adamw"), ("muon", "sgd")])
def test_muons_matrices_and_ends(name, ends):
    """Muon (match_rms_adamw): its matrices at lr / sqrt(m); its ends by their own rule."""
    cfg = trial(256, "mup", name, optimizer={"muon_ends": ends, "muon_ends_lr_ratio": 1.0})
    opt = build_optimizer(cfg, Transformer.from_config(cfg))
    assert {g["lr_scale"] for g in opt.muon.param_groups} == {0.5}
    ends_scales = {mup_role(n, p): g["lr_scale"] for g in opt.ends.param_groups for n, p in zip(g["param_names"], g["params"])}
    assert ends_scales == ({"input": 1.0, "output": 1.0, "vector": 1.0} if ends == "adamw"
                           else {"input": 4.0, "output": 4.0, "vector": 4.0})


def test_soap_and_bad_widths_are_refused_at_their_place(tmp_path):
    with pytest.raises(ValidationError, match="mup is not defined for soap"):
        trial(128, "mup", "soap")
    with pytest.raises(ValidationError, match="must be divisible by n_heads"):
        trial(128, "mup", model={"mup_base_width": 66})
    with pytest.raises(ValidationError, match="applies to parametrization mup only"):
        trial(128, "sp", model={"mup_base_width": 32})
    spec = tmp_path / "s.yaml"
    spec.write_text("name: m\ndata: {corpus: stdlib, seq_len: 32}\ntrain: {steps: 5, batch_size: 4}\n"
                    "grid:\n  model: [{d_model: 32, n_layers: 2, n_heads: 2, parametrization: mup, mup_base_width: 16}]\n"
                    "  optimizer: [{name: adam, lr: 1.0e-3}, {name: soap, lr: 1.0e-3}]\n")
    result = CliRunner().invoke(app, ["plan", str(spec), "--results", str(tmp_path / "r")])
    assert result.exit_code == 2 and "grid.model[0].parametrization: mup is not defined for soap (line 5)" in result.output
    assert not (tmp_path / "r").exists()


def test_ids_of_sp_trials_are_unchanged():
    """sp, written or not, hashes as before; mup is hashed; and every kept store's runs row
    (docs/stores) still reads back to its own trial_id."""
    plain = TrialConfig(model={"d_model": 64, "n_layers": 2, "n_heads": 2}, optimizer={"name": "adam", "lr": 1e-3},
                        train={"steps": 10})
    assert (plain.trial_id, plain.config_id) == ("2937e358547a", "02fea6c04727")  # tests/test_config.py's golden
    explicit = TrialConfig(model={"d_model": 64, "n_layers": 2, "n_heads": 2, "parametrization": "sp", "mup_base_width": 64},
                           optimizer={"name": "adam", "lr": 1e-3}, train={"steps": 10})
    assert explicit.trial_id == plain.trial_id and "parametrization" not in plain.config_json()
    mup = TrialConfig.model_validate({**plain.model_dump(), "model": {**plain.model.model_dump(), "parametrization": "mup"}})
    assert mup.trial_id != plain.trial_id and TrialConfig.model_validate_json(mup.config_json()) == mup
    assert (plain.flat()["parametrization"], plain.flat()["mup_base_width"], mup.flat()["mup_base_width"]) == ("sp", None, 64)
    runs = pl.concat([pl.read_parquet(f, columns=["trial_id", "config_json"])
                      for f in sorted(ROOT.glob("docs/stores/*/runs/*.parquet"))])
    assert runs.height > 100
    assert all(TrialConfig.model_validate_json(c).trial_id == t for t, c in runs.iter_rows())
