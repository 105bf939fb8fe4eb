"""Rotating the residual basis: exact for rmsnorm_scalar, broken by basis-dependent norms."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import batch
from study.config import TrialConfig
from study.invariance import loss_change_by_dtype, plan_in_basis, rotate_residual_basis
from study.model import Rotate, Transformer
from study.optim import build_optimizer
from study.rotation import build_plan, generator_for, random_orthogonal
from variants import ATTENTION_NAMES, L, ROTATIONS


D = 32


def make_model(norm, rotation="none", dtype=torch.float64, perturb=True, seed=0, attention="softmax"):
    """A model with 'trained-looking' norm parameters: gains 1 + N(0, 0.5), biases N(0, 0.3)."""
    cfg = TrialConfig(model={"d_model": D, "n_layers": L, "n_heads": 2}, norm=norm, rotation=ROTATIONS[rotation],
                      attention=attention,
                      optimizer={"name": "adam", "lr": 1e-3}, train={"steps": 1}, data={"seq_len": 16}, seed=seed)
    model = Transformer.from_config(cfg, dtype=dtype)
    if perturb:
        g = generator_for(seed, "test-perturb")
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
                    p.copy_(noise * 0.3 if name.endswith("bias") else 1 + 0.5 * noise)
    return model


def q_for(seed=0):
    return random_orthogonal(D, generator_for(seed, "test-q"))


@pytest.mark.parametrize("attention", ATTENTION_NAMES)
@pytest.mark.parametrize("rotation", ROTATIONS)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "rmsnorm_scalar"])
def test_rotated_logits(norm, rotation, attention):
    """Every attention variant x every rotation plan: invariant exactly (float64) with rmsnorm_scalar,
    not with a per-coordinate norm."""
    model = make_model(norm, rotation, attention=attention)
    x, _ = batch(generator_for(0, "test-batch"), 2, 16)
    diff = (rotate_residual_basis(model, q_for())(x)[0] - model(x)[0]).abs().max().item()
    if norm == "rmsnorm_scalar":
        assert diff < 1e-10
    else:
        assert diff > 1e-3  # per-coordinate gains (and layernorm's mean) see the basis


@pytest.mark.parametrize("rotation", ["none", "independent"])
def test_rmsnorm_with_uniform_gains_is_invariant(rotation):
    """The per-coordinate gain is rmsnorm's only basis dependence; layernorm's mean subtraction remains."""
    x, _ = batch(generator_for(0, "test-batch"), 2, 16)
    rms = make_model("rmsnorm", rotation, perturb=False)
    assert (rotate_residual_basis(rms, q_for())(x)[0] - rms(x)[0]).abs().max() < 1e-10
    ln = make_model("layernorm", rotation, perturb=False)
    assert (rotate_residual_basis(ln, q_for())(x)[0] - ln(x)[0]).abs().max() > 1e-4


def test_residual_stream_is_rotated_everywhere():
    model = make_model("rmsnorm_scalar", "shared")
    rotated = rotate_residual_basis(model, q := q_for())
    x, _ = batch(generator_for(0, "test-batch"), 2, 16)
    outs = {}
    for tag, m in (("a", model), ("b", rotated)):
        for i, block in enumerate(m.blocks):
            block.register_forward_hook(lambda mod, inp, out, k=(tag, i): outs.__setitem__(k, out))
        m(x)
    for i in range(L):
        torch.testing.assert_close(outs[("b", i)], outs[("a", i)] @ q, atol=1e-10, rtol=0)


def test_rotation_keeps_structure_and_leaves_model_alone():
    model = make_model("layernorm", "groups")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rotated = rotate_residual_basis(model, q_for())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert rotated is not model
    eye = torch.eye(D, dtype=torch.float64)
    for b0, b1 in zip(model.blocks, rotated.blocks):
        for attr in ("read_attn", "write_attn", "read_mlp", "write_mlp"):
            assert type(getattr(b0, attr)) is type(getattr(b1, attr))
            if isinstance(getattr(b1, attr), Rotate):
                m = getattr(b1, attr).matrix
                torch.testing.assert_close(m @ m.T, eye, atol=1e-12, rtol=0)
        for name in ("attn_norm", "mlp_norm"):  # gains and biases untouched
            for p0, p1 in zip(getattr(b0, name).parameters(), getattr(b1, name).parameters()):
                assert torch.equal(p0, p1)
    with pytest.raises(ValueError):
        rotate_residual_basis(model, torch.eye(D + 1))


def test_rotation_of_float32_model_stays_float32():
    model = make_model("rmsnorm_scalar", "independent", dtype=torch.float32)
    rotated = rotate_residual_basis(model, q_for())
    assert all(p.dtype == torch.float32 for p in rotated.parameters())
    assert all(b.dtype == torch.float32 for b in rotated.buffers())
    x, _ = batch(generator_for(0, "test-batch"), 2, 16)
    torch.testing.assert_close(rotated(x)[0], model(x)[0], atol=1e-4, rtol=0)


def test_identity_rotation_is_a_no_op():
    model = make_model("layernorm", "shared")
    same = rotate_residual_basis(model, torch.eye(D))
    for (k, a), b in zip(model.state_dict().items(), same.state_dict().values()):
        assert torch.equal(a, b), k


# ---- loss_change_by_dtype ------------------------------------------------------------------


@pytest.mark.parametrize("rotation", ["none", "shared", "partial2"])
def test_loss_change_rows(rotation):
    model = make_model("rmsnorm_scalar", rotation, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = batch(generator_for(0, "test-batch"), 2, 16)
    rows = loss_change_by_dtype(model, x, y, seed=7)
    assert [r["dtype"] for r in rows] == ["float64", "float32", "bfloat16"]
    assert all(set(r) == {"check", "dtype", "value"} and r["check"] == "rotate_residual_basis" for r in rows)
    assert all(isinstance(r["value"], float) and math.isfinite(r["value"]) for r in rows)
    v = {r["dtype"]: r["value"] for r in rows}
    assert abs(v["float64"]) < 1e-10
    assert abs(v["float32"]) < 1e-3 and abs(v["bfloat16"]) < 0.5
    assert all(torch.equal(v_, before[k]) for k, v_ in model.state_dict().items())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert rows == loss_change_by_dtype(model, x, y, seed=7)  # deterministic from seed


def test_loss_change_detects_layernorm():
    model = make_model("layernorm", "none", dtype=torch.float32)
    x, y = batch(generator_for(0, "test-batch"), 2, 16)
    rows = loss_change_by_dtype(model, x, y, seed=0, dtypes=("float64",))
    assert len(rows) == 1 and abs(rows[0]["value"]) > 1e-4
    other = loss_change_by_dtype(model, x, y, seed=1, dtypes=("float64",))
    assert other[0]["value"] != rows[0]["value"]  # a different seed draws a different Q


# ---- no parameter lives in the residual basis (every read and write rotated) ------------------


def trial(norm, rotation, optimizer="adam", attention="softmax"):
    opt = {"name": "adam", "lr": 1e-2} if optimizer == "adam" else {"name": "sgd", "lr": 0.3, "momentum": 0.9}
    return TrialConfig(model={"d_model": D, "n_layers": L, "n_heads": 2}, norm=norm, rotation=rotation,
                       attention=attention, optimizer=opt, train={"steps": 1}, data={"seq_len": 16}, seed=3)


def train_float64(cfg, plan, steps=6, ends_q=None):
    """`steps` optimiser steps in float64 from the seed's init with `plan`; ends_q: first move the
    embeddings and unembedding into the residual basis x Q (E Q, P Q, W_U Q). Returns the model,
    the per-step losses and the residual stream after each block on a held-out batch."""
    m = cfg.model
    model = Transformer(vocab_size=256, seq_len=16, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                        d_mlp=m.d_mlp, norm=cfg.norm, attention=cfg.attention, plan=plan, seed=cfg.seed,
                        dtype=torch.float64)
    if ends_q is not None:
        with torch.no_grad():
            for p in (model.tok_emb.weight, model.pos_emb.weight, model.unembed.weight):
                p.copy_(p @ ends_q)
    opt = build_optimizer(cfg, model)
    x, losses = torch.randint(0, 256, (4, 17), generator=generator_for(0, "test-train")), []
    for _ in range(steps):  # one batch, memorised: the loss must fall
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    resid = []
    handles = [b.register_forward_hook(lambda _m, _i, out: resid.append(out)) for b in model.blocks]
    with torch.no_grad():
        model(batch(generator_for(0, "test-batch"), 2, 16)[0])
    for h in handles:
        h.remove()
    return model, losses, resid


ALL_READS = ["shared", "independent", {"mode": "partial", "group_size": 2}, {"mode": "groups", "groups": [[0, 1], [2, 3]]}]


@pytest.mark.parametrize("attention", ATTENTION_NAMES)
@pytest.mark.parametrize("rotation", ALL_READS, ids=str)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm_scalar"])
def test_rotating_every_read_and_write_changes_nothing_adam_sees(norm, rotation, attention):
    """R -> Q^T R for every rotation of the plan (plan_in_basis), same init, Adam in float64: the
    same loss curve step for step and a residual stream exactly Q times the original's, for a
    basis-dependent norm too and every attention variant, since no parameter lives in the
    residual basis (gated's gate reads the normalised input, kv_bias's key and value live in the
    heads' coordinates)."""
    cfg = trial(norm, rotation, attention=attention)
    plan = build_plan(cfg.rotation, L, D, cfg.seed)
    q = q_for(5)
    _, losses, resid = train_float64(cfg, plan)
    _, losses_q, resid_q = train_float64(cfg, plan_in_basis(plan, q))
    assert losses[-1] < losses[0] - 0.1  # it trained
    assert max(abs(a - b) for a, b in zip(losses, losses_q)) < 1e-10
    for a, b in zip(resid, resid_q):
        torch.testing.assert_close(b, a @ q, atol=1e-10, rtol=0)
        assert (b - a).abs().max() > 1e-2  # the stored basis did change


@pytest.mark.parametrize("rotation", ["shared", "independent"])
def test_with_embeddings_unrotated_adam_sees_the_residual_basis(rotation):
    """embeddings: false (the ablation): the embeddings and unembedding live in the residual basis.
    Moving them into the basis x Q too (E Q, P Q, W_U Q) gives the same function at init, and SGD
    (rotation-equivariant) still follows the same curve, but Adam's per-coordinate steps differ."""
    q = q_for(5)
    for optimizer, same in (("sgd", True), ("adam", False)):
        cfg = trial("rmsnorm_scalar", {"mode": rotation, "embeddings": False}, optimizer)
        plan = build_plan(cfg.rotation, L, D, cfg.seed)
        assert plan.embed is None and plan.unembed is None
        _, losses, resid = train_float64(cfg, plan)
        _, losses_q, resid_q = train_float64(cfg, plan_in_basis(plan, q), ends_q=q)
        assert abs(losses[0] - losses_q[0]) < 1e-10  # the same function at init
        gap = max(abs(a - b) for a, b in zip(losses, losses_q))
        off = max((b - a @ q).abs().max().item() for a, b in zip(resid, resid_q))
        if same:
            assert gap < 1e-9 and off < 1e-9
        else:
            assert gap > 1e-4 and off > 1e-3


# ---- the sharing study's control: partial(k = L) with the ends in the group's basis is shared ---


def test_partial_all_blocks_with_group_ends_is_shared_and_with_own_ends_is_not():
    """ends: group puts the embeddings in the first group's basis and the unembedding in the last
    group's, so partial(k = L) is `shared` exactly: the same loss curve under Adam in float64. With
    their own bases (the default) the ends are two more bases: a different model at step 0."""
    shared = trial("rmsnorm_scalar", "shared")
    group = trial("rmsnorm_scalar", {"mode": "partial", "group_size": L, "ends": "group"})
    own = trial("rmsnorm_scalar", {"mode": "partial", "group_size": L})
    runs = {name: train_float64(cfg, build_plan(cfg.rotation, L, D, cfg.seed))
            for name, cfg in (("shared", shared), ("group", group), ("own", own))}
    (_, a, ra), (_, b, rb), (_, c, _) = runs["shared"], runs["group"], runs["own"]
    assert a[-1] < a[0] - 0.1  # it trained
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-12
    for x, y in zip(ra, rb):
        torch.testing.assert_close(y, x, atol=1e-12, rtol=0)
    assert abs(a[0] - c[0]) > 1e-6  # own ends: not the shared model, even at step 0
    assert group.rotation.label == "partial(4)-groupends" and group.trial_id != own.trial_id


def test_ends_option_leaves_existing_ids_alone():
    """ends is id_optional: a config that leaves it at its default has the id it had before."""
    cfg = trial("rmsnorm_scalar", {"mode": "partial", "group_size": 2})
    assert "ends" not in cfg.science_json()
    assert "ends" in trial("rmsnorm_scalar", {"mode": "partial", "group_size": 2, "ends": "group"}).science_json()


@pytest.mark.parametrize("rotation", ["none", "shared"])
def test_ends_group_is_refused_where_it_means_nothing(rotation):
    with pytest.raises(ValueError, match="ends"):
        trial("rmsnorm_scalar", {"mode": rotation, "ends": "group"})
    with pytest.raises(ValueError, match="ends"):
        trial("rmsnorm_scalar", {"mode": "independent", "embeddings": False, "ends": "group"})


# ---- rotation-equivariant training: a rotated init ends as the rotation of the unrotated run ---


TWINS = {
    "sgd": {"name": "sgd", "lr": 0.3, "momentum": 0.9, "weight_decay": 0.01},
    "sgd_nesterov": {"name": "sgd", "lr": 0.3, "momentum": 0.9, "nesterov": True},
    "muon_pure": {"name": "muon", "lr": 3e-2, "muon_ends": "sgd", "muon_ends_lr_ratio": 10},
    "adam": {"name": "adam", "lr": 1e-2},
}


@pytest.mark.parametrize("name", list(TWINS))
def test_rotated_init_twin(name):
    """Start from the seed's init rotated in the residual basis (x -> x Q: embeddings, positions,
    every read and write map, the unembedding), train in float64 with the loop's global-norm
    clip: a rotation-equivariant optimiser (SGD, the pure Muon) ends exactly as the rotation of
    the unrotated run, so with an isotropic (Gaussian) init its expected stored-basis kurtosis is
    the null's; Adam's per-coordinate steps do not (the control)."""
    cfg = TrialConfig(model={"d_model": D, "n_layers": L, "n_heads": 2}, norm="rmsnorm_scalar", rotation="none",
                      optimizer=TWINS[name], train={"steps": 1}, data={"seq_len": 16}, seed=3)
    q = q_for(7)
    base = Transformer(vocab_size=256, seq_len=16, d_model=D, n_layers=L, n_heads=2, d_mlp=cfg.model.d_mlp,
                       norm="rmsnorm_scalar", seed=cfg.seed, dtype=torch.float64)
    twin = rotate_residual_basis(base, q)
    x = torch.randint(0, 256, (4, 17), generator=generator_for(0, "test-twin"))
    losses, streams = {}, {}
    for label, model in (("base", base), ("twin", twin)):
        opt = build_optimizer(cfg, model)
        losses[label] = []
        for _ in range(8):
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[label].append(loss.item())
        with torch.no_grad():
            streams[label] = model.tok_emb.weight.clone(), model.blocks[-1](model.blocks[0](
                model.tok_emb(batch(generator_for(0, "test-batch"), 2, 16)[0]) + model.pos_emb(torch.arange(16))))
    assert losses["base"][-1] < losses["base"][0] - 0.05  # it trained
    gap = max(abs(a - b) for a, b in zip(losses["base"], losses["twin"]))
    off = max((t - b @ q).abs().max().item() for b, t in zip(streams["base"], streams["twin"]))
    if name == "adam":
        assert gap > 1e-4 and off > 1e-3
    else:
        assert gap < 1e-10 and off < 1e-9, (gap, off)
