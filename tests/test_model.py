"""The Transformer: exact sizes, shapes, init, the attribute interface, and rotation placement."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn

from conftest import batch
from study.config import TrialConfig
from study.model import NORMS, LayerNorm, RMSNorm, Rotate, ScalarRMSNorm, Transformer
from study.rotation import generator_for
from variants import ATTENTION_NAMES, L, NORM_NAMES, ROTATIONS




def make_cfg(norm="layernorm", rotation="none", seed=0, d_model=32, n_heads=2, d_mlp=0, seq_len=16, vocab=None,
             attention="softmax"):
    data = {"seq_len": seq_len} if vocab is None else {"seq_len": seq_len, "tokens": "x.bin", "vocab_size": vocab}
    return TrialConfig(model={"d_model": d_model, "n_layers": L, "n_heads": n_heads, "d_mlp": d_mlp}, norm=norm,
                       attention=attention,
                       rotation=ROTATIONS[rotation] if isinstance(rotation, str) else rotation, optimizer={"name": "adam", "lr": 1e-3},
                       train={"steps": 1}, data=data, seed=seed)


def fold_plan(none_model: Transformer, rotated: Transformer) -> None:
    """Give `rotated` (any plan) the weights that make it compute what `none_model` computes.

    A read R and write R^T next to full linear maps: W_in -> W_in R (so N(x R) (W_in R)^T =
    N(x) W_in^T for a rotation-invariant N) and W_out -> R^T W_out (so (h W_out^T R) R^T = h W_out^T).
    The ends: embeddings E -> E R_e (E R_e R_e^T = E), unembedding W_U -> W_U R_u.
    """
    state = {k: v for k, v in none_model.state_dict().items() if not k.endswith("matrix")}
    rotated.load_state_dict(state, strict=False)
    with torch.no_grad():
        if isinstance(rotated.write_emb, Rotate):
            r_e = rotated.write_emb.matrix.T
            rotated.tok_emb.weight.copy_(rotated.tok_emb.weight @ r_e)
            rotated.pos_emb.weight.copy_(rotated.pos_emb.weight @ r_e)
        if isinstance(rotated.read_out, Rotate):
            rotated.unembed.weight.copy_(rotated.unembed.weight @ rotated.read_out.matrix)
        for block in rotated.blocks:
            for read, fc, proj in ((block.read_attn, block.attn.qkv, block.attn.proj), (block.read_mlp, block.mlp.fc, block.mlp.proj)):
                if isinstance(read, Rotate):
                    r = read.matrix
                    fc.weight.copy_(fc.weight @ r)
                    proj.weight.copy_(r.T @ proj.weight)


# ---- sizes, shapes, init -------------------------------------------------------------------


@pytest.mark.parametrize("norm", NORM_NAMES)
@pytest.mark.parametrize("rotation", ["none", "independent"])
@pytest.mark.parametrize("shape", [{}, {"d_mlp": 48, "n_heads": 4}, {"vocab": 1000, "seq_len": 8}])
def test_param_count_matches_config(norm, rotation, shape):
    cfg = make_cfg(norm, rotation, **shape)
    model = Transformer.from_config(cfg)
    assert model.num_params() == sum(p.numel() for p in model.parameters()) == cfg.params
    assert model.num_params(non_embedding=True) == cfg.params_non_embedding
    assert all(not isinstance(m, Rotate) or not list(m.parameters()) for m in model.modules())  # rotations are buffers


@pytest.mark.parametrize("norm", NORM_NAMES)
@pytest.mark.parametrize("rotation", ROTATIONS)
def test_forward_shapes_and_initial_loss(norm, rotation):
    cfg = make_cfg(norm, rotation)
    model = Transformer.from_config(cfg)
    x, y = batch(generator_for(0, "test-batch"), 3, cfg.data.seq_len, cfg.vocab_size)
    logits, loss = model(x, y)
    assert logits.shape == (3, cfg.data.seq_len, 256) and logits.dtype == torch.float32
    assert loss.shape == () and abs(loss.item() - math.log(256)) < 0.1
    logits2, none = model(x[:, :5])
    assert none is None and logits2.shape == (3, 5, 256)
    torch.testing.assert_close(logits2, logits[:, :5], atol=1e-5, rtol=1e-5)  # causal
    with pytest.raises(ValueError):
        model(torch.zeros(1, cfg.data.seq_len + 1, dtype=torch.long))


def test_backward_reaches_every_parameter():
    model = Transformer.from_config(make_cfg("layernorm", "independent"))
    _, loss = model(*batch(generator_for(0, "test-batch"), 2, 16, 256))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert all(not b.requires_grad for b in model.buffers())


def test_init_statistics():
    cfg = make_cfg(d_model=64, n_heads=4)
    model = Transformer.from_config(cfg)
    stds = {n: p.std().item() for n, p in model.named_parameters() if p.ndim == 2}
    assert abs(stds["tok_emb.weight"] - 0.02) < 0.002 and abs(stds["unembed.weight"] - 0.02) < 0.002
    assert abs(stds["blocks.0.attn.qkv.weight"] - 0.02) < 0.002
    for n in ("blocks.1.attn.proj.weight", "blocks.1.mlp.proj.weight"):
        assert abs(stds[n] - 0.02 / math.sqrt(2 * L)) < 0.001
    for name, p in model.named_parameters():
        if "norm" in name:
            assert torch.equal(p, torch.zeros_like(p) if name.endswith("bias") else torch.ones_like(p))


def test_init_is_deterministic_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a = Transformer.from_config(make_cfg("rmsnorm", "shared", seed=3))
    assert torch.equal(torch.get_rng_state(), state)
    b = Transformer.from_config(make_cfg("rmsnorm", "shared", seed=3))
    c = Transformer.from_config(make_cfg("rmsnorm", "shared", seed=4))
    for (k, va), vb, vc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(va, vb), k
        if "norm" not in k:
            assert not torch.equal(va, vc), k
    d = Transformer.from_config(make_cfg("rmsnorm", "shared", seed=3), dtype=torch.float64)
    for va, vd in zip(a.state_dict().values(), d.state_dict().values()):
        assert vd.dtype == torch.float64 and torch.equal(va, vd.float())  # same numbers, either dtype


# ---- the attribute interface (the activation probe hooks these names) ------------------------


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_attribute_interface(norm):
    model = Transformer.from_config(make_cfg(norm, {"mode": "groups", "groups": [[1]]}))
    assert NORMS[norm] is {"layernorm": LayerNorm, "rmsnorm": RMSNorm, "rmsnorm_scalar": ScalarRMSNorm}[norm]
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == L
    for attr in ("tok_emb", "pos_emb", "final_norm", "unembed"):
        assert isinstance(getattr(model, attr), nn.Module)
    assert isinstance(model.write_emb, Rotate) and isinstance(model.read_out, Rotate)  # groups: ends of their own
    plain = Transformer.from_config(make_cfg(norm, {"mode": "groups", "groups": [[1]], "embeddings": False}))
    assert isinstance(plain.write_emb, nn.Identity) and isinstance(plain.read_out, nn.Identity)
    assert isinstance(plain.blocks[1].read_attn, Rotate)
    assert isinstance(model.final_norm, NORMS[norm])
    for i, block in enumerate(model.blocks):
        assert isinstance(block.mlp.act, nn.GELU)
        assert isinstance(block.attn_norm, NORMS[norm]) and isinstance(block.mlp_norm, NORMS[norm])
        kind = Rotate if i == 1 else nn.Identity
        for attr in ("read_attn", "write_attn", "read_mlp", "write_mlp"):
            assert isinstance(getattr(block, attr), kind)


def test_hooks_see_the_residual_equation():
    """Block inputs/outputs are residual streams; norms see the rotated read; act is (B, T, d_mlp)."""
    cfg = make_cfg("rmsnorm_scalar", "shared")
    model = Transformer.from_config(cfg, dtype=torch.float64)
    seen = {}
    hook = lambda name: (lambda m, i, o: seen.__setitem__(name, (i[0], o)))
    model.blocks[0].register_forward_hook(hook("block0"))
    model.blocks[0].attn_norm.register_forward_hook(hook("attn_norm"))
    model.blocks[0].mlp.act.register_forward_hook(hook("act"))
    model.final_norm.register_forward_hook(hook("final_norm"))
    model.blocks[-1].register_forward_hook(hook("last"))
    x, _ = batch(generator_for(0, "test-batch"), 2, cfg.data.seq_len, cfg.vocab_size)
    model(x)
    emb = model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1]))
    r = model.blocks[0].read_attn.matrix
    torch.testing.assert_close(seen["block0"][0], emb @ r.T)  # layer 0 = embedding sum, written through R^T
    torch.testing.assert_close(seen["attn_norm"][0], emb)  # shared: block 0 reads in the embeddings' basis
    torch.testing.assert_close(seen["final_norm"][0], seen["last"][1] @ r)  # the final read is rotated too
    assert seen["act"][1].shape == (2, cfg.data.seq_len, cfg.model.d_mlp)


# ---- dtypes and devices --------------------------------------------------------------------


def test_rotation_buffers_follow_dtype():
    model = Transformer.from_config(make_cfg("layernorm", "independent"))
    mats = [m.matrix for m in model.modules() if isinstance(m, Rotate)]
    assert len(mats) == 4 * L + 2 and all(m.dtype == torch.float32 for m in mats)
    model.to(torch.bfloat16)
    assert all(m.matrix.dtype == torch.bfloat16 for m in model.modules() if isinstance(m, Rotate))
    logits, loss = model(*batch(generator_for(0, "test-batch"), 2, 16, 256))
    assert logits.dtype == torch.float32 and torch.isfinite(loss)
    assert "blocks.0.read_attn.matrix" in model.state_dict()  # saved with checkpoints


BF16_PLANS = {"none": "none", "shared": "shared", "independent": "independent", "partial2": ROTATIONS["partial2"],
              "shared-noemb": {"mode": "shared", "embeddings": False}}


def residuals(model: Transformer, idx: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream at every layer (embeddings, then each block's output)."""
    seen: list[torch.Tensor] = []
    handles = [model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))]
    handles += [b.register_forward_hook(lambda _m, _i, out: seen.append(out)) for b in model.blocks]
    try:
        model(idx)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_bf16_autocast_carries_every_plan_in_the_precision_of_none():
    """Rotations run in float32 outside autocast: under CPU bf16 autocast every plan's residual
    stream has none's dtype at every layer, and its error against a float64 forward of the same
    weights is of none's order at every layer (bf16 rotations: 3e-3 vs 1e-8 at the embeddings,
    2.5x none's at the last block, at this size)."""
    errors, dtypes = {}, {}
    for name, rotation in BF16_PLANS.items():
        cfg = make_cfg("layernorm", rotation, d_model=64, n_heads=4, seq_len=32)
        model = Transformer.from_config(cfg)
        exact = Transformer.from_config(cfg, dtype=torch.float64)
        exact.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
        idx = batch(generator_for(0, "test-batch"), 4, cfg.data.seq_len, cfg.vocab_size)[0]
        with torch.no_grad():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = residuals(model, idx)
            ref = residuals(exact, idx)
        dtypes[name] = [r.dtype for r in low]
        errors[name] = [((a.double() - b).norm() / b.norm()).item() for a, b in zip(low, ref)]
    assert all(d == dtypes["none"] for d in dtypes.values()), dtypes
    assert dtypes["none"] == [torch.float32] * (L + 1)
    for name, errs in errors.items():  # layer 0 (embeddings): float32 rounding, ~1e-8, where bf16 gave ~3e-3
        assert all(e < 2 * e_none + 1e-6 for e, e_none in zip(errs, errors["none"])), (name, errs, errors["none"])


def test_rotate_keeps_float64_and_the_input_dtype():
    r = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64, generator=generator_for(0, "t"))).Q
    x = torch.randn(3, 8, dtype=torch.float64, generator=generator_for(1, "t"))
    torch.testing.assert_close(Rotate(r)(x), x @ r, rtol=0, atol=1e-15)  # float64 is not narrowed
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert Rotate(r.float())(x.bfloat16()).dtype == torch.bfloat16
        assert Rotate(r.float())(x.float()).dtype == torch.float32


def test_norms_numerics():
    x = torch.randn(3, 5, 8, dtype=torch.float64) * 4 + 1
    ms = lambda t: (t.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(RMSNorm(8, torch.float64)(x), x / ms(x))
    torch.testing.assert_close(ScalarRMSNorm(8, torch.float64)(x), x / ms(x))
    c = x - x.mean(-1, keepdim=True)
    torch.testing.assert_close(LayerNorm(8, torch.float64)(x), c / ms(c))
    q = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64))[0]
    s = ScalarRMSNorm(8, torch.float64)
    with torch.no_grad():
        s.weight.fill_(1.7)
    torch.testing.assert_close(s(x @ q), s(x) @ q, atol=1e-12, rtol=0)


# ---- rotations sit next to full linear maps -------------------------------------------------


@pytest.mark.parametrize("rotation", [r for r in ROTATIONS if r != "none"])
def test_rotated_plan_expresses_the_same_function(rotation):
    """rmsnorm_scalar: a rotated-plan model with folded weights computes the `none` model's function."""
    base = Transformer.from_config(make_cfg("rmsnorm_scalar", "none"), dtype=torch.float64)
    rotated = Transformer.from_config(make_cfg("rmsnorm_scalar", rotation), dtype=torch.float64)
    x, y = batch(generator_for(0, "test-batch"), 2, 16, 256)
    if rotation != "shared":  # shared with rotated ends IS the none model (next test)
        assert not torch.allclose(base(x)[0], rotated(x)[0])  # same seed, different plan: different function
    fold_plan(base, rotated)
    torch.testing.assert_close(rotated(x)[0], base(x)[0], atol=1e-10, rtol=0)


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_shared_with_rotated_ends_is_the_unrotated_model_in_a_rotated_basis(norm):
    """Every read x R and write R^T with ONE R, ends included: z = x R evolves exactly as the
    none model's residual stream, for every norm and the same parameters. So shared differs from
    none only in the basis the residual stream is stored (and measured) in; embeddings false
    breaks this (the embeddings then write in the residual basis the blocks do not read in)."""
    base = Transformer.from_config(make_cfg(norm, "none"), dtype=torch.float64)
    shared = Transformer.from_config(make_cfg(norm, "shared"), dtype=torch.float64)
    x, _ = batch(generator_for(0, "test-batch"), 2, 16, 256)
    torch.testing.assert_close(shared(x)[0], base(x)[0], atol=1e-10, rtol=0)
    noemb = Transformer.from_config(make_cfg(norm, {"mode": "shared", "embeddings": False}), dtype=torch.float64)
    assert (noemb(x)[0] - base(x)[0]).abs().max() > 1e-3


def test_folding_fails_for_basis_dependent_norm():
    base = Transformer.from_config(make_cfg("layernorm", "none"), dtype=torch.float64)
    rotated = Transformer.from_config(make_cfg("layernorm", "shared"), dtype=torch.float64)
    fold_plan(base, rotated)
    x, _ = batch(generator_for(0, "test-batch"), 2, 16, 256)
    assert (rotated(x)[0] - base(x)[0]).abs().max() > 1e-4


# ---- the attention variants (study.attention): each computes what its paper defines ----------


def one_head(name: str, **options) -> nn.Module:
    """A one-head attention of d_model 1 (D = 1), float64, from ATTENTIONS."""
    from study.attention import AttentionConfig
    from study.model import ATTENTIONS

    return ATTENTIONS[name](1, 1, torch.float64, AttentionConfig(name=name, **options))


def counting_values(T: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q = k = 0 (every logit 0: each query weighs its keys equally) and v_j = j + 1: (1, 1, T, 1)."""
    zero = torch.zeros(1, 1, T, 1, dtype=torch.float64)
    return zero, zero, torch.arange(1.0, T + 1, dtype=torch.float64).view(1, 1, T, 1)


@pytest.mark.parametrize("name, options, want", [
    ("softmax", {}, [1.0, 1.5, 2.0]),  # y_i = mean(v_0..v_i)
    ("softmax1", {}, [1 / 2, 3 / 3, 6 / 4]),  # exp(0) / (1 + (i+1) exp(0)) = 1/(i+2) on each key, 0 on the zero value
    ("clipped", {"gamma": -0.1}, [1.0, 0.45 * 3, (1.1 / 3 - 0.1) * 6]),  # clip(1.1 p - 0.1, 0, 1), p = 1/(i+1)
    ("clipped", {"gamma": -0.5}, [1.0, 0.25 * 3, 0.0]),  # 1.5/3 - 0.5 = 0: query 2 attends to nothing
    ("clipped", {"gamma": -0.1, "zeta": 2.5}, [1.0, 1.0 * 3, (2.6 / 3 - 0.1) * 6]),  # 2.6/2 - 0.1 = 1.2 -> 1
    ("gated", {}, [1.0, 1.5, 2.0]),  # mix is softmax's; the gate acts in forward
])
def test_each_variant_mixes_values_as_its_paper_defines_by_hand(name, options, want):
    attn = one_head(name, **options)
    y = attn.mix(*counting_values()).flatten().tolist()
    assert y == pytest.approx(want, abs=1e-12)


def test_kv_bias_is_softmax_over_one_more_learned_key_and_value_by_hand():
    """Sun et al.'s explicit bias: q = 0, so the learned key's logit is 0 too; value v' = 4: y_i =
    (sum_{j<=i} v_j + 4) / (i + 2)."""
    attn = one_head("kv_bias")
    with torch.no_grad():
        attn.key_bias.fill_(3.0)  # q = 0: its logit is 0 whatever the key
        attn.value_bias.fill_(4.0)
    assert attn.mix(*counting_values()).flatten().tolist() == pytest.approx([5 / 2, 7 / 3, 10 / 4], abs=1e-12)


def reference_mix(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, zeta: float = 1.0, gamma: float = 0.0,
                  k0: torch.Tensor | None = None, v0: torch.Tensor | None = None) -> torch.Tensor:
    """Each paper's formula with Python loops over (b, h, i, j): the independent reference."""
    B, H, T, D = q.shape
    out = torch.zeros_like(v)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                s = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(D) for j in range(i + 1)]
                extra = None
                if name == "softmax1":
                    extra, value = 0.0, torch.zeros(D, dtype=v.dtype)
                elif name == "kv_bias":
                    extra, value = float(q[b, h, i] @ k0[h]) / math.sqrt(D), v0[h]
                top = max(s + ([extra] if extra is not None else []))
                e = [math.exp(x - top) for x in s]
                total = sum(e) + (math.exp(extra - top) if extra is not None else 0.0)
                p = [x / total for x in e]
                if name == "clipped":
                    p = [min(1.0, max(0.0, (zeta - gamma) * x + gamma)) for x in p]
                out[b, h, i] = sum(pj * v[b, h, j] for j, pj in enumerate(p))
                if extra is not None:
                    out[b, h, i] += math.exp(extra - top) / total * value
    return out


@pytest.mark.parametrize("name", ["softmax", "softmax1", "clipped", "kv_bias"])
def test_each_variant_matches_its_formula_on_a_random_input(name):
    """Two heads of D = 3, five positions: mix (SDPA with the extra zero or learned key, or the
    explicit clipped pattern) against the loop reference; `pattern @ v` is mix over the sequence's
    own keys (the extra key's share is 1 - the row's sum)."""
    from study.attention import AttentionConfig
    from study.model import ATTENTIONS

    cfg = AttentionConfig(name=name, **({"gamma": -0.08, "zeta": 1.2} if name == "clipped" else {}))
    attn = ATTENTIONS[name](6, 2, torch.float64, cfg)
    g = generator_for(0, "test-attention")
    q, k, v = (torch.randn(2, 2, 5, 3, dtype=torch.float64, generator=g) * 2 for _ in range(3))
    extra = {}
    if name == "kv_bias":
        with torch.no_grad():
            attn.key_bias.copy_(torch.randn(6, dtype=torch.float64, generator=g))
            attn.value_bias.copy_(torch.randn(6, dtype=torch.float64, generator=g))
        extra = {"k0": attn.key_bias.view(2, 3), "v0": attn.value_bias.view(2, 3)}
    want = reference_mix(name, q, k, v, zeta=cfg.zeta or 1.0, gamma=cfg.gamma or 0.0, **extra)
    torch.testing.assert_close(attn.mix(q, k, v), want, atol=1e-12, rtol=0)
    p = attn.pattern(q, k)
    assert p.shape == (2, 2, 5, 5) and (p.triu(1) == 0).all()  # causal
    own = p @ v
    if name == "kv_bias":
        own = own + (1 - p.sum(-1, keepdim=True)) * attn.value_bias.view(1, 2, 1, 3)
    torch.testing.assert_close(own, want, atol=1e-12, rtol=0)


def test_gated_attention_gates_each_head_output_elementwise_before_the_output_projection():
    """Qiu et al.'s G1: y * sigmoid(x W_g^T) per channel of the concatenated heads, x the normalised
    input the qkv map reads, then proj. With proj = I and W_g = c I the output is the softmax
    attention's heads times sigmoid(c x) channel by channel; W_g = 0 halves softmax attention."""
    from study.model import Attention, GatedAttention

    d, H = 4, 2
    gated, plain = GatedAttention(d, H, torch.float64), Attention(d, H, torch.float64)
    g = generator_for(1, "test-gate")
    with torch.no_grad():
        for m in (gated, plain):
            m.qkv.weight.copy_(torch.randn(3 * d, d, dtype=torch.float64, generator=g))
            m.proj.weight.copy_(torch.eye(d, dtype=torch.float64))
        plain.qkv.weight.copy_(gated.qkv.weight)
        gated.gate.weight.copy_(2.0 * torch.eye(d, dtype=torch.float64))
    x = torch.randn(3, 5, d, dtype=torch.float64, generator=g)
    torch.testing.assert_close(gated(x), plain(x) * torch.sigmoid(2.0 * x), atol=1e-12, rtol=0)
    with torch.no_grad():
        gated.gate.weight.zero_()
        gated.proj.weight.copy_(torch.randn(d, d, dtype=torch.float64, generator=g))
        plain.proj.weight.copy_(gated.proj.weight)
    torch.testing.assert_close(gated(x), 0.5 * plain(x), atol=1e-12, rtol=0)
    with torch.no_grad():  # both random: the gate acts on the heads' outputs, before the projection mixes them
        gated.gate.weight.copy_(torch.randn(d, d, dtype=torch.float64, generator=g))
        plain.proj.weight.copy_(torch.eye(d, dtype=torch.float64))
    heads = plain(x)  # proj = I: the concatenated heads' outputs
    want = (heads * torch.sigmoid(x @ gated.gate.weight.T)) @ gated.proj.weight.T
    torch.testing.assert_close(gated(x), want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_every_variant_is_causal_counted_and_shares_the_common_init(name):
    """Each variant's model: causal, its parameter count the config's, and at one seed every weight
    it shares with softmax identical (the variant's own drawn last)."""
    cfg = make_cfg("rmsnorm_scalar", attention=name)
    model = Transformer.from_config(cfg)
    assert model.num_params() == cfg.params and model.num_params(non_embedding=True) == cfg.params_non_embedding
    x, y = batch(generator_for(0, "test-batch"), 3, cfg.data.seq_len, cfg.vocab_size)
    logits, loss = model(x, y)
    assert abs(loss.item() - math.log(256)) < 0.1
    torch.testing.assert_close(model(x[:, :5])[0], logits[:, :5], atol=1e-5, rtol=1e-5)  # causal
    softmax = Transformer.from_config(make_cfg("rmsnorm_scalar")).state_dict()
    own = {k for k in model.state_dict() if k not in softmax}
    assert own == {f"blocks.{l}.attn.{p}" for l in range(L) for p in
                   {"gated": ["gate.weight"], "kv_bias": ["key_bias", "value_bias"]}.get(name, [])}
    for key, value in softmax.items():
        assert torch.equal(model.state_dict()[key], value), key
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_every_variant_trains_under_bf16_autocast(name):
    """A few AdamW steps on one batch under CPU bf16 autocast: finite, falling loss."""
    model = Transformer.from_config(make_cfg("rmsnorm_scalar", attention=name))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = batch(generator_for(0, "test-batch"), 4, 16, 256)
    losses = []
    for _ in range(8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.1, losses


def compiled_matches_eager(name: str, device: str) -> None:
    """torch.compile of one variant's attention (the only part that differs) on `device`: forward
    and backward equal eager's, in float32 and under bf16 autocast (on CUDA, SDPA's fused kernels)."""
    from study.attention import AttentionConfig
    from study.model import ATTENTIONS

    eager = ATTENTIONS[name](32, 2, torch.float32, AttentionConfig(name=name))
    with torch.no_grad():
        for p in eager.parameters():
            p.copy_(torch.randn(p.shape, generator=generator_for(0, "test-compile", p.numel())) * 0.3)
    eager = eager.to(device)
    compiled = copy.deepcopy(eager)
    fast = torch.compile(compiled)
    x = torch.randn(2, 16, 32, generator=generator_for(1, "test-compile")).to(device)
    for autocast in (False, True):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            a, b = eager(x), fast(x)
        close = lambda got, want: torch.testing.assert_close(  # noqa: E731  bf16: ~2 ulp of the largest value
            got.float(), want.float(), rtol=2e-2 if autocast else 1e-4, atol=(2e-2 if autocast else 1e-5) * want.abs().max().item())
        close(b, a)
        a.float().pow(2).sum().backward()
        b.float().pow(2).sum().backward()
        for p, q in zip(eager.parameters(), compiled.parameters()):
            close(q.grad, p.grad)
            p.grad, q.grad = None, None


@pytest.mark.slow
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_every_variant_compiles_on_cpu_and_matches_eager(name):
    """inductor on CPU, per variant (the whole model compiles too; at ~3 min a variant on one core
    it is left to the CUDA test below, which benchmarks/gpu_check.sh runs)."""
    compiled_matches_eager(name, "cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.sh runs these)")
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_every_variant_compiles_on_cuda_and_matches_eager(name):
    compiled_matches_eager(name, "cuda")
