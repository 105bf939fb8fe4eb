"""The attention-sink measures (study/sinks.py) on planted attention patterns, and in the probe."""

from __future__ import annotations

import math

import pytest
import torch

from study import sinks
from study.attribution import DELIMITER_BYTES, token_info
from study.config import TrialConfig
from study.metrics import ActivationProbe
from study.model import Transformer
from study.rotation import generator_for

B, H, T = 2, 3, 8


def no_delimiters(b: int = B, t: int = T) -> torch.Tensor:
    return torch.zeros(b, t, dtype=torch.bool)


def causal_uniform(t: int = T, b: int = B, h: int = H) -> torch.Tensor:
    """Query i uniform over its i + 1 keys: 1/(i+1) on each key j <= i."""
    p = torch.ones(t, t).tril()
    return (p / p.sum(-1, keepdim=True)).expand(b, h, t, t)


def on_position(j: int | torch.Tensor, t: int = T, b: int = B, h: int = H) -> torch.Tensor:
    """Every query puts all its mass on key j (query i < j on itself: it cannot see j)."""
    p = torch.zeros(b, h, t, t)
    for i in range(t):
        p[..., i, min(int(j), i)] = 1.0
    return p


def test_all_mass_on_the_first_position_reads_one():
    m = sinks.sink_metrics(on_position(0), no_delimiters())
    assert m["first_mass"].item() == 1.0
    assert m["sink_heads"].item() == 1.0  # every head's top key is position 0
    assert m["delimiter_mass"].item() == 0.0 and abs(m["null_mass"].item()) < 1e-7


def test_uniform_attention_over_all_keys_reads_one_over_t():
    """Attention uniform over all T keys (no causal mask) puts 1/T on position 0."""
    p = torch.full((B, H, T, T), 1.0 / T)
    assert sinks.sink_metrics(p, no_delimiters())["first_mass"].item() == pytest.approx(1 / T)


@pytest.mark.parametrize("t", [1, 2, 8, 128])
def test_uniform_causal_attention_reads_the_harmonic_mean_and_no_sink_head(t):
    """Query i uniform over its i + 1 keys puts 1/(i+1) on position 0: the mean over queries is
    H_t / t (0.0424 at t = 128), not 1/t. Ties are not a top key: no head is a sink head."""
    m = sinks.sink_metrics(causal_uniform(t), no_delimiters(t=t))
    harmonic = sum(1 / i for i in range(1, t + 1)) / t
    assert m["first_mass"].item() == pytest.approx(harmonic, rel=1e-6)
    assert sinks.uniform_reference(no_delimiters(t=t))["first_mass"].item() == pytest.approx(harmonic, rel=1e-6)
    assert m["sink_heads"].item() == 0.0
    if t == 128:
        assert m["first_mass"].item() == pytest.approx(0.0424, abs=1e-4)


def test_delimiter_mass_and_its_uniform_reference():
    """Delimiters at positions 2 and 5 of every sequence: attention parked on position 2 (from
    query 2 on) reads delimiter mass (T - 2) / T; uniform causal attention reads the mean over
    queries of the delimiter share of each prefix, which uniform_reference gives."""
    delim = no_delimiters()
    delim[:, [2, 5]] = True
    m = sinks.sink_metrics(on_position(2), delim)
    assert m["delimiter_mass"].item() == pytest.approx((T - 2) / T)
    assert m["first_mass"].item() == pytest.approx(1 / T)  # query 0 sees only position 0
    assert m["sink_heads"].item() == 1.0  # queries 1: itself (not a sink); 2..7: position 2 (a delimiter)
    share = [sum(1 for j in (2, 5) if j <= i) / (i + 1) for i in range(T)]
    ref = sinks.uniform_reference(delim)
    assert ref["delimiter_mass"].item() == pytest.approx(sum(share) / T, rel=1e-6)
    assert sinks.sink_metrics(causal_uniform(), delim)["delimiter_mass"].item() == pytest.approx(sum(share) / T, rel=1e-6)


def test_sink_heads_counts_heads_by_their_majority_of_queries():
    """Head 0 parks on position 0, head 1 on the previous token, head 2 on position 0 for 4 of
    its 7 queries i >= 1: two of three heads are sink heads."""
    p = torch.zeros(1, 3, T, T)
    for i in range(T):
        p[0, 0, i, 0] = 1.0
        p[0, 1, i, max(i - 1, 0)] = 1.0
        p[0, 2, i, 0 if i <= 4 else i] = 1.0
    assert sinks.sink_metrics(p, no_delimiters(1))["sink_heads"].item() == pytest.approx(2 / 3)
    stats = sinks.head_stats(p, no_delimiters(1))
    assert stats[3].tolist() == pytest.approx([1.0, 1 / 7, 4 / 7])  # queries 1..7 whose top key is a sink


def test_null_mass_is_the_mass_no_key_gets():
    """softmax1 with every logit 0: query i puts 1/(i+2) on each of its keys and the rest on the
    zero key; null_mass is the mean of 1/(i+2)."""
    t = 6
    p = torch.ones(t, t).tril() / torch.arange(2, t + 2, dtype=torch.float32)[:, None]
    m = sinks.sink_metrics(p.expand(1, 1, t, t), no_delimiters(1, t))
    assert m["null_mass"].item() == pytest.approx(sum(1 / (i + 2) for i in range(t)) / t, rel=1e-6)


def test_delimiters_are_the_outlier_dimension_studys():
    x = torch.tensor([[ord("a"), ord(" "), ord("\n"), ord("("), ord("z")]])
    assert sinks.delimiter_ids(256, x)[x].tolist() == [[False, True, True, True, False]]
    assert torch.equal(sinks.delimiter_ids(256, x), token_info(torch.ones(256).numpy(), byte_level=True).delimiter)
    assert set(torch.nonzero(sinks.delimiter_ids(256, x)).flatten().tolist()) == set(DELIMITER_BYTES)
    tokens = torch.tensor([[7] * 9 + [3] * 5 + list(range(10, 20))])  # a larger vocabulary: the commonest ids
    ids = torch.nonzero(sinks.delimiter_ids(1000, tokens)).flatten().tolist()
    assert len(ids) == 8 and {7, 3} <= set(ids)


# ---- in the probe ---------------------------------------------------------------------------------


def model_with(attention: str, d: int = 32, layers: int = 2) -> Transformer:
    cfg = TrialConfig(model={"d_model": d, "n_layers": layers, "n_heads": 2}, norm="rmsnorm_scalar", attention=attention,
                      optimizer={"name": "adam", "lr": 1e-3}, train={"steps": 1}, data={"seq_len": 16})
    return Transformer.from_config(cfg)


@pytest.mark.parametrize("attention", ["softmax", "softmax1", "gated", "clipped", "kv_bias"])
def test_probe_rows_are_the_measures_of_each_blocks_own_pattern(attention):
    """Each layer's rows equal study.sinks' measures of that block's pattern, recomputed from its
    normalised input; the uniform reference at layer -1."""
    model = model_with(attention)
    g = generator_for(0, "test-sinks")
    x = torch.randint(0, 256, (3, 16), generator=g)
    rows = {(r["layer"], r["site"], r["basis"], r["metric"]): r["value"] for r in ActivationProbe(model, 0).run(x, x).rows}
    delim = sinks.delimiter_ids(256, x)[x]
    inputs = []
    handles = [b.attn_norm.register_forward_hook(lambda _m, _i, out: inputs.append(out)) for b in model.blocks]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    for layer, (block, a) in enumerate(zip(model.blocks, inputs), start=1):
        with torch.no_grad():
            q, k, _ = block.attn.heads(block.attn.qkv(a))
            want = sinks.sink_metrics(block.attn.pattern(q, k), delim)
        for name in sinks.METRICS:
            assert rows[(layer, "attn", "heads", name)] == pytest.approx(want[name].item(), abs=1e-6), (layer, name)
    for name, value in sinks.uniform_reference(delim).items():
        assert rows[(-1, "attn", "uniform", name)] == pytest.approx(value.item(), rel=1e-6)
    null = rows[(1, "attn", "heads", "null_mass")]
    assert (null > 0.01) if attention in ("softmax1", "kv_bias", "clipped") else abs(null) < 1e-6


def test_probe_reads_one_on_a_model_with_a_planted_sink():
    """Every token holds coordinate 0, position 0 also coordinate 1; every query channel reads
    coordinate 0 and every key channel coordinate 1: only position 0's key meets the queries
    (logit ~90 against 0), so the first position takes all the mass in every head."""
    model = model_with("softmax", layers=1)
    attn = model.blocks[0].attn
    with torch.no_grad():
        model.tok_emb.weight.zero_()
        model.pos_emb.weight.zero_()
        model.tok_emb.weight[:, 0] = 1.0
        model.pos_emb.weight[0, 1] = 1.0
        attn.qkv.weight.zero_()
        attn.qkv.weight[:32, 0] = 1.0  # q: every channel = x_0
        attn.qkv.weight[32:64, 1] = 1.0  # k: every channel = x_1
    x = torch.randint(0, 256, (4, 16), generator=generator_for(1, "test-sinks"))
    probe = ActivationProbe(model, 0, delimiter=torch.zeros(256, dtype=torch.bool))
    rows = {(r["layer"], r["metric"]): r["value"] for r in probe.run(x, x).rows if r["site"] == "attn"}
    assert rows[(1, "first_mass")] == pytest.approx(1.0, abs=1e-6)
    assert rows[(1, "sink_heads")] == 1.0
    assert rows[(1, "delimiter_mass")] == 0.0 and rows[(-1, "delimiter_mass")] == 0.0  # the caller's set: none


def test_long_batches_are_measured_in_chunks_with_the_same_result(monkeypatch):
    model = model_with("clipped")
    x = torch.randint(0, 256, (5, 16), generator=generator_for(2, "test-sinks"))
    whole = [r for r in ActivationProbe(model, 0).run(x, x).rows if r["site"] == "attn"]
    monkeypatch.setattr(sinks, "MAX_CHUNK", 2 * 2 * 16 * 16)  # two sequences a chunk: 2, 2, 1
    chunked = [r for r in ActivationProbe(model, 0).run(x, x).rows if r["site"] == "attn"]
    for a, b in zip(whole, chunked, strict=True):
        assert b["value"] == pytest.approx(a["value"], abs=1e-6), a
