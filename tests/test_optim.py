"""Tests for study.optim: build_optimizer's name map, RotatedAdam's maths, bases and state, and
what defines each of soap, muon, adafactor, lion, signsgd (a reference formula on a small case,
and rotation equivariance where the optimiser should have it)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import batch
from study.config import TrialConfig
from study.model import Transformer
from study.optim import SOAP, Lion, MuonAdamW, RotatedAdam, build_optimizer, decay_groups, index_dims
from study.optim.muon import HIDDEN_MATRICES
from study.rotation import generator_for, random_orthogonal

F64 = torch.float64


def trial(name: str = "rotated_adam", *, d_model: int = 32, vocab: int | None = None, seq_len: int = 16,
          seed: int = 0, norm: str = "layernorm", **opt) -> TrialConfig:
    data = {"seq_len": seq_len} if vocab is None else {"tokens": "unused.bin", "vocab_size": vocab, "seq_len": seq_len}
    return TrialConfig(model={"d_model": d_model, "n_layers": 2, "n_heads": 2}, norm=norm, data=data,
                       optimizer={"name": name, "lr": 1e-2, **opt}, train={"steps": 10}, seed=seed)


def haar(n: int, *tags: object) -> torch.Tensor:
    return random_orthogonal(n, generator_for(1234, *tags))


def toy_params(shapes, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=F64).requires_grad_() for s in shapes]


def toy_loss(ps: list[torch.Tensor]) -> torch.Tensor:
    """A smooth, non-quadratic loss with per-parameter curvature differences."""
    return sum(((p**2).sum() + 1).log() + (p.sin() * torch.arange(p.numel(), dtype=F64).view(p.shape)).sum() + (p**4).sum() * 0.1
               for p in ps)


def run(ps, opt, steps: int, lrs=None, loss=toy_loss, skip=None) -> None:
    for t in range(steps):
        if lrs is not None:
            for group in opt.param_groups:
                group["lr"] = lrs[t]
        opt.zero_grad(set_to_none=True)
        loss(ps).backward()
        if skip is not None:
            for i in skip(t):
                ps[i].grad = None
        opt.step()


SHAPES = [(6, 4), (6, 4), (4,), (), (3, 2, 2), (1,), (4, 6)]


# ---- with identity bases RotatedAdam is torch Adam(W) -------------------------------------


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("identity", ["eye", "none"])
def test_identity_bases_equal_torch_adam(weight_decay: float, identity: str) -> None:
    a, b = toy_params(SHAPES), toy_params(SHAPES)
    eye = lambda n: torch.eye(n, dtype=F64)  # noqa: E731
    if identity == "eye":  # real matmuls with I: must still be exact
        bases = {i: ((eye(p.shape[0]), eye(p.numel() // p.shape[0])) if p.ndim >= 2 else eye(p.shape[0]) if p.ndim == 1 else None)
                 for i, p in enumerate(a)}
    else:
        bases = {p: None for p in a}
    lrs = [1e-2 * (1 + t) / 20 for t in range(20)]  # a scheduler rewriting group["lr"]
    ours = RotatedAdam(a, lr=1.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay, bases=bases)
    ref_cls = torch.optim.AdamW if weight_decay else torch.optim.Adam
    ref = ref_cls(b, lr=1.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    run(a, ours, 20, lrs)
    run(b, ref, 20, lrs)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    for p, q in zip(a, b):
        torch.testing.assert_close(ours.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"], rtol=0, atol=1e-12)
        assert float(ours.state[p]["step"]) == float(ref.state[q]["step"]) == 20


def test_params_without_grad_are_skipped_like_torch_adam() -> None:
    """Bucket members that miss a gradient keep their state; per-parameter step counts differ."""
    a, b = toy_params(SHAPES), toy_params(SHAPES)
    ours = RotatedAdam(a, lr=1e-2, weight_decay=0.1, bases={p: None for p in a})
    ref = torch.optim.AdamW(b, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    skip = lambda t: [1] if t % 3 == 0 else [0, 2, 3] if t % 5 == 0 else []  # noqa: E731
    run(a, ours, 20, skip=skip)
    run(b, ref, 20, skip=skip)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
        assert float(ours.state[p]["step"]) == float(ref.state[q]["step"])
    assert float(ours.state[a[1]]["step"]) < float(ours.state[a[0]]["step"])


@settings(max_examples=15, deadline=None)
@given(st.lists(st.lists(st.integers(1, 5), min_size=0, max_size=3).map(tuple), min_size=1, max_size=5),
       st.floats(0.0, 0.5))
def test_identity_bases_equal_adam_any_shapes(shapes, weight_decay) -> None:
    a, b = toy_params(shapes), toy_params(shapes)
    ours = RotatedAdam(a, lr=3e-2, weight_decay=weight_decay, rotate="all",
                       bases={i: None for i in range(len(a))})
    ref = torch.optim.AdamW(b, lr=3e-2, betas=(0.9, 0.95), weight_decay=weight_decay)
    run(a, ours, 5)
    run(b, ref, 5)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


# ---- equivariance: the point of the study -------------------------------------------------


def rotated_problem():
    """f(W, c) on W (6 x 4), c (6,), and its rotated copy g(W', c') = f(Po^T W' Pi, Po^T c')."""
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(4, 10, generator=gen, dtype=F64), torch.randn(6, 10, generator=gen, dtype=F64)
    scale = torch.linspace(0.1, 3.0, 24, dtype=F64).view(6, 4)  # per-coordinate curvature: Adam cares

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


def test_rotated_adam_is_equivariant() -> None:
    """Train W on f with bases (Qo, Qi) and W' = Po W Pi^T on g with (Po Qo, Pi Qi): W'_N = Po W_N Pi^T."""
    f, g, po, pi, w0, c0 = rotated_problem()
    qo, qi, qc = haar(6, "Qo"), haar(4, "Qi"), haar(6, "Qc")
    a = [w0.clone().requires_grad_(), c0.clone().requires_grad_()]
    b = [(po @ w0 @ pi.T).requires_grad_(), (po @ c0).requires_grad_()]
    opt_a = RotatedAdam(a, lr=3e-2, weight_decay=0.1, bases={0: (qo, qi), 1: qc})
    opt_b = RotatedAdam(b, lr=3e-2, weight_decay=0.1, bases={0: (po @ qo, pi @ qi), 1: po @ qc})
    run(a, opt_a, 25, loss=f)
    run(b, opt_b, 25, loss=g)
    moved = (a[0] - w0).norm()
    assert moved > 0.1  # it trained
    torch.testing.assert_close(b[0], po @ a[0] @ pi.T, rtol=0, atol=1e-12)
    torch.testing.assert_close(b[1], po @ a[1], rtol=0, atol=1e-12)


def test_plain_adam_is_not_equivariant() -> None:
    """The same experiment with torch Adam (moments in the stored basis): far from equivariant."""
    f, g, po, pi, w0, c0 = rotated_problem()
    a = [w0.clone().requires_grad_(), c0.clone().requires_grad_()]
    b = [(po @ w0 @ pi.T).requires_grad_(), (po @ c0).requires_grad_()]
    run(a, torch.optim.AdamW(a, lr=3e-2, weight_decay=0.1), 25, loss=f)
    run(b, torch.optim.AdamW(b, lr=3e-2, weight_decay=0.1), 25, loss=g)
    moved = (a[0] - w0).norm()
    gap = (b[0] - po @ a[0] @ pi.T).norm()
    assert gap > 0.3 * moved, (float(gap), float(moved))  # measured ~0.9 x moved; RotatedAdam's is ~1e-15


# ---- which dimensions rotate --------------------------------------------------------------


def named_bases(opt: RotatedAdam, model: torch.nn.Module) -> dict[str, tuple]:
    return {n: opt.bases(p) for n, p in model.named_parameters()}


def side_sizes(bases) -> tuple:
    return tuple(None if q is None else q.shape[0] for q in bases)


def test_residual_rotates_only_d_model_dims() -> None:
    cfg = trial(d_model=32, vocab=256, seq_len=16)
    model = Transformer.from_config(cfg)
    b = named_bases(build_optimizer(cfg, model), model)
    assert side_sizes(b["tok_emb.weight"]) == (None, 32)  # (V, d): only the d side
    assert side_sizes(b["pos_emb.weight"]) == (None, 32)
    assert side_sizes(b["unembed.weight"]) == (None, 32)  # (V, d) Linear weight
    assert side_sizes(b["blocks.0.attn.qkv.weight"]) == (None, 32)  # (3d, d)
    assert side_sizes(b["blocks.0.attn.proj.weight"]) == (32, 32)
    assert side_sizes(b["blocks.0.mlp.fc.weight"]) == (None, 32)  # (4d, d)
    assert side_sizes(b["blocks.0.mlp.proj.weight"]) == (32, None)  # (d, 4d)
    assert side_sizes(b["blocks.0.attn_norm.weight"]) == (32, None)  # vectors: one Q


def test_residual_never_rotates_index_dims_even_when_they_equal_d_model() -> None:
    """vocab = seq_len = d_model: the token / position / unembed index dims still stay put."""
    cfg = trial(d_model=32, vocab=32, seq_len=32)
    model = Transformer.from_config(cfg)
    assert index_dims(model, 32) == {"tok_emb.weight": (0,), "pos_emb.weight": (0,), "unembed.weight": (0,)}
    b = named_bases(build_optimizer(cfg, model), model)
    for name in ("tok_emb.weight", "pos_emb.weight", "unembed.weight"):
        assert side_sizes(b[name]) == (None, 32), name
    assert side_sizes(b["blocks.1.attn.proj.weight"]) == (32, 32)


def test_all_rotates_every_dim() -> None:
    cfg = trial(d_model=32, vocab=256, seq_len=16, rotate="all", norm="rmsnorm_scalar")
    model = Transformer.from_config(cfg)
    opt = build_optimizer(cfg, model)
    for name, p in model.named_parameters():
        qo, qi = opt.bases(p)
        expect = (p.shape[0], p.shape[1] if p.ndim == 2 else None)
        assert side_sizes((qo, qi)) == expect, name
        for q in (qo, qi):
            if q is not None:
                assert q.dtype == p.dtype and q.device == p.device
                torch.testing.assert_close(q.double().T @ q.double(), torch.eye(q.shape[0], dtype=F64), atol=1e-5, rtol=0)


def test_bases_deterministic_from_seed_and_distinct_per_parameter() -> None:
    def bases(seed: int):
        cfg = trial(seed=seed)
        model = Transformer.from_config(cfg)
        return named_bases(build_optimizer(cfg, model), model)

    b0, b0_again, b1 = bases(0), bases(0), bases(1)
    w = "blocks.0.attn.proj.weight"
    assert torch.equal(b0[w][0], b0_again[w][0]) and torch.equal(b0[w][1], b0_again[w][1])
    assert not torch.allclose(b0[w][0], b1[w][0])
    assert not torch.allclose(b0[w][0], b0[w][1])  # out and in sides differ
    assert not torch.allclose(b0[w][1], b0["blocks.1.attn.proj.weight"][1])  # parameters differ


def test_bad_explicit_bases_and_missing_d_model_are_rejected() -> None:
    p = torch.zeros(3, 2, requires_grad=True)
    with pytest.raises(ValueError, match="does not fit"):
        RotatedAdam([p], bases={p: (torch.eye(2), None)})
    with pytest.raises(ValueError, match="not orthogonal"):
        RotatedAdam([p], bases={p: (2 * torch.eye(3), None)})
    with pytest.raises(ValueError, match="d_model"):
        RotatedAdam([p], rotate="residual")
    with pytest.raises(ValueError, match="rotate"):
        RotatedAdam([p], rotate="some", d_model=2)


# ---- build_optimizer ----------------------------------------------------------------------


@pytest.mark.parametrize("name, cls", [("adam", torch.optim.AdamW), ("sgd", torch.optim.SGD), ("rotated_adam", RotatedAdam),
                                       ("soap", SOAP), ("adafactor", torch.optim.Adafactor), ("lion", Lion), ("signsgd", Lion)])
def test_build_optimizer_classes_and_decay_groups(name: str, cls: type) -> None:
    cfg = trial(name, weight_decay=0.1, nesterov=True) if name == "sgd" else trial(name, weight_decay=0.1)
    model = Transformer.from_config(cfg)
    opt = build_optimizer(cfg, model)
    assert type(opt) is cls
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim < 2 for p in no_decay["params"])
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}
    assert all(g["lr"] == cfg.optimizer.lr for g in opt.param_groups)  # the peak; a scheduler sets it
    if name == "sgd":
        assert decay["momentum"] == 0.9 and decay["nesterov"] is True
    elif name == "signsgd":
        assert decay["betas"] == (0.9, 0.9)
    elif name in ("lion", "adafactor"):
        assert decay["betas" if name == "lion" else "beta2_decay"] == ((0.9, 0.95) if name == "lion" else -0.8)
    else:
        assert decay["betas"] == (0.9, 0.95) and decay["eps"] == 1e-8


def test_decay_groups_skip_frozen_and_empty() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False))
    groups = decay_groups(model, 0.1)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1
    model[0].weight.requires_grad_(False)
    assert decay_groups(model, 0.1) == []


# ---- on the real model; state_dict round trip ---------------------------------------------


def train_steps(cfg: TrialConfig, model, opt, start: int, stop: int) -> None:
    for step in range(start, stop):
        for group in opt.param_groups:
            group["lr"] = cfg.optimizer.lr * (1 - step / 20)
        _, loss = model(*batch(torch.Generator().manual_seed(step), 4, cfg.data.seq_len, cfg.vocab_size))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", ["adam", "sgd", "rotated_adam", "soap", "soap-shampoo", "muon", "muon-sgd",
                                  "muon-rotated_adam", "adafactor", "lion", "signsgd"])
def test_state_dict_round_trip_continues_identically(name: str) -> None:
    extra = {"precondition_frequency": 2} if name == "soap" else {}  # a refresh after the resume
    if name.startswith("muon-"):
        name, ends = name.split("-")
        extra = {"muon_ends": ends, "muon_ends_lr_ratio": 3.0}
    if name == "soap-shampoo":  # gain and bias vectors preconditioned too
        name, extra = "soap", {**extra, "soap_vectors": "shampoo"}
    cfg = trial(name, weight_decay=0.1, seed=3, **extra)
    model = Transformer.from_config(cfg)
    opt = build_optimizer(cfg, model)
    train_steps(cfg, model, opt, 0, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    train_steps(cfg, model, opt, 3, 6)  # uninterrupted

    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    other = trial(name, weight_decay=0.1, seed=4, **extra)  # a different seed: the loaded bases must win
    resumed = Transformer.from_config(other)
    resumed.load_state_dict(saved["model"])
    opt2 = build_optimizer(other, resumed)
    opt2.load_state_dict(saved["optim"])
    train_steps(cfg, resumed, opt2, 3, 6)
    for (n, p), q in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), n
    if name in ("rotated_adam", "soap"):  # and the loaded state is decoupled from the saved dict
        before = saved["optim"]["state"][0]["exp_avg"].clone()
        train_steps(cfg, resumed, opt2, 6, 7)
        assert torch.equal(saved["optim"]["state"][0]["exp_avg"], before)


@pytest.mark.parametrize("rotate", ["residual", "all"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm_scalar"])
def test_trains_the_real_model(rotate: str, norm: str) -> None:
    cfg = trial(rotate=rotate, norm=norm, lr=3e-3)
    model = Transformer.from_config(cfg)
    opt = build_optimizer(cfg, model)
    x, y = batch(torch.Generator().manual_seed(0), 4, cfg.data.seq_len, cfg.vocab_size)
    first = None
    for _ in range(8):  # overfit one batch
        _, loss = model(x, y)
        first = float(loss.detach()) if first is None else first
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert float(model(x, y)[1].detach()) < first - 0.05


def test_real_model_float64_identity_bases_match_adamw() -> None:
    """build_optimizer's groups with every basis forced to identity reproduce torch AdamW."""
    cfg = trial(weight_decay=0.1)
    a, b = Transformer.from_config(cfg, dtype=F64), Transformer.from_config(cfg, dtype=F64)
    groups = decay_groups(a, 0.1)
    ours = RotatedAdam(groups, lr=1e-2, weight_decay=0.1, rotate="all", bases={n: None for n, _ in a.named_parameters()})
    ref = torch.optim.AdamW(decay_groups(b, 0.1), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    train_steps(cfg, a, ours, 0, 5)
    train_steps(cfg, b, ref, 0, 5)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12, msg=n)


def test_add_param_group_gets_bases_and_state() -> None:
    p, q = torch.zeros(4, 4, requires_grad=True), torch.zeros(4, requires_grad=True)
    opt = RotatedAdam([p], rotate="all")
    opt.add_param_group({"params": [q], "lr": 1e-3})
    assert opt.bases(q)[0].shape == (4, 4) and opt.bases(p)[1].shape == (4, 4)
    (p.sum() + q.sum()).backward()
    opt.step()
    assert float(opt.state[q]["step"]) == 1 and copy.deepcopy(opt.state_dict())["state"][1]["basis_out"].shape == (4, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_has_no_host_sync() -> None:
    cfg = trial(rotate="all")
    model = Transformer.from_config(cfg).cuda()
    opt = build_optimizer(cfg, model)
    x, y = (t.cuda() for t in batch(torch.Generator().manual_seed(0), 4, cfg.data.seq_len, cfg.vocab_size))
    model(x, y)[1].backward()
    assert all(q is None or q.is_cuda for p in model.parameters() for q in opt.bases(p))
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---- soap: Adam in Shampoo's eigenbasis -----------------------------------------------------


def test_soap_frozen_at_identity_is_adam() -> None:
    """precondition_frequency=None freezes the start bases (identity on matrices): torch AdamW."""
    a, b = toy_params(SHAPES), toy_params(SHAPES)
    ours = SOAP(a, lr=3e-2, weight_decay=0.1, precondition_frequency=None)
    assert ours.bases(a[0])[0].shape == (6, 6)  # real identity matmuls, not skipped
    ref = torch.optim.AdamW(b, lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1)
    run(a, ours, 15)
    run(b, ref, 15)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def test_soap_frozen_at_random_bases_is_rotated_adam() -> None:
    a, b = toy_params(SHAPES), toy_params(SHAPES)
    bases = {0: (haar(6, "o0"), haar(4, "i0")), 1: (haar(6, "o1"), None), 6: (None, haar(6, "i6"))}
    ours = SOAP(a, lr=3e-2, weight_decay=0.1, precondition_frequency=None, bases=bases)
    ref = RotatedAdam(b, lr=3e-2, weight_decay=0.1, bases={**{i: None for i in range(len(b))}, **bases})
    run(a, ours, 15)
    run(b, ref, 15)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def square_problem():
    """A 5 x 5 matrix problem and its rotated copy: G G^T and G^T G have full rank, so their
    eigenbases are unique (a rank-deficient factor's null-space basis is arbitrary, and two
    correct implementations may pick different ones)."""
    gen = torch.Generator().manual_seed(11)
    x, y = torch.randn(5, 12, generator=gen, dtype=F64), torch.randn(5, 12, generator=gen, dtype=F64)
    scale = torch.linspace(0.1, 2.0, 25, dtype=F64).view(5, 5)

    def f(ps):
        return torch.log(torch.cosh(ps[0] @ x - y)).sum() + ((scale * ps[0]) ** 4).sum()

    po, pi = haar(5, "Po5"), haar(5, "Pi5")
    return f, (lambda ps: f([po.T @ ps[0] @ pi])), po, pi, torch.randn(5, 5, generator=gen, dtype=F64)


def soap_reference(w: torch.Tensor, loss, steps: int, lr: float, freq: int, b1=0.9, b2=0.95, s=0.95, eps=1e-8) -> torch.Tensor:
    """SOAP on one matrix, written out as nikhilvyas/SOAP orders it: the first step only builds
    the factors and eigh bases; each later step is Adam in the basis (m carried exactly), then
    the factors, then every `freq` Adam steps: sort the columns (v follows), L Q, QR."""
    w = w.clone().requires_grad_()
    o, i = w.shape
    L, R = torch.zeros(o, o, dtype=F64), torch.zeros(i, i, dtype=F64)
    m, v = torch.zeros(o, i, dtype=F64), torch.zeros(o, i, dtype=F64)
    qo = qi = None
    for call in range(steps):
        w.grad = None
        loss([w]).backward()
        g = w.grad
        t = call  # Adam steps after this one
        if call > 0:
            gt = qo.T @ g @ qi
            m, v = b1 * m + (1 - b1) * gt, b2 * v + (1 - b2) * gt**2
            u = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
            with torch.no_grad():
                w -= lr * qo @ u @ qi.T
        L, R = s * L + (1 - s) * g @ g.T, s * R + (1 - s) * g.T @ g
        if call == 0:
            qo, qi = (torch.linalg.eigh(f + 1e-30 * torch.eye(len(f), dtype=F64)).eigenvectors.flip(-1) for f in (L, R))
        elif t % freq == 0:
            m_param = qo @ m @ qi.T
            ko = torch.diag(qo.T @ L @ qo).argsort(descending=True)
            v, qo = v[ko], torch.linalg.qr(L @ qo[:, ko]).Q
            ki = torch.diag(qi.T @ R @ qi).argsort(descending=True)
            v, qi = v[:, ki], torch.linalg.qr(R @ qi[:, ki]).Q
            m = qo.T @ m_param @ qi
    return w.detach()


def test_soap_matches_its_written_out_reference() -> None:
    # The first Adam step sees the gradient the bases were built from (W has not moved), so in
    # the basis it is diagonal plus rounding noise that eps = 1e-8 would blow up to ~1e-5; a
    # large eps keeps the comparison about the algorithm.
    loss, _, _, _, w0 = square_problem()
    expect = soap_reference(w0, loss, steps=10, lr=3e-2, freq=3, eps=1e-2)
    w = [w0.clone().requires_grad_()]
    opt = SOAP(w, lr=3e-2, precondition_frequency=3, eps=1e-2)
    run(w, opt, 1, loss=loss)
    assert torch.equal(w[0], w0)  # the first step only builds the factors
    run(w, opt, 9, loss=loss)
    torch.testing.assert_close(w[0], expect, rtol=0, atol=1e-9)
    assert (expect - w0).norm() > 0.1


def test_soap_refinement_sorts_the_basis_and_the_second_moment_with_it() -> None:
    """A refinement orders the columns by diag(Q^T L Q), descending, and v's coordinates follow."""
    w = torch.zeros(3, 2, dtype=F64, requires_grad=True)
    opt = SOAP([w], precondition_frequency=1)
    (b,) = opt._buckets
    b.gg_out[0] = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=F64))  # identity basis: ascending
    b.gg_in[0] = torch.diag(torch.tensor([5.0, 4.0], dtype=F64))  # already descending
    b.exp_avg_sq[0] = torch.arange(6, dtype=F64).view(3, 2)
    opt._refresh = "qr"
    opt._refresh_bases(b, slice(None))
    torch.testing.assert_close(b.exp_avg_sq[0], torch.tensor([[4.0, 5.0], [2.0, 3.0], [0.0, 1.0]], dtype=F64))
    torch.testing.assert_close(b.basis_out[0].abs(), torch.eye(3, dtype=F64).flip(1), rtol=0, atol=1e-15)
    torch.testing.assert_close(b.basis_in[0].abs(), torch.eye(2, dtype=F64), rtol=0, atol=1e-15)


@pytest.mark.parametrize("freq", [1, 3])
def test_soap_is_equivariant_on_matrices(freq: int) -> None:
    """Its bases follow the gradients' rotation (L' = Po L Po^T), so the whole run rotates."""
    f, g, po, pi, w0 = square_problem()
    a, b = [w0.clone().requires_grad_()], [(po @ w0 @ pi.T).requires_grad_()]
    # eps 1e-2: see test_soap_matches_its_written_out_reference (rounding noise, not the basis)
    run(a, SOAP(a, lr=3e-2, eps=1e-2, weight_decay=0.1, precondition_frequency=freq), 20, loss=f)
    run(b, SOAP(b, lr=3e-2, eps=1e-2, weight_decay=0.1, precondition_frequency=freq), 20, loss=g)
    assert (a[0] - w0).norm() > 0.1
    torch.testing.assert_close(b[0], po @ a[0] @ pi.T, rtol=0, atol=1e-8)


def test_soap_skips_long_sides_and_vectors() -> None:
    w, c = torch.zeros(8, 3, requires_grad=True), torch.zeros(8, requires_grad=True)
    opt = SOAP([w, c], max_precond_dim=4)
    assert opt.bases(w)[0] is None and opt.bases(w)[1].shape == (3, 3) and opt.bases(c) == (None, None)
    with pytest.raises(ValueError, match="precondition_frequency"):
        SOAP([w], precondition_frequency=0)
    w.grad, c.grad = torch.ones_like(w), None
    opt.step()  # factor-only: a group added now would skip its own first step
    with pytest.raises(ValueError, match="after the first step"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})


# ---- sign methods, sgd, adafactor -------------------------------------------------------------


def test_lion_and_signsgd_match_their_formulas() -> None:
    lr, wd, (b1, b2), mu = 1e-2, 0.1, (0.9, 0.99), 0.8
    a, b, c = toy_params(SHAPES), toy_params(SHAPES), toy_params(SHAPES)
    run(a, Lion(a, lr=lr, betas=(b1, b2), weight_decay=wd), 6)
    c = [torch.nn.Parameter(p.detach()) for p in c]
    run(c, build_optimizer(trial("signsgd", momentum=mu, weight_decay=wd), torch.nn.ParameterList(c)), 6)
    ms = [torch.zeros_like(p) for p in b]
    hb = [torch.zeros_like(p) for p in b]  # signsgd's reference: heavy-ball sum mu h + g, same sign
    ref_c = [p.detach().clone().requires_grad_() for p in toy_params(SHAPES)]
    for _ in range(6):
        for ps, rule in ((b, "lion"), (ref_c, "signsgd")):
            for p in ps:
                p.grad = None
            toy_loss(ps).backward()
            with torch.no_grad():
                for k, p in enumerate(ps):
                    if rule == "lion":
                        u = (b1 * ms[k] + (1 - b1) * p.grad).sign()
                        ms[k] = b2 * ms[k] + (1 - b2) * p.grad
                        p.mul_(1 - lr * wd).sub_(lr * u)
                    else:
                        hb[k] = mu * hb[k] + p.grad
                        p.mul_(1 - 1e-2 * wd if p.ndim >= 2 else 1).sub_(1e-2 * hb[k].sign())
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    for p, q in zip(c, ref_c):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def adafactor_reference(w: torch.Tensor, loss, steps: int, lr: float, d=1.0, eps1=None, eps2=1e-3, decay=-0.8) -> torch.Tensor:
    """Adafactor on one matrix (torch's documented algorithm, no momentum): factored second moment
    V = r c^T / mean(r), relative step max(eps2, RMS(W)) min(lr, 1/sqrt(t)), update clipping d."""
    w = w.clone().requires_grad_()
    eps1 = torch.finfo(w.dtype).eps if eps1 is None else eps1
    r, c = torch.zeros(w.shape[0], 1, dtype=F64), torch.zeros(1, w.shape[1], dtype=F64)
    for t in range(1, steps + 1):
        w.grad = None
        loss([w]).backward()
        g = w.grad
        beta2 = 1 - t**decay
        r = beta2 * r + (1 - beta2) * (g**2).mean(1, keepdim=True)
        c = beta2 * c + (1 - beta2) * (g**2).mean(0, keepdim=True)
        v = r @ c / r.mean().clamp(min=eps1)
        u = g / v.clamp(min=eps1**2).sqrt()
        alpha = max(eps2, float(w.detach().pow(2).mean().sqrt())) * min(lr, t**-0.5)
        with torch.no_grad():
            w -= alpha / max(1.0, float(u.pow(2).mean().sqrt()) / d) * u
    return w.detach()


def test_adafactor_matches_the_factored_formula() -> None:
    f, _, _, _, w0, c0 = rotated_problem()
    loss = lambda ps: f([ps[0], c0])  # noqa: E731
    w = [torch.nn.Parameter(w0.clone())]
    run(w, build_optimizer(trial("adafactor"), torch.nn.ParameterList(w)), 6, loss=loss)
    torch.testing.assert_close(w[0], adafactor_reference(w0, loss, 6, lr=1e-2), rtol=0, atol=1e-12)


# ---- equivariance across optimisers: which ones privilege the basis ---------------------------


def equivariance_gap(make, steps: int = 25) -> tuple[float, float]:
    """Train W alone on f and W' = Po W Pi^T on the rotated problem g; (|W'_N - Po W_N Pi^T|, |W_N - W_0|)."""
    f, g, po, pi, w0, c0 = rotated_problem()
    a, b = [torch.nn.Parameter(w0.clone())], [torch.nn.Parameter(po @ w0 @ pi.T)]
    run(a, make(a), steps, loss=lambda ps: f([ps[0], c0]))
    run(b, make(b), steps, loss=lambda ps: g([ps[0], po @ c0]))
    return float((b[0] - po @ a[0] @ pi.T).detach().norm()), float((a[0] - w0).detach().norm())


def test_sgd_is_equivariant() -> None:
    gap, moved = equivariance_gap(lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, nesterov=True, weight_decay=0.1))
    assert moved > 0.1 and gap < 1e-12 * max(1.0, moved)


def test_muon_on_matrices_is_equivariant_up_to_its_bfloat16() -> None:
    """Newton-Schulz is a matrix polynomial in B B^T times B: NS(Po B Pi^T) = Po NS(B) Pi^T. torch
    runs it in bfloat16, so the gap is rounding (measured 3e-3 x moved), not the basis."""
    gap, moved = equivariance_gap(lambda ps: torch.optim.Muon(ps, lr=3e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"))
    assert moved > 0.1 and gap < 0.03 * moved, (gap, moved)


def test_our_muon_is_equivariant_to_rounding() -> None:
    """EquivariantMuon (what the muon rule builds) runs Newton-Schulz in the parameter's dtype:
    float64 here, so the gap is float64 rounding, three orders below torch's bfloat16 Muon."""
    from study.optim.rules.muon import EquivariantMuon

    gap, moved = equivariance_gap(lambda ps: EquivariantMuon(ps, lr=3e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"))
    assert moved > 0.1 and gap < 1e-9 * moved, (gap, moved)


def test_our_muon_is_torch_muon_step_for_step(monkeypatch) -> None:
    """With torch's own Newton-Schulz put in, EquivariantMuon's step is torch.optim.Muon's exactly
    (momentum, Nesterov, decoupled decay, lr adjustment): only the precision differs."""
    import torch.optim._muon as torch_muon
    from study.optim.rules import muon as ours

    f, _, _, _, w0, c0 = rotated_problem()
    loss = lambda ps: f([ps[0], c0])  # noqa: E731
    a, b = [torch.nn.Parameter(w0.clone().float())], [torch.nn.Parameter(w0.clone().float())]
    monkeypatch.setattr(ours, "newton_schulz", torch_muon._zeropower_via_newtonschulz)
    for ps, cls in ((a, torch.optim.Muon), (b, ours.EquivariantMuon)):
        run(ps, cls(ps, lr=3e-2, weight_decay=0.1, momentum=0.9, nesterov=True, adjust_lr_fn="match_rms_adamw"), 5,
            loss=lambda p: loss([p[0].double()]))
    assert (a[0] - w0.float()).norm() > 0.05
    torch.testing.assert_close(b[0], a[0], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["adam", "adafactor", "lion", "signsgd"])
def test_per_coordinate_optimisers_are_not_equivariant(name: str) -> None:
    def make(ps):
        return build_optimizer(trial(name, lr=3e-2, weight_decay=0.1), torch.nn.ParameterList(ps))

    gap, moved = equivariance_gap(make)
    assert moved > 0.1 and gap > 0.2 * moved, (gap, moved)


# ---- muon: Muon on hidden matrices, AdamW on the rest -----------------------------------------


def test_muon_split_lr_and_orthogonalised_update() -> None:
    cfg = trial("muon", lr=1e-2, weight_decay=0.1, muon_lr_ratio=2.0)
    model = Transformer.from_config(cfg)
    opt = build_optimizer(cfg, model)
    assert isinstance(opt, MuonAdamW)
    name_of = {id(p): n for n, p in model.named_parameters()}
    muon_names = {name_of[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    assert muon_names == {n for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks.")}
    assert set(HIDDEN_MATRICES) <= muon_names  # the config's check names real parameters
    adam_names = {name_of[id(p)] for g in opt.ends.param_groups for p in g["params"]}
    assert adam_names == set(name_of.values()) - muon_names and "tok_emb.weight" in adam_names
    assert len(opt.param_groups) == 3 and all(g["lr"] == 1e-2 for g in opt.param_groups)

    for g in opt.param_groups:  # a scheduler's write reaches both parts
        g["lr"] = 1e-3
    w = model.blocks[0].attn.proj.weight
    before = w.detach().clone()
    x, y = batch(torch.Generator().manual_seed(0), 4, cfg.data.seq_len, cfg.vocab_size)
    model(x, y)[1].backward()
    grad = w.grad.clone()
    opt.step()
    assert all(g["lr"] == 1e-3 for g in opt.param_groups)  # restored after Muon's scaled step
    # first step: momentum buffer (1 - mu) G, Nesterov update G.lerp(buf, mu) = (1 - mu^2) G, direction of G
    lr_eff = 1e-3 * 2.0 * 0.2 * 32**0.5
    o = -(w.detach() - before * (1 - 1e-3 * 2.0 * 0.1)) / lr_eff  # NS(G), about U S' V^T
    u, sv, vh = torch.linalg.svd(grad)
    d = u.T @ o @ vh.T  # about diagonal: NS keeps G's singular vectors, moves its singular values
    assert (d - torch.diag(d.diagonal())).norm() < 0.1 * d.norm()
    big = d.diagonal()[sv > 0.2 * sv[0]]  # the 5 Newton-Schulz steps lift these into ~(0.5, 1.5)
    assert len(big) >= 4 and 0.5 < float(big.min()) and float(big.max()) < 1.5


def test_muon_without_matrices_is_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4))
    from study.optim import muon_adamw
    with pytest.raises(ValueError, match="no 2-D parameter is left for Muon"):
        muon_adamw(model, lr=1e-3, exclude=("0.*",))


# ---- muon's ends: AdamW, SGD or RotatedAdam; which runs are rotation-equivariant ------------------


@pytest.mark.parametrize("ends, cls", [("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD), ("rotated_adam", RotatedAdam)])
def test_muon_ends_optimiser_and_its_lr_ratio(ends: str, cls: type) -> None:
    cfg = trial("muon", lr=1e-2, weight_decay=0.1, muon_ends=ends, muon_ends_lr_ratio=10.0, momentum=0.8)
    model = Transformer.from_config(cfg)
    opt = build_optimizer(cfg, model)
    assert type(opt.ends) is cls
    name_of = {id(p): n for n, p in model.named_parameters()}
    ends_names = {name_of[id(p)] for g in opt.ends.param_groups for p in g["params"]}
    assert {"tok_emb.weight", "pos_emb.weight", "unembed.weight", "final_norm.weight"} <= ends_names
    assert not any(n.endswith(("qkv.weight", "proj.weight", "fc.weight")) and n.startswith("blocks.") for n in ends_names)
    if ends == "rotated_adam":  # residual dims rotate, the vocabulary and position dims never do
        qo, qi = opt.ends.bases(model.tok_emb.weight)
        assert qo is None and qi.shape == (32, 32) and opt.ends.bases(model.final_norm.weight)[0].shape == (32, 32)
    for g in opt.param_groups:
        g["lr"] = 1e-3  # a scheduler's write
    gain = model.final_norm.weight
    before = gain.detach().clone()
    _, loss = model(*batch(torch.Generator().manual_seed(0), 4, cfg.data.seq_len, cfg.vocab_size))
    loss.backward()
    grad = gain.grad.clone()
    opt.step()
    assert all(g["lr"] == 1e-3 for g in opt.param_groups)  # restored after the scaled steps
    step = gain.detach() - before
    if ends == "sgd":  # first SGD step with momentum: buf = grad, no decay on vectors
        torch.testing.assert_close(step, -1e-3 * 10.0 * grad, rtol=0, atol=2e-7)  # float32 rounding at 1.0
    if ends == "adamw":  # first Adam step: -lr sign(grad) wherever |grad| >> eps
        big = grad.abs() > 1e-5
        torch.testing.assert_close(step[big], -1e-3 * 10.0 * grad[big].sign(), rtol=1e-3, atol=1e-7)


def residual_equivariance_gap(optimizer: dict, steps: int = 8) -> tuple[float, float]:
    """Train a float64 rmsnorm_scalar model A and its copy B rotated in the residual basis by a
    Haar Q (invariance.rotate_residual_basis: the same function, every residual-basis parameter
    rotated), each with its own optimiser from the same config. Returns (|rotate(A_N) - B_N|,
    |A_N - A_0|) over all parameters: 0 when the whole update is rotation-equivariant."""
    from study.invariance import rotate_residual_basis

    cfg = trial(norm="rmsnorm_scalar", **optimizer)
    a = Transformer.from_config(cfg, dtype=F64)
    q = haar(32, "residual")
    b = rotate_residual_basis(a, q)
    a0 = [p.detach().clone() for p in a.parameters()]
    for model in (a, b):
        opt = build_optimizer(cfg, model)
        for step in range(steps):
            _, loss = model(*batch(torch.Generator().manual_seed(step), 4, cfg.data.seq_len, cfg.vocab_size))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    want = rotate_residual_basis(a, q)
    gap = sum(float((p - r).detach().norm()) ** 2 for p, r in zip(b.parameters(), want.parameters())) ** 0.5
    moved = sum(float((p - p0).detach().norm()) ** 2 for p, p0 in zip(a.parameters(), a0)) ** 0.5
    return gap, moved


def test_pure_muon_is_rotation_equivariant_up_to_its_bfloat16() -> None:
    """muon_ends: sgd: Muon's Newton-Schulz on the matrices (equivariant up to its bfloat16, as
    test_muon_on_matrices_is_equivariant_up_to_its_bfloat16) and SGD on the ends and gains."""
    gap, moved = residual_equivariance_gap({"name": "muon", "lr": 1e-2, "muon_ends": "sgd", "muon_ends_lr_ratio": 30.0})
    assert moved > 0.1 and gap < 0.03 * moved, (gap, moved)


def test_muon_with_adamw_ends_is_not_rotation_equivariant() -> None:
    gap, moved = residual_equivariance_gap({"name": "muon", "lr": 1e-2})
    assert moved > 0.1 and gap > 0.2 * moved, (gap, moved)


def test_sgd_whole_model_is_rotation_equivariant() -> None:
    """The harness itself: plain SGD (no bf16 anywhere) rotates with the model to rounding."""
    gap, moved = residual_equivariance_gap({"name": "sgd", "lr": 0.3, "momentum": 0.9})
    assert moved > 0.1 and gap < 1e-10 * moved, (gap, moved)


@pytest.mark.parametrize("vectors", [False, True])
def test_soap_vectors_get_plain_adam_unless_preconditioned(vectors: bool) -> None:
    """Why config.optimizer_family calls soap on layernorm/rmsnorm `mixed` by default: its
    matrices' update rotates with the problem (test_soap_is_equivariant_on_matrices) but a
    vector c, trained beside them, gets per-coordinate Adam (measured gap 0.52 x moved, and
    0.13 on W through c). Preconditioned one-sided (soap_vectors: shampoo) the gap is 0.014 on c
    and 0.013 on W: not rounding, the factor's rank-deficient start, but 40x smaller."""
    f, g, po, pi, w0, c0 = rotated_problem()
    a = [w0.clone().requires_grad_(), c0.clone().requires_grad_()]
    b = [(po @ w0 @ pi.T).requires_grad_(), (po @ c0).requires_grad_()]
    run(a, SOAP(a, lr=3e-2, eps=1e-2, precondition_frequency=1, precondition_vectors=vectors), 20, loss=f)
    run(b, SOAP(b, lr=3e-2, eps=1e-2, precondition_frequency=1, precondition_vectors=vectors), 20, loss=g)
    with torch.no_grad():
        moved, gap = float((a[1] - c0).norm()), float((b[1] - po @ a[1]).norm())
        moved_w, gap_w = float((a[0] - w0).norm()), float((b[0] - po @ a[0] @ pi.T).norm())
    assert moved > 0.1 and moved_w > 0.1
    if vectors:
        assert gap < 0.05 * moved and gap_w < 0.05 * moved_w, (gap, moved, gap_w, moved_w)
    else:
        assert gap > 0.2 * moved, (gap, moved)


def test_soap_preconditions_vectors_one_sided_when_asked() -> None:
    w, c, s, one = (torch.zeros(8, 3, requires_grad=True), torch.zeros(8, requires_grad=True),
                    torch.zeros((), requires_grad=True), torch.zeros(1, requires_grad=True))
    opt = SOAP([w, c, s, one], precondition_vectors=True, max_precond_dim=8)
    assert opt.bases(c)[0].shape == (8, 8) and opt.bases(c)[1] is None
    assert opt.bases(s) == (None, None) and opt.bases(one) == (None, None)
    assert SOAP([c], precondition_vectors=True, max_precond_dim=7).bases(c) == (None, None)
    cfg = trial("soap", soap_vectors="shampoo")
    model = Transformer.from_config(cfg)
    built = build_optimizer(cfg, model)
    assert built.bases(model.final_norm.bias)[0].shape == (32, 32)
    assert build_optimizer(trial("soap"), model).bases(model.final_norm.bias) == (None, None)
