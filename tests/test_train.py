import math

import pytest
import torch

from conftest import tiny
from study.train import MemorySink, StopTraining, lr_at, train
from variants import OPTIMIZERS as ALL_OPTIMIZERS

NORMS = ["layernorm", "rmsnorm", "rmsnorm_scalar"]
ROTATIONS = ["none", "shared", "independent", {"mode": "partial", "group_size": 1}]
OPTIMIZERS = [ALL_OPTIMIZERS[n] for n in ("adam", "sgd", "rotated_adam")]  # the full norm x rotation grid
BEYOND = [o for n, o in ALL_OPTIMIZERS.items() if n not in ("adam", "sgd", "rotated_adam")]  # one variant each


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("rotation", ROTATIONS, ids=str)
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o["name"])
def test_smoke_train_every_variant(norm, rotation, optimizer):
    sink = MemorySink()
    summary = train(tiny(6, 3, norm=norm, rotation=rotation, optimizer=optimizer), sink)
    assert summary.status == "done" and summary.steps == 6
    assert math.isfinite(summary.final_val_loss) and summary.final_val_loss < math.log(256) + 0.5
    steps = sorted({r["step"] for r in sink.tables["metrics"]})
    assert steps == [0, 3, 6]
    assert [r["step"] for r in sink.tables["curves"]] == list(range(0, 7))
    assert sink.run_row["status"] == "done" and sink.run_row["norm"] == norm


@pytest.mark.parametrize("attention", ["softmax1", "gated", "clipped", "kv_bias"])
def test_every_attention_trains_with_its_sink_rows_and_stays_invariant(attention):
    """The trial loop with each attention variant (issue 36): done, its runs column, a sink row per
    block and eval, and the float64 invariance check ~0 under rmsnorm_scalar."""
    sink = MemorySink()
    cfg = tiny(6, 3, norm="rmsnorm_scalar", rotation="independent", attention=attention,
               train={"invariance_check": True})
    summary = train(cfg, sink)
    assert summary.status == "done" and sink.run_row["attention"] == attention
    assert sink.run_row["params"] == cfg.params
    rows = [r for r in sink.tables["metrics"] if r["site"] == "attn" and r["basis"] == "heads"]
    assert len(rows) == 3 * 2 * 4  # evals (steps 0, 3, 6) x blocks x measures
    assert abs(next(r["value"] for r in sink.tables["checks"] if r["dtype"] == "float64")) < 1e-10


@pytest.mark.parametrize("optimizer", BEYOND, ids=lambda o: o["name"])
def test_smoke_train_each_further_optimizer(optimizer):
    sink = MemorySink()
    summary = train(tiny(12, 3, norm="rmsnorm", rotation="shared", optimizer=optimizer), sink)
    assert summary.status == "done" and summary.steps == 12
    assert summary.final_val_loss < sink.tables["curves"][0]["val_loss"]  # it learned something
    assert sink.run_row["optimizer"] == optimizer["name"] and sink.run_row["optimizer_family"]


def test_rows_match_the_store_schema_and_loss_falls():
    sink = MemorySink()
    cfg = tiny(40, 20, train={"batch_size": 8, "checkpoint_every": 500, "invariance_check": True})
    summary = train(cfg, sink)
    first_val = sink.tables["curves"][0]["val_loss"]
    assert summary.final_val_loss < first_val - 0.5
    sites = {(r["site"], r["basis"]) for r in sink.tables["metrics"]}
    assert sites == {("resid", "stored"), ("resid", "random"), ("attn_in", "computation"), ("attn_in", "random"),
                     ("mlp_in", "computation"), ("mlp_in", "random"), ("mlp_act", "neuron"), ("model", "computation"),
                     ("model", "w8a8"), ("model", "w4a4"), ("attn", "heads"), ("attn", "uniform")}
    assert {r["dtype"] for r in sink.tables["checks"]} == {"float64", "float32", "bfloat16"}
    assert sink.run_row["params"] == cfg.params and sink.run_row["tokens"] == 40 * 8 * 16
    # exactly one row per (step, layer, site, basis, metric)
    keys = [(r["step"], r["layer"], r["site"], r["basis"], r["metric"]) for r in sink.tables["metrics"]]
    assert len(keys) == len(set(keys))


class CrashAt(MemorySink):
    def __init__(self, step):
        super().__init__()
        self.crash_step = step

    def checkpoint(self, step, directory):
        if step == self.crash_step:
            raise StopTraining(step)


@pytest.mark.parametrize("eval_every", [4, 3], ids=["evals-at-checkpoints", "checkpoints-between-evals"])
def test_checkpoint_resume_gives_the_same_curve(tmp_path, eval_every):
    cfg = tiny(12, eval_every, optimizer={"name": "rotated_adam", "lr": 3e-3}, rotation="shared",
               train={"checkpoint_every": 4})
    straight = MemorySink()
    train(cfg, straight, checkpoint_dir=tmp_path / "a")

    sink = CrashAt(8)
    with pytest.raises(StopTraining):
        train(cfg, sink, checkpoint_dir=tmp_path / "b")
    sink.tables["curves"].append({"step": 9, "train_loss": 123.0})  # a row past the checkpoint: must vanish
    sink.crash_step = None
    train(cfg, sink, checkpoint_dir=tmp_path / "b")

    assert [r["step"] for r in sink.tables["curves"]] == list(range(13))
    assert [r["train_loss"] for r in sink.tables["curves"]] == [r["train_loss"] for r in straight.tables["curves"]]
    assert [r["value"] for r in sink.tables["metrics"]] == [r["value"] for r in straight.tables["metrics"]]
    assert sink.run_row["final_val_loss"] == straight.run_row["final_val_loss"]


def test_resume_refuses_another_trials_checkpoint(tmp_path):
    train(tiny(4, 2, train={"checkpoint_every": 2}), checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="belongs to trial"):
        train(tiny(6, 3, seed=1), checkpoint_dir=tmp_path)


def test_divergence_stops_early():
    cfg = tiny(30, 5, optimizer={"name": "sgd", "lr": 1e4, "momentum": 0.99},
               train={"grad_clip": 0, "checkpoint_every": 500, "invariance_check": True})
    sink = MemorySink()
    summary = train(cfg, sink)
    assert summary.status == "diverged" and summary.steps < 30
    assert sink.run_row["status"] == "diverged" and sink.tables["checks"] == []


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = tiny(100, 100, train={"warmup": 10, "min_lr_ratio": 0.1, "batch_size": 32, "eval_batch": {"sequences": 16},
                          "checkpoint_every": 500, "invariance_check": True})  # TrainConfig's defaults
    lrs = [lr_at(cfg, s) for s in range(100)]
    assert lrs[0] == pytest.approx(3e-4) and lrs[9] == pytest.approx(3e-3)
    assert max(lrs) == pytest.approx(3e-3)
    assert lrs[-1] == pytest.approx(3e-4, rel=0.01)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_training_applies_the_configured_torch_threads():
    before = torch.get_num_threads()  # conftest's 1: ask for another count, so the test can fail
    want = before + 1
    sink = MemorySink()
    try:
        train(tiny(2, 3, runtime={"num_threads": want, "device": "cpu"}), sink)
        assert torch.get_num_threads() == want
        assert sink.run_row["device"].endswith(f", {want} threads)")  # in effect while it ran
    finally:
        torch.set_num_threads(before)


def test_one_host_readback_per_eval_and_none_in_steps(readbacks):
    train(tiny(20, 5, optimizer={"name": "rotated_adam", "lr": 3e-3}))
    readbacks.pop("numpy")  # the batch sampler draws window starts on a CPU generator: not a readback
    assert readbacks == {"tolist": 5, "item": 0, "cpu": 0}  # evals at 0, 5, 10, 15, 20


def test_quantisation_cost_at_the_final_eval_and_every_kth():
    sink = MemorySink()
    train(tiny(12, 3), sink)
    quant = [r for r in sink.tables["metrics"] if r["metric"] == "quant_loss_delta"]
    assert [(r["step"], r["layer"], r["site"], r["basis"]) for r in quant] == [(12, -1, "model", "w8a8"), (12, -1, "model", "w4a4")]
    d = {r["basis"]: r["value"] for r in quant}
    assert 0 < abs(d["w8a8"]) < abs(d["w4a4"]) and d["w4a4"] > 1e-3  # 4 bits cost more than 8
    sink = MemorySink()
    train(tiny(12, 3, train={"quant_every": 2}), sink)
    assert sorted({r["step"] for r in sink.tables["metrics"] if r["metric"] == "quant_loss_delta"}) == [0, 6, 12]


def test_quantisation_cost_rides_in_the_evals_one_readback(readbacks):
    train(tiny(20, 5, optimizer={"name": "rotated_adam", "lr": 3e-3},  # torch Adam's CPU path calls .item()
               train={"quant_every": 1}))
    readbacks.pop("numpy")
    assert readbacks == {"tolist": 5, "item": 0, "cpu": 0}


def test_a_token_corpus_gives_the_sink_probe_its_corpus_delimiters(tmp_path):
    """A non-byte vocabulary has no fixed delimiter ids: the probe's sink metrics take the corpus's
    frequent ids (study.attribution's TokenInfo), as the attribution does, not one eval batch's."""
    import numpy as np

    from study.attribution import N_FREQUENT, corpus_token_info
    from study.train import _build

    rng = np.random.default_rng(0)
    rng.zipf(1.3, 20_000).clip(max=499).astype(np.uint16).tofile(tmp_path / "train.bin")
    cfg = tiny(6, 3, data={"tokens": str(tmp_path / "train.bin"), "vocab_size": 500, "seq_len": 16})
    setup = _build(cfg, "ddp")  # one process: no sharding
    want = corpus_token_info(setup.corpus).delimiter
    assert setup.probe.delimiter is not None and torch.equal(setup.probe.delimiter, want)
    assert int(want.sum()) == N_FREQUENT
