"""Tests for study.optim: build_optimizer's name map and RotatedAdam's maths, bases and state."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from study.config import TrialConfig
from study.model import Transformer
from study.optim import RotatedAdam, build_optimizer, decay_groups, index_dims
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


@pytest.mark.parametrize("name, cls", [("adam", torch.optim.AdamW), ("sgd", torch.optim.SGD), ("rotated_adam", RotatedAdam)])
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
    else:
        assert decay["betas"] == (0.9, 0.95) and decay["eps"] == 1e-8


def test_decay_groups_skip_frozen_and_empty() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False))
    groups = decay_groups(model, 0.1)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1
    model[0].weight.requires_grad_(False)
    assert decay_groups(model, 0.1) == []


# ---- on the real model; state_dict round trip ---------------------------------------------


def batch(cfg: TrialConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.data.seq_len + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def train_steps(cfg: TrialConfig, model, opt, start: int, stop: int) -> None:
    for step in range(start, stop):
        for group in opt.param_groups:
            group["lr"] = cfg.optimizer.lr * (1 - step / 20)
        _, loss = model(*batch(cfg, step))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", ["adam", "sgd", "rotated_adam"])
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
    other = trial(name, weight_decay=0.1, seed=4)  # a different seed: the loaded bases must win
    resumed = Transformer.from_config(other)
    resumed.load_state_dict(saved["model"])
    opt2 = build_optimizer(other, resumed)
    opt2.load_state_dict(saved["optim"])
    train_steps(cfg, resumed, opt2, 3, 6)
    for (n, p), q in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), n
    if name == "rotated_adam":  # and the loaded state is decoupled from the saved dict
        before = saved["optim"]["state"][0]["exp_avg"].clone()
        train_steps(cfg, resumed, opt2, 6, 7)
        assert torch.equal(saved["optim"]["state"][0]["exp_avg"], before)


@pytest.mark.parametrize("rotate", ["residual", "all"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm_scalar"])
def test_trains_the_real_model(rotate: str, norm: str) -> None:
    cfg = trial(rotate=rotate, norm=norm, lr=3e-3)
    model = Transformer.from_config(cfg)
    opt = build_optimizer(cfg, model)
    x, y = batch(cfg, 0)
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
    x, y = (t.cuda() for t in batch(cfg, 0))
    model(x, y)[1].backward()
    assert all(q is None or q.is_cuda for p in model.parameters() for q in opt.bases(p))
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
