"""Attribution and ablation of outlier dimensions, tested on planted structure: a planted residual
dimension is found at rank 1 everywhere, its ablation beats every random draw, its tokens are the
planted ones, and the same model in a rotated residual basis shows no dimension above the null."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from conftest import tiny
from analysis import load
from resultstore.schema import DIMS_SCHEMA
from study.attribution import (
    DELIMITER_BYTES,
    Attribution,
    ablation_p_value,
    dim_stats,
    token_frequencies,
    token_info,
)
from study.config import TrialConfig
from study.invariance import rotate_residual_basis
from study.model import Transformer
from study.rotation import generator_for, random_orthogonal
from study.train import MemorySink, StopTraining, train
from resultstore.writer import ResultsStore, StoreSink
from test_quant import plant_outlier

PLANTED, TARGET, SPIKE, GAIN = (10, 20, 30), 7, 20.0, 60.0


def planted_batch(B=8, T=32, target_everywhere=False):
    """Random byte tokens, a quarter of them planted ids; after a planted id the target comes next."""
    g = generator_for(0, "test-attribution")
    x = torch.randint(0, 256, (B, T), generator=g)
    hit = torch.rand(B, T, generator=g) < 0.25
    x[hit] = torch.tensor(PLANTED)[torch.randint(0, len(PLANTED), (int(hit.sum()),), generator=g)]
    y = torch.randint(0, 256, (B, T), generator=g)
    y[hit | target_everywhere] = TARGET
    return x, y


def planted_model(norm="rmsnorm", d=32, constant=False):
    """Residual coordinate 0 carries a spike on the planted tokens (every token with `constant`),
    and the unembedding reads it as the target; with a per-coordinate gain, test_quant's
    plant_outlier also makes coordinate 0 of every normalised input GAIN times larger."""
    cfg = TrialConfig(model={"d_model": d, "n_layers": 2, "n_heads": 2}, norm=norm, train={"steps": 1},
                      optimizer={"name": "adam", "lr": 1e-3}, data={"seq_len": 32})
    model = Transformer.from_config(cfg, dtype=torch.float64)
    with torch.no_grad():
        if constant:
            model.pos_emb.weight[:, 0] = SPIKE
        else:
            model.tok_emb.weight[list(PLANTED), 0] = SPIKE
        model.unembed.weight[TARGET, 0] = 2.0
    if norm == "rmsnorm":
        plant_outlier(model, GAIN)
    return model


def info_for(x):
    return token_info(np.bincount(x.reshape(-1).numpy(), minlength=256), byte_level=True)


def attribute(model, x, y, **kw):
    return Attribution(model, info_for(x), seed=0, **kw).run(x, y)


def ablation(rows):
    top = [r for r in rows if r["layer"] == -1 and r["role"] == "top"]
    null = [r for r in rows if r["layer"] == -1 and r["role"] == "null"]
    return top, null


# ---- planted structure --------------------------------------------------------------------------


def test_a_planted_dimension_is_rank_one_at_every_layer_and_site():
    x, y = planted_batch()
    rows = attribute(planted_model(), x, y)
    first = {(r["layer"], r["site"]): r for r in rows if r["layer"] >= 0 and r["rank_max"] == 1}
    assert sorted(first) == [(0, "resid")] + [(l, s) for l in (1, 2) for s in ("attn_in", "mlp_in", "resid")]
    for r in first.values():
        assert r["dim"] == 0 and r["rank_m4"] == 1
        assert r["m4_share"] > 0.99  # the spike carries the fourth moment
        assert {int(t.split(":")[0]) for t in r["top_tokens"].split(",")} <= set(PLANTED)
        assert r["frequent_share"] == 1.0  # the planted ids are the batch's commonest
        assert r["pos0_share"] < 0.5 and r["freq_corr"] > 0.8
        assert r["gain_ratio"] == pytest.approx(GAIN)  # every norm reading it carries the planted gain
        assert r["sun_ratio"] > 100  # against the layer's median |x|
        if r["site"] == "resid":  # three quarters of the tokens do not carry it
            assert r["max_median"] > 100


def test_a_planted_dimensions_ablation_exceeds_every_random_draw():
    x, y = planted_batch()
    top, null = ablation(attribute(planted_model(), x, y))
    assert len(null) == 16 and not {r["dim"] for r in top} & {r["dim"] for r in null}
    planted = top[0]
    assert planted["dim"] == 0 and planted["first_layer"] == 0
    assert planted["zero_delta"] > 100 * max(r["zero_delta"] for r in null)
    assert planted["zero_p"] == pytest.approx(1 / 17) and planted["mean_p"] == pytest.approx(1 / 17)
    assert planted["zero_delta_first"] > 0.5  # set at the embeddings only, it stays gone
    assert planted["loss_tokens"] == f"{TARGET}:8"  # the 8 positions that lose most all predict the target


def test_zero_ablation_of_a_constant_dimension_costs_while_its_mean_does_not():
    """Sun et al. 2024: a massive activation acts as a bias; zero destroys, the mean keeps it."""
    x, y = planted_batch(target_everywhere=True)
    top, _ = ablation(attribute(planted_model(norm="rmsnorm_scalar", constant=True), x, y))
    assert top[0]["dim"] == 0
    assert top[0]["zero_delta"] > 1.0
    assert abs(top[0]["mean_delta"]) < 1e-3 * top[0]["zero_delta"]


def test_the_same_model_in_a_rotated_basis_shows_no_dimension_above_the_null():
    x, y = planted_batch()
    model = planted_model(norm="rmsnorm_scalar")  # exactly rotation-invariant: the same function
    rotated = rotate_residual_basis(model, random_orthogonal(32, generator_for(0, "test-attribution-q")))
    assert rotated(x, y)[1].item() == pytest.approx(model(x, y)[1].item(), abs=1e-9)
    stored, stored_null = ablation(attribute(model, x, y))
    top, null = ablation(attribute(rotated, x, y))
    band = max(r["zero_delta"] for r in null)  # the top of the random-dimension null band
    assert stored[0]["zero_delta"] > 100 * max(r["zero_delta"] for r in stored_null)
    # rotated, the spike is spread over every coordinate: no zero ablation leaves the band's scale
    # (one of 8 candidates may still top 16 draws by chance: p = 1/17 is no multiple-test answer)
    assert max(r["zero_delta"] for r in top) < 2 * band
    assert max(r["zero_delta"] for r in top) < 0.01 * stored[0]["zero_delta"]
    assert sum(r["zero_p"] <= 1 / 17 + 1e-9 for r in top) <= 1
    rows = attribute(rotated, x, y)
    assert max(r["m4_share"] for r in rows if r["site"] == "resid" and r["layer"] >= 0) < 0.5


# ---- the measures -------------------------------------------------------------------------------


def test_dim_stats_on_a_hand_built_batch():
    B, T, d = 4, 5, 3
    ids = torch.arange(B * T) % 7
    info = token_info(np.arange(7, 0, -1), byte_level=False, n_frequent=2)  # ids 0 and 1 are frequent
    a = torch.ones(B * T, d)
    a[::T, 0] = 10.0  # dim 0 is large at position 0 of every sequence
    a[:, 1] = torch.linspace(1, 2, B * T)
    gain = torch.tensor([4.0, 1.0, 2.0])
    s = dict(zip(("max_abs", "median_abs", "max_median", "sun_ratio", "m4_share", "pos0_share",
                  "frequent_share", "delimiter_share", "freq_corr", "gain_ratio"),
                 dim_stats(a, ids, T, info, gain, n_top=B)))
    assert s["max_abs"].tolist() == [10.0, 2.0, 1.0]
    assert s["max_median"][0] == 10.0 and s["sun_ratio"][0] == 10.0  # the layer's median |x| is 1
    assert s["pos0_share"][0] == 1.0 and s["pos0_share"][1] == 0.0
    assert s["gain_ratio"].tolist() == [2.0, 0.5, 1.0]
    assert s["m4_share"].sum() == pytest.approx(1.0)
    # position 0 holds ids 0, 5, 3, 1: two of the four are frequent; delimiters = frequent for BPE
    assert s["frequent_share"][0] == 0.5 and s["delimiter_share"][0] == 0.5
    scalar = dim_stats(a, ids, T, info, torch.tensor([3.0]), n_top=B)[-1]
    assert scalar.tolist() == [1.0, 1.0, 1.0]


def test_freq_corr_follows_token_frequency():
    ids = torch.arange(200) % 10
    info = token_info(np.arange(10, 0, -1) * 100, byte_level=False)  # id 0 the commonest
    a = torch.stack([info.log_freq[ids], -info.log_freq[ids]], 1)  # |x| rises / falls with frequency
    corr = dim_stats(torch.stack([a[:, 0], a[:, 0].neg()], 1), ids, 20, info, None, n_top=4)[-2]
    assert corr.tolist() == pytest.approx([1.0, 1.0])
    corr = dim_stats(1 / a[:, :1], ids, 20, info, None, n_top=4)[-2]
    assert corr.item() < -0.9
    assert dim_stats(a, ids, 20, info, None, n_top=4)[-1].isnan().all()  # no norm: gain_ratio nan


def test_token_info_and_frequencies():
    info = token_info(np.bincount(np.frombuffer(b"a a a b\n", dtype=np.uint8), minlength=256), byte_level=True,
                      n_frequent=2)
    assert set(torch.nonzero(info.frequent).flatten().tolist()) == {ord("a"), ord(" ")}
    assert set(torch.nonzero(info.delimiter).flatten().tolist()) == set(DELIMITER_BYTES)
    assert {ord("\n"), ord(" "), ord("."), ord(",")} <= set(DELIMITER_BYTES)
    stream = np.tile(np.arange(4, dtype=np.uint8), 1000)
    assert token_frequencies(stream, 5).tolist() == [1000, 1000, 1000, 1000, 0]
    sampled = token_frequencies(stream, 4, max_tokens=64 * 8)  # 64 chunks of 8 tokens
    assert sampled.sum() == 512 and sampled.tolist() == [128] * 4


def test_ablation_p_value():
    assert ablation_p_value(5.0, [1.0, 2.0, 3.0]) == 0.25
    assert ablation_p_value(2.0, [1.0, 2.0, 3.0]) == 0.75  # ties count against
    assert ablation_p_value(0.0, [1.0] * 16) == 1.0


# ---- the pass -----------------------------------------------------------------------------------


def test_rows_exactly_once_per_layer_site_dim_and_the_model_left_as_it_was():
    x, y = planted_batch()
    model = planted_model(norm="layernorm").train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = attribute(model, x, y, k=4, n_null=5)
    keys = [(r["layer"], r["site"], r["dim"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert {(r["layer"], r["site"]) for r in rows} == (
        {(-1, "resid"), (0, "resid")} | {(l, s) for l in (1, 2) for s in ("attn_in", "mlp_in", "resid")})
    for layer, site in {(r["layer"], r["site"]) for r in rows if r["layer"] >= 0}:
        here = [r for r in rows if (r["layer"], r["site"]) == (layer, site)]
        assert sorted(r["rank_max"] for r in here if r["rank_max"]) == [1, 2, 3, 4]
        assert sorted(r["rank_m4"] for r in here if r["rank_m4"]) == [1, 2, 3, 4]
    top, null = ablation(rows)
    assert [r["rank_max"] for r in top] == [1, 2, 3, 4] and len(null) == 5
    assert model.training and sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_pass_makes_no_host_readback_until_its_rows_are_read(readbacks):
    x, y = planted_batch()
    attribution = Attribution(planted_model(), info_for(x), seed=0)
    readbacks.update(numpy=0)  # info_for counted tokens on the host
    pending = attribution.measure(x, y)
    assert readbacks == {"tolist": 0, "item": 0, "cpu": 0, "numpy": 0}
    assert len(pending.rows(pending.values.tolist())) > 16


def test_ablated_copies_in_one_batch_equal_one_at_a_time():
    x, y = planted_batch(B=2, T=8)
    a = Attribution(planted_model(), info_for(x), seed=0)
    dims = torch.tensor([0, 3, 5])
    values = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], dtype=torch.float64)
    at = torch.tensor([[True, True, True], [False, True, False], [True, False, False]])
    together = a.token_losses(x, y, dims, values, at)
    for g in range(3):
        alone = a.token_losses(x, y, dims[g : g + 1], values[g : g + 1], at[g : g + 1])
        assert torch.allclose(together[g], alone[0], atol=1e-10)
    assert not torch.allclose(together[0], a.token_losses(x, y, dims[:0], values[:0], at[:0])[0])


# ---- in a trial, through the store ------------------------------------------------------------


def test_a_trial_attributes_at_the_final_eval_and_every_kth_in_the_evals_one_readback(readbacks):
    sink = MemorySink()
    train(tiny(), sink)
    assert {r["step"] for r in sink.tables["dims"]} == {12}
    assert {r["tokens"] for r in sink.tables["dims"]} == {12 * 4 * 16}
    assert tiny().trial_id == tiny(train={"attribution_every": 0}).trial_id  # the new field keeps the ids
    readbacks.update({k: 0 for k in readbacks})
    sink = MemorySink()
    train(tiny(train={"attribution_every": 2}), sink)
    assert sorted({r["step"] for r in sink.tables["dims"]}) == [0, 8, 12]
    assert readbacks["tolist"] == 4  # evals at 0, 4, 8, 12: the attribution rides in each one's readback
    keys = [(r["step"], r["layer"], r["site"], r["dim"]) for r in sink.tables["dims"]]
    assert len(keys) == len(set(keys))


class CrashingSink(StoreSink):
    crash_step: int | None = None

    def checkpoint(self, step, directory):
        if step == self.crash_step:
            raise StopTraining(step)


def test_dims_rows_exactly_once_after_a_crash_and_resume_and_readable_with_plain_polars(tmp_path):
    cfg = tiny(train={"attribution_every": 1, "checkpoint_every": 4})
    straight = MemorySink()
    train(cfg, straight, checkpoint_dir=tmp_path / "a")
    store = ResultsStore(tmp_path / "results", "s")
    sink = CrashingSink(store, cfg.trial_id)
    sink.crash_step = 8
    with pytest.raises(StopTraining):
        train(cfg, sink, checkpoint_dir=tmp_path / "b")
    store.write_rows("dims", cfg.trial_id, [{**straight.tables["dims"][-1], "step": 10}])  # past the checkpoint: must go
    sink.crash_step = None
    train(cfg, sink, checkpoint_dir=tmp_path / "b")
    dims = pl.read_parquet(str(tmp_path / "results" / "s" / "dims" / "*.parquet"))
    keys = dims.select("trial_id", "step", "layer", "site", "dim")
    assert keys.height == keys.unique().height == len(straight.tables["dims"])
    assert sorted(dims["step"].unique().to_list()) == [0, 4, 8, 12]
    want = pl.DataFrame(straight.tables["dims"], schema_overrides={"rank_max": pl.Int64}, infer_schema_length=None)
    got = dims.sort("step", "layer", "site", "dim")
    assert got["zero_delta"].to_list() == pytest.approx(
        want.sort("step", "layer", "site", "dim")["zero_delta"].to_list(), nan_ok=True)
    loaded = load(tmp_path / "results" / "s").dims.collect()
    assert loaded.height == keys.height and dict(loaded.schema) == DIMS_SCHEMA


def test_a_store_that_predates_the_table_loads_with_an_empty_dims_frame(tmp_path):
    store = ResultsStore(tmp_path, "old")
    store.write_run({"trial_id": "a", "status": "done"})
    r = load(tmp_path / "old")
    assert r.dims.collect().height == 0 and dict(r.dims.collect_schema()) == DIMS_SCHEMA
    assert "dims" in r.tables()
