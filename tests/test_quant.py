"""Fake quantisation: exact levels and error bounds, a float path left bit-for-bit alone, and the
cost of a basis-aligned outlier (large under W8A8) against the same model rotated (small)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import batch
from study.config import TrialConfig
from study.model import Rotate, Transformer
from study.quant import SCHEMES, fake_quantise, quant_rows, quantised, quantised_delta_se, quantised_losses
from study.rotation import generator_for, random_orthogonal


def make_model(norm="rmsnorm", rotation="none", d=32, layers=2, dtype=torch.float32):
    cfg = TrialConfig(model={"d_model": d, "n_layers": layers, "n_heads": 2}, norm=norm, rotation=rotation,
                      optimizer={"name": "adam", "lr": 1e-3}, train={"steps": 1}, data={"seq_len": 32})
    return Transformer.from_config(cfg, dtype=dtype)


# ---- fake_quantise ----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([2, 4, 8]), seed=st.integers(0, 2**31), scale=st.floats(1e-4, 1e4), per_row=st.booleans())
def test_fake_quantise_levels_and_error(bits, seed, scale, per_row):
    x = torch.randn(6, 16, generator=generator_for(seed, "q"), dtype=torch.float64) * scale
    out = fake_quantise(x, bits, dim=-1 if per_row else None)
    qmax = 2 ** (bits - 1) - 1
    step = (x.abs().amax(-1, keepdim=True) if per_row else x.abs().amax()) / qmax
    k = out / step  # integer levels in [-qmax, qmax]
    torch.testing.assert_close(k, k.round(), atol=1e-9, rtol=0)
    assert k.abs().max() <= qmax + 1e-9
    assert ((out - x).abs() <= step / 2 * (1 + 1e-9)).all()  # round to nearest
    torch.testing.assert_close(out.abs().amax(-1) if per_row else out.abs().amax(),
                               x.abs().amax(-1) if per_row else x.abs().amax(), rtol=1e-12, atol=0)  # absmax kept


def test_fake_quantise_per_channel_scales_rows_independently():
    w = torch.tensor([[100.0, 1.0, -0.5], [0.01, 0.02, -0.03]])
    per_tensor, per_row = fake_quantise(w, 8), fake_quantise(w, 8, dim=-1)
    assert torch.equal(per_tensor[1], torch.zeros(3))  # the small row drowns under the big row's scale
    torch.testing.assert_close(per_row[1], w[1], atol=0.03 / 127 / 2 + 1e-9, rtol=0)
    assert torch.equal(fake_quantise(torch.zeros(2, 3), 4), torch.zeros(2, 3))
    assert torch.equal(fake_quantise(torch.zeros(2, 3), 4, dim=-1), torch.zeros(2, 3))
    b = torch.randn(4, 8).bfloat16()
    assert fake_quantise(b, 8).dtype == torch.bfloat16
    with pytest.raises(ValueError):
        fake_quantise(w, 1)


def test_fake_quantise_known_values():
    x = torch.tensor([7.0, 3.2, -1.6, 0.49, -7.0])
    assert fake_quantise(x, 4).tolist() == [7.0, 3.0, -2.0, 0.0, -7.0]  # step 1, round half away is moot here


# ---- the context manager: what is quantised, and the float path ----------------------------------


def test_every_linear_input_and_weight_and_nothing_else():
    model = make_model(rotation="independent")
    x, y = batch(generator_for(0, "test-quant"), 8, 32)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 * 2 + 1  # qkv, proj, fc, proj per block; the unembedding
    rotations = {n: b.clone() for n, b in model.named_buffers()}
    seen = {}
    with quantised(model, 8, 8):
        for m in linears:  # registered after the context's hooks: sees what the Linear computes with
            assert torch.equal(m.weight, fake_quantise(m.weight, 8, dim=-1))  # on the 8-bit per-row grid
            assert not torch.equal(m.weight, fake_quantise(m.weight, 8))  # per row, not per tensor
            m.register_forward_pre_hook(lambda mod, args: seen.__setitem__(id(mod), args[0]))
        model(x, y)
        assert all(torch.equal(b, rotations[n]) for n, b in model.named_buffers())  # Rotate buffers stay float
    assert set(seen) == {id(m) for m in linears}
    for inp in seen.values():
        assert torch.equal(inp, fake_quantise(inp, 8))  # on the per-tensor 8-bit grid
        assert inp.unique().numel() <= 255


def test_float_path_is_untouched_bit_for_bit():
    model = make_model(norm="layernorm", rotation="shared")
    x, y = batch(generator_for(0, "test-quant"), 8, 32)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    before = model(x, y)[1]
    q = quantised_losses(model, x, y)
    assert q.shape == (len(SCHEMES),) and torch.isfinite(q).all() and not torch.equal(q[0], before)
    assert torch.equal(model(x, y)[1], before)
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    assert model.training  # mode restored
    hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
    assert hooks == 0


def test_quantised_restores_after_an_exception():
    model = make_model()
    x, y = batch(generator_for(0, "test-quant"), 8, 32)
    before = model(x, y)[1]
    with pytest.raises(RuntimeError, match="boom"):
        with quantised(model, 4, 4):
            assert not torch.equal(model(x, y)[1], before)
            raise RuntimeError("boom")
    assert torch.equal(model(x, y)[1], before)


def test_quant_rows():
    rows = quant_rows([2.5, 3.0], 2.0)
    assert rows == [
        {"layer": -1, "site": "model", "basis": "w8a8", "metric": "quant_loss_delta", "value": 0.5},
        {"layer": -1, "site": "model", "basis": "w4a4", "metric": "quant_loss_delta", "value": 1.0},
    ]


# ---- what a basis-aligned outlier costs ---------------------------------------------------------


def plant_outlier(model: Transformer, ratio: float) -> None:
    """Coordinate 0 of every normalised layer input `ratio` times larger (rmsnorm gain), and the
    reading weights' column 0 `ratio` times smaller: the same float function, one huge input
    coordinate (the outlier features of LLM.int8() / SmoothQuant live in exactly such gains)."""
    with torch.no_grad():
        for norm, lin in _reads(model):
            norm.weight[0] *= ratio
            lin.weight[:, 0] /= ratio


def _reads(model):
    return ([(b.attn_norm, b.attn.qkv) for b in model.blocks] + [(b.mlp_norm, b.mlp.fc) for b in model.blocks]
            + [(model.final_norm, model.unembed)])


def rotate_reads(model: Transformer, q: torch.Tensor) -> Transformer:
    """The same function with every normalised input rotated before its Linear: x W^T =
    (x Q)(W Q)^T (an online rotation, QuaRot-style; the Rotate stays in float)."""
    rotated = copy.deepcopy(model)
    for parent, name in ([(b.attn, "qkv") for b in rotated.blocks] + [(b.mlp, "fc") for b in rotated.blocks]
                         + [(rotated, "unembed")]):
        lin = getattr(parent, name)
        with torch.no_grad():
            lin.weight.copy_(lin.weight @ q)
        setattr(parent, name, nn.Sequential(Rotate(q), lin))
    return rotated


def test_a_planted_outlier_costs_w8a8_much_more_than_the_same_model_rotated():
    torch.manual_seed(0)
    model = make_model(norm="rmsnorm", d=128)
    x, y = batch(generator_for(0, "test-quant"), 8, 32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(20):  # some structure, so the loss is sensitive to its inputs
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    q = random_orthogonal(128, generator_for(0, "test-quant-q"), dtype=torch.float32)

    def w8a8(m):
        return (quantised_losses(m, x, y, ("w8a8",))[0] - m(x, y)[1]).item()

    clean = w8a8(model)
    plant_outlier(model, 60.0)
    rotated = rotate_reads(model, q)
    float_loss = model(x, y)[1].item()
    assert abs(rotated(x, y)[1].item() - float_loss) < 1e-4  # the same function in float
    planted, spread = w8a8(model), w8a8(rotated)
    assert abs(clean) < 0.01
    assert planted > 0.05 and planted > 8 * abs(spread)


def test_the_penalty_s_standard_error_is_the_spread_of_per_sequence_differences():
    model = make_model(norm="layernorm", rotation="none")
    x, y = batch(generator_for(0, "test-quant"), 8, 32)
    se = quantised_delta_se(model, x, y)
    assert se.shape == (len(SCHEMES),) and (se > 0).all()
    # by hand: per-sequence losses, float and under each scheme, sd of the difference / sqrt(B)
    per_seq = lambda: torch.nn.functional.cross_entropy(  # noqa: E731
        model(x, y)[0].float().transpose(1, 2), y, reduction="none").mean(1)
    model.eval()
    with torch.no_grad():
        f = per_seq()
        for i, name in enumerate(SCHEMES):
            with quantised(model, *SCHEMES[name]):
                d = per_seq() - f
            assert torch.allclose(se[i], d.std() / d.numel() ** 0.5, rtol=1e-5)
            # the mean of the per-sequence differences is the penalty the probe records
            assert torch.allclose(d.mean(), quantised_losses(model, x, y, (name,))[0] - model(x, y)[1], atol=1e-5)
    assert model.training is False  # this test left it in eval; quantised_delta_se restores what it found
    rows = quant_rows([2.5, 3.0], 2.0, standard_errors=[0.01, 0.02])
    assert [r["metric"] for r in rows] == ["quant_loss_delta"] * 2 + ["quant_loss_delta_se"] * 2
    assert [r["value"] for r in rows[2:]] == [0.01, 0.02]
