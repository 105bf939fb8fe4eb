"""Tests for study.optim.twins and rules.rotated_basis: each per-coordinate optimiser's rotated
twin (rotated_lion, rotated_signsgd, rotated_adafactor) is its base's rule in fixed random bases.
Exact float64 identities: with Q = I the twin is its base; with bases Q it is the base trained on
the model reparametrised as W = Qo W~ Qi^T (the base itself is far from that); and what
rotated_adam's tests show (equivariance, bases, dims, resume) holds for every twin."""

from __future__ import annotations

import dataclasses
import io
import pickle

import pytest
import torch
from torch import nn

from conftest import batch, tiny
from study.config import TrialConfig
from study.model import Transformer
from study.optim import OPTIMIZERS, RotatedAdam, build_optimizer
from study.optim.registry import Optimizer
from study.optim.rules.rotated_basis import RotatedBasis
from study.optim.twins import TWINS, base_config
from study.rotation import generator_for, random_orthogonal
from study.train import MemorySink, StopTraining, train

F64 = torch.float64
NAMES = [f"rotated_{b}" for b in TWINS]
LR = {"adafactor": 3e-2, "lion": 3e-4, "signsgd": 3e-4}  # lrs that train the tiny models
TWIN = {"norm": "rmsnorm", "rotation": "shared"}  # what the `tiny` trials here train with


def trial(name: str, *, d_model: int = 32, vocab: int | None = None, seq_len: int = 16, seed: int = 0,
          norm: str = "layernorm", **opt) -> TrialConfig:
    data = {"seq_len": seq_len} if vocab is None else {"tokens": "unused.bin", "vocab_size": vocab, "seq_len": seq_len}
    return TrialConfig(model={"d_model": d_model, "n_layers": 2, "n_heads": 2}, norm=norm, data=data,
                       optimizer={"name": name, "lr": 1e-2, **opt}, train={"steps": 10}, seed=seed)


def base_of(name: str) -> str:
    return name.removeprefix("rotated_")


def haar(n: int, *tags: object) -> torch.Tensor:
    return random_orthogonal(n, generator_for(1234, *tags))


def params(shapes, seed: int = 0) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=g, dtype=F64)) for s in shapes]


def toy_loss(ps) -> torch.Tensor:
    """A smooth, non-quadratic loss with per-coordinate curvature differences."""
    return sum(((p**2).sum() + 1).log() + (p.sin() * torch.arange(p.numel(), dtype=F64).view(p.shape)).sum()
               + (p**4).sum() * 0.1 for p in ps)


def run(ps, opt, steps: int, loss=toy_loss, lrs=None, skip=None) -> None:
    for t in range(steps):
        for group in opt.param_groups:
            group["lr"] = lrs[t] if lrs else group["lr"]
        opt.zero_grad(set_to_none=True)
        loss(ps).backward()
        for i in skip(t) if skip else ():
            ps[i].grad = None
        opt.step()


def base_optimizer(name: str, ps, weight_decay: float = 0.1, lr: float = 1e-2):
    """The base optimiser over `ps`, as its registry entry builds it (decay groups)."""
    return OPTIMIZERS[base_of(name)].build(trial(base_of(name), lr=lr, weight_decay=weight_decay), nn.ParameterList(ps))


SHAPES = [(6, 4), (6, 4), (4,), (), (3, 2, 2), (1,), (4, 6)]


# ---- the registry entries ------------------------------------------------------------------------


def test_every_per_coordinate_optimiser_has_its_twin_derived_from_its_entry() -> None:
    per_coordinate = [n for n, e in OPTIMIZERS.items() if e.family == "per_coordinate"]
    assert sorted(per_coordinate) == sorted(["adam", *TWINS])  # a new one needs a twin (adam's: rotated_adam)
    changed = {"name", "order", "family", "config", "build", "family_for", "trial_check", "unshardable"}
    for base in TWINS:
        entry, twin = OPTIMIZERS[base], OPTIMIZERS[f"rotated_{base}"]
        assert twin.family == "fixed_random_basis" and not twin.shardable and twin.order > entry.order
        for field in dataclasses.fields(Optimizer):  # a field another engineer adds carries over
            if field.name not in changed:
                assert getattr(twin, field.name) == getattr(entry, field.name), field.name
        assert set(twin.config.model_fields) == {*entry.config.model_fields, "rotate"}
        assert twin.config.model_fields["rotate"].default == "residual"


@pytest.mark.parametrize("name", NAMES)
def test_config_row_pickle_and_base_config(name: str) -> None:
    cfg = trial(name, weight_decay=0.1)
    row = cfg.flat()
    assert row["optimizer"] == name and row["optimizer_family"] == "fixed_random_basis" and row["rotate"] == "residual"
    assert trial(name, rotate="all").flat()["rotate"] == "all"
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # Ray sends trials to its workers
    plain = base_config(cfg.optimizer, base_of(name))
    assert plain == trial(base_of(name), weight_decay=0.1).optimizer


def test_a_spec_validates_a_twin_and_refuses_a_wrong_field_at_its_place(tmp_path) -> None:
    from sweep.spec import SpecError, load_spec

    spec = ("name: t\ntrain: {steps: 5}\ngrid:\n  model: [{d_model: 32, n_layers: 2, n_heads: 2}]\n"
            "  optimizer:\n    - {name: adam, lr: 1.0e-3}\n    - {name: rotated_lion, lr: 1.0e-3}\n")
    path = tmp_path / "spec.yaml"
    path.write_text(spec)
    assert [o.name for o in load_spec(path).grid.optimizer] == ["adam", "rotated_lion"]
    for bad, expected in [("momentum: 0.5", "grid.optimizer[1].momentum: momentum does not apply to rotated_lion"),
                          ("rotate: some", "grid.optimizer[1].rotate: Input should be 'all' or 'residual'"),
                          ("betas: [0.9, 1.5]", "grid.optimizer[1].betas: betas must lie in [0, 1)")]:
        path.write_text(spec.replace("rotated_lion, lr: 1.0e-3}", f"rotated_lion, lr: 1.0e-3, {bad}}}"))
        with pytest.raises(SpecError) as info:
            load_spec(path)
        assert expected in str(info.value) and "(line 7)" in str(info.value), str(info.value)


def test_rotate_all_is_refused_with_a_large_vocabulary() -> None:
    with pytest.raises(ValueError, match=r"optimizer.rotate: 'all' would need a 10000 x 10000 basis"):
        trial("rotated_lion", vocab=10000, rotate="all")
    assert trial("rotated_lion", vocab=10000).optimizer.rotate == "residual"


# ---- with Q = I a twin is its base -----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("identity", ["eye", "none"])
def test_identity_bases_equal_the_base_step_for_step(name: str, identity: str) -> None:
    a, b = params(SHAPES), params(SHAPES)
    eye = lambda n: torch.eye(n, dtype=F64)  # noqa: E731
    if identity == "eye":  # real matmuls with I: still the base's numbers
        bases = {p: ((eye(p.shape[0]), eye(p.numel() // p.shape[0])) if p.ndim >= 2 else eye(p.shape[0]) if p.ndim == 1 else None)
                 for p in a}
    else:
        bases = {p: None for p in a}
    lrs = [1e-2 * (1 + t) / 12 for t in range(12)]  # a scheduler rewriting group["lr"]
    skip = lambda t: [1] if t % 3 == 0 else [0, 2] if t % 5 == 0 else []  # noqa: E731
    twin = RotatedBasis(base_optimizer(name, a), rotate="all", bases=bases)
    ref = base_optimizer(name, b)
    run(a, twin, 12, lrs=lrs, skip=skip)
    run(b, ref, 12, lrs=lrs, skip=skip)
    assert (a[0] - params(SHAPES)[0]).norm() > 0.01  # it trained
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-15 if identity == "eye" else 0)
    assert all(twin.base.param_groups[i]["lr"] == lrs[-1] for i in range(len(ref.param_groups)))


def test_a_groups_keys_reach_the_base_rule() -> None:
    """The scheduler writes the wrapper's groups; every key (lr, weight_decay, one a rule adds, as
    muP's lr_scale) reaches the base's group before its step."""
    a = params(SHAPES[:3])
    twin = RotatedBasis(base_optimizer("rotated_lion", a), rotate="all")
    for group in twin.param_groups:
        group.update(lr=3e-3, weight_decay=0.5, lr_scale=0.25)
    run(a, twin, 1)
    assert [(g["lr"], g["weight_decay"], g["lr_scale"]) for g in twin.base.param_groups] == [(3e-3, 0.5, 0.25)] * 2
    assert all(s is not p for g, h in zip(twin.param_groups, twin.base.param_groups) for s, p in zip(h["params"], g["params"]))


# ---- with bases Q a twin is its base on the model reparametrised in those bases ---------------------


def rotated_problem():
    """f(W, c) on W (6 x 4), c (6,), and its rotated copy g(W', c') = f(Po^T W' Pi, Po^T c')."""
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(4, 10, generator=gen, dtype=F64), torch.randn(6, 10, generator=gen, dtype=F64)
    scale = torch.linspace(0.1, 3.0, 24, dtype=F64).view(6, 4)  # per-coordinate curvature

    def f(ps):
        w, c = ps
        r = w @ x + c[:, None] - y
        return torch.log(torch.cosh(r)).sum() + ((scale * w) ** 4).sum() + (c**3).abs().sum()

    po, pi = haar(6, "Po"), haar(4, "Pi")

    def g(ps):
        w, c = ps
        return f([po.T @ w @ pi, po.T @ c])

    w0, c0 = torch.randn(6, 4, generator=gen, dtype=F64), torch.randn(6, generator=gen, dtype=F64)
    return f, g, po, pi, w0, c0


@pytest.mark.parametrize("name", NAMES)
def test_twin_is_its_base_in_the_rotated_basis_and_the_base_is_not(name: str) -> None:
    """Twin with bases (Qo, Qi), Qc on f from (W0, c0) == Qo [base on h(W~, c~) = f(Qo W~ Qi^T, Qc c~)
    from (Qo^T W0 Qi, Qc^T c0)] Qi^T; the base on f itself ends far from both."""
    f, _, _, _, w0, c0 = rotated_problem()
    qo, qi, qc = haar(6, "Qo"), haar(4, "Qi"), haar(6, "Qc")
    a = [nn.Parameter(w0.clone()), nn.Parameter(c0.clone())]
    t = [nn.Parameter(qo.T @ w0 @ qi), nn.Parameter(qc.T @ c0)]
    plain = [nn.Parameter(w0.clone()), nn.Parameter(c0.clone())]
    run(a, RotatedBasis(base_optimizer(name, a, lr=3e-2), bases={0: (qo, qi), 1: qc}), 25, loss=f)
    run(t, base_optimizer(name, t, lr=3e-2), 25, loss=lambda ps: f([qo @ ps[0] @ qi.T, qc @ ps[1]]))
    run(plain, base_optimizer(name, plain, lr=3e-2), 25, loss=f)
    with torch.no_grad():
        moved = float((a[0] - w0).norm())
        assert moved > 0.1  # it trained
        torch.testing.assert_close(a[0], qo @ t[0] @ qi.T, rtol=0, atol=1e-12)
        torch.testing.assert_close(a[1], qc @ t[1], rtol=0, atol=1e-12)
        assert float((a[0] - plain[0]).norm()) > 0.2 * moved  # the basis matters to the base rule


@pytest.mark.parametrize("name", NAMES)
def test_twin_is_equivariant(name: str) -> None:
    """As rotated_adam: W on f with bases (Qo, Qi) and W' = Po W Pi^T on g with (Po Qo, Pi Qi):
    W'_N = Po W_N Pi^T. The base on the same pair is not (test_optim's per-coordinate test)."""
    f, g, po, pi, w0, c0 = rotated_problem()
    qo, qi, qc = haar(6, "Qo"), haar(4, "Qi"), haar(6, "Qc")
    a = [nn.Parameter(w0.clone()), nn.Parameter(c0.clone())]
    b = [nn.Parameter(po @ w0 @ pi.T), nn.Parameter(po @ c0)]
    run(a, RotatedBasis(base_optimizer(name, a, lr=3e-2), bases={0: (qo, qi), 1: qc}), 25, loss=f)
    run(b, RotatedBasis(base_optimizer(name, b, lr=3e-2), bases={0: (po @ qo, pi @ qi), 1: po @ qc}), 25, loss=g)
    assert (a[0] - w0).norm() > 0.1
    torch.testing.assert_close(b[0], po @ a[0] @ pi.T, rtol=0, atol=1e-12)
    torch.testing.assert_close(b[1], po @ a[1], rtol=0, atol=1e-12)


def train_steps(cfg: TrialConfig, model, opt, start: int, stop: int, loss=None) -> None:
    for step in range(start, stop):
        for group in opt.param_groups:
            group["lr"] = cfg.optimizer.lr * (1 - step / 20)
        (loss or (lambda x, y: model(x, y)[1]))(*batch(torch.Generator().manual_seed(step), 4, cfg.data.seq_len, cfg.vocab_size)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", NAMES)
def test_real_model_twin_is_its_base_on_the_rotated_parameters(name: str) -> None:
    """build_optimizer's twin (seeded residual bases) on the float64 model equals the base built
    by its own builder over W~ = Qo^T W Qi, the model run at W = Qo W~ Qi^T, rotated back."""
    cfg = trial(name, weight_decay=0.1, lr=LR[base_of(name)], norm="rmsnorm_scalar")
    model = Transformer.from_config(cfg, dtype=F64)
    twin = build_optimizer(cfg, model)
    names = [n for n, _ in model.named_parameters()]
    qs = [twin.bases(p) for p in model.parameters()]

    def turn(x, qo, qi, back: bool):
        v = x.reshape(x.shape[0], -1) if x.ndim >= 2 else x
        if qo is not None:
            v = (qo if back else qo.T) @ v
        if qi is not None:
            v = v @ (qi.T if back else qi)
        return v.reshape(x.shape)

    shadow = nn.ParameterList([nn.Parameter(turn(p.detach().clone(), *q, back=False)) for p, q in zip(model.parameters(), qs)])
    base = OPTIMIZERS[base_of(name)].build(trial(base_of(name), weight_decay=0.1, lr=cfg.optimizer.lr), shadow)
    ref_model = Transformer.from_config(cfg, dtype=F64)

    def shadow_loss(x, y):
        weights = {n: turn(s, *q, back=True) for n, s, q in zip(names, shadow, qs)}
        return torch.func.functional_call(ref_model, weights, (x, y))[1]

    train_steps(cfg, model, twin, 0, 5)
    train_steps(cfg, shadow, base, 0, 5, loss=shadow_loss)
    unrotated = sum(qo is None and qi is None for qo, qi in qs)
    assert len(qs) - unrotated > 10 and unrotated > 0  # rotated parameters, and scalar gains: the base's own
    with torch.no_grad():
        for n, p, s, q in zip(names, model.parameters(), shadow, qs):
            torch.testing.assert_close(p, turn(s, *q, back=True), rtol=0, atol=1e-12, msg=n)


# ---- bases and which dimensions rotate: exactly rotated_adam's ---------------------------------------


def side_sizes(bases) -> tuple:
    return tuple(None if q is None else q.shape[0] for q in bases)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rotate, vocab, seq_len", [("residual", 256, 16), ("residual", 32, 32), ("all", 256, 16)])
def test_bases_are_rotated_adams(name: str, rotate: str, vocab: int, seq_len: int) -> None:
    cfg = trial(name, rotate=rotate, vocab=vocab, seq_len=seq_len, seed=5)
    model = Transformer.from_config(cfg)
    twin = build_optimizer(cfg, model)
    adam = build_optimizer(trial("rotated_adam", rotate=rotate, vocab=vocab, seq_len=seq_len, seed=5), model)
    assert isinstance(twin, RotatedBasis) and isinstance(adam, RotatedAdam)
    for n, p in model.named_parameters():
        for ours, theirs in zip(twin.bases(p), adam.bases(p)):
            assert (ours is None) == (theirs is None) and (ours is None or torch.equal(ours, theirs)), n
    b = {n: side_sizes(twin.bases(p)) for n, p in model.named_parameters()}
    if rotate == "all":
        assert all(b[n] == (p.shape[0], p.shape[1] if p.ndim == 2 else None) for n, p in model.named_parameters())
    else:  # only d_model dims; the token, position and unembedding index dims never, even at size d_model
        assert b["tok_emb.weight"] == b["pos_emb.weight"] == b["unembed.weight"] == (None, 32)
        assert b["blocks.0.attn.proj.weight"] == (32, 32) and b["blocks.0.mlp.fc.weight"] == (None, 32)
        assert b["blocks.0.mlp.proj.weight"] == (32, None) and b["blocks.0.attn_norm.weight"] == (32, None)


def test_bad_rotate_and_missing_d_model_are_rejected() -> None:
    p = nn.Parameter(torch.zeros(3, 2))
    from study.optim import Lion

    with pytest.raises(ValueError, match="d_model"):
        RotatedBasis(Lion([p]), rotate="residual")
    with pytest.raises(ValueError, match="rotate"):
        RotatedBasis(Lion([p]), rotate="some", d_model=2)
    with pytest.raises(ValueError, match="not orthogonal"):
        RotatedBasis(Lion([p]), bases={p: (2 * torch.eye(3), None)})
    stepped = Lion([p])
    p.grad = torch.ones_like(p)
    stepped.step()
    with pytest.raises(ValueError, match="freshly built"):
        RotatedBasis(stepped, rotate="all")


def test_add_param_group_gets_bases_and_keeps_the_others_state() -> None:
    from study.optim import Lion

    p, q = nn.Parameter(torch.randn(4, 4)), nn.Parameter(torch.randn(4))
    opt = RotatedBasis(Lion([p]), rotate="all")
    p.grad = torch.ones_like(p)
    opt.step()
    m = opt.state_dict()["state"][0]["exp_avg"].clone()
    opt.add_param_group({"params": [q], "lr": 1e-3})
    assert opt.bases(q)[0].shape == (4, 4) and opt.base.param_groups[1]["lr"] == 1e-3
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], m)


# ---- resume: state_dict round trip, and through study.train ---------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_continues_identically(name: str) -> None:
    cfg = trial(name, weight_decay=0.1, seed=3)
    model = Transformer.from_config(cfg)
    opt = build_optimizer(cfg, model)
    train_steps(cfg, model, opt, 0, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    train_steps(cfg, model, opt, 3, 6)  # uninterrupted

    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    held = {k for s in saved["optim"]["state"].values() for k in s}
    assert {"basis_out", "basis_in"} < held and held - {"basis_out", "basis_in"}  # the bases and the base's state
    other = trial(name, weight_decay=0.1, seed=4)  # a different seed: the loaded bases must win
    resumed = Transformer.from_config(other)
    resumed.load_state_dict(saved["model"])
    opt2 = build_optimizer(other, resumed)
    opt2.load_state_dict(saved["optim"])
    train_steps(cfg, resumed, opt2, 3, 6)
    for (n, p), q in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), n
    before = {k: v.clone() for k, v in saved["optim"]["state"][0].items() if isinstance(v, torch.Tensor)}
    train_steps(cfg, resumed, opt2, 6, 7)  # the loaded state is decoupled from the saved dict
    assert all(torch.equal(saved["optim"]["state"][0][k], v) for k, v in before.items())


@pytest.mark.parametrize("name", NAMES)
def test_trains_through_study_train(name: str) -> None:
    sink = MemorySink()
    summary = train(tiny(optimizer={"name": name, "lr": LR[base_of(name)]}, **TWIN), sink)
    assert summary.status == "done" and summary.steps == 12
    assert summary.final_val_loss < sink.tables["curves"][0]["val_loss"] - 0.05  # it learned something
    row = sink.run_row
    assert row["optimizer"] == name and row["optimizer_family"] == "fixed_random_basis" and row["rotate"] == "residual"


class CrashAt(MemorySink):
    def __init__(self, step):
        super().__init__()
        self.crash_step = step

    def checkpoint(self, step, directory):
        if step == self.crash_step:
            raise StopTraining(step)


def test_checkpoint_resume_through_study_train_gives_the_same_curve(tmp_path) -> None:
    cfg = tiny(train={"checkpoint_every": 4}, optimizer={"name": "rotated_adafactor", "lr": LR["adafactor"]}, **TWIN)
    straight = MemorySink()
    train(cfg, straight, checkpoint_dir=tmp_path / "a")
    sink = CrashAt(8)
    with pytest.raises(StopTraining):
        train(cfg, sink, checkpoint_dir=tmp_path / "b")
    sink.crash_step = None
    train(cfg, sink, checkpoint_dir=tmp_path / "b")
    assert [r["train_loss"] for r in sink.tables["curves"]] == [r["train_loss"] for r in straight.tables["curves"]]
    assert sink.run_row["final_val_loss"] == straight.run_row["final_val_loss"]


def test_the_wrapper_adds_no_host_readback(readbacks) -> None:
    train(tiny(8, optimizer={"name": "rotated_lion", "lr": LR["lion"]}, **TWIN))
    readbacks.pop("numpy")
    assert readbacks == {"tolist": 3, "item": 0, "cpu": 0}  # evals at 0, 4, 8
