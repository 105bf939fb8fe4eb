"""Metrics on known distributions and hand-built tensors; the ActivationProbe on the real model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import batch
from study.config import TrialConfig
from study.metrics import (
    CONTROL_BASES,
    CONTROL_MEDIAN,
    CONTROL_SPREAD,
    METRICS,
    RANK_TESTED,
    RANK_TOKENS,
    ActivationProbe,
    basis_test,
    control_metrics,
    dettmers_outliers,
    kurtosis,
    kurtosis_null,
    max_abs,
    max_median_ratio,
    neuron_kurtosis,
    outlier_dims,
    top_share,
)
from study import sinks
from study.model import Transformer
from study.rotation import generator_for, random_orthogonal


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def gaussian(n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=gen(seed))


# ---- known distributions ------------------------------------------------------------------


def test_gaussian_kurtosis_is_three_and_neuron_kurtosis_one():
    x = gaussian(4096, 1024)
    # per-token sample kurtosis has bias about -6/(d+1) and std sqrt(24/d)/sqrt(n) ~ 0.002
    assert kurtosis(x).item() == pytest.approx(3.0, abs=0.02)
    assert neuron_kurtosis(x).item() == pytest.approx(1.0, abs=0.01)


def test_laplace_kurtosis_is_six():
    g = gen(1)
    e1 = torch.empty(2048, 4096).exponential_(generator=g)
    e2 = torch.empty(2048, 4096).exponential_(generator=g)
    assert kurtosis(e1 - e2).item() == pytest.approx(6.0, abs=0.1)  # E1 - E2 ~ Laplace(0, 1)


def test_random_rotation_removes_basis_aligned_tails():
    n, d = 2048, 256
    x = gaussian(n, d, seed=2)
    x[:, :4] *= 40.0  # a few huge, basis-aligned coordinates
    q = random_orthogonal(d, generator_for(0, "test"), dtype=torch.float32)
    assert kurtosis(x).item() > 30
    assert neuron_kurtosis(x).item() > 10
    assert kurtosis(x @ q).item() == pytest.approx(3.0, abs=0.15)
    assert neuron_kurtosis(x @ q).item() < 2.0  # the energy is spread over every coordinate


def test_exact_null_is_the_centred_formula():
    """Gaussian coordinates: E[centred per-token kurtosis] = 3(d-1)/(d+1) exactly (1.8 at d 4,
    2.333 at d 8), not the uncentred 3d/(d+2) (2.0, 2.4); 65536 tokens resolve the two."""
    for d in (4, 8):
        x = gaussian(65536, d, seed=d)
        assert kurtosis(x).item() == pytest.approx(kurtosis_null(d), abs=0.02)
        assert abs(kurtosis_null(d) - 3 * d / (d + 2)) > 0.06
    assert kurtosis_null(32) == pytest.approx(2.818, abs=1e-3) and kurtosis_null(128) == pytest.approx(2.953, abs=1e-3)


def control_bases(d: int, k: int = CONTROL_BASES) -> torch.Tensor:
    return torch.stack([random_orthogonal(d, generator_for(0, "probe", i), dtype=torch.float32) for i in range(k)])


def control_inputs(d: int = 64, n: int = 2048) -> dict[str, torch.Tensor]:
    """Token sets on which the control's expectation is the null: Gaussian, uniform on the
    sphere, heavy basis-aligned tails, and nearly parallel tokens (one heavy-tailed direction)."""
    g = gen(7)
    x = torch.randn(n, d, generator=g)
    heavy = torch.randn(n, d, generator=g)
    heavy[:, :3] *= 30.0
    u = torch.full((d,), 0.3)
    u[:2] = torch.tensor([10.0, 5.0])
    return {"gaussian": x, "sphere": x / x.norm(dim=-1, keepdim=True), "heavy": heavy,
            "parallel": u + 0.01 * torch.randn(n, d, generator=g)}


@pytest.mark.parametrize("name", ["gaussian", "sphere", "heavy", "parallel"])
def test_control_mean_is_the_exact_null_within_its_standard_error(name):
    """Given any tokens, each basis' kurtosis (over every token) is a draw whose expectation is
    the null, so the K-basis mean is within a few sd / sqrt(K) of 3(d-1)/(d+1); the sd and
    median rows are the spread and median of the single-basis readings."""
    d, x = 64, control_inputs()[name]
    q = control_bases(d)
    out = control_metrics(x, q)
    assert set(out) == {*METRICS, CONTROL_SPREAD, CONTROL_MEDIAN, *(f"{m}_rank_p" for m in RANK_TESTED)}
    mean, sd = out["kurtosis"].item(), out[CONTROL_SPREAD].item()
    tokens = x[:: -(-x.shape[0] // RANK_TOKENS)]  # the basis test's tokens: every other one of 2048
    assert tokens.shape[0] == 1024
    single = torch.stack([kurtosis(tokens @ q[k]) for k in range(CONTROL_BASES)])  # basis k: the same tokens
    assert sd == pytest.approx(single.std().item(), rel=1e-4)
    assert mean == pytest.approx(single.mean().item(), rel=1e-5)
    assert out[CONTROL_MEDIAN].item() == pytest.approx(single.median().item(), rel=1e-5)
    tolerance = 4 * sd / math.sqrt(CONTROL_BASES)
    assert abs(mean - kurtosis_null(d)) < tolerance, (mean, kurtosis_null(d), tolerance)
    if name in ("gaussian", "sphere"):
        assert kurtosis(x).item() == pytest.approx(kurtosis_null(d), abs=0.05)  # the stored basis reads it too
        assert sd < 0.1
    else:  # basis-aligned tails: the stored basis is far above every random basis
        assert kurtosis(x).item() > 20
        assert out["kurtosis_rank_p"].item() == pytest.approx(1 / (1 + CONTROL_BASES))
        assert out["top1_share_rank_p"].item() == pytest.approx(1 / (1 + CONTROL_BASES))
    if name == "parallel":  # nearly one direction: each random basis is one draw, a noisy one
        assert sd > 0.15 and (single - kurtosis_null(d)).abs().max().item() > 2 * tolerance


def test_rank_p_is_exact_under_rotation_invariance():
    """Tokens whose distribution no rotation changes (Gaussian): the stored basis is exchangeable
    with the random ones, so p = (1 + #random >= stored) / 33 is uniform on {1/33, ..., 1}:
    P(p <= 1/33) = 1/33 and P(p <= 1/2) ~ 1/2, over 400 independent token sets."""
    d, n, k = 12, 40, 32
    q = control_bases(d, k)
    ps = {"kurtosis_rank_p": [], "top1_share_rank_p": []}
    for s in range(400):
        x = gaussian(n, d, seed=1000 + s)
        out = basis_test(x, q)
        for m in ps:
            ps[m].append(out[m].item())
    for m, p in ps.items():
        p = np.array(p)
        assert set(np.round(p * 33).astype(int)) <= set(range(1, 34))
        assert abs((p <= 1 / 33 + 1e-9).mean() - 1 / 33) < 0.03, m  # binomial sd 0.009
        assert abs((p <= 0.5).mean() - 0.5) < 0.08, m


def test_rank_p_counts_random_bases_at_or_above_the_stored_value():
    """By hand: two bases, one the identity (ties count against the stored basis)."""
    x = gaussian(30, 8, seed=5)
    q = torch.stack([torch.eye(8), random_orthogonal(8, generator_for(1, "t"), dtype=torch.float32)])
    out = basis_test(x, q)
    other = kurtosis(x @ q[1]).item() >= kurtosis(x).item()
    assert out["kurtosis_rank_p"].item() == pytest.approx((1 + 1 + other) / 3)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_top_share_is_width_free_where_kurtosis_is_not(d):
    """A coordinate holding a fixed 15% of every token's energy reads top-1 share 0.15 at every
    width (within 15%), while kurtosis grows about like d f^2; Gaussian and sphere tokens read
    the share's null, the control's mean."""
    f, n = 0.15, 4096
    g = gaussian(n, d, seed=d)
    rest = g.clone()
    rest[:, 0] = 0
    rest = rest / rest.norm(dim=-1, keepdim=True) * math.sqrt(1 - f)
    rest[:, 0] = math.sqrt(f) * torch.sign(gaussian(n, 1, seed=d + 1)[:, 0])
    assert top_share(rest).item() == pytest.approx(f, rel=0.15)
    assert kurtosis(rest).item() == pytest.approx(d * f**2 + 3 * (1 - f) ** 2, rel=0.15)  # grows with d
    q = control_bases(d, 8)
    null = basis_test(g, q)["top1_share"].item()
    for tokens in (g, g / g.norm(dim=-1, keepdim=True)):
        assert top_share(tokens).item() == pytest.approx(null, rel=0.03)
    assert top_share(g, 4).item() > top_share(g, 1).item()


def test_top_share_by_hand():
    x = torch.tensor([[3.0, -1.0, -1.0, -1.0], [2.0, 2.0, 2.0, 2.0]])  # the second token is constant: left out
    # centred: (3, -1, -1, -1) has mean 0; energies 9, 1, 1, 1 -> top-1 9/12, top-4 1
    assert top_share(x).item() == pytest.approx(0.75)
    assert top_share(x, 4).item() == pytest.approx(1.0)
    assert math.isnan(top_share(torch.ones(3, 5)).item())


def test_private_metrics_take_a_stack_of_token_sets():
    from study.metrics import _all_metrics
    stack = torch.stack([gaussian(50, 12, seed=s) * (1 + s) for s in range(3)])
    stack[1, :, 0] += 9.0  # one set with a basis-aligned outlier
    batched = _all_metrics(stack, 2.0)
    for k in range(3):
        single = _all_metrics(stack[k], 2.0)
        for metric, b, s1 in zip(METRICS, batched, single):
            assert b.shape == (3,) and b[k].item() == pytest.approx(s1.item(), rel=1e-6), metric


def test_control_other_metrics_see_every_rotated_token():
    d, x = 16, gaussian(70, 16, seed=3)  # 70 tokens, 32 bases: two each, the last 6 left out
    q = control_bases(d)
    rotated = torch.cat([x[k:64:CONTROL_BASES] @ q[k] for k in range(CONTROL_BASES)])
    out = control_metrics(x, q, threshold=1.5)
    want = {"neuron_kurtosis": neuron_kurtosis(rotated), "outlier_dims_abs": outlier_dims(rotated, 1.5),
            "outlier_dims_rel": outlier_dims(rotated, 1.5, relative=True), "max_abs": max_abs(rotated),
            "max_median_ratio": max_median_ratio(rotated)}
    for metric, w in want.items():
        assert out[metric].item() == pytest.approx(w.item(), rel=1e-5), metric
    assert out["outlier_dims_abs"].item() > 0  # the threshold is low enough that the counts are not trivially 0


def test_one_spike_neuron_kurtosis_is_d():
    x = torch.zeros(10, 16)
    x[:, 3] = torch.arange(1.0, 11.0)
    assert neuron_kurtosis(x).item() == pytest.approx(16.0)


# ---- hand-built -----------------------------------------------------------------------------


def test_outlier_dims_absolute():
    x = torch.zeros(3, 8)
    x[0, 1], x[1, 1] = 7.0, -8.0  # one coordinate, twice
    x[2, 5] = 6.0  # exactly the threshold: not "exceeds"
    x[1, 7] = -6.5
    assert outlier_dims(x).item() == 2
    assert outlier_dims(x, threshold=5.0).item() == 3
    assert outlier_dims(x, threshold=10.0).item() == 0


def test_outlier_dims_relative_is_scale_free():
    x = torch.ones(2, 64)
    x[0, 0] = 10.0  # rms = sqrt((63 + 100) / 64) = 1.596; 6 rms = 9.58 < 10
    x[1, 2] = 9.0  # rms = sqrt((63 + 81) / 64) = 1.5; 6 rms = 9.0: not strictly above
    assert outlier_dims(x, relative=True).item() == 1
    assert outlier_dims(x * 1000, relative=True).item() == 1
    assert outlier_dims(x * 1000).item() == 64  # the absolute count is not scale-free
    assert outlier_dims(torch.ones(5, 36) * 100, relative=True).item() == 0  # d <= 36: always 0


def test_max_abs_and_max_median_ratio():
    x = torch.tensor([[1.0, -2.0, 3.0, 4.0], [-1.0, 5.0, 2.0, 0.5], [1.0, 1.0, 1.0, -4.0]])
    # |.| medians: 2.5 (even d: mean of the middle two), 1.5, 1.0 -> ratios 1.6, 10/3, 4
    assert max_abs(x).item() == 5.0
    assert max_median_ratio(x).item() == pytest.approx((1.6 + 5 / 1.5 + 4.0) / 3)
    assert max_median_ratio(torch.tensor([[-1.0, 5.0, 2.0]])).item() == pytest.approx(2.5)  # odd d
    # a zero median has no ratio: undefined (left out), not infinite
    assert math.isnan(max_median_ratio(torch.tensor([[0.0, 0.0, 0.0, 1.0]])).item())
    assert max_median_ratio(torch.tensor([[0.0, 0.0, 0.0, 1.0], [-1.0, 5.0, 2.0, 0.0]])).item() == pytest.approx(5 / 1.5)


def test_max_median_ratio_matches_quantile_median():
    x = torch.randint(-3, 4, (200, 10), generator=gen(3)).float()
    a = x.abs()
    median = a.quantile(0.5, dim=-1)
    ref = torch.nanmean(torch.where(median > 0, a.amax(-1) / median, torch.nan))
    torch.testing.assert_close(max_median_ratio(x), ref, equal_nan=True)


def test_dettmers_outliers_hand_built():
    n_layers, n, d = 8, 100, 6  # needs >= 2 of 8 layers and >= 6 of 100 tokens
    layers = [torch.zeros(n, d) for _ in range(n_layers)]
    for l in range(n_layers):
        layers[l][:5, 1] = 9.0  # 5% of tokens in every layer: never counts in a layer
    layers[0][:50, 0] = 7.0  # 50% of tokens but in only 1 layer: not a model outlier
    for l in (2, 5):
        layers[l][:6, 2] = 6.0  # exactly 6% of tokens, exactly the threshold (>=), 2 of 8 layers
        layers[l][10:16, 3] = -7.0  # negative values count by |x|
    for l in range(n_layers):
        layers[l][:, 4] = 5.9  # below the threshold everywhere
    assert dettmers_outliers(layers).item() == 2
    assert dettmers_outliers(layers, layer_frac=0.1).item() == 3  # 1 of 8 layers suffices
    assert dettmers_outliers(layers, pos_frac=0.05).item() == 3  # coordinate 1 now counts; 0 still in 1 layer only
    assert dettmers_outliers(layers, pos_frac=0.05, layer_frac=0.1).item() == 4
    assert dettmers_outliers([t.view(4, 25, d) for t in layers]).item() == 2  # leading shape


def test_dettmers_needs_layers():
    with pytest.raises(ValueError):
        dettmers_outliers([])


ALL = [kurtosis, neuron_kurtosis, outlier_dims, lambda x: outlier_dims(x, relative=True), max_abs, max_median_ratio]


@pytest.mark.parametrize("fn", ALL)
def test_leading_shape_invariance_dtype_and_0d(fn):
    x = gaussian(6 * 20, 48, seed=4) * torch.linspace(0.5, 8.0, 48)
    flat, batched = fn(x), fn(x.view(6, 20, 48))
    assert flat.shape == () and flat.dtype == torch.float32
    torch.testing.assert_close(flat, batched)
    torch.testing.assert_close(fn(x.bfloat16()), fn(x.bfloat16().float()))  # upcast, not bf16 maths


def test_constant_tokens_are_left_out_of_kurtosis():
    x = torch.stack([torch.full((8,), 3.0), torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0])])
    one_spike = 8 - 2 + 1 / 7  # the largest kurtosis d values can have
    assert kurtosis(x).item() == pytest.approx(one_spike)
    assert math.isnan(kurtosis(torch.ones(3, 8)).item())


# ---- properties -------------------------------------------------------------------------------

token_arrays = hnp.arrays(
    np.int16, hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=48), elements=st.integers(-1000, 1000)
)


@settings(max_examples=60, deadline=None)
@given(token_arrays, st.integers(-12, 12))
def test_kurtosis_bounds_and_scale_invariance(a, k):
    x = torch.from_numpy(a.astype(np.float32)) / 10
    value = kurtosis(x)
    assume(not torch.isnan(value))
    d = x.shape[-1]
    assert 1.0 - 1e-4 <= value.item() <= d - 2 + 1 / (d - 1) + 1e-3
    torch.testing.assert_close(kurtosis(x * 2.0**k), value, rtol=1e-5, atol=0)  # powers of two are exact
    torch.testing.assert_close(kurtosis(x * 3.7), value, rtol=1e-3, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(token_arrays, st.integers(-12, 12), st.floats(0.5, 10.0))
def test_relative_outliers_scale_invariant(a, k, threshold):
    x = torch.from_numpy(a.astype(np.float32)) / 10
    assert outlier_dims(x * 2.0**k, threshold, relative=True) == outlier_dims(x, threshold, relative=True)


@settings(max_examples=40, deadline=None)
@given(token_arrays)
def test_neuron_kurtosis_bounds(a):
    x = torch.from_numpy(a.astype(np.float32))
    assume(bool((x != 0).any()))
    assert 1.0 - 1e-4 <= neuron_kurtosis(x).item() <= x.shape[-1] + 1e-3


# ---- the probe -------------------------------------------------------------------------------


def tiny_model(d_model: int = 64, n_layers: int = 2, norm: str = "layernorm", rotation: str = "none") -> Transformer:
    cfg = TrialConfig.model_validate({
        "model": {"d_model": d_model, "n_layers": n_layers, "n_heads": 2}, "norm": norm, "rotation": rotation,
        "optimizer": {"name": "adam", "lr": 1e-3}, "train": {"steps": 1}, "data": {"seq_len": 16},
    })
    return Transformer.from_config(cfg)


def expected_keys(n_layers: int) -> set[tuple]:
    keys = {(l, "resid", b, m) for l in range(n_layers + 1) for b in ("stored", "random") for m in METRICS}
    tested = (CONTROL_SPREAD, CONTROL_MEDIAN, *(f"{m}_rank_p" for m in RANK_TESTED))
    keys |= {(l, "resid", "random", m) for l in range(n_layers + 1) for m in tested}
    keys |= {(l, s, "random", m) for l in range(1, n_layers + 1) for s in ("attn_in", "mlp_in")
             for m in ("kurtosis", "top1_share", *tested)}
    keys |= {(l, s, "computation", m) for l in range(1, n_layers + 1) for s in ("attn_in", "mlp_in") for m in METRICS}
    keys |= {(l, "mlp_act", "neuron", m) for l in range(1, n_layers + 1) for m in METRICS}
    keys |= {(l, "attn", "heads", m) for l in range(1, n_layers + 1) for m in sinks.METRICS}
    keys |= {(-1, "attn", "uniform", m) for m in ("first_mass", "delimiter_mass")}
    return keys | {(-1, "model", "computation", "dettmers_outliers")}


def all_hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("rotation", ["none", "independent"])
def test_probe_rows_once_each_one_forward_and_loss(rotation):
    model = tiny_model(n_layers=3, rotation=rotation)
    x, y = batch(gen(0), 4, 16, shifted=False)
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    before = all_hooks(model)
    result = ActivationProbe(model, seed=0).run(x, y)
    assert len(calls) == 1
    keys = [(r["layer"], r["site"], r["basis"], r["metric"]) for r in result.rows]
    assert len(keys) == len(set(keys)) and set(keys) == expected_keys(3)
    assert all(isinstance(r["value"], float) and math.isfinite(r["value"]) for r in result.rows)
    assert all_hooks(model) == before  # the probe's hooks are gone
    with torch.no_grad():
        _, loss = model(x, y)
    assert result.val_loss == pytest.approx(loss.item(), rel=1e-6)
    assert model.training  # mode restored


def test_probe_sites_match_direct_measurement():
    model = tiny_model()
    x, y = batch(gen(0), 4, 16, shifted=False)
    rows = {(r["layer"], r["site"], r["basis"], r["metric"]): r["value"] for r in ActivationProbe(model, 0).run(x, y).rows}
    with torch.no_grad():
        emb = model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1]))
        after1 = model.blocks[0](emb)
        attn_in2 = model.blocks[1].attn_norm(after1)
    assert rows[(0, "resid", "stored", "kurtosis")] == pytest.approx(kurtosis(emb).item(), rel=1e-5)
    assert rows[(1, "resid", "stored", "max_abs")] == pytest.approx(max_abs(after1).item(), rel=1e-5)
    assert rows[(2, "attn_in", "computation", "max_median_ratio")] == pytest.approx(max_median_ratio(attn_in2).item(), rel=1e-5)


def test_probe_with_rotated_ends_layer0_is_the_written_residual_and_sites_the_computation_basis():
    """shared with rotated ends is the none model in a rotated residual basis: every computation-
    basis site reads as none's; resid layer 0 is the embeddings after write_emb (x = e R^T)."""
    x, y = batch(gen(0), 4, 16, shifted=False)
    base, shared = tiny_model(rotation="none"), tiny_model(rotation="shared")
    rows = {}
    for name, m in (("none", base), ("shared", shared)):
        rows[name] = {(r["layer"], r["site"], r["basis"], r["metric"]): r["value"] for r in ActivationProbe(m, 0).run(x, y).rows}
    for key, v in rows["none"].items():
        if key[1] in ("attn_in", "mlp_in", "mlp_act", "model"):
            assert rows["shared"][key] == pytest.approx(v, rel=1e-3, abs=1e-4), key
    with torch.no_grad():
        emb = shared.tok_emb(x) + shared.pos_emb(torch.arange(x.shape[1]))
        written = emb @ shared.blocks[0].read_attn.matrix.T
    assert rows["shared"][(0, "resid", "stored", "max_abs")] == pytest.approx(max_abs(written).item(), rel=1e-5)
    assert rows["shared"][(0, "resid", "stored", "max_abs")] != pytest.approx(max_abs(emb).item(), rel=1e-3)


def test_probe_control_reads_the_exact_null_under_heavy_tails():
    model = tiny_model(d_model=128)
    with torch.no_grad():  # every token id gets a huge coordinate of its own: basis-aligned tails
        ids = torch.arange(256)
        model.tok_emb.weight[ids, ids % 128] += 30.0
    x, y = batch(gen(0), 8, 16, shifted=False)
    rows = ActivationProbe(model, seed=0).run(x, y).rows
    k = {(r["layer"], r["basis"], r["metric"]): r["value"] for r in rows if r["site"] == "resid"}
    for layer in range(3):
        assert k[(layer, "stored", "kurtosis")] > 50
        sd = k[(layer, "random", CONTROL_SPREAD)]
        assert 0 < sd < 1
        assert k[(layer, "random", "kurtosis")] == pytest.approx(kurtosis_null(128), abs=4 * sd / math.sqrt(CONTROL_BASES))


def test_probe_control_rows_are_control_metrics_of_the_residual():
    model = tiny_model()
    x, y = batch(gen(0), 4, 16, shifted=False)
    probe = ActivationProbe(model, 3)
    rows = {(r["layer"], r["metric"]): r["value"] for r in probe.run(x, y).rows if r["basis"] == "random"}
    with torch.no_grad():
        emb = model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1]))
    want = control_metrics(emb, probe.random_bases(64, emb.device))
    for metric, value in want.items():
        assert rows[(0, metric)] == pytest.approx(value.item(), rel=1e-5), metric


def test_probe_hooks_removed_after_an_error():
    model = tiny_model()
    probe = ActivationProbe(model, 0)
    with pytest.raises(ValueError):
        probe.run(*batch(gen(0), 4, 32, shifted=False))  # longer than the model's seq_len: the forward raises
    assert all_hooks(model) == 0


def test_probe_one_host_transfer(request):
    model = tiny_model()
    x, y = batch(gen(0), 4, 16, shifted=False)
    probe = ActivationProbe(model, 0)
    probe.run(x, y)  # builds the random basis once
    counts = request.getfixturevalue("readbacks")
    result = probe.run(x, y, extra=(torch.tensor([1.0, 2.0]), torch.tensor([3.0])))
    assert counts == {"tolist": 1, "item": 0, "cpu": 0, "numpy": 0}
    assert result.extra == [[1.0, 2.0], [3.0]]  # the caller's values ride in the same readback


def test_probe_under_bf16_autocast():
    model = tiny_model()
    x, y = batch(gen(0), 4, 16, shifted=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result = ActivationProbe(model, 0).run(x, y)
    assert all(math.isfinite(r["value"]) for r in result.rows)


def test_probe_basis_is_fixed_by_seed():
    model = tiny_model()
    a, b, c = ActivationProbe(model, 0), ActivationProbe(model, 0), ActivationProbe(model, 1)
    dev = torch.device("cpu")
    torch.testing.assert_close(a.random_bases(64, dev), b.random_bases(64, dev))
    assert not torch.allclose(a.random_bases(64, dev), c.random_bases(64, dev))
    q = a.random_bases(64, dev)
    assert q.shape == (CONTROL_BASES, 64, 64) and CONTROL_BASES >= 32
    torch.testing.assert_close(q @ q.mT, torch.eye(64).expand(CONTROL_BASES, 64, 64), atol=1e-5, rtol=0)
    assert not torch.allclose(q[0], q[1])  # K different bases, not one repeated


def test_basis_test_reads_the_metric_functions_on_its_tokens():
    """The basis test's one-pass kurtosis and top-1 share are `kurtosis` and `top_share` on the
    same tokens (at most RANK_TOKENS of them, strided), in its own basis and in each random one."""
    from study.metrics import _kurtosis_and_top1

    x = control_inputs(n=3000)["heavy"]
    k, t = _kurtosis_and_top1(x)
    assert k.item() == pytest.approx(kurtosis(x).item(), rel=1e-5)
    assert t.item() == pytest.approx(top_share(x).item(), rel=1e-5)
    q = control_bases(64, 4)
    out = basis_test(x, q)
    tokens = x[::3]  # ceil(3000 / 1024) = 3
    assert out["top1_share"].item() == pytest.approx(torch.stack([top_share(tokens @ b) for b in q]).mean().item(), rel=1e-5)
